"""Replicas starved of CPU declare no healthy node DEAD, and still find a dead one
(issue 24; arbiter/server/ingest/lateness.py rule 1, worker.py rule 7).

Two of the three replicas (a quorum) have their ingest workers, the processes that
read the heartbeat streams, stopped by SIGSTOP bursts of 1.2 s (past D, 0.75 s
at the 0.15 s interval) with 0.3 s of running between them, as a machine whose
neighbours take the CPU does to them in coarser grain. The nodes never stop
sending. Each worker must blame its silences on itself: the batch it flushes as
it wakes, before it has read what gRPC kept for it, carries the worker's own
lateness, so the consensus process does not take it as heard up to the time it
left. Then a node is killed during the bursts: it is
DEAD all the same.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import pytest

from tests.integration.harness import ProcCluster, alive_set, changes, wait_until

pytestmark = pytest.mark.integration

NODES = tuple(f"n{i}" for i in range(1, 7))
STARVED = ("a2", "a3")
STOP_S = 1.2  # each burst: > D (0.75 s), < the workers' wedge limit (5 s)
RUN_S = 0.3
# Kill to DEAD here: 1.4 s in most runs, once 9.0 s with another cluster test running
# beside it (not traced yet); stamped at the send time alone, 4.3 to 9.1 s. The wait
# below is the bound asserted: DEAD, not how soon.
DEAD_WITHIN = 20.0


def _workers(cluster: ProcCluster, rid: str) -> list[int]:
    pid = cluster.procs[rid].pid
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


class Starver:
    """SIGSTOP/SIGCONT bursts on the workers of ``STARVED`` from a thread, until stopped;
    every worker is left running however it ends."""

    def __init__(self, cluster: ProcCluster) -> None:
        self.cluster = cluster
        self.bursts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stopped: set[int] = set()

    def __enter__(self) -> Starver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._cont()

    def _signal(self, pid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    def _cont(self) -> None:
        for pid in list(self._stopped):
            self._signal(pid, signal.SIGCONT)
        self._stopped.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = [p for r in STARVED for p in _workers(self.cluster, r)]
            for pid in pids:
                self._stopped.add(pid)
                self._signal(pid, signal.SIGSTOP)
            self.bursts += 1
            self._stop.wait(STOP_S)  # the fault's length, not a wait for a condition
            self._cont()
            self._stop.wait(RUN_S)


def test_starved_replicas_declare_no_sending_node_dead_and_a_killed_one_dead(
    cluster: ProcCluster,
) -> None:
    cluster.arbiter_args = ("--ingest-workers", "2")
    cluster.start_arbiters(3)
    wait_until(lambda: all(len(_workers(cluster, r)) == 2 for r in cluster.arbiters), 60, "workers")
    wait_until(cluster.leader, 60, "a leader")
    for n in NODES:
        cluster.start_node(n)
    w = cluster.start_watch("w", first="a1")
    wait_until(lambda: alive_set(w) == set(NODES), 60, "every node ALIVE")

    with Starver(cluster) as starver:
        # Eight bursts with every node sending: nobody DEAD.
        wait_until(lambda: starver.bursts >= 8, 60, "eight bursts")
        dead = [c["node_id"] for c in changes(w) if c["state"] == "DEAD"]
        assert dead == [], f"nodes that never stopped sending were declared DEAD: {dead}"
        # A node killed while the bursts go on is DEAD all the same.
        killed_at = time.monotonic()
        cluster.procs["n1"].kill()
        wait_until(
            lambda: any(c["state"] == "DEAD" for c in changes(w, "n1")), DEAD_WITHIN, "n1 DEAD"
        )
        took = time.monotonic() - killed_at
    dead = [c["node_id"] for c in changes(w) if c["state"] == "DEAD"]
    assert dead == ["n1"], dead
    wait_until(lambda: alive_set(w) == set(NODES) - {"n1"}, 20, "the others ALIVE")
    print(f"n1 DEAD {took:.2f} s after SIGKILL, during {starver.bursts} bursts")
