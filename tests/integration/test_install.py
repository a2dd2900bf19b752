"""README.md's install works: a wheel built from the checkout installs and runs.

The package is not on PyPI (issue 25, item 1), so README.md says how to install
from a checkout or a built wheel. This builds the wheel as README.md does
(``pip wheel --no-deps -w dist .``), installs it without dependencies into a
folder of its own (the dependencies are this environment's), and runs the
installed ``membership`` command from there, checking that the code it runs is
the wheel's and not this checkout's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str | Path, env: dict[str, str] | None = None, cwd: Path = ROOT) -> str:
    r = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=300, env=env, cwd=cwd
    )
    assert r.returncode == 0, (argv, r.stdout[-2000:], r.stderr[-2000:])
    return r.stdout


def test_install_the_wheel_readme_builds_installs_and_runs(tmp_path: Path) -> None:
    dist, target = tmp_path / "dist", tmp_path / "site"
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, ".")
    (wheel,) = dist.glob("grpc_membership-*-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("membership/cli/__init__.py", "arbiter/server/app.py",
                   "membership/v1/membership_pb2.py"):  # fmt: skip
        assert needed in names, needed
    assert not any(n.startswith(("tests/", "bench/")) for n in names)
    _run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, wheel)
    # run from elsewhere: the checkout (the current folder of pip) must not be on sys.path
    env, away = {**os.environ, "PYTHONPATH": str(target)}, tmp_path
    script = target / "bin" / "membership"
    assert script.exists(), sorted(p.name for p in (target / "bin").iterdir())
    version = _run(sys.executable, script, "--version", env=env, cwd=away)
    assert version.startswith("membership "), version
    where = _run(sys.executable, "-c", "import arbiter, membership; print(membership.__file__);"
                 "print(arbiter.__file__)", env=env, cwd=away)  # fmt: skip
    assert all(line.startswith(str(target)) for line in where.split()), where
    helped = _run(sys.executable, script, "arbiter", "--help", env=env, cwd=away)  # the server's
    assert "--peers" in helped and "--data-dir" in helped
