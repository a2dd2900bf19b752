"""One long-lived process that runs ``membership`` commands in-process, on request.

The integration harness reads replica views through ``membership view --json``
(:meth:`tests.integration.harness.ProcCluster.view`), polled many times per
test. A ``membership`` process per poll costs a Python start with gRPC
(0.5 to 1 s on a loaded 2-core machine), and a poll of three replicas three
of them. This process pays that once: it reads one JSON array per line on
stdin (the command line, as ``membership`` would get it), runs
:func:`membership.cli.main` on it, as ``python -m membership`` does (its own
event loop, a fresh client and connection for every command, the same
environment), and prints one JSON object per line on stdout::

    {"rc": <exit code>, "stdout": "...", "stderr": "..."}

For reading state only: tests of the command line itself run the real
``membership`` process (:func:`tests.integration.harness.run_cli`).

``python -m tests.integration.clirunner``; EOF on stdin ends it.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys


def run(argv: list[str]) -> dict[str, object]:
    from membership.cli import main

    # As in a new process, the command configures logging itself (at its own
    # level, on the stderr captured here): the previous command's handler goes.
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:  # --help, malformed flags
            rc = e.code if isinstance(e.code, int) else 1
    return {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}


def serve() -> int:
    real_stdout = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = run(json.loads(line))
        real_stdout.write(json.dumps(reply) + "\n")
        real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
