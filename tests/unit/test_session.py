"""NodeSession: leases counted from send time, fencing, rejoin (sans-I/O, time passed in)."""

from __future__ import annotations

import pytest

from membership._node.session import (
    EndReason,
    Evicted,
    Fenced,
    NodeSession,
    Rejoined,
    StateChanged,
    Superseded,
)
from membership.shared.view import MemberState

ARBITERS = ("a1", "a2", "a3")


def _session(**kw: object) -> NodeSession:
    return NodeSession(node_id="n1", incarnation=10, arbiters=ARBITERS, **kw)  # type: ignore[arg-type]


def _ack(
    s: NodeSession,
    arbiter: str,
    seq: int,
    now: float,
    *,
    lease: float = 1.0,
    state: MemberState = MemberState.ALIVE,
    recorded: int = 10,
    epoch: int = 5,
) -> list:
    return s.on_ack(
        arbiter,
        seq=seq,
        lease=lease,
        state=state,
        recorded_incarnation=recorded,
        epoch=epoch,
        now=now,
    )


def test_session_starts_fenced_and_unfences_with_quorum_of_leases() -> None:
    s = _session()
    assert s.fenced(0.0)
    seq1, inc = s.heartbeat("a1", 0.0)
    seq2, _ = s.heartbeat("a2", 0.0)
    assert inc == 10 and seq2 > seq1
    events = _ack(s, "a1", seq1, 0.01)
    assert StateChanged(state=MemberState.ALIVE, incarnation=10) in events
    assert s.fenced(0.01)  # one lease of three is not a quorum
    events = _ack(s, "a2", seq2, 0.02)
    assert Fenced(fenced=False, epoch=5) in events
    assert not s.fenced(0.02)
    assert s.fencing_epoch == 5


def test_session_lease_counts_from_send_time_not_receipt() -> None:
    s = _session()
    a, _ = s.heartbeat("a1", 0.0)
    b, _ = s.heartbeat("a2", 0.0)
    _ack(s, "a1", a, 0.5, lease=1.0)  # acked late: still ends at 0.0 + 1.0
    _ack(s, "a2", b, 0.5, lease=1.0)
    assert not s.fenced(0.99)
    assert s.fenced(1.0)
    assert s.next_deadline() == pytest.approx(1.0)


def test_session_tick_reports_fencing_when_leases_run_out() -> None:
    s = _session()
    for arb in ("a1", "a2"):
        seq, _ = s.heartbeat(arb, 0.0)
        _ack(s, arb, seq, 0.0, lease=0.75)
    assert s.tick(0.5) == []
    assert s.tick(0.8) == [Fenced(fenced=True, epoch=5)]
    assert s.tick(0.9) == []


def test_session_zero_lease_grants_nothing() -> None:
    s = _session()
    for arb in ARBITERS:
        seq, _ = s.heartbeat(arb, 0.0)
        _ack(s, arb, seq, 0.0, lease=0.0, state=MemberState.JOINING)
    assert s.fenced(0.0)


def test_session_dead_rejoins_with_higher_incarnation_and_voids_leases() -> None:
    s = _session()
    for arb in ("a1", "a2"):
        seq, _ = s.heartbeat(arb, 0.0)
        _ack(s, arb, seq, 0.0)
    seq, _ = s.heartbeat("a3", 0.1)
    events = _ack(s, "a3", seq, 0.1, lease=0.0, state=MemberState.DEAD)
    assert events == [
        Fenced(fenced=True, epoch=5),  # first: stop acting as a member
        StateChanged(state=MemberState.DEAD, incarnation=10),
        Evicted(incarnation=10, state=MemberState.DEAD, rejoining=True),  # said, never silent
        Rejoined(old_incarnation=10, new_incarnation=11, reason="declared DEAD"),
        StateChanged(state=MemberState.JOINING, incarnation=11),
    ]
    assert s.incarnation == 11 and s.state is MemberState.JOINING
    assert s.fenced(0.1)
    # Acks to heartbeats of the old incarnation are ignored from now on.
    assert _ack(s, "a1", 1, 0.2) == []


def test_session_without_rejoin_stays_dead() -> None:
    s = _session(auto_rejoin=False)
    seq, _ = s.heartbeat("a1", 0.0)
    events = _ack(s, "a1", seq, 0.0, state=MemberState.DEAD, lease=0.0)
    assert s.state is MemberState.DEAD and s.incarnation == 10
    assert events[-1] == Evicted(incarnation=10, state=MemberState.DEAD, rejoining=False)
    assert s.end_reason is EndReason.DEAD


def test_session_left_without_asking_is_an_eviction_its_own_leave_is_not() -> None:
    s = _session()
    seq, _ = s.heartbeat("a1", 0.0)
    events = _ack(s, "a1", seq, 0.0, state=MemberState.LEFT, lease=0.0)
    assert events[-2:] == [
        StateChanged(state=MemberState.LEFT, incarnation=10),
        Evicted(incarnation=10, state=MemberState.LEFT, rejoining=False),
    ]
    assert s.end_reason is EndReason.REMOVED
    own = _session()
    own.leaving = True  # the shell asked the cluster to let it leave
    seq, _ = own.heartbeat("a1", 0.0)
    events = _ack(own, "a1", seq, 0.0, state=MemberState.LEFT, lease=0.0)
    assert not any(isinstance(e, Evicted) for e in events)
    assert own.end_reason is EndReason.LEFT


def test_session_dead_of_a_newer_life_while_joining_is_no_eviction() -> None:
    # A replica that heard a newer incarnation answers the older one DEAD with
    # the newer incarnation: that is a takeover or restart, not an eviction.
    s = _session()
    seq, _ = s.heartbeat("a1", 0.0)
    events = _ack(s, "a1", seq, 0.0, state=MemberState.DEAD, recorded=12, lease=0.0)
    assert not any(isinstance(e, Evicted) for e in events)
    assert s.incarnation == 13


def test_session_lower_incarnation_than_record_picks_higher() -> None:
    s = _session()
    seq, _ = s.heartbeat("a1", 0.0)
    events = _ack(s, "a1", seq, 0.0, state=MemberState.JOINING, recorded=42, lease=0.0)
    assert any(isinstance(e, Rejoined) and e.new_incarnation == 43 for e in events)
    assert s.incarnation == 43


def test_session_left_is_final() -> None:
    s = _session()
    seq, _ = s.heartbeat("a1", 0.0)
    _ack(s, "a1", seq, 0.0, state=MemberState.LEFT, lease=0.0)
    assert s.left and s.state is MemberState.LEFT
    seq, _ = s.heartbeat("a1", 0.1)
    assert _ack(s, "a1", seq, 0.1, state=MemberState.DEAD) == []
    assert s.incarnation == 10


def test_session_unknown_seq_is_ignored() -> None:
    s = _session()
    assert _ack(s, "a1", 999, 0.0) == []
    assert s.state is MemberState.JOINING


@pytest.mark.parametrize("incarnation", [0, -1])
def test_session_rejects_bad_incarnation(incarnation: int) -> None:
    with pytest.raises(ValueError):
        NodeSession(node_id="n", incarnation=incarnation, arbiters=ARBITERS)


def test_session_lagging_replica_saying_joining_does_not_demote_alive() -> None:
    s = _session()
    seq, _ = s.heartbeat("a1", 0.0)
    _ack(s, "a1", seq, 0.0)
    seq, _ = s.heartbeat("a3", 0.0)
    assert _ack(s, "a3", seq, 0.01, state=MemberState.JOINING, lease=0.0) == []
    assert s.state is MemberState.ALIVE


def test_session_member_superseded_by_higher_incarnation_steps_aside() -> None:
    s = _session()
    for arb in ("a1", "a2"):
        seq, _ = s.heartbeat(arb, 0.0)
        _ack(s, arb, seq, 0.0)
    seq, _ = s.heartbeat("a1", 0.1)
    events = _ack(s, "a1", seq, 0.1, state=MemberState.DEAD, recorded=20, lease=0.0)
    assert events == [
        Fenced(fenced=True, epoch=5),
        StateChanged(state=MemberState.DEAD, incarnation=10),
        Superseded(incarnation=10, by=20),
    ]
    assert s.ended and s.incarnation == 10  # no fight back with incarnation 21
    seq, _ = s.heartbeat("a2", 0.2)
    assert _ack(s, "a2", seq, 0.2) == []


def test_session_quorum_follows_cluster_size_not_the_node_list() -> None:
    # A node that lists one arbiter of three must never believe it holds a quorum.
    s = NodeSession(node_id="n1", incarnation=10, arbiters=("a1",))
    seq, _ = s.heartbeat("a1", 0.0)
    s.on_ack(
        "a1",
        seq=seq,
        lease=1.0,
        state=MemberState.JOINING,
        recorded_incarnation=10,
        epoch=1,
        now=0.0,
        cluster_size=3,
    )
    assert s.quorum == 2
    assert s.fenced(0.1)


def test_session_reset_voids_leases_and_restarts_the_fencing_epoch() -> None:
    s = _session()
    for arb in ("a1", "a2"):
        seq, _ = s.heartbeat(arb, 0.0)
        _ack(s, arb, seq, 0.0)
    assert not s.fenced(0.1) and s.fencing_epoch == 5
    assert s.reset(0.1) == [Fenced(fenced=True, epoch=5)]  # fenced, holding the old token
    assert s.fenced(0.1) and s.fencing_epoch == 0
    seq, _ = s.heartbeat("a1", 0.2)
    _ack(s, "a1", seq, 0.2)
    seq, _ = s.heartbeat("a2", 0.2)
    events = _ack(s, "a2", seq, 0.2)
    assert Fenced(fenced=False, epoch=5) in events  # the new cluster's epochs from here


def test_session_lease_guard_fences_that_much_before_the_arbiters_promise() -> None:
    # Rule 2: the arbiter promises 1.0 s from its receipt (at or after the send
    # at 0.0); the node counts 1.0 - 0.1 s from its send.
    s = NodeSession(node_id="n1", incarnation=10, arbiters=ARBITERS, lease_guard=0.1)
    for arb in ("a1", "a2"):
        seq, _ = s.heartbeat(arb, 0.0)
        _ack(s, arb, seq, 0.0, lease=1.0)
    assert not s.fenced(0.89) and s.fenced(0.9)
    assert s.next_deadline() == pytest.approx(0.9)
    with pytest.raises(ValueError):
        NodeSession(node_id="n1", incarnation=10, arbiters=ARBITERS, lease_guard=-0.1)


def test_session_holders_are_the_voters_whose_leases_are_unexpired() -> None:
    s = _session(lease_guard=0.1)
    assert s.holders(0.0) == [] and s.voters == 3 and s.next_expiry(0.0) is None
    for arb, lease in (("a3", 1.0), ("a1", 0.5)):
        seq, _ = s.heartbeat(arb, 0.0)
        _ack(s, arb, seq, 0.01, lease=lease)
    assert s.holders(0.1) == ["a1", "a3"]  # sorted, whatever order the acks came in
    assert s.next_expiry(0.1) == pytest.approx(0.4)  # a1's: 0.0 + 0.5 - 0.1
    assert s.holders(0.4) == ["a3"] and s.fenced(0.4)  # rule 3: what fencing counts
    assert s.next_expiry(0.4) == pytest.approx(0.9)
    assert s.holders(0.9) == [] and s.next_expiry(0.9) is None
    # Rule 9: a learner's lease is not held; the voters are the configuration's.
    seq, _ = s.heartbeat("a2", 1.0)
    _ack(s, "a2", seq, 1.0, lease=1.0)
    s.configure(["a1", "a3", "a4", "a5"], ["a2"], 7, 1.0)
    assert s.holders(1.0) == [] and s.voters == 4 and s.next_expiry(1.0) is None


def test_session_holders_stay_put_through_renewals_and_drop_when_one_stops_granting() -> None:
    # At the defaults (interval 0.15 s, lease 0.75 s, guard 0.1 s) every lease is
    # renewed long before it ends: the holders change only when a3 stops granting.
    s = _session(lease_guard=0.1)
    seen: list[list[str]] = []
    t = 0.0
    while t < 3.0:
        for arb in ARBITERS if t < 1.5 else ("a1", "a2"):
            seq, _ = s.heartbeat(arb, t)
            _ack(s, arb, seq, t + 0.02, lease=0.75)
        for now in (t + 0.02, t + 0.1):
            s.tick(now)
            if not seen or seen[-1] != s.holders(now):
                seen.append(s.holders(now))
        t = round(t + 0.15, 6)
    assert seen == [["a1", "a2", "a3"], ["a1", "a2"]]
    # a3's last renewal was sent at 1.35 s: it ends at 1.35 + 0.75 - 0.1.
    assert s.holders(1.99) == ["a1", "a2", "a3"]
    assert s.holders(2.0) == ["a1", "a2"]
