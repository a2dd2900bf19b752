"""Replica faults on network namespaces (issue 5): a minority replica isolated, the leader
isolated, a bridge partition, the leader paused past the election timeout, a rolling
restart. Each asserts what every subscriber saw and what every node believed.

Subscribers list a chosen replica first. A subscriber whose replica is cut off
entirely hears nothing (DROP: no FIN, no RST), so it fails over only when its
stream has been idle for ``stream_idle_timeout`` (12 s; the arbiters send a
progress marker every 5 s on an idle stream); one whose replica merely lost its
quorum is told so and moves at once.
"""

from __future__ import annotations

import time
from functools import partial

import pytest

from membership._config import ClientConfig
from tests.chaos.cluster import (
    BACKOFF_MAX,
    DEAD_WITHIN,
    ELECTION_TIMEOUT,
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

# A window in which a fault must change nothing in the view: a wrongful
# suspicion needs D of silence, then one Raft round to become a DEAD; five D
# is several times that.
QUIET_WINDOW = 5 * D
# A subscriber cut off with its replica: its stream goes silent, it gives up
# after stream_idle_timeout (12 s) without even a progress marker, backs off
# (at most 1 s) and resumes elsewhere; then the change it waits for is
# committed (DEAD_WITHIN).
FAILOVER_WITHIN = ClientConfig().stream_idle_timeout + BACKOFF_MAX + DEAD_WITHIN
# How long the leader stays SIGSTOPped: past its election timeout (1 s) and its
# detector's suspicion time D, so that when it resumes every timer it holds
# (election, detector deadlines, the leases it granted) has long expired, and a
# new leader has been elected meanwhile (waited for before resuming).
PAUSE_FOR = 3 * ELECTION_TIMEOUT + D
# After resuming, the paused replica's stale timers fire in its first loop
# turns; a DEAD they caused would be committed one Raft round later. Watched for
# five D, which also covers the nodes' reconnects (backoff up to 1 s).
QUIET_AFTER_RESUME = 5 * D
# After a heal, the leader must stay the leader for this long: a replica that
# came back with a higher term would force an election within one election
# timeout (randomised up to 2x).
STABLE_WINDOW = 2 * ELECTION_TIMEOUT + 1.0


def _answers(cluster: ChaosCluster, rid: str) -> bool:
    return "error" not in cluster.view(rid)


def _others(cluster: ChaosCluster, rid: str) -> list[str]:
    return [r for r in sorted(cluster.arbiters) if r != rid]


def _wait_dead_everywhere(cluster: ChaosCluster, node_id: str, timeout: float) -> None:
    wait_until(
        lambda: all(cluster.feed(s).changes(node_id, "DEAD") for s in cluster.watchers),
        timeout,
        f"DEAD({node_id}) on every subscriber",
    )


def _assert_dead_once(
    cluster: ChaosCluster, node_id: str, epoch: int, not_from: str | None = None
) -> None:
    """DEAD(node_id) once on every subscriber, at ``epoch``, served by a replica other
    than ``not_from``."""
    for s in cluster.watchers:
        evs = cluster.feed(s).changes(node_id, "DEAD")
        assert len(evs) == 1, (s, evs)
        assert evs[0]["epoch"] == epoch, (s, evs)
        if not_from is not None:
            assert evs[0]["arbiter"] != not_from, (s, evs)


def test_chaos_minority_replica_isolated_changes_nothing_and_rejoins_quietly(
    cluster: ChaosCluster,
) -> None:
    cluster.start(["n1", "n2"])
    leader = cluster.wait_leader(LEADER_WITHIN)
    m = _others(cluster, leader)[0]  # the minority replica
    majority = _others(cluster, m)
    view0 = cluster.add_watchers({"s1": leader, "s2": m})
    e0 = view0["epoch"]
    leader_log = len(cluster.quorum_log(leader))

    t_iso = time.monotonic()
    cluster.host(m).isolate()
    wait_until(lambda: not cluster.view(m)["in_quorum"], LEADER_WITHIN, f"{m} to lose its quorum")

    def quiet() -> None:
        assert_no_change_since(cluster, t_iso, e0)
        v = cluster.views()
        assert not v[m]["in_quorum"] and v[m]["epoch"] == e0, v[m]
        for r in majority:
            assert v[r]["in_quorum"] and v[r]["leader"] == leader, v[r]

    # Bounded window: the isolation alone changes nothing (the nodes still
    # reach two replicas), and the leader stays.
    window(QUIET_WINDOW, quiet)

    # The majority still decides, and m's subscriber gets it by failing over.
    cluster.nodes["n2"].kill()
    _wait_dead_everywhere(cluster, "n2", FAILOVER_WITHIN)
    _assert_dead_once(cluster, "n2", e0 + 1, not_from=m)
    v = cluster.view(m)
    assert not v["in_quorum"] and v["epoch"] == e0, f"the isolated replica moved: {v}"

    cluster.host(m).heal_all()
    converge(cluster, {"n1": "ALIVE", "n2": "DEAD"}, SETTLE_WITHIN)

    # It rejoined without disturbing the leader: same leader throughout a
    # window, and the leader logged no loss of quorum or leadership since the
    # isolation (PreVote: the isolated replica never raised its term).
    def same_leader() -> None:
        for r, v in cluster.views().items():
            assert v["in_quorum"] and v["leader"] == leader, (r, v)

    window(STABLE_WINDOW, same_leader)
    assert cluster.quorum_log(leader)[leader_log:] == []
    assert cluster.node_log("n1").fenced_at(t_iso) == []
    assert len(set(cluster.node_log("n1").alive_incarnations())) == 1


def test_chaos_leader_isolated_new_leader_within_bound_old_one_steps_down(
    cluster: ChaosCluster,
) -> None:
    cluster.start(["n1", "n2"])
    old = cluster.wait_leader(LEADER_WITHIN)
    others = _others(cluster, old)
    view0 = cluster.add_watchers({"s1": old, "s2": others[0]})
    e0 = view0["epoch"]

    t_iso = time.monotonic()
    cluster.host(old).isolate()
    new = cluster.wait_leader(LEADER_WITHIN, among=others)
    elected = time.monotonic() - t_iso
    assert elected < LEADER_WITHIN, elected

    def stepped_down() -> bool:
        v = cluster.view(old)
        return not v["in_quorum"] and v["leader"] != old

    wait_until(stepped_down, LEADER_WITHIN, f"{old} to stop claiming leadership")

    def quiet() -> None:
        assert_no_change_since(cluster, t_iso, e0)
        v = cluster.views()
        assert not v[old]["in_quorum"] and v[old]["leader"] != old, v[old]
        assert v[old]["epoch"] == e0, v[old]
        for r in others:
            assert v[r]["in_quorum"] and v[r]["leader"] == new, v[r]

    # Bounded window: losing the leader changes no member, and the old leader
    # keeps reporting no quorum and commits nothing.
    window(QUIET_WINDOW, quiet)

    # The new leader decides; the old leader's subscriber gets it by failing over.
    cluster.nodes["n2"].kill()
    _wait_dead_everywhere(cluster, "n2", FAILOVER_WITHIN)
    _assert_dead_once(cluster, "n2", e0 + 1, not_from=old)
    dead = cluster.feed("s2").changes("n2", "DEAD")[0]
    assert {e["arbiter"] for e in dead["evidence"]} == set(others), dead
    assert cluster.view(old)["epoch"] == e0

    cluster.host(old).heal_all()
    converge(cluster, {"n1": "ALIVE", "n2": "DEAD"}, SETTLE_WITHIN)
    wait_until(
        lambda: all(v["leader"] == new for v in cluster.views().values()),
        LEADER_WITHIN,
        f"every replica following {new}",
    )
    assert cluster.node_log("n1").fenced_at(t_iso) == []
    assert len(set(cluster.node_log("n1").alive_incarnations())) == 1
    # What the old leader logged: leader until the isolation, then no quorum.
    transitions = cluster.quorum_log(old)
    assert any(not q for q, *_ in transitions), transitions
    print(f"new leader {new} elected {elected:.2f}s after {old} was isolated")


def test_chaos_bridge_partition_cluster_keeps_deciding(cluster: ChaosCluster) -> None:
    cluster.start(["n1", "n2"])
    leader = cluster.wait_leader(LEADER_WITHIN)
    cut_off, bridge = _others(cluster, leader)
    view0 = cluster.add_watchers({"s1": cut_off, "s2": leader, "s3": bridge})
    e0 = view0["epoch"]

    # The leader and one follower cannot talk; both still reach the third.
    t_cut = time.monotonic()
    cluster.host(leader).cut(cluster.host(cut_off))
    # Bounded window: nodes reach every replica, so nothing may change.
    window(QUIET_WINDOW, lambda: assert_no_change_since(cluster, t_cut, e0))
    now_leader = cluster.wait_leader(LEADER_WITHIN)

    # The cluster still decides, once, at one epoch, on every subscriber.
    cluster.nodes["n2"].kill()
    _wait_dead_everywhere(cluster, "n2", DEAD_WITHIN + LEADER_WITHIN)
    _assert_dead_once(cluster, "n2", e0 + 1)
    assert cluster.node_log("n1").fenced_at(t_cut) == []

    cluster.host(leader).heal_all()
    converge(cluster, {"n1": "ALIVE", "n2": "DEAD"}, SETTLE_WITHIN)
    assert len(set(cluster.node_log("n1").alive_incarnations())) == 1
    terms = {r: [t for _, _, t, _ in cluster.quorum_log(r)] for r in cluster.arbiters}
    print(f"bridge partition: leader {leader} -> {now_leader}; terms logged {terms}")


def test_chaos_leader_paused_past_election_timeout_acts_on_no_stale_timer(
    cluster: ChaosCluster,
) -> None:
    cluster.start(["n1", "n2"])
    old = cluster.wait_leader(LEADER_WITHIN)
    others = _others(cluster, old)
    view0 = cluster.add_watchers({"s1": old, "s2": others[0]})
    e0 = view0["epoch"]

    t_pause = time.monotonic()
    cluster.replicas[old].pause()
    new = cluster.wait_leader(LEADER_WITHIN, among=others)
    # The fault's duration (not a condition): stopped until every timer it holds expired.
    time.sleep(max(0.0, t_pause + PAUSE_FOR - time.monotonic()))
    cluster.replicas[old].resume()

    suspected: set[str] = set()  # what the resumed replica suspected on its own (information)

    def quiet() -> None:
        assert_no_change_since(cluster, t_pause, e0)
        views = cluster.views()
        for r in others:
            assert views[r]["in_quorum"] and views[r]["leader"] == new, views[r]
        suspected.update(views[old].get("local_suspects", []))

    # Bounded window after the resume: no burst of deaths (no change at all), no
    # node fenced, and the new leader keeps leading.
    window(QUIET_AFTER_RESUME, quiet)
    wait_until(
        lambda: (v := cluster.view(old))["in_quorum"] and v["leader"] == new,
        LEADER_WITHIN,
        f"{old} back as a follower of {new}",
    )
    wait_until(
        lambda: cluster.view(old)["local_suspects"] == [], DEAD_WITHIN, f"{old} hearing every node"
    )
    assert_no_change_since(cluster, t_pause, e0)
    view = converge(cluster, {"n1": "ALIVE", "n2": "ALIVE"}, SETTLE_WITHIN)
    assert view["epoch"] == e0
    for nid in ("n1", "n2"):
        assert len(set(cluster.node_log(nid).alive_incarnations())) == 1
    print(
        f"{old} paused {PAUSE_FOR}s; {new} elected; {old} suspected on its own after: {suspected}"
    )


def test_chaos_rolling_restart_of_every_replica_declares_no_node_dead(
    cluster: ChaosCluster,
) -> None:
    view0 = cluster.start(["n1", "n2"], {"s1": "a1", "s2": "a3"})
    e0 = view0["epoch"]
    t0 = time.monotonic()
    for rid in sorted(cluster.arbiters):
        others = _others(cluster, rid)
        # Every replica grants the nodes leases again (the one restarted last too)
        # before this one goes: a node that holds two of three is fenced without it.
        cluster.wait_every_lease(START_WITHIN)
        cluster.replicas[rid].kill()  # a crash: SIGKILL
        cluster.wait_leader(LEADER_WITHIN, among=others)
        cluster.replicas[rid].restart()  # same command line, same data dir
        wait_until(partial(_answers, cluster, rid), START_WITHIN, f"{rid} answering again")
        t_up = time.monotonic()

        def healthy(rid: str = rid, t_up: float = t_up) -> bool:
            # In quorum at the cluster's epoch, its restart grace over (counted
            # from its first answer, so surely after it started) plus D, and
            # suspecting no one: it has heard every node within the last D.
            v = cluster.view(rid)
            return (
                v["in_quorum"]
                and v["epoch"] == e0
                and v["local_suspects"] == []
                and time.monotonic() >= t_up + RESTART_GRACE + D
            )

        wait_until(healthy, RESTART_GRACE + D + SLACK + START_WITHIN, f"{rid} healthy again")
        assert_no_change_since(cluster, t0, e0)
    view = converge(cluster, {"n1": "ALIVE", "n2": "ALIVE"}, SETTLE_WITHIN)
    assert view["epoch"] == e0
    assert all(p.starts == 2 for p in cluster.replicas.values())
    for nid in ("n1", "n2"):
        log = cluster.node_log(nid)
        assert log.fenced_at(t0) == [], log.proc.lines()
        assert len(set(log.alive_incarnations())) == 1
