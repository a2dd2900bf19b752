"""The command line's exit codes and its one-line error (membership/cli.py, rules 1 and 2).

A module of their own, below every command: ``certs``, ``admin`` and the
server's ``arbiter`` command raise :class:`CliError` without importing the
other commands (``membership.cli.commands`` imports the demo, which imports the
local-cluster helper, which issues certificates with ``membership.cli.certs``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["EXIT_ENDED", "EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "CliError", "stopped_early"]

# 0 ok; 1 a runtime failure; 2 a usage error; 3 a node the cluster ended
# without its asking (membership --help has the whole list).
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_ENDED = 0, 1, 2, 3


class CliError(Exception):
    """A failure to report as one line on stderr, with exit code :attr:`code`."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


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
    for node, watch, top and arbiter (they stop by a signal), saying so on stderr as
    the command itself does (``n1: stopped before joining``, ``watch: stopped before
    connecting``); ``128 + signum`` for the others.

    Args:
        argv: the command's arguments (without the program name).
        signum: the signal number.
    """
    command = next((a for a in argv if a in _BEFORE), None)
    if command is None:
        return 128 + signum
    who = _node_id(argv) if command == "node" else None
    # the words the command says itself once it runs (membership/cli/commands.py)
    print(f"{who or command}: stopped before {_BEFORE[command]}", file=sys.stderr)
    return 0


def _node_id(argv: Sequence[str]) -> str | None:
    """The ``--id`` given in ``argv`` (``--id X`` or ``--id=X``), or None."""
    for i, a in enumerate(argv):
        if a == "--id" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--id="):
            return a[len("--id=") :]
    return None
