"""The ``membership`` console script: exits as documented from its first instant.

``membership.cli`` imports grpc, protobuf and the commands, which takes a few
hundred milliseconds; a SIGINT or SIGTERM meanwhile printed an importlib
``KeyboardInterrupt`` traceback (SIGINT) and the process died of the signal,
while the same signal a moment later exited quietly (issue 25, item 6). This
module imports nothing heavy (``membership/__init__.py`` is lazy): it makes
both signals a quiet, documented exit (:func:`stopped_early`) until
``membership.cli.main`` installs its own handlers
(``membership/shared/interrupt.py``). Before the interpreter runs this module
(its first 10 to 30 ms), Python's own startup reports a SIGINT.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from types import FrameType

__all__ = ["run", "stopped_early"]

# Commands that stop by a signal and exit 0 then (EXIT_CODES), and what they had
# not done yet when a signal stops them before they start.
_BEFORE = {
    "node": "joining",
    "watch": "connecting",
    "top": "connecting",
    "arbiter": "serving",
}


def stopped_early(argv: Sequence[str], signum: int) -> int:
    """The exit code of a command stopped by signal ``signum`` before it started: 0
    for node, watch, top and arbiter (they stop by a signal), saying so on stderr
    (``membership node: stopped before joining``); ``128 + signum`` for the others.

    Args:
        argv: the command's arguments (without the program name).
        signum: the signal number.
    """
    command = next((a for a in argv if a in _BEFORE), None)
    if command is None:
        return 128 + signum
    print(f"membership {command}: stopped before {_BEFORE[command]}", file=sys.stderr)
    return 0


def _early(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(stopped_early(sys.argv[1:], signum))


def run() -> None:
    """Entry point of the console script: ``sys.exit(membership.cli.main())``."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _early)
    from membership.cli import main

    sys.exit(main())
