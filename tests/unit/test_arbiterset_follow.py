"""The client follows the arbiter set acks carry (membership/_arbiters/arbiterset.py,
session rule 9)."""

from __future__ import annotations

from membership._arbiters.arbiterset import ArbiterFollower
from membership._node.session import Fenced, NodeSession
from membership.shared.view import MemberState

A = ["h:1", "h:2", "h:3"]


def _acked(s: NodeSession, arbiter: str, now: float, lease: float = 10.0) -> None:
    seq, _ = s.heartbeat(arbiter, now)
    s.on_ack(
        arbiter,
        seq=seq,
        lease=lease,
        state=MemberState.ALIVE,
        recorded_incarnation=1,
        epoch=1,
        now=now,
    )


def test_follower_replacement_opens_the_new_arbiter_and_closes_the_removed_one() -> None:
    f = ArbiterFollower(A)
    for i, addr in enumerate(A):
        f.heard(addr, f"a{i + 1}")
    plan = f.offer([("a1", "x:1", True), ("a2", "x:2", True), ("a4", "h:4", False)], 7)
    assert plan is not None
    # Known ids keep the address the client reaches them at (rule 2).
    assert plan.open == ("h:4",) and plan.close == ("h:3",)
    assert plan.voters == ("h:1", "h:2") and plan.learners == ("h:4",)


def test_follower_ignores_older_configurations_and_the_first_one() -> None:
    f = ArbiterFollower(A)
    assert f.offer([("a1", "h:1", True)], 0) is None  # rule 4: the one given
    assert f.offer([("a1", "h:1", True), ("a2", "h:2", True)], 5) is not None
    assert f.offer([("a1", "h:1", True)], 4) is None  # a lagging replica's (rule 1)
    assert f.offer([("a1", "h:1", True)], 5) is None
    assert f.offer([], 9) is None  # an old replica: no set at all


def test_session_quorum_follows_the_voters_and_learners_never_count() -> None:
    s = NodeSession(node_id="n1", incarnation=1, arbiters=A)
    for addr in A:
        _acked(s, addr, 0.0)
    assert not s.fenced(1.0) and s.quorum == 2
    # Grow to 5 voters: 3 leases are needed, and only h:1..h:3 hold one.
    events = s.configure([*A, "h:4", "h:5"], [], 3, 1.0)
    assert s.quorum == 3 and not s.fenced(1.0) and events == []
    # Remove two voters that held leases: h:1 alone of the voters holds one.
    events = s.configure(["h:1", "h:4", "h:5"], ["h:2"], 4, 1.0)
    assert s.quorum == 2 and s.fenced(1.0)
    assert events == [Fenced(fenced=True, epoch=1)]
    _acked(s, "h:2", 2.0)  # a learner's lease does not count
    assert s.fenced(2.0)
    _acked(s, "h:4", 2.0)
    assert not s.fenced(2.0)


def test_session_ignores_an_older_configuration_and_acks_of_removed_arbiters() -> None:
    s = NodeSession(node_id="n1", incarnation=1, arbiters=A)
    seq, _ = s.heartbeat("h:3", 0.0)
    s.configure(["h:1", "h:2"], [], 5, 0.0)
    assert s.configure(A, [], 4, 0.0) == [] and s.quorum == 2
    assert (
        s.on_ack(
            "h:3",
            seq=seq,
            lease=5.0,
            state=MemberState.ALIVE,
            recorded_incarnation=1,
            epoch=1,
            now=0.1,
        )
        == []
    )
    # Once configured, an ack's cluster_size no longer raises the quorum.
    seq, _ = s.heartbeat("h:1", 0.2)
    s.on_ack(
        "h:1",
        seq=seq,
        lease=5.0,
        state=MemberState.ALIVE,
        recorded_incarnation=1,
        epoch=1,
        now=0.2,
        cluster_size=5,
    )
    assert s.quorum == 2
