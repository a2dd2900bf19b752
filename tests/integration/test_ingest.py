"""``--ingest-workers 2``: heartbeats in worker processes, everything else proxied.

Every replica runs a consensus process and two workers sharing its port.
Nodes join and die as without workers; views, watches and admin calls work
through whichever worker a connection lands on; a worker SIGKILLed is
restarted and its nodes are not declared DEAD; SIGTERM leaves no process.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import tls_replicas
from tests.integration.harness import (
    ProcCluster,
    alive_set,
    changes,
    run_cli,
    wait_until,
)

pytestmark = pytest.mark.integration

NODES = ("n1", "n2", "n3", "n4")
WORKERS = ("--ingest-workers", "2")


def _children(pid: int) -> list[int]:
    """The pids of ``pid``'s children (its ingest workers)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def _workers(cluster: ProcCluster, rid: str) -> list[int]:
    return _children(cluster.procs[rid].pid)


def _served(cluster: ProcCluster, rid: str) -> set[str]:
    """Worker indexes of ``rid`` that logged their first heartbeat stream."""
    text = cluster.procs[rid].stderr()
    return set(re.findall(r"ingest worker (\d+) \(pid \d+\) serves its first heartbeat", text))


def _streaming_pid(cluster: ProcCluster, rid: str) -> int:
    """The pid of a worker of ``rid`` that serves heartbeat streams."""
    text = cluster.procs[rid].stderr()
    found = re.findall(r"ingest worker \d+ \(pid (\d+)\) serves its first heartbeat", text)
    live = [int(p) for p in found if int(p) in _workers(cluster, rid)]
    assert live, f"no worker of {rid} serves a heartbeat stream"
    return live[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[-1][0] != "Z"


def test_ingest_workers_serve_nodes_views_and_deaths_and_restart(cluster: ProcCluster) -> None:
    cluster.arbiter_args = WORKERS
    cluster.start_arbiters(3)
    wait_until(lambda: all(len(_workers(cluster, r)) == 2 for r in cluster.arbiters), 60, "workers")
    workers = {r: _workers(cluster, r) for r in cluster.arbiters}
    wait_until(cluster.leader, 60, "a leader among the replicas")
    for n in NODES:
        quiet = ("--no-status-probes",) if n == "n4" else ()  # a status that rarely changes
        cluster.start_node(n, "--label", f"rack=r{n[-1]}", *quiet)
    w = cluster.start_watch("w", first="a1")
    wait_until(lambda: alive_set(w) == set(NODES), 60, "every node ALIVE through the workers")
    # 4 nodes x 2 connections per link (the SDK hedges) spread over 2 workers: both
    # workers of some replica took streams (SO_REUSEPORT spreads connections).
    wait_until(
        lambda: any(_served(cluster, r) == {"0", "1"} for r in cluster.arbiters),
        10,
        "both workers of a replica serving heartbeat streams",
    )
    wait_until(lambda: all(_served(cluster, r) for r in cluster.arbiters), 10, "streams on all")
    # Views and admin calls through the workers, over many connections.
    for _ in range(2):
        view = cluster.view("a2")
        assert view is not None and {m["node_id"] for m in view["members"]} == set(NODES)
        assert view["members"][0]["labels"]["rack"].startswith("r")
    status = run_cli("admin", "status", "--json", "--arbiters", cluster.arbiter_list())
    assert status.returncode == 0, status.stderr
    _silence_is_since_heard(cluster, "n4")

    # A worker with streams SIGKILLed on two replicas at once: each is restarted, and
    # its nodes, which lost two of their three links, stay ALIVE: they reconnect to
    # the port (either worker) within their leases.
    victims = {r: _streaming_pid(cluster, r) for r in ("a1", "a2")}
    for pid in victims.values():
        os.kill(pid, signal.SIGKILL)
    for r, pid in victims.items():
        wait_until(
            lambda r=r, pid=pid: len(_workers(cluster, r)) == 2 and pid not in _workers(cluster, r),
            20,
            f"{r}'s worker restarted",
        )
        assert "died" in cluster.procs[r].stderr()
    # A node killed is DEAD by quorum; the others never were.
    cluster.procs["n2"].kill()
    wait_until(lambda: any(c["state"] == "DEAD" for c in changes(w, "n2")), 10, "n2 DEAD")
    cluster.start_node("n5")
    wait_until(lambda: "n5" in alive_set(w), 15, "n5 ALIVE after the restart")
    dead = [c["node_id"] for c in changes(w) if c["state"] == "DEAD"]
    assert dead == ["n2"], dead
    assert alive_set(w) == {"n1", "n3", "n4", "n5"}

    # SIGTERM: every replica and every worker gone, nothing left behind.
    everyone = [p for ps in workers.values() for p in ps] + [
        p for r in cluster.arbiters for p in _workers(cluster, r)
    ]
    cluster.stop_all(timeout=10)
    for rid in cluster.arbiters:
        assert cluster.procs[rid].popen.returncode == 0, cluster.procs[rid].stderr()[-2000:]
    wait_until(lambda: not any(_alive(p) for p in everyone), 10, "every worker gone")
    assert "stopped (stopping)" in cluster.procs["a3"].stderr()


def _silence_is_since_heard(cluster: ProcCluster, node: str) -> None:
    """``silence_seconds`` in the view is the time since the replica heard ``node``,
    not since a worker last forwarded its status (only when it changed, or every 5 s):
    over a refresh period it never exceeds the detector's missed intervals times the
    longest interval (0.6 s), the silence the detector itself measures."""
    samples = []
    deadline = time.monotonic() + 6.0  # more than the workers' 5 s status refresh
    while time.monotonic() < deadline:
        view = cluster.view("a2")
        member = next((m for m in (view or {}).get("members", []) if m["node_id"] == node), None)
        if member is not None and "silence_seconds" in member and "suspicion" in member:
            samples.append((member["silence_seconds"], member["suspicion"]))
        time.sleep(0.1)  # pacing the samples, not waiting for anything
    assert len(samples) >= 3, samples
    wrong = [(s, level) for s, level in samples if s > level * 0.6 + 0.05]
    assert not wrong, f"silence beyond the detector's: {len(wrong)} of {len(samples)}, {wrong[:5]}"


@pytest.fixture
def tls_workers(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ProcCluster]:
    """Three replicas with two workers each, under mutual TLS (certificates in tmp_path/tls)."""
    yield from tls_replicas(tmp_path, request, *WORKERS)


def test_ingest_workers_under_mutual_tls(tls_workers: ProcCluster) -> None:
    """A node certificate heartbeats through a worker; an observer cannot Remove
    through one (PERMISSION_DENIED), an admin can; SIGHUP reaches the workers."""
    c = tls_workers
    wait_until(lambda: all(len(_workers(c, r)) == 2 for r in c.arbiters), 60, "workers")
    c.start_node("n1")
    c.start_node("n2")
    w = c.start_watch("w", first="a2")
    wait_until(lambda: alive_set(w) == {"n1", "n2"}, 60, "n1 and n2 ALIVE under TLS")
    observer = c.certs.files("obs", "observer")
    arbiters = c.arbiter_list()
    r = subprocess.run(
        [*_cli(), "admin", "remove", "n1", "--arbiters", arbiters, *observer.flags()],
        capture_output=True,
        text=True,
        timeout=60,
        env=c.env,
    )
    assert r.returncode != 0 and "PERMISSION_DENIED" in (r.stderr + r.stdout), r
    admin = c.certs.files("admin", "admin")
    r = subprocess.run(
        [*_cli(), "admin", "remove", "n1", "--arbiters", arbiters, *admin.flags()],
        capture_output=True,
        text=True,
        timeout=60,
        env=c.env,
    )
    assert r.returncode == 0, r
    wait_until(
        lambda: any(ch["state"] == "LEFT" for ch in changes(w, "n1")), 10, "n1 LEFT by the admin"
    )
    assert "n2" in alive_set(w)
    # SIGHUP's TLS reload reaches both workers of a1.
    c.procs["a1"].signal(signal.SIGHUP)
    wait_until(
        lambda: (
            len(re.findall(r"ingest worker \d: TLS files reloaded", c.procs["a1"].stderr())) == 2
        ),
        10,
        "a1's workers reloading their TLS files",
    )


def _cli() -> list[str]:
    import sys

    return [sys.executable, "-m", "membership"]
