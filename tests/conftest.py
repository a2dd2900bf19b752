"""Test-wide settings."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Tests fork child processes (with a preexec_fn that ties them to the test's
# life) while gRPC is running in the test process. gRPC's fork handlers then
# restart its poller in the child before exec, which can abort the child
# (grpc/grpc#43055). The children exec at once and need none of that. Must be
# set before grpc is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# An arbiter started without --data-dir keeps its Raft state under
# $XDG_STATE_HOME/membership/<cluster>/<id>. Tests (and every child process they
# start, which inherits the environment) get a state dir of their own, so they
# never touch the user's real one nor collide with another test run.
_STATE_HOME = tempfile.mkdtemp(prefix="membership-tests-state-")
os.environ["XDG_STATE_HOME"] = _STATE_HOME
atexit.register(shutil.rmtree, _STATE_HOME, ignore_errors=True)
