"""The command line's exit codes and its one-line error (membership/cli.py, rules 1 and 2).

A module of their own, below every command: ``certs``, ``admin`` and the
server's ``arbiter`` command raise :class:`CliError` without importing the
other commands (``membership.cli.commands`` imports the demo, which imports the
local-cluster helper, which issues certificates with ``membership.cli.certs``).
"""

from __future__ import annotations

__all__ = ["EXIT_ENDED", "EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "CliError"]

# 0 ok; 1 a runtime failure; 2 a usage error; 3 a node the cluster ended
# without its asking (membership --help has the whole list).
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_ENDED = 0, 1, 2, 3


class CliError(Exception):
    """A failure to report as one line on stderr, with exit code :attr:`code`."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code
