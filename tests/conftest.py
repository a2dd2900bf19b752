"""Test-wide settings."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.sim.background import SeedRuns

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


# The simulator's CI seeds run ahead in a niced background process while the
# integration tests wait on real time (tests/sim/background.py); the seed
# tests read its results. Started only when they are collected.
SIM_SEEDS_TEST = "tests/sim/test_sim.py::test_sim_ci_seeds_hold_every_invariant"
sim_runs_key = pytest.StashKey["SeedRuns | None"]()


def pytest_collection_finish(session: pytest.Session) -> None:
    from tests.sim.background import SeedRuns
    from tests.sim.test_sim import CI_CHUNK, CI_SECONDS

    session.config.stash[sim_runs_key] = None
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Under pytest-xdist every worker collects every test: the seed tests
        # run their seeds themselves, on whichever worker they land.
        return
    firsts = [
        item.callspec.params["first"]
        for item in session.items
        if item.nodeid.startswith(SIM_SEEDS_TEST) and isinstance(item, pytest.Function)
    ]
    if firsts:  # the seeds of the chunks collected (-k may pick some)
        out = Path(tempfile.mkdtemp(prefix="sim-seeds-")) / "seeds.jsonl"
        first, last = min(firsts), max(firsts) + CI_CHUNK
        session.config.stash[sim_runs_key] = SeedRuns.start(out, first, last - first, CI_SECONDS)


def pytest_sessionfinish(session: pytest.Session) -> None:
    runs = session.config.stash.get(sim_runs_key, None)
    if runs is not None:
        runs.stop()
        shutil.rmtree(runs.out.parent, ignore_errors=True)


@pytest.fixture
def sim_seed_runs(request: pytest.FixtureRequest) -> SeedRuns | None:
    """The background run of the simulator's CI seeds, or None (run them in the test)."""
    return request.config.stash.get(sim_runs_key, None)
