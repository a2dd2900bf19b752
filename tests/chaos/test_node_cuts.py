"""A node's links cut by iptables (issue 5): from one replica it is never DEAD; from a
majority it is fenced, then DEAD, then back at a higher incarnation after the heal.

Each replica, node and subscriber is a process in its own network namespace
(tests/chaos/netlab.py); a cut is a DROP rule on the receiving side's INPUT
chain, inside its namespace, so TCP sees silence (no RST), as with a pulled cable.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from membership._config import ClientConfig
from tests.chaos.cluster import (
    DEAD_WITHIN,
    REJOIN_WITHIN,
    SETTLE_WITHIN,
    SLACK,
    ChaosCluster,
    D,
    assert_no_change_since,
    converge,
    view_members,
    window,
)
from tests.chaos.netlab import Lab, wait_until

pytestmark = pytest.mark.chaos

# Cut to the replica suspecting the node. "out" and "both": the replica hears
# nothing, so D. "in" (the replica's packets to the node are dropped): the
# node's TCP keeps sending until its congestion window is full of unacknowledged
# bytes (retransmissions bring the replica nothing new), and a reconnect never
# completes (the SYN-ACK is dropped); before that the replica may still hear a
# few heartbeats. Bounded by the TCP_USER_TIMEOUT (keepalive timeout, 5 s) plus D.
SUSPECT_WITHIN = ClientConfig().keepalive_timeout + D + SLACK
# A window in which a cut from one replica must change nothing. A second
# replica's wrongful suspicion would need only D of silence and one Raft round
# to become a DEAD; five D is several times that.
QUIET_WINDOW = 5 * D


def test_chaos_node_cut_from_majority_is_fenced_then_dead_then_rejoins(
    cluster: ChaosCluster,
) -> None:
    view0 = cluster.start(["n1", "n2"], {"s1": "a1", "s2": "a3"})
    inc0 = cluster.node_log("n1").incarnation()
    n1 = cluster.host("n1")

    t_cut = time.monotonic()
    n1.cut([cluster.host("a1"), cluster.host("a2")])

    def dead_everywhere() -> bool:
        return all(cluster.feed(s).changes("n1", "DEAD") for s in cluster.watchers)

    wait_until(dead_everywhere, DEAD_WITHIN, "DEAD(n1) on every subscriber")
    t_dead = time.monotonic()
    assert t_dead - t_cut < DEAD_WITHIN
    deads = {s: cluster.feed(s).changes("n1", "DEAD") for s in cluster.watchers}
    # Once, for the incarnation that was cut, at one epoch, decided by the two
    # replicas that lost it.
    for s, evs in deads.items():
        assert len(evs) == 1, (s, evs)
        assert evs[0]["incarnation"] == inc0, (s, evs)
        assert evs[0]["epoch"] == view0["epoch"] + 1, (s, evs)
        assert {e["arbiter"] for e in evs[0]["evidence"]} == {"a1", "a2"}, evs
    # Fenced before the cluster declared it DEAD (the node knows first).
    fenced = cluster.node_log("n1").fenced_at(t_cut)
    assert fenced, cluster.nodes["n1"].lines()
    for s in cluster.watchers:
        got = cluster.feed(s).received_at(
            lambda ev: ev["type"] == "change" and ev["node_id"] == "n1" and ev["state"] == "DEAD"
        )
        assert got is not None and fenced[0] < got, (s, fenced, got)
    # n2 was never touched: ALIVE, never fenced.
    assert not cluster.node_log("n2").fenced_at(t_cut), cluster.nodes["n2"].lines()
    for s in cluster.watchers:
        assert cluster.feed(s).changes("n2", since=t_cut) == []

    n1.heal_all()
    t_heal = time.monotonic()
    view = converge(cluster, {"n1": "ALIVE", "n2": "ALIVE"}, REJOIN_WITHIN)
    inc1 = view["members"][[m["node_id"] for m in view["members"]].index("n1")]["incarnation"]
    assert inc1 > inc0
    # On every subscriber: DEAD(n1, inc0) then ALIVE(n1, inc1), in that order, once each.
    for s in cluster.watchers:
        seen = [(e["state"], e["incarnation"]) for e in cluster.feed(s).changes("n1", since=t_cut)]
        assert seen == [("DEAD", inc0), ("ALIVE", inc1)], (s, seen)
    log = cluster.node_log("n1")
    assert log.incarnation() == inc1
    assert [x for x in log.since(t_heal) if x.kind == "unfenced"], cluster.nodes["n1"].lines()
    assert not log.fenced()


# After the test above (which has a lab of its own), so that the shared cluster is
# not running beside it: a module fixture is torn down at the module's end.
@pytest.fixture(scope="module")
def started(module_lab: Lab) -> tuple[ChaosCluster, dict[str, Any]]:
    """One cluster for the three directions of a cut from one replica (each heals its
    cut and changes nothing, which it asserts); with the view it started at."""
    cluster = ChaosCluster(module_lab)
    return cluster, cluster.start(["n1", "n2"], {"s1": "a1", "s2": "a3"})


@pytest.fixture
def shared(
    started: tuple[ChaosCluster, dict[str, Any]], request: pytest.FixtureRequest
) -> Iterator[tuple[ChaosCluster, dict[str, Any]]]:
    """The shared cluster as a fresh one would be: replicas and subscribers at the
    starting view (same epoch, both nodes ALIVE at their first incarnation), no
    replica suspecting anyone, no node ever fenced. Healed afterwards, whatever
    happened; on failure its processes' logs are printed."""
    cluster, view0 = started
    view = converge(cluster, {"n1": "ALIVE", "n2": "ALIVE"}, SETTLE_WITHIN)
    assert view["epoch"] == view0["epoch"], ("the shared cluster moved", view)
    assert view_members(view) == view_members(view0), ("the shared cluster moved", view)
    wait_until(
        lambda: all(v["local_suspects"] == [] for v in cluster.views().values()),
        REJOIN_WITHIN,
        "no replica suspecting anyone",
    )
    for nid in cluster.nodes:
        assert cluster.node_log(nid).fenced_at() == [], cluster.nodes[nid].lines()
    try:
        yield cluster, view0
    finally:
        cluster.host("n1").heal_all()
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(f"lab workdir: {cluster.lab.workdir}")
            print(cluster.dump())


@pytest.mark.parametrize("direction", ["both", "out", "in"])
def test_chaos_node_cut_from_one_replica_is_never_dead(
    shared: tuple[ChaosCluster, dict[str, Any]], direction: str
) -> None:
    cluster, view0 = shared
    n1, a1 = cluster.host("n1"), cluster.host("a1")

    t_cut = time.monotonic()
    n1.cut(a1, direction)  # type: ignore[arg-type]
    # The fault took: a1 alone suspects n1 (one opinion of three: no quorum).
    wait_until(
        lambda: "n1" in cluster.view("a1")["local_suspects"], SUSPECT_WITHIN, "a1 to suspect n1"
    )
    v = cluster.views()
    assert all("n1" not in v[r]["local_suspects"] for r in ("a2", "a3")), v
    # Bounded window: no view change, no node fenced, no epoch moved.
    window(QUIET_WINDOW, lambda: assert_no_change_since(cluster, t_cut, view0["epoch"]))

    n1.heal(a1)
    wait_until(
        lambda: "n1" not in cluster.view("a1")["local_suspects"],
        REJOIN_WITHIN,
        "a1 to hear n1 again",
    )
    assert_no_change_since(cluster, t_cut, view0["epoch"])
    view = converge(cluster, {"n1": "ALIVE", "n2": "ALIVE"}, SETTLE_WITHIN)
    assert view["epoch"] == view0["epoch"]
    for nid in ("n1", "n2"):
        log = cluster.node_log(nid)
        assert len(set(log.alive_incarnations())) == 1, log.proc.lines()
        assert log.fenced_at() == [], log.proc.lines()
