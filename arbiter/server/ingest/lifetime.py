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
    signals sent to the whole group left to the consensus process (a Ctrl-C or a
    SIGHUP at the terminal, systemd's SIGTERM to every process of the unit): it gets
    them too, and says STOP or RELOAD_TLS to its workers, which then end their
    streams gracefully instead of dying under them. SIGKILL still ends a worker."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    if sys.platform == "linux":
        import ctypes

        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
