"""Grace windows: the Grace command, the tally's record (rule 13), the observer's windows."""

from __future__ import annotations

import pytest

from arbiter.core.commands import (
    CommandDecodeError,
    Grace,
    Observation,
    ObserveBatch,
    Opinion,
    decode,
    encode,
)
from arbiter.core.detection import MissedHeartbeatDetector
from arbiter.core.leaves import LeaveRefusal
from arbiter.core.observer import Observer
from arbiter.core.tally import MembershipState, SnapshotDecodeError
from membership._node.session import NodeSession
from membership.shared.view import MemberState

R3 = ("a1", "a2", "a3")
INTERVAL, MISSED, LEASE = 0.1, 5, 0.5  # D = 0.5 s


class Log:
    """A tally fed consecutive log indexes."""

    def __init__(self) -> None:
        self.state = MembershipState(R3)

    def apply(self, command: ObserveBatch | Grace) -> object:
        return self.state.apply(self.state.applied_index + 1, encode(command))

    def observe(self, replica: str, node: str, inc: int, opinion: Opinion, seq: int) -> None:
        o = Observation(node_id=node, incarnation=inc, opinion=opinion, seq=seq)
        self.apply(ObserveBatch(replica_id=replica, observations=(o,)))

    def admit(self, node: str, inc: int = 1, seq: int = 1) -> None:
        for r in ("a2", "a3"):
            self.observe(r, node, inc, Opinion.ALIVE, seq)

    def grace(self, node: str, seconds: float, inc: int = 1, until: float | None = None):  # type: ignore[no-untyped-def]
        g = Grace(
            node_id=node,
            incarnation=inc,
            seconds=seconds,
            until=(100.0 + seconds if until is None else until) if seconds else 0.0,
            reason="checkpoint" if seconds else "",
            request_id="q",
        )
        return self.apply(g).grace  # type: ignore[attr-defined]


def test_grace_command_round_trip_and_strict_decoding() -> None:
    g = Grace(node_id="n1", incarnation=3, seconds=90.0, until=1e9, reason="ckpt", request_id="r")
    assert decode(encode(g)) == g
    text = encode(g).decode()
    for bad in (
        text.replace("90.0", "90"),  # an int is not a float
        text.replace('"reason":"ckpt"', '"reason":7'),
        text.replace('"reason":"ckpt",', ""),  # missing
        text.replace("90.0", "-1.0"),
        text.replace('"ckpt"', '"a\\nb"'),  # not printable
    ):
        with pytest.raises(CommandDecodeError):
            decode(bad.encode())
    with pytest.raises(ValueError):
        Grace(node_id="n", incarnation=1, seconds=float("inf"), until=0.0, reason="", request_id="")


def test_tally_grace_recorded_for_an_alive_member_without_a_view_change() -> None:
    log = Log()
    log.admit("n1")
    epoch, version = log.state.epoch, log.state.grace_version
    out = log.grace("n1", 90.0)
    assert out.accepted and out.record is not None and out.record.grant == log.state.applied_index
    assert log.state.grace("n1") == out.record and log.state.epoch == epoch
    assert log.state.grace_version == version + 1
    restored = MembershipState.from_bytes(log.state.to_bytes())
    assert restored.grace("n1") == out.record and restored.to_bytes() == log.state.to_bytes()
    again = log.grace("n1", 30.0)  # a new window replaces the old
    assert log.state.grace("n1") == again.record and again.record.grant > out.record.grant
    assert log.grace("n1", 0.0).accepted and log.state.grace("n1") is None  # ended
    assert log.grace("n1", 0.0).accepted  # ending no window is fine


@pytest.mark.parametrize(
    ("setup", "inc", "refusal"),
    [
        ([], 1, LeaveRefusal.UNKNOWN),  # no record
        (["admit"], 2, LeaveRefusal.STALE),  # another incarnation
        (["admit", "kill"], 1, LeaveRefusal.FINAL),  # DEAD
    ],
)
def test_tally_grace_refused_unless_alive_at_the_incarnation(
    setup: list[str], inc: int, refusal: LeaveRefusal
) -> None:
    log = Log()
    if "admit" in setup:
        log.admit("n1")
    if "kill" in setup:
        for r in ("a2", "a3"):
            log.observe(r, "n1", 1, Opinion.SUSPECT, 5)
    version = log.state.grace_version
    out = log.grace("n1", 60.0, inc=inc)
    assert not out.accepted and out.refusal is refusal and out.reason
    assert log.state.judge_grace("n1", inc)[0] is refusal
    assert log.state.grace("n1") is None and log.state.grace_version == version


def test_tally_grace_window_goes_with_the_life_it_was_for() -> None:
    log = Log()
    log.admit("n1")
    log.grace("n1", 90.0)
    log.admit("n1", inc=2, seq=2)  # a new life: DEAD at 1, ALIVE at 2 in one entry
    assert log.state.grace("n1") is None
    log.grace("n1", 90.0, inc=2)
    for r in ("a2", "a3"):
        log.observe(r, "n1", 2, Opinion.SUSPECT, 9)
    assert log.state.grace("n1") is None
    text = log.state.to_bytes().decode()
    assert '"graces"' not in text


def test_tally_grace_snapshot_refuses_a_window_of_a_node_not_alive() -> None:
    log = Log()
    log.admit("n1")
    log.grace("n1", 90.0)
    text = log.state.to_bytes().decode()
    with pytest.raises(SnapshotDecodeError):
        MembershipState.from_bytes(
            text.replace('"graces":[["n1",1,', '"graces":[["n1",2,').encode()
        )


def _observer(now: float = 0.0, max_grace: float = 300.0, grace: float = 0.0) -> Observer:
    return Observer(
        replica_id="a1",
        detector=MissedHeartbeatDetector(interval=INTERVAL, missed_limit=MISSED),
        lease=LEASE,
        retry_after=0.3,
        seq_base=1000,
        now=now,
        restart_grace=grace,
        max_grace=max_grace,
    )


def _alive_here(log: Log, obs: Observer, node: str = "n1", t: float = 0.0) -> None:
    """n1 ALIVE in the view and committed from this replica (it holds leases)."""
    log.admit(node)
    obs.heartbeat(node, 1, {}, t, log.state)
    log.apply(ObserveBatch(replica_id="a1", observations=obs.observations(t, log.state)))
    assert obs.heartbeat(node, 1, {}, t, log.state).lease == LEASE


def _suspected_at(
    obs: Observer, log: Log, start: float, stop: float, wall0: float = 100.0
) -> float | None:
    """Ticks every 10 ms from ``start``; the first time a SUSPECT of n1 is owed."""
    t = start
    while t <= stop:
        obs.tick(t, log.state, wall=wall0 + t)
        if any(o.opinion is Opinion.SUSPECT for o in obs.observations(t, log.state)):
            return round(t, 2)
        t += 0.01
    return None


def test_observer_grace_window_defers_suspicion_until_its_end_then_d() -> None:
    log, obs = Log(), _observer()
    _alive_here(log, obs)
    log.grace("n1", 3.0, until=100.0 + 3.0)  # proposed at wall 100 = monotonic 0 here
    obs.tick(0.0, log.state, wall=100.0)
    v = obs.heartbeat("n1", 1, {}, 0.0, log.state)
    assert v.lease == LEASE and v.grace == pytest.approx(3.0) and v.grace_id > 0
    assert obs.windows.window("n1", 1.0) == (pytest.approx(2.0), "checkpoint")
    # Silent from 0: without the window it would be suspected at D = 0.5 s.
    at = _suspected_at(obs, log, 0.0, 5.0)
    assert at == pytest.approx(3.0 + 0.5, abs=0.02)  # the window's end, then D
    (sus,) = [o for o in obs.observations(10.0, log.state) if o.opinion is Opinion.SUSPECT]
    assert sus.silence == pytest.approx(3.5, abs=0.02)  # the real silence, since 0


def test_observer_grace_node_heard_in_its_window_keeps_it() -> None:
    log, obs = Log(), _observer()
    _alive_here(log, obs)
    log.grace("n1", 3.0, until=103.0)
    assert _suspected_at(obs, log, 0.0, 2.0) is None
    obs.heartbeat("n1", 1, {}, 2.0, log.state)  # back within its window, then silent again
    assert _suspected_at(obs, log, 2.0, 4.0) == pytest.approx(3.5, abs=0.02)  # still its window
    (sus,) = [o for o in obs.observations(10.0, log.state) if o.opinion is Opinion.SUSPECT]
    assert sus.silence == pytest.approx(1.5, abs=0.02)  # since its heartbeat at 2 s


def test_observer_grace_ended_early_is_suspected_d_after_the_end() -> None:
    log, obs = Log(), _observer()
    _alive_here(log, obs)
    log.grace("n1", 30.0, until=130.0)
    assert _suspected_at(obs, log, 0.0, 1.0) is None
    log.grace("n1", 0.0)  # grace(0), committed at ~1 s
    assert obs.needs_sync(log.state)
    assert _suspected_at(obs, log, 1.01, 3.0) == pytest.approx(1.51, abs=0.02)


def test_observer_grace_replayed_after_a_restart_is_not_extended() -> None:
    log = Log()
    log.admit("n1")
    log.grace("n1", 10.0, until=110.0)  # granted at wall 100
    # A replica restarted at wall 106 (its monotonic clock at 0) replays the grant:
    obs = _observer(now=0.0)
    obs.tick(0.0, log.state, wall=106.0)
    assert obs.windows.window("n1", 0.0)[0] == pytest.approx(4.0)  # what is left, not 10
    late = _observer(now=0.0)
    late.tick(0.0, log.state, wall=111.0)  # learnt after its end: no window at all
    assert late.windows.window("n1", 0.0)[0] == 0.0
    capped = _observer(now=0.0, max_grace=2.0)  # its own cap, whatever was committed
    capped.tick(0.0, log.state, wall=100.0)
    assert capped.windows.window("n1", 0.0)[0] == pytest.approx(2.0)
    skewed = _observer(now=0.0)
    skewed.tick(0.0, log.state, wall=90.0)  # a clock behind: never more than the seconds
    assert skewed.windows.window("n1", 0.0)[0] == pytest.approx(10.0)


def test_observer_grace_not_in_acks_without_a_lease() -> None:
    log, obs = Log(), _observer()
    log.admit("n1")
    log.grace("n1", 30.0, until=130.0)
    obs.tick(0.0, log.state, wall=100.0)
    v = obs.heartbeat("n1", 1, {}, 0.0, log.state)  # its own ALIVE not committed yet
    assert v.lease == 0.0 and v.grace == 0.0 and v.grace_id == 0


def _session() -> NodeSession:
    return NodeSession(node_id="n1", incarnation=1, arbiters=list(R3), lease_guard=0.05)


def _ack(s: NodeSession, arbiter: str, t: float, grace: float = 0.0, grant: int = 0) -> None:
    seq, _ = s.heartbeat(arbiter, t)
    s.on_ack(
        arbiter,
        seq=seq,
        lease=LEASE,
        state=MemberState.ALIVE,
        recorded_incarnation=1,
        epoch=3,
        now=t + 0.01,
        grace=grace,
        grace_id=grant,
    )


def test_session_grace_counts_like_a_lease_for_its_grant_only() -> None:
    s = _session()
    for a in R3:
        _ack(s, a, 0.0)
    assert s.fenced(0.5)  # leases: 0.5 - guard
    s.end_grace(0.5)
    _ack(s, "a1", 1.0, grace=10.0, grant=7)
    assert s.leases(1.2)["a1"] == pytest.approx(0.25)  # asked, not answered: none counted
    s.grace_answered(7, granted=True)
    _ack(s, "a1", 1.0, grace=10.0, grant=7)
    assert s.grace(7, 1.0) == 0.0  # one arbiter is not a quorum
    _ack(s, "a2", 1.0, grace=9.0, grant=7)
    assert s.grace(7, 1.0) == pytest.approx(9.0 - 0.05)  # the quorum-th longest, guard off
    assert not s.fenced(9.5) and s.fenced(10.0)  # the window holds the quorum, then ends
    assert s.leases(5.0)["a1"] == pytest.approx(5.95)
    _ack(s, "a3", 1.0, grace=9.0, grant=5)  # an older grant (replaced): not counted
    assert s.leases(5.0)["a3"] == 0.0


def test_session_end_grace_stops_counting_and_ignores_grants_up_to_the_end() -> None:
    s = _session()
    s.end_grace(0.0)
    s.grace_answered(7, granted=True)
    for a in ("a1", "a2"):
        _ack(s, a, 0.0, grace=30.0, grant=7)
    assert not s.fenced(20.0)
    s.end_grace(1.0)  # asking for grace(0), or for another window
    assert s.fenced(1.0 + LEASE) and s.grace(7, 1.0) == 0.0
    _ack(s, "a3", 1.0, grace=29.0, grant=7)  # an arbiter that has not applied the end yet
    _ack(s, "a1", 1.0, grace=29.0, grant=9)  # a grant committed unseen (a lost answer)
    assert s.leases(5.0) == {"a1": 0.0, "a2": 0.0, "a3": 0.0}
    s.grace_answered(10, granted=False)  # the end, committed at 10
    _ack(s, "a1", 1.5, grace=29.0, grant=9)
    assert s.leases(5.0)["a1"] == 0.0
    _ack(s, "a1", 2.0, grace=60.0, grant=12)  # a later grant (an administrator's) counts
    _ack(s, "a2", 2.0, grace=60.0, grant=12)
    assert s.grace(12, 2.0) == pytest.approx(59.95) and not s.fenced(50.0)


def test_tally_grace_an_administrator_opens_a_window_but_never_ends_or_replaces_one() -> None:
    log = Log()
    log.admit("n1")

    def ask(seconds: float, by: str) -> object:
        g = Grace(
            node_id="n1",
            incarnation=1,
            seconds=seconds,
            until=100.0 + seconds if seconds else 0.0,
            reason="stuck" if by else "ckpt",
            request_id="q",
            by=by,
        )
        assert decode(encode(g)) == g
        return log.apply(g).grace  # type: ignore[attr-defined]

    opened = ask(60.0, "spiffe://default/admin/ops")
    assert opened.accepted and log.state.grace("n1") == opened.record  # type: ignore[attr-defined]
    for seconds in (0.0, 30.0, 90.0):  # end, replace shorter or longer: the node's alone
        refused = ask(seconds, "spiffe://default/admin/ops")
        assert refused.refusal is LeaveRefusal.WINDOW  # type: ignore[attr-defined]
    assert log.state.grace("n1") == opened.record  # type: ignore[attr-defined]
    assert ask(0.0, "").accepted and log.state.grace("n1") is None  # type: ignore[attr-defined]


def test_observer_grace_window_is_for_its_incarnation_only() -> None:
    log, obs = Log(), _observer()
    _alive_here(log, obs)
    log.grace("n1", 30.0, until=130.0)  # for incarnation 1
    obs.tick(0.0, log.state, wall=100.0)
    obs.heartbeat("n1", 2, {}, 0.1, log.state)  # a new life, heard here, not committed yet
    assert _suspected_at(obs, log, 0.1, 2.0) == pytest.approx(0.6, abs=0.02)  # D, no window
