"""The committed generated protocol code matches protos/ (etcd's verify_genproto)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_genproto_committed_code_is_not_stale() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "genproto.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
