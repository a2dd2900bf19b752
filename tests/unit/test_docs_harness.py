"""The doc-test harness (tests/docs.py) and the rules the pages keep.

The pages themselves run in tests/integration/test_docs.py; here: that a
block the harness skips names a test that exists, that the README's test
command is what CI runs, that every file a page names exists, and that the
harness fails a page when it should (a failing command, a wait that never
holds, an interrupted command that exits non-zero) and leaves no process.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import docs_pip
from tests.docs import ROOT, RUN, PageFailed, PageRun, blocks, covering_test, run_page

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _page(tmp_path: Path, body: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent(body))
    return page


def _work(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


# --- the pages ---------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_every_skipped_example_names_a_test_that_exists(page: Path) -> None:
    for block in blocks(page):
        if block.lang not in RUN or block.one("skip") is None:
            continue
        cover = covering_test(block)
        assert cover is not None, f"{block.where}: a skip must say 'covered by tests/X.py::test_Y'"
        path, name = cover
        assert path.is_file(), f"{block.where}: {path} does not exist"
        assert re.search(rf"^\s*(async )?def {name}\b", path.read_text(), re.M), (
            f"{block.where}: {path.relative_to(ROOT)} has no {name}"
        )


def test_docs_the_readme_test_command_is_what_ci_runs() -> None:
    readme = blocks(ROOT / "README.md")
    commands = [b.text.strip() for b in readme if b.lang == "sh" and "pytest" in b.text]
    assert len(commands) == 1, commands
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[0] in ci, f"{commands[0]!r} is not a line of .ci/run"


def test_docs_the_readme_stays_short_and_links_pages_that_exist() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    for target in re.findall(r"\]\((docs/[\w.-]+\.md)(?:#[\w-]*)?\)", text):
        assert (ROOT / target).is_file(), target


# A path in backquotes that names a file of the checkout: `arbiter/core/tally.py`,
# `bench/scale.py`, `deploy/...`; globs and placeholders (`*`, `X`, `...`) are not paths.
_PATH = re.compile(r"`((?:arbiter|membership|bench|tests|deploy|protos|examples|docs)/[\w./-]+)`")


def _written_by_a_run(path: str) -> bool:
    """True for a path under a directory that .gitignore names (``bench/results/``,
    ``bench/.build/``): a run writes it, so a clean clone lacks it."""
    ignored = [
        line.strip().rstrip("/") + "/"
        for line in (ROOT / ".gitignore").read_text().splitlines()
        if "/" in line.strip() and not line.startswith("#")
    ]
    return any((path.rstrip("/") + "/").startswith(d) for d in ignored)


def test_docs_written_by_a_run_is_what_gitignore_names() -> None:
    assert _written_by_a_run("bench/.build/")
    assert _written_by_a_run("bench/results/scale-1000.json")
    assert not _written_by_a_run("bench/scale.py")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_every_file_a_page_names_exists(page: Path) -> None:
    missing = []
    for path in _PATH.findall(page.read_text()):
        path = path.rstrip(".")
        if "*" in path or "..." in path or _written_by_a_run(path):
            continue  # a glob, an elision, or what a run writes (gitignored: absent from a clone)
        if not (ROOT / path).exists():
            missing.append(path)
    assert not missing, f"{page.relative_to(ROOT)} names files that do not exist: {missing}"


# --- the harness --------------------------------------------------------------------


def test_harness_blocks_reads_languages_lines_and_directives(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        """\
        text

        <!-- doctest: replace: a => b -->
        <!-- doctest: timeout: 5 -->
        ```sh
        echo a
        ```

        ```json
        {"x": 1}
        ```
        """,
    )
    found = blocks(page)
    assert [(b.line, b.lang) for b in found] == [(5, "sh"), (9, "json")]
    assert found[0].directives == {"replace": ["a => b"], "timeout": ["5"]}
    assert found[0].text == "echo a\n"


def test_harness_refuses_an_unknown_directive_and_an_unclosed_fence(tmp_path: Path) -> None:
    bad = _page(tmp_path, "<!-- doctest: skipp: no -->\n```sh\necho\n```\n")
    with pytest.raises(ValueError, match="unknown doctest directive 'skipp'"):
        blocks(bad)
    unclosed = _page(tmp_path, "```sh\necho\n")
    with pytest.raises(ValueError, match="never closed"):
        blocks(unclosed)


def test_harness_blocks_share_one_shell_and_a_port_keeps_its_number(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        """\
        ```sh
        A=127.0.0.1:7001
        ```

        ```sh
        echo "$A localhost:7001 127.0.0.1:7002 127.0.0.1:8080"
        ```

        ```python
        import os
        print("python", os.path.exists(".venv/bin/python"))
        ```
        """,
    )
    out = run_page(page, _work(tmp_path))
    first, same, other, kept = out[1].split()
    assert first.startswith("127.0.0.1:") and first != "127.0.0.1:7001"
    assert same == "localhost:" + first.split(":")[1]
    assert other.startswith("127.0.0.1:") and other != first and other != "127.0.0.1:7002"
    assert kept == "127.0.0.1:8080"  # outside the ranges: left alone
    assert out[2].strip() == "python True"


def test_harness_a_failing_command_fails_the_page_and_names_the_block(tmp_path: Path) -> None:
    page = _page(tmp_path, "```sh\necho before\nfalse\necho after\n```\n")
    with pytest.raises(PageFailed) as failed:
        run_page(page, _work(tmp_path))
    assert "page.md:1" in str(failed.value)
    assert "before" in str(failed.value)


def test_harness_a_replace_whose_text_is_absent_fails(tmp_path: Path) -> None:
    page = _page(tmp_path, "<!-- doctest: replace: nowhere => x -->\n```sh\necho\n```\n")
    with pytest.raises(PageFailed, match="'nowhere' is not in the block"):
        run_page(page, _work(tmp_path))


def test_harness_a_wait_that_never_holds_times_out(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "<!-- doctest: wait: test -e never -->\n<!-- doctest: timeout: 1 -->\n```sh\necho\n```\n",
    )
    started = time.monotonic()
    with pytest.raises(PageFailed, match="waiting for: test -e never"):
        run_page(page, _work(tmp_path))
    assert time.monotonic() - started < 30


def test_harness_wait_holds_once_a_background_command_makes_it_true(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        """\
        <!-- doctest: wait: test -e ready -->
        ```sh
        ( python -c "import time; time.sleep(0.3)"; touch ready ) &
        ```

        ```sh
        ls ready
        ```
        """,
    )
    assert run_page(page, _work(tmp_path))[1].strip() == "ready"


def test_harness_interrupt_after_stops_a_command_that_prints_then_runs_on(tmp_path: Path) -> None:
    script = "import signal, sys, time\n"
    script += "signal.signal(signal.SIGINT, lambda *a: sys.exit(0))\n"
    script += "print('watching', flush=True)\n"
    script += "time.sleep(600)\n"
    (tmp_path / "watch.py").write_text(script)
    page = _page(
        tmp_path,
        f"""\
        <!-- doctest: interrupt after: watching -->
        ```sh
        python {tmp_path / "watch.py"}
        ```
        """,
    )
    started = time.monotonic()
    assert "watching" in run_page(page, _work(tmp_path))[0]
    assert time.monotonic() - started < 60


def test_harness_an_interrupted_command_that_exits_non_zero_fails(tmp_path: Path) -> None:
    # (A background command of a non-interactive shell starts with SIGINT
    # ignored; a watch sets its own handler, as this one does.)
    (tmp_path / "watch.py").write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *a: sys.exit(3))\n"
        "print('watching', flush=True)\n"
        "time.sleep(600)\n"
    )
    page = _page(
        tmp_path,
        f"""\
        <!-- doctest: interrupt after: watching -->
        ```sh
        python {tmp_path / "watch.py"}
        ```
        """,
    )
    with pytest.raises(PageFailed):
        run_page(page, _work(tmp_path))


def test_harness_background_processes_are_stopped_when_the_page_ends(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        """\
        <!-- doctest: wait: test -s pid -->
        ```sh
        python -c "import os, time; open('pid', 'w').write(str(os.getpid())); time.sleep(600)" &
        ```
        """,
    )
    work = _work(tmp_path)
    run_page(page, work)
    pid = int((work / "pid").read_text())
    stat = Path(f"/proc/{pid}/stat")
    gone = not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert gone, f"process {pid} outlived its page"


def test_harness_the_page_folder_mirrors_the_checkout_and_pip_installs_the_checkout(
    tmp_path: Path,
) -> None:
    work = _work(tmp_path)
    session = PageRun(_page(tmp_path, ""), work)
    try:
        assert (work / "arbiter").resolve() == ROOT / "arbiter"
        assert (work / "bench" / "results").is_dir()
        assert not any((work / "bench" / "results").iterdir())  # the committed figures stay
        pip = (work / ".venv" / "bin" / "pip").read_text()
        assert str(ROOT / "tests" / "docs_pip.py") in pip
        assert (work / ".venv" / "bin" / "python").resolve() == Path(sys.executable).resolve()
    finally:
        session.close()
    assert os.path.isdir(work)


def test_harness_a_pages_pip_adds_the_extras_and_never_reinstalls_the_checkout() -> None:
    dist = docs_pip._installed_editable(ROOT)
    assert dist is not None, "the tests run from an editable install of this checkout"
    bench = [r.split(";")[0].strip() for r in dist.requires or [] if 'extra == "bench"' in r]
    assert bench  # matplotlib, py-spy, uvloop
    assert docs_pip.rewrite(["install", "-q", "-e", ".[bench]"], ROOT, dist) == [
        "install",
        "-q",
        *bench,
    ]
    assert docs_pip.rewrite(["install", "-e", "."], ROOT, dist) == ["install"]
    # Not installed from here: the checkout itself, by its real path.
    assert docs_pip.rewrite(["install", "-e", ".[bench]"], ROOT, None) == [
        "install",
        "-e",
        f"{ROOT}[bench]",
    ]
    assert docs_pip.rewrite(["list", "--format", "json"], ROOT, dist) == [
        "list",
        "--format",
        "json",
    ]
