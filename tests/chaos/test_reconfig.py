"""Changing the arbiter group online on network namespaces (issue 11, README "Replacing an
arbiter"): the loopback tests of ``tests/integration/test_reconfig.py`` with every
replica, node and subscriber on a host of its own.

(1) A replica whose machine is gone (SIGKILL, data dir deleted, namespace deleted:
its address answers nothing, not even ARP) is replaced: a4 is added on a new host,
started with ``--join`` on an empty data dir, promoted once caught up, a3 removed.
No view change, no node fenced, and a node killed afterwards is DEAD on the
suspicions of a quorum of {a1, a2, a4}, seen once by the subscriber.

(2) The group grows from 3 to 5 replicas (a4, a5) and shrinks back to 3 (a5, then
the leader, whoever it is) while a dozen nodes heartbeat: no false DEAD, no node
fenced, the epoch unchanged; each removed replica exits 0.

The dangerous moment of both is a promotion: a group of 4 voters needs 3 leases
of every node (with a3 gone, all of a1, a2, a4), so a4 must have granted its
leases before it votes (the leader waits ``restart_grace`` after catch-up,
``arbiter/server/ops/reconfig.py`` rule 4).
"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from tests.chaos.cluster import (
    DEAD_WITHIN,
    LEADER_WITHIN,
    RESTART_GRACE,
    SETTLE_WITHIN,
    SLACK,
    START_WITHIN,
    ChaosCluster,
    D,
    assert_no_change_since,
    converge,
    window,
)
from tests.chaos.netlab import wait_until

pytestmark = pytest.mark.chaos

# Started to promoted: a Python start with gRPC (1 to 3 s under load), the join
# (GetView, snapshot, catch-up: well under a second), then the leader's
# restart_grace (3 s) of being caught up, one Raft round for the promotion.
PROMOTED_WITHIN = START_WITHIN + RESTART_GRACE
# A committed removal to the removed replica's exit: it learns the commit in the
# next append (heartbeat interval), logs it and stops its server.
EXIT_WITHIN = 2 * SLACK + 12.0
# After the last change: a node fenced by it would print so within a lease (under
# D), a wrongful suspicion would become a DEAD one Raft round after D of silence;
# five D is several times both.
QUIET_WINDOW = 5 * D


def _follows(cluster: ChaosCluster, node_id: str, present: str, absent: str | None) -> bool:
    """The node's latest "follows the arbiter configuration" line names ``present``'s
    address and not ``absent``'s."""
    lines = [
        line
        for line in cluster.nodes[node_id].stderr().splitlines()
        if "follows the arbiter configuration" in line
    ]
    return bool(lines) and present in lines[-1] and (absent is None or absent not in lines[-1])


def _promote(cluster: ChaosCluster, rid: str, via: list[str]) -> None:
    cluster.join_arbiter(rid, via)
    wait_until(
        lambda: cluster.roles(via).get(rid) == "voter",
        PROMOTED_WITHIN,
        f"{rid} promoted once caught up",
        interval=0.1,  # roles() is a call in the management host's CLI process, not a start
    )


def test_chaos_replace_a_replica_whose_machine_is_gone(cluster: ChaosCluster) -> None:
    view0 = cluster.start(["n1", "n2"], {"s1": "a1"})
    e0 = view0["epoch"]
    t0 = time.monotonic()
    a3_addr = cluster.addr("a3")
    a3_netns = cluster.host("a3").netns

    # The machine is gone: the process, its disk, its network.
    cluster.replicas["a3"].kill()
    shutil.rmtree(cluster.lab.workdir / "a3.data")
    cluster.lab.remove_host("a3")
    cluster.forget_arbiter("a3")
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert a3_netns not in netns.stdout

    _promote(cluster, "a4", ["a1", "a2"])
    assert "joining cluster" in cluster.replicas["a4"].stderr()
    r = cluster.admin_arbiters("remove", "a3", via=["a1", "a2"])
    assert r.returncode == 0, r.stderr
    want = {"a1": "voter", "a2": "voter", "a4": "voter"}
    wait_until(lambda: cluster.roles(["a4"]) == want, SETTLE_WITHIN, "a4 to list {a1, a2, a4}")
    a4_addr = cluster.addr("a4")
    for n in ("n1", "n2"):
        wait_until(
            lambda n=n: _follows(cluster, n, a4_addr, a3_addr),
            SETTLE_WITHIN,
            f"{n} to follow the configuration with a4 and without a3",
        )
    # Bounded window after the last change (see QUIET_WINDOW); the check also covers
    # everything since the SIGKILL: no change on the feed, no "fenced" line.
    window(QUIET_WINDOW, lambda: assert_no_change_since(cluster, t0, e0))
    assert all(v["in_quorum"] and v["epoch"] == e0 for v in cluster.views().values())

    # A node killed now is DEAD, decided by the new group.
    t_kill = time.monotonic()
    cluster.nodes["n2"].kill()
    wait_until(
        lambda: cluster.feed("s1").changes("n2", "DEAD"),
        DEAD_WITHIN + SLACK,
        "DEAD(n2) on s1",
    )
    converge(cluster, {"n1": "ALIVE", "n2": "DEAD"}, SETTLE_WITHIN)  # a1, a2, a4 agree
    feed = cluster.feed("s1")
    dead = feed.changes("n2", "DEAD")
    assert len(dead) == 1, dead
    assert dead[0]["epoch"] == e0 + 1, dead
    judges = {e["arbiter"] for e in dead[0]["evidence"]}
    assert len(judges) >= 2 and judges <= {"a1", "a2", "a4"}, dead
    assert [ev["node_id"] for ev in feed.changes(since=t0)] == ["n2"]
    log = cluster.node_log("n1")
    assert log.fenced_at(t0) == [], log.proc.lines()
    assert len(set(log.alive_incarnations())) == 1
    print(f"a3 replaced by a4; n2 DEAD {time.monotonic() - t_kill:.2f}s after SIGKILL by {judges}")


def test_chaos_grow_to_five_and_shrink_back_under_load(cluster: ChaosCluster) -> None:
    nodes = [f"n{i}" for i in range(1, 13)]
    view0 = cluster.start(nodes, {"s1": "a1"})
    e0 = view0["epoch"]
    t0 = time.monotonic()

    _promote(cluster, "a4", ["a1", "a2", "a3"])
    _promote(cluster, "a5", ["a1", "a2", "a3"])
    assert cluster.roles(["a1"]) == dict.fromkeys(["a1", "a2", "a3", "a4", "a5"], "voter")
    # Every node heartbeats every one of the five: no replica suspects anyone.
    wait_until(
        lambda: all(v.get("local_suspects") == [] for v in cluster.views().values()),
        SETTLE_WITHIN,
        "all five replicas hearing every node",
    )
    assert_no_change_since(cluster, t0, e0)

    # Shrink: a5, then whichever replica leads (a removed leader commits its removal
    # without itself, steps down, and the other three elect a leader among them).
    removed = []
    for pick in ("a5", "leader"):
        rid = pick if pick != "leader" else cluster.wait_leader(LEADER_WITHIN)
        via = [r for r in sorted(cluster.arbiters) if r != rid]
        r = cluster.admin_arbiters("remove", rid, via=via)
        assert r.returncode == 0, r.stderr
        # A removed replica stops by itself, exit 0 (reconfig.py rule 2).
        assert cluster.replicas[rid].wait(EXIT_WITHIN) == 0, cluster.replicas[rid].stderr()
        assert "was removed from the arbiter group" in cluster.replicas[rid].stderr()
        cluster.forget_arbiter(rid)
        removed.append(rid)
    remaining = sorted(cluster.arbiters)
    assert len(remaining) == 3, remaining
    new_leader = cluster.wait_leader(LEADER_WITHIN)
    assert cluster.roles(remaining) == dict.fromkeys(remaining, "voter")

    # Bounded window after the last change (see QUIET_WINDOW), covering all since t0.
    window(QUIET_WINDOW, lambda: assert_no_change_since(cluster, t0, e0))
    view = converge(cluster, dict.fromkeys(nodes, "ALIVE"), SETTLE_WITHIN)
    assert view["epoch"] == e0
    for n in nodes:
        log = cluster.node_log(n)
        assert log.proc.alive(), n
        assert log.fenced_at(t0) == [], log.proc.lines()
        assert len(set(log.alive_incarnations())) == 1, log.proc.lines()
    print(f"3 -> 5 -> 3: removed {removed}, group {remaining}, leader {new_leader}")
