"""bench/scale.py refuses a command line that cannot make a run, before anything starts
(exit 2, one line naming the flag; no process, no file written)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCALE = Path(__file__).resolve().parents[2] / "bench" / "scale.py"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--sizes", "-100"], "--sizes needs node counts >= 1"),
        (["--sizes", "abc"], "--sizes must be a comma list"),
        (["--skip", "etdc"], "unknown: ['etdc']"),
        (["--skip", "ours,bare,etcd"], "no system to run"),
        (["--join-rate", "0"], "--join-rate must be a finite number > 0"),
        (["--election-timeout", "nan"], "--election-timeout must be a finite number > 0"),
        (["--hogs", "-1"], "--hogs must be >= 0"),
        (["--etcd-timing", "500,50"], "--etcd-timing needs 0 < heartbeat"),
        (["--ingest-workers", "foo"], "--ingest-workers must be 'auto'"),
        (["--out", "/proc/nope"], "--out /proc/nope: not a writable directory"),
    ],
)
def test_scale_args_refused_with_exit_2_before_anything_starts(
    argv: list[str], says: str, tmp_path: Path
) -> None:
    run = subprocess.run(
        [sys.executable, str(SCALE), *argv], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2, run.stderr
    assert says in run.stderr
    assert "Traceback" not in run.stderr
