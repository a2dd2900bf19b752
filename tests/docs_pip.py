"""The ``pip`` of a docs page's virtualenv (``tests/docs.py``, module rule 2).

A page says ``pip install -e '.[bench]'``, as a user in a checkout would. Run
as written it would reinstall the checkout into the virtualenv the tests run
from, pointing it at the page's temporary folder, and, while the other
worker starts ``membership`` processes, a half-written install lists the
package's entry points twice. So:

- ``.`` and ``.[EXTRAS]`` name the real checkout;
- when the virtualenv already has the checkout installed editable from there,
  they become the requirements of EXTRAS (``matplotlib``, ``py-spy``...),
  which is what the page's command adds to it, and the checkout is not
  reinstalled;
- one pip at a time (a lock file in the virtualenv), as two pages may install
  the same extra at once.

Everything else is passed to ``python -m pip`` unchanged.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import sys
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_EXTRA = re.compile(r"""^(?P<req>[^;]+?)\s*;\s*extra\s*==\s*["'](?P<extra>[^"']+)["']\s*$""")


def _installed_editable(root: Path) -> metadata.Distribution | None:
    # Every copy of the metadata on sys.path: the checkout's own egg-info (when
    # run from it) has no direct_url.json; the virtualenv's install has.
    for dist in metadata.distributions(name="grpc-membership"):
        url = json.loads(dist.read_text("direct_url.json") or "{}")
        if url.get("dir_info", {}).get("editable") and url.get("url") == root.as_uri():
            return dist
    return None


def rewrite(args: list[str], root: Path, dist: metadata.Distribution | None) -> list[str]:
    """``args`` for ``python -m pip``: each ``.``/``.[EXTRAS]`` (and its ``-e``)
    as described in the module docstring."""
    out: list[str] = []
    for i, a in enumerate(args):
        if a != "." and not a.startswith(".["):
            if a in ("-e", "--editable") and i + 1 < len(args) and dist is not None:
                nxt = args[i + 1]
                if nxt == "." or nxt.startswith(".["):
                    continue  # the checkout is installed editable already
            out.append(a)
            continue
        if dist is None:
            out.append(str(root) + a[1:])
            continue
        extras = {e.strip() for e in a[2:-1].split(",")} if a.startswith(".[") else set()
        for line in dist.requires or []:
            m = _EXTRA.match(line)
            if m and m["extra"] in extras:
                out.append(m["req"])
    return out


def main() -> int:
    args = sys.argv[1:]
    dist = _installed_editable(ROOT)
    new = rewrite(args, ROOT, dist)
    if args[:1] == ["install"] and not [a for a in new[1:] if not a.startswith("-")]:
        return 0  # nothing left to install
    # One lock per virtualenv, wherever the page's links make sys.prefix point.
    site = str(dist.locate_file("")) if dist is not None else sys.prefix
    key = hashlib.sha256(site.encode()).hexdigest()[:12]
    lock = Path(tempfile.gettempdir()) / f"docs-pip-{key}.lock"
    with lock.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        return os.spawnv(os.P_WAIT, sys.executable, [sys.executable, "-m", "pip", *new])


if __name__ == "__main__":
    raise SystemExit(main())
