"""Unit tests of bounded history: the Forget command (tally rule 12), the floors it
leaves (arbiter.core.floors) and when a leader proposes it (arbiter.core.retention)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbiter.core.commands import CommandDecodeError, Forget, decode, encode
from arbiter.core.retention import Retention, RetentionPolicy
from arbiter.core.tally import LeaveRefusal, MembershipState
from membership.shared.view import MemberState, View
from tests.unit.test_tally import (
    _NODES,
    JOIN_N1,
    R3,
    _entry,
    a,
    leave,
    log,
    members,
    obs,
    remove,
    s,
)

ALIVE, DEAD, LEFT = MemberState.ALIVE, MemberState.DEAD, MemberState.LEFT
KILL_N1 = (obs("r1", s("n", 1, 2)), obs("r2", s("n", 1, 2)))


def forget(*records: tuple[str, int, str]) -> bytes:
    return encode(Forget(records=tuple(records)))


# -- the command -------------------------------------------------------------


def test_forget_encoding_round_trips_and_is_canonical() -> None:
    command = Forget(records=(("a", 3, "DEAD"), ("b", 1, "LEFT")))
    data = encode(command)
    assert data == b'{"records":[["a",3,"DEAD"],["b",1,"LEFT"]],"type":"forget","v":1}'
    assert decode(data) == command


@pytest.mark.parametrize(
    "data",
    [
        b'{"records":[],"type":"forget","v":1}',  # empty
        b'{"records":[["a",1,"ALIVE"]],"type":"forget","v":1}',  # not final
        b'{"records":[["a",true,"DEAD"]],"type":"forget","v":1}',  # a bool is not an int
        b'{"records":[["a",-1,"DEAD"]],"type":"forget","v":1}',
        b'{"records":[["b",1,"DEAD"],["a",1,"DEAD"]],"type":"forget","v":1}',  # unsorted
        b'{"records":[["a",1,"DEAD"],["a",2,"DEAD"]],"type":"forget","v":1}',  # duplicate id
        b'{"records":[["",1,"DEAD"]],"type":"forget","v":1}',
        b'{"records":[["a",1]],"type":"forget","v":1}',
        b'{"records":[["a",1,"DEAD"]],"type":"forget","v":1,"x":0}',  # unknown field
    ],
)
def test_forget_decoding_is_strict(data: bytes) -> None:
    with pytest.raises(CommandDecodeError):
        decode(data)


# -- tally rule 12 -------------------------------------------------------------


def test_forget_removes_only_records_that_still_match() -> None:
    feed = log(R3, *JOIN_N1, *KILL_N1, obs("r1", a("m", 1, 3)), obs("r2", a("m", 1, 3)))
    assert members(feed.state) == [("m", 1, ALIVE), ("n", 1, DEAD)]
    epoch = feed.state.epoch
    # ALIVE m, a stale incarnation of n, a wrong state of n and a ghost: all skipped.
    for data in (forget(("m", 1, "DEAD")), forget(("n", 0, "DEAD")), forget(("n", 1, "LEFT"))):
        (result,) = feed(data)
        assert result.change is None and result.error is None
    (result,) = feed(forget(("ghost", 1, "DEAD")))
    assert result.change is None and feed.state.epoch == epoch
    (result,) = feed(forget(("m", 1, "DEAD"), ("n", 1, "DEAD")))
    assert result.change is not None and result.change.epoch == epoch + 1
    (change,) = result.change.changes
    assert (change.node_id, change.incarnation, change.state, change.forgotten) == (
        "n",
        1,
        DEAD,
        True,
    )
    assert members(feed.state) == [("m", 1, ALIVE)]
    assert feed.state.member("n") is None
    assert View().with_changes(0, ()).get("n") is None
    # The same Forget again (a re-proposal) does nothing.
    (again,) = feed(forget(("n", 1, "DEAD")))
    assert again.change is None and feed.state.epoch == epoch + 1


def test_forget_at_the_same_index_on_every_replica_given_the_same_log() -> None:
    entries = [*JOIN_N1, *KILL_N1, forget(("n", 1, "DEAD")), obs("r3", a("n", 1, 9))]
    one, two = MembershipState(R3), MembershipState(list(reversed(R3)))
    forgotten_at = []
    for index, e in enumerate(entries, start=1):
        r1, r2 = one.apply(index, e), two.apply(index, e)
        assert r1 == r2
        if r1.change is not None and any(c.forgotten for c in r1.change.changes):
            forgotten_at.append((index, r1.change.epoch))
    assert forgotten_at == [(6, 3)]
    assert one.to_bytes() == two.to_bytes()


def _forgotten_dead_n1() -> MembershipState:
    feed = log(R3, *JOIN_N1, *KILL_N1, forget(("n", 1, "DEAD")))
    assert feed.state.member("n") is None
    return feed.state


@pytest.mark.parametrize("incarnation", [0, 1])
def test_forgotten_incarnation_never_comes_back_alive(incarnation: int) -> None:
    state = _forgotten_dead_n1()
    epoch = state.epoch
    for i, r in enumerate(R3):  # a whole quorum hears the old life again
        result = state.apply(state.applied_index + 1, obs(r, a("n", incarnation, 10 + i)))
        assert result.change is None
    assert state.member("n") is None and state.epoch == epoch
    assert state.observation("r1", "n") is None  # not even stored (rule 2)


def test_forgotten_node_joins_again_at_a_higher_incarnation_and_the_floor_goes() -> None:
    state = _forgotten_dead_n1()
    assert state.floors.incarnation("n") == 1 and state.highest_incarnation("n") == 1
    for r in R3:
        state.apply(state.applied_index + 1, obs(r, a("n", 2, 20)))
    assert members(state) == [("n", 2, ALIVE)]
    assert not state.floors.has("n") and len(state.floors) == 0


@pytest.mark.parametrize(
    ("setup", "asked", "refusal"),
    [
        ((*JOIN_N1, *KILL_N1), 1, LeaveRefusal.FINAL),  # DEAD at 1
        ((*JOIN_N1, *KILL_N1), 0, LeaveRefusal.STALE),
        ((*JOIN_N1, leave("n", 1)), 1, LeaveRefusal.FINAL),  # LEFT at 1
    ],
)
def test_forgotten_record_judges_leave_and_remove_as_the_record_did(
    setup: tuple[bytes, ...], asked: int, refusal: LeaveRefusal
) -> None:
    feed = log(R3, *setup)
    before_leave = feed.state.judge_leave("n", asked)
    before_remove = feed.state.judge_remove("n", asked)
    record = feed.state.member("n")
    assert record is not None and record.state.is_final
    feed(forget(("n", 1, record.state.value)))
    assert feed.state.member("n") is None
    assert feed.state.judge_leave("n", asked) == before_leave
    assert before_leave[0] is refusal
    assert feed.state.judge_remove("n", asked) == before_remove
    epoch = feed.state.epoch
    (left,) = feed(leave("n", asked))
    (removed,) = feed(remove("n", asked))
    for result in (left, removed):
        assert result.change is None and result.leave is not None and not result.leave.accepted
    assert feed.state.epoch == epoch and feed.state.member("n") is None


def test_forgotten_floor_survives_a_snapshot_round_trip() -> None:
    state = _forgotten_dead_n1()
    data = state.to_bytes()
    assert b'"forgotten":[["n",1,"DEAD"]]' in data
    restored = MembershipState.from_bytes(data)
    assert restored.to_bytes() == data
    assert restored.floors.record("n") == state.floors.record("n")
    for i, r in enumerate(R3):
        restored.apply(restored.applied_index + 1, obs(r, a("n", 1, 30 + i)))
    assert restored.member("n") is None


def test_snapshot_without_floors_encodes_as_before() -> None:
    feed = log(R3, *JOIN_N1)
    assert b"forgotten" not in feed.state.to_bytes()


def test_snapshot_refuses_a_floor_that_is_not_final() -> None:
    data = _forgotten_dead_n1().to_bytes().replace(b'["n",1,"DEAD"]', b'["n",1,"ALIVE"]')
    with pytest.raises(ValueError, match="DEAD or LEFT"):
        MembershipState.from_bytes(data)


_forget_entry = st.lists(
    st.tuples(st.sampled_from(_NODES), st.integers(0, 3), st.sampled_from(["DEAD", "LEFT"])),
    min_size=1,
    max_size=3,
    unique_by=lambda r: r[0],
).map(lambda rs: forget(*sorted(rs)))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_entry, _forget_entry, _forget_entry), max_size=40), st.integers(0, 40))
def test_forget_is_deterministic_and_no_old_life_returns(entries: list[bytes], cut: int) -> None:
    one, two = MembershipState(R3), MembershipState(list(reversed(R3)))
    folded = View()
    floors: dict[str, int] = {}  # the highest incarnation ever forgotten, per node
    restored: MembershipState | None = None
    for index, entry in enumerate(entries, start=1):
        result = one.apply(index, entry)
        assert two.apply(index, entry) == result
        if restored is not None:
            assert restored.apply(index, entry) == result
        if result.change is not None:
            folded = folded.with_changes(result.change.epoch, result.change.changes)
            for c in result.change.changes:
                if c.forgotten:
                    assert c.state.is_final
                    floors[c.node_id] = max(floors.get(c.node_id, 0), c.incarnation)
                else:  # no change ever names an incarnation at or below a forgotten one
                    assert c.incarnation > floors.get(c.node_id, -1), (c, floors)
        assert folded == one.view()
        if index == cut:
            restored = MembershipState.from_bytes(one.to_bytes())
    assert one.to_bytes() == two.to_bytes()
    if restored is not None:
        assert restored.to_bytes() == one.to_bytes()


# -- arbiter.core.retention ----------------------------------------------------


def _dead(*nodes: str) -> MembershipState:
    """A state where each node joined (inc 1) then died, in that order (one epoch each)."""
    feed = log(R3)
    for i, n in enumerate(nodes):
        feed(*(obs(r, a(n, 1, 2 * i + 1)) for r in R3))
        feed(obs("r1", s(n, 1, 2 * i + 2)), obs("r2", s(n, 1, 2 * i + 2)))
    return feed.state


def test_retention_forgets_by_age_on_the_leader_only_one_pending_at_a_time() -> None:
    state = _dead("x", "y")
    r = Retention(RetentionPolicy(retention=10.0, retry_after=1.0))
    assert r.due(state, 100.0, leader=True) is None  # first seen at 100
    assert r.tombstones() == 2
    assert r.next_deadline(leader=True) == 110.0
    assert r.next_deadline(leader=False) is None
    assert r.due(state, 109.9, leader=True) is None
    assert r.due(state, 110.0, leader=False) is None  # a follower never proposes
    f = r.due(state, 110.0, leader=True)
    assert f == Forget(records=(("x", 1, "DEAD"), ("y", 1, "DEAD")))
    assert r.due(state, 110.5, leader=True) is None  # pending
    assert r.next_deadline(leader=True) == 111.0
    assert r.due(state, 111.0, leader=True) == f  # lost: proposed again after retry_after
    state.apply(state.applied_index + 1, encode(f))
    assert r.due(state, 111.1, leader=True) is None and r.tombstones() == 0
    assert r.next_deadline(leader=True) is None


def test_retention_age_starts_when_this_replica_first_saw_the_record() -> None:
    feed = log(R3)
    r = Retention(RetentionPolicy(retention=10.0))
    feed(*JOIN_N1)
    assert r.due(feed.state, 0.0, leader=True) is None and r.tombstones() == 0
    feed(*KILL_N1)
    assert r.due(feed.state, 5.0, leader=True) is None
    assert r.due(feed.state, 14.9, leader=True) is None
    assert r.due(feed.state, 15.0, leader=True) == Forget(records=(("n", 1, "DEAD"),))


def test_retention_by_count_forgets_the_oldest_epochs_first_in_batches() -> None:
    state = _dead("d", "c", "b", "a")  # d died first
    r = Retention(RetentionPolicy(max_tombstones=1, batch=2))
    assert r.next_deadline(leader=True) is None
    f = r.due(state, 0.0, leader=True)
    assert f == Forget(records=(("c", 1, "DEAD"), ("d", 1, "DEAD")))  # oldest two, by node id
    state.apply(state.applied_index + 1, encode(f))
    f = r.due(state, 0.1, leader=True)
    assert f == Forget(records=(("b", 1, "DEAD"),))
    state.apply(state.applied_index + 1, encode(f))
    assert r.due(state, 0.2, leader=True) is None
    assert [m.node_id for m in state.view().members] == ["a"]


def test_retention_disabled_by_default() -> None:
    assert not RetentionPolicy().enabled
    r = Retention(RetentionPolicy())
    assert r.due(_dead("x"), 1e9, leader=True) is None


@pytest.mark.parametrize(
    "kwargs",
    [{"retention": -1.0}, {"retention": math.nan}, {"max_tombstones": -1}, {"batch": 0}],
)
def test_retention_policy_refuses_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetentionPolicy(**kwargs)  # type: ignore[arg-type]


def test_config_tombstone_retention_inf_forgets_by_count_only() -> None:
    from arbiter.config import ArbiterConfig
    from membership.shared.errors import InvalidArgument

    policy = ArbiterConfig.lan(tombstone_retention=math.inf).validate().replica_settings().retention
    assert policy.retention == math.inf and policy.enabled  # the count still bounds
    with pytest.raises(InvalidArgument, match="tombstone_retention"):
        ArbiterConfig.lan(tombstone_retention=math.nan).validate()


# -- the observer refuses a forgotten life as it refused the record -------------


@pytest.mark.parametrize(("incarnation", "told"), [(1, DEAD), (0, DEAD)])
def test_observer_refuses_heartbeats_at_or_below_a_floor(
    incarnation: int, told: MemberState
) -> None:
    from tests.unit.test_observer import _observer

    state = _forgotten_dead_n1()
    observer = _observer()
    verdict = observer.heartbeat("n", incarnation, {}, 1.0, state)
    assert not verdict.accepted and verdict.lease == 0.0
    assert verdict.state is told and verdict.incarnation == 1  # told the floor: rejoin above it
    assert observer.observations(1.0, state) == ()
    fresh = observer.heartbeat("n", 2, {}, 1.1, state)
    assert fresh.accepted and fresh.state is MemberState.JOINING


def test_snapshot_refuses_a_floor_beside_a_record_of_the_same_node() -> None:
    state = _forgotten_dead_n1()
    for i, r in enumerate(R3):
        state.apply(state.applied_index + 1, obs(r, a("m", 1, 40 + i)))
    data = state.to_bytes().replace(b'["n",1,"DEAD"]', b'["m",1,"DEAD"]')
    with pytest.raises(ValueError, match="both a record and a forgotten floor"):
        MembershipState.from_bytes(data)
