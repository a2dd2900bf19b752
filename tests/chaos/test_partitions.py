"""Partitions of the whole cluster and of one subscriber, on network namespaces (issue 5;
failure classes "split brain and stale views after a partition", "half-open stream" and
"resume point compacted" in docs/architecture.md).

- {a1, n1, n2, s1} | {a2, a3, n3, n4, s2}: the majority side declares n1 and n2
  DEAD (once each), the minority side commits nothing and its subscriber sees
  no change, only that its replica lost its quorum; after the heal n1 and n2
  rejoin at higher incarnations and every replica and subscriber holds one view.
- a subscriber cut off while two changes are committed, then healed: it
  receives both, in order, once.
"""

from __future__ import annotations

import json
import time

import pytest

from membership._config import ClientConfig
from tests.chaos.cluster import (
    DEAD_WITHIN,
    LEADER_WITHIN,
    SETTLE_WITHIN,
    START_WITHIN,
    ChaosCluster,
    D,
    converge,
    view_members,
    window,
)
from tests.chaos.netlab import wait_until

pytestmark = pytest.mark.chaos

# The partition is held for this long after the majority decided, to watch the
# minority side: a wrong commit there (it has no quorum, so none may happen)
# would need one Raft round; five D is several.
MINORITY_WINDOW = 5 * D
# How long the subscriber stays cut after the first change was committed: past
# TCP_USER_TIMEOUT (the keepalive timeout, 5 s) of the replica's socket to it,
# whose change events stay unacknowledged, so that the replica drops that
# stream and the subscriber must resume from its epoch on a new one (not just
# receive TCP retransmissions). 2 s on top: the kernel checks the timeout at a
# retransmission, and the heal must come after that.
SUBSCRIBER_CUT_AFTER_CHANGE = ClientConfig().keepalive_timeout + 2.0


def test_chaos_full_partition_majority_decides_minority_changes_nothing(
    cluster: ChaosCluster,
) -> None:
    view0 = cluster.start(["n1", "n2", "n3", "n4"], {"s1": "a1", "s2": "a2"})
    e0 = view0["epoch"]
    inc0: dict[str, int] = {}
    for n in cluster.nodes:
        inc = cluster.node_log(n).incarnation()
        assert inc is not None
        inc0[n] = inc
    h = cluster.host
    minority = [h("a1"), h("n1"), h("n2"), h("s1")]
    majority = [h("a2"), h("a3"), h("n3"), h("n4"), h("s2")]

    t_cut = time.monotonic()
    cluster.lab.partition(minority, majority)

    # The majority side declares n1 and n2 DEAD (maybe after electing a leader
    # first, when a1 led).
    wait_until(
        lambda: all(cluster.feed("s2").changes(n, "DEAD") for n in ("n1", "n2")),
        LEADER_WITHIN + DEAD_WITHIN,
        "DEAD(n1) and DEAD(n2) on s2",
    )
    wait_until(lambda: not cluster.view("a1")["in_quorum"], LEADER_WITHIN, "a1 to lose its quorum")
    s2 = cluster.feed("s2")
    for n in ("n1", "n2"):
        evs = s2.changes(n, "DEAD")
        assert len(evs) == 1 and evs[0]["incarnation"] == inc0[n], evs
        assert {e["arbiter"] for e in evs[0]["evidence"]} == {"a2", "a3"}, evs
        # Each was fenced before the majority's DEAD reached s2.
        fenced = cluster.node_log(n).fenced_at(t_cut)
        got = s2.received_at(
            lambda ev: ev["type"] == "change" and ev["node_id"] == n and ev["state"] == "DEAD"  # noqa: B023
        )
        assert fenced and got is not None and fenced[0] < got, (n, fenced, got)

    def sides_hold() -> None:
        views = cluster.views()
        # Minority: a1 commits nothing and says so; its subscriber sees no change.
        assert not views["a1"]["in_quorum"] and views["a1"]["epoch"] == e0, views["a1"]
        assert cluster.feed("s1").changes(since=t_cut) == []
        # Majority: n3 and n4 untouched, never fenced.
        for r in ("a2", "a3"):
            states = {k: s for k, (_, s) in view_members(views[r]).items()}
            assert states == {"n1": "DEAD", "n2": "DEAD", "n3": "ALIVE", "n4": "ALIVE"}, views[r]
        for n in ("n3", "n4"):
            assert cluster.node_log(n).fenced_at(t_cut) == []

    # Bounded window with the partition held: nothing more happens on either side.
    window(MINORITY_WINDOW, sides_hold)
    told = cluster.feed("s1").received_at(
        lambda ev: ev["type"] == "quorum" and not ev["in_quorum"] and ev["arbiter"] == "a1",
        since=t_cut,
    )
    assert told is not None and told > t_cut, "s1 was not told that a1 lost its quorum"

    cluster.lab.heal_all()
    view = converge(cluster, dict.fromkeys(inc0, "ALIVE"), SETTLE_WITHIN)
    incs = {k: i for k, (i, _) in view_members(view).items()}
    assert incs["n1"] > inc0["n1"] and incs["n2"] > inc0["n2"], (inc0, incs)
    assert incs["n3"] == inc0["n3"] and incs["n4"] == inc0["n4"], (inc0, incs)
    # Every subscriber: n1 and n2 each DEAD at the old incarnation then ALIVE at
    # the new one, once; nothing for n3 and n4.
    for s in cluster.watchers:
        f = cluster.feed(s)
        for n in ("n1", "n2"):
            seen = [(e["state"], e["incarnation"]) for e in f.changes(n, since=t_cut)]
            assert seen == [("DEAD", inc0[n]), ("ALIVE", incs[n])], (s, n, seen)
        assert f.changes("n3", since=t_cut) == f.changes("n4", since=t_cut) == []
    for n in ("n1", "n2"):
        assert cluster.node_log(n).incarnation() == incs[n]


def test_chaos_subscriber_cut_off_receives_both_changes_in_order_once(
    cluster: ChaosCluster,
) -> None:
    cluster.start(["n1", "n2"], {"s2": "a2"})
    view0 = cluster.add_watchers({"s1": "a1"}, log_level="debug")  # logs its resubscriptions
    e0 = view0["epoch"]
    s1 = cluster.host("s1")

    t_cut = time.monotonic()
    s1.isolate()
    cluster.nodes["n1"].kill()
    cluster.wait_agreed(DEAD_WITHIN, expect={"n1": "DEAD"})
    t_first = time.monotonic()
    cluster.start_node("n3")
    view = cluster.wait_agreed(START_WITHIN, expect={"n3": "ALIVE"})
    assert view["epoch"] == e0 + 2, view
    # The fault's duration (not a condition): see SUBSCRIBER_CUT_AFTER_CHANGE.
    time.sleep(max(0.0, t_first + SUBSCRIBER_CUT_AFTER_CHANGE - time.monotonic()))
    # Through the cut s1 got nothing, and said so: one "disconnected" line.
    during = [json.loads(ln) for t, ln in cluster.watchers["s1"].timed_lines() if t >= t_cut]
    assert [ev["type"] for ev in during] == ["disconnected"], during
    assert during[0]["epoch"] == e0 and during[0]["silence_seconds"] >= 3.0, during

    s1.heal_all()
    converge(cluster, {"n1": "DEAD", "n2": "ALIVE", "n3": "ALIVE"}, SETTLE_WITHIN)
    # ...and that contact came back, before the changes it had missed.
    types = [ev["type"] for ev in cluster.feed("s1").events]
    assert types.count("reconnected") == 1, types
    assert types.index("reconnected") < len(types) - 2, types
    inc = {k: i for k, (i, _) in view_members(view).items()}
    expected = [(e0 + 1, "n1", inc["n1"], "DEAD"), (e0 + 2, "n3", inc["n3"], "ALIVE")]
    for s in cluster.watchers:
        got = [
            (e["epoch"], e["node_id"], e["incarnation"], e["state"])
            for e in cluster.feed(s).changes(since=t_cut)
        ]
        assert got == expected, (s, got)
    # s1 resumed (no second snapshot): it got the changes themselves.
    assert [ev["type"] for ev in cluster.feed("s1").events].count("snapshot") == 1
    # And it got them on a new subscription, resumed from its epoch: the cut
    # outlived the replica's socket (see SUBSCRIBER_CUT_AFTER_CHANGE), so they
    # did not just come as TCP retransmissions of the old one.
    how = [ln for ln in cluster.watchers["s1"].stderr().splitlines() if "subscription to" in ln]
    assert how, "s1 kept its subscription through the cut"
    print("s1 after the heal:", how)
