"""The ``membership`` console script: exits as documented from its first instant.

``membership.cli`` imports grpc, protobuf and the commands, which takes a few
hundred milliseconds; a SIGINT or SIGTERM meanwhile printed an importlib
``KeyboardInterrupt`` traceback (SIGINT) and the process died of the signal,
while the same signal a moment later exited quietly (issue 25, item 6). This
module imports nothing heavy (``membership/__init__.py`` is lazy): it makes
both signals a quiet, documented exit
(:func:`membership.shared.exits.stopped_early`) until
``membership.cli.main`` installs its own handlers
(``membership/shared/interrupt.py``). Before the interpreter runs this module
(its first 10 to 30 ms), Python's own startup reports a SIGINT.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

from membership.shared.exits import stopped_early

__all__ = ["run"]


def _early(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(stopped_early(sys.argv[1:], signum))


def run() -> None:
    """Entry point of the console script: ``sys.exit(membership.cli.main())``."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _early)
    from membership.cli import main

    sys.exit(main())
