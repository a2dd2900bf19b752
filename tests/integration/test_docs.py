"""The examples of README.md and docs/*.md, run (tests/docs.py has the conventions).

Every page with an example is one test: its ``sh`` and ``python`` blocks run
in order in one shell, in a folder of the page's own, with free ports; a block
that cannot run here names the test that covers it
(tests/unit/test_docs_harness.py checks that the test exists).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.docs import ROOT, RUN, blocks, run_page

pytestmark = pytest.mark.integration

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = [
    page for page in PAGES if any(b.lang in RUN and b.one("skip") is None for b in blocks(page))
]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # The docs are secure by default: a page that runs plaintext says so itself.
    env.pop("MEMBERSHIP_INSECURE", None)
    # Replicas started by the pages keep heartbeats in their own process
    # (the lan default starts a worker process per core; tests/conftest.py).
    env["MEMBERSHIP_INGEST_WORKERS"] = "0"
    return env


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_page_examples_run(page: Path, tmp_path: Path) -> None:
    outputs = run_page(page, tmp_path, _env())
    assert len(outputs) == sum(1 for b in blocks(page) if b.lang in RUN and b.one("skip") is None)
