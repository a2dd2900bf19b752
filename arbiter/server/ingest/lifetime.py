"""An ingest worker lives no longer than its consensus process (worker.py rule 5)."""

from __future__ import annotations

import contextlib
import signal
import sys

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL when the consensus process dies (Linux's PR_SET_PDEATHSIG; a parent
    gone before this call is noticed by the end of the channel instead), and the
    terminal's signals left to the consensus process: a Ctrl-C or a SIGHUP reaches
    it too, and it says STOP or RELOAD_TLS to its workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if sys.platform == "linux":
        import ctypes

        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
