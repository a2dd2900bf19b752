"""Test-wide settings."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
# tests read its results. Started only when they are collected: by this
# process, or under pytest-xdist by the controller, once a worker has
# collected (the workers find it by the path each is given at its start).
SIM_SEEDS_TEST = "tests/sim/test_sim.py::test_sim_ci_seeds_hold_every_invariant"
SIM_SEEDS_ID = re.compile(re.escape(SIM_SEEDS_TEST) + r"\[seeds(\d+)\+\]$")
sim_runs_key = pytest.StashKey["SeedRuns | None"]()
sim_out_key = pytest.StashKey[Path]()  # xdist controller: where the workers look


def _start_seed_runs(config: pytest.Config, out: Path, firsts: list[int]) -> None:
    from tests.sim.background import SeedRuns
    from tests.sim.test_sim import CI_CHUNK, CI_SECONDS

    first, last = min(firsts), max(firsts) + CI_CHUNK  # the chunks collected (-k may pick some)
    config.stash[sim_runs_key] = SeedRuns.start(out, first, last - first, CI_SECONDS)


def pytest_collection_finish(session: pytest.Session) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controller starts it (pytest_xdist_node_collection_finished)
    session.config.stash[sim_runs_key] = None
    firsts = [
        item.callspec.params["first"]
        for item in session.items
        if item.nodeid.startswith(SIM_SEEDS_TEST) and isinstance(item, pytest.Function)
    ]
    if firsts:
        out = Path(tempfile.mkdtemp(prefix="sim-seeds-")) / "seeds.jsonl"
        _start_seed_runs(session.config, out, firsts)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller, as each worker starts: where the background seed run will be."""
    config = node.config
    if sim_out_key not in config.stash:
        config.stash[sim_out_key] = Path(tempfile.mkdtemp(prefix="sim-seeds-")) / "seeds.jsonl"
    node.workerinput["sim_seeds_out"] = str(config.stash[sim_out_key])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """xdist controller: the first worker to have collected says which seeds to run."""
    config = node.config
    if sim_runs_key in config.stash or sim_out_key not in config.stash:
        return
    config.stash[sim_runs_key] = None
    firsts = [int(m.group(1)) for i in ids if (m := SIM_SEEDS_ID.match(i))]
    if firsts:
        _start_seed_runs(config, config.stash[sim_out_key], firsts)


def pytest_sessionfinish(session: pytest.Session) -> None:
    runs = session.config.stash.get(sim_runs_key, None)
    if runs is not None:
        runs.stop()
    out = runs.out if runs is not None else session.config.stash.get(sim_out_key, None)
    if out is not None and not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(out.parent, ignore_errors=True)


@pytest.fixture
def sim_seed_runs(request: pytest.FixtureRequest) -> SeedRuns | None:
    """The background run of the simulator's CI seeds, or None (run them in the test)."""
    runs = request.config.stash.get(sim_runs_key, None)
    out = getattr(request.config, "workerinput", {}).get("sim_seeds_out")
    if runs is None and out:  # an xdist worker: the controller's run, if it started one
        from tests.sim.background import SeedRuns

        runs = SeedRuns.attach(Path(out))
    return runs
