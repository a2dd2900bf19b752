"""Test-wide settings."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

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


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Keeps each phase's report on the item (``item.rep_call``...), so that
    fixtures can print a failed test's process logs in their teardown."""
    rep = yield
    setattr(item, "rep_" + rep.when, rep)
    return rep
