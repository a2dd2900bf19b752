"""Leases and fencing on real processes: a paused node knows it is fenced before anything else.

The rules Leases and Fencing (docs/architecture.md, "Correctness rules";
membership/_node/session.py), against the failure class "zombie after being declared
dead": a node paused past its lease.
"""

from __future__ import annotations

import re
import signal

import pytest

from arbiter.config import ArbiterConfig
from tests.integration.harness import ProcCluster, alive_set, changes, wait_until

pytestmark = pytest.mark.integration

D = ArbiterConfig.lan().suspect_after  # detection time at default settings
LEASE = ArbiterConfig.lan().lease


def _start(cluster: ProcCluster) -> None:
    cluster.start_arbiters(3)
    wait_until(cluster.leader, 20, "a leader")
    for n in ("n1", "n2", "n3"):
        cluster.start_node(n)


def test_fencing_paused_node_is_fenced_first_then_dead_then_rejoins(
    cluster: ProcCluster,
) -> None:
    _start(cluster)
    w = cluster.start_watch("w", first="a1")
    wait_until(lambda: alive_set(w) == {"n1", "n2", "n3"}, 20, "every node ALIVE")
    node = cluster.procs["n2"]
    wait_until(lambda: any("unfenced" in line for line in node.lines()), 10, "n2 unfenced")
    old_incarnation = _member(w, "n2")["incarnation"]

    node.signal(signal.SIGSTOP)
    try:
        # Paused for well over 2 x D: the quorum declares it DEAD meanwhile.
        wait_until(
            lambda: any(c["state"] == "DEAD" for c in changes(w, "n2")),
            2 * D + 5,
            "n2 DEAD while paused",
        )
        seen = len(node.lines())
    finally:
        node.signal(signal.SIGCONT)

    wait_until(
        lambda: any(
            c["state"] == "ALIVE" and c["incarnation"] > old_incarnation for c in changes(w, "n2")
        ),
        15,
        "n2 ALIVE again at a higher incarnation",
    )
    after = node.lines()[seen:]
    assert after, "n2 printed nothing after it resumed"
    # The first thing the node reports on resuming is that it is fenced.
    assert re.match(r"n2: fenced", after[0]), after
    rejoin = next(line for line in after if "rejoining as" in line)
    # It never claims membership for the dead incarnation after resuming.
    assert not any("unfenced" in line for line in after[: after.index(rejoin)]), after
    new_incarnation = int(rejoin.rsplit(" ", 1)[1])
    assert new_incarnation > old_incarnation
    dead = [c for c in changes(w, "n2") if c["state"] == "DEAD"]
    assert len(dead) == 1 and dead[0]["incarnation"] == old_incarnation
    # the others were never disturbed
    assert all(c["state"] == "ALIVE" for c in changes(w) if c["node_id"] != "n2")


def test_fencing_short_pause_is_never_dead_nor_fenced(cluster: ProcCluster) -> None:
    _start(cluster)
    w = cluster.start_watch("w", first="a2")
    wait_until(lambda: alive_set(w) == {"n1", "n2", "n3"}, 20, "every node ALIVE")
    node = cluster.procs["n1"]
    wait_until(lambda: any("unfenced" in line for line in node.lines()), 10, "n1 unfenced")
    epoch_before = _epoch(w)
    # The fault schedule: five pauses of less than half a lease, each followed
    # by two heartbeat intervals of running.
    for _ in range(5):
        node.signal(signal.SIGSTOP)
        wait_until(lambda: _stopped(node.popen.pid), 2, "n1 stopped")
        _hold(LEASE / 2 * 0.8)
        node.signal(signal.SIGCONT)
        wait_until(lambda: not _stopped(node.popen.pid), 2, "n1 running")
        _hold(2 * ArbiterConfig.lan().heartbeat_interval)
    # Let any false death surface: every replica must have heard n1 again
    # since the last pause and nobody may suspect it.
    wait_until(
        lambda: all(
            (v := cluster.view(a)) is not None and "n1" not in v["local_suspects"]
            for a in ("a1", "a2", "a3")
        ),
        10,
        "no replica suspects n1",
    )
    assert [c for c in changes(w, "n1") if c["state"] != "ALIVE"] == []
    assert _epoch(w) == epoch_before
    assert [line for line in node.lines() if line.startswith("n1: fenced")] == []


def _member(w, node_id: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """The latest record of ``node_id`` a watcher printed (snapshot or change)."""
    latest = None
    for ev in w.json_lines():
        if ev["type"] == "snapshot":
            latest = next((m for m in ev["members"] if m["node_id"] == node_id), latest)
        elif ev["type"] == "change" and ev["node_id"] == node_id:
            latest = ev
    assert latest is not None, f"watcher never saw {node_id}"
    return latest


def _epoch(w) -> int:  # type: ignore[no-untyped-def]
    """The latest epoch a watcher printed."""
    return max(ev["epoch"] for ev in w.json_lines() if ev["type"] in ("snapshot", "change"))


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _hold(seconds: float) -> None:
    """Keeps a process paused for ``seconds``: the pause length is the fault being injected."""
    import time

    time.sleep(seconds)
