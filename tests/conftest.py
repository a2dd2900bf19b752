"""Test-wide settings."""

from __future__ import annotations

import os

import pytest

# Tests fork child processes (with a preexec_fn that ties them to the test's
# life) while gRPC is running in the test process. gRPC's fork handlers then
# restart its poller in the child before exec, which can abort the child
# (grpc/grpc#43055). The children exec at once and need none of that. Must be
# set before grpc is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# gRPC core's informational lines (GOAWAY received...) are noise in test output.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
# Secure by default: every command and client needs TLS files or an explicit
# plaintext choice. Tests that are not about TLS run plaintext; this process
# and every child it starts inherit it. TLS tests clear it for their children
# (tests/integration/test_tls.py).
os.environ["MEMBERSHIP_INSECURE"] = "1"
# Heartbeat ingest in the replica's process for every arbiter a test starts
# (the lan default, auto, adds a worker process per core to each): tests of the
# workers give --ingest-workers, which wins (arbiter/cli.py rule 10).
os.environ.setdefault("MEMBERSHIP_INGEST_WORKERS", "0")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Keeps each phase's report on the item (``item.rep_call``...), so that
    fixtures can print a failed test's process logs in their teardown."""
    rep = yield
    setattr(item, "rep_" + rep.when, rep)
    return rep
