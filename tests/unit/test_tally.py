"""Unit tests of arbiter.core.tally: the tally, epochs, leaves, determinism, snapshots."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbiter.core.commands import Leave, Observation, ObserveBatch, Opinion, Remove, encode
from arbiter.core.tally import (
    ApplyResult,
    LeaveOutcome,
    LeaveRefusal,
    MembershipState,
    ObservationRecord,
    SnapshotDecodeError,
    ViewChange,
)
from membership.shared.view import MemberChange, MemberState, View

R3 = ("r1", "r2", "r3")
R5 = ("r1", "r2", "r3", "r4", "r5")
ALIVE, DEAD, LEFT = MemberState.ALIVE, MemberState.DEAD, MemberState.LEFT


def a(node: str, inc: int, seq: int, **labels: str) -> Observation:
    return Observation(
        node_id=node,
        incarnation=inc,
        opinion=Opinion.ALIVE,
        seq=seq,
        labels=tuple(sorted(labels.items())),
    )


def s(node: str, inc: int, seq: int) -> Observation:
    return Observation(node_id=node, incarnation=inc, opinion=Opinion.SUSPECT, seq=seq)


def obs(replica: str, *observations: Observation) -> bytes:
    return encode(ObserveBatch(replica_id=replica, observations=observations))


def leave(node: str, inc: int, request_id: str = "q", heard_by: str = "") -> bytes:
    return encode(Leave(node_id=node, incarnation=inc, request_id=request_id, heard_by=heard_by))


def remove(node: str, inc: int = 0, by: str = "admin") -> bytes:
    return encode(Remove(node_id=node, incarnation=inc, by=by, request_id="q"))


@dataclass
class Log:
    """A state machine fed with consecutive log indexes."""

    state: MembershipState

    def __call__(self, *entries: bytes) -> list[ApplyResult]:
        return [self.state.apply(self.state.applied_index + 1, e) for e in entries]


def log(arbiters: tuple[str, ...] = R3, *entries: bytes) -> Log:
    feed = Log(MembershipState(arbiters))
    feed(*entries)
    return feed


def members(state: MembershipState) -> list[tuple[str, int, MemberState]]:
    return [(m.node_id, m.incarnation, m.state) for m in state.view().members]


JOIN_N1 = (obs("r1", a("n", 1, 1)), obs("r2", a("n", 1, 1)), obs("r3", a("n", 1, 1)))


@pytest.mark.parametrize(
    ("arbiters", "entries", "expected", "epoch"),
    [
        pytest.param(R3, [obs("r1", a("n", 1, 1))], [], 0, id="1-of-3-alive-is-not-enough"),
        pytest.param(R3, JOIN_N1[:2], [("n", 1, ALIVE)], 1, id="2-of-3-alive-joins"),
        pytest.param(R3, [*JOIN_N1], [("n", 1, ALIVE)], 1, id="third-alive-changes-nothing"),
        pytest.param(
            R3,
            [*JOIN_N1, obs("r1", s("n", 1, 2))],
            [("n", 1, ALIVE)],
            1,
            id="single-suspicion-never-kills",
        ),
        pytest.param(
            R3,
            [*JOIN_N1, obs("r1", s("n", 1, 2)), obs("r3", s("n", 1, 2))],
            [("n", 1, DEAD)],
            2,
            id="quorum-of-suspects-kills",
        ),
        pytest.param(
            R3,
            [*JOIN_N1, obs("r1", s("n", 1, 2)), obs("r1", a("n", 1, 3)), obs("r2", s("n", 1, 2))],
            [("n", 1, ALIVE)],
            1,
            id="suspicion-withdrawn-does-not-count",
        ),
        pytest.param(
            R3,
            [*JOIN_N1, obs("r1", s("n", 1, 0)), obs("r2", s("n", 1, 0))],
            [("n", 1, ALIVE)],
            1,
            id="stale-seq-never-overrides-newer",
        ),
        pytest.param(
            R3,
            [
                obs("r1", a("n", 2, 1)),
                obs("r2", a("n", 2, 1)),
                obs("r1", a("n", 1, 5)),
                obs("r2", a("n", 1, 5)),
                obs("r3", a("n", 1, 5)),
            ],
            [("n", 2, ALIVE)],
            1,
            id="old-incarnation-alive-ignored",
        ),
        pytest.param(
            R3,
            [
                obs("r1", a("n", 2, 1)),
                obs("r2", a("n", 2, 1)),
                obs("r1", s("n", 1, 5)),
                obs("r2", s("n", 1, 5)),
            ],
            [("n", 2, ALIVE)],
            1,
            id="old-incarnation-suspect-ignored",
        ),
        pytest.param(
            R3,
            [
                *JOIN_N1,
                obs("r1", s("n", 1, 2)),
                obs("r2", s("n", 1, 2)),
                obs("r1", a("n", 1, 3)),
                obs("r2", a("n", 1, 3)),
                obs("r3", a("n", 1, 3)),
            ],
            [("n", 1, DEAD)],
            2,
            id="dead-is-final",
        ),
        pytest.param(
            R3,
            [*JOIN_N1, obs("r1", a("n", 2, 2)), obs("r2", a("n", 2, 2))],
            [("n", 2, ALIVE)],
            2,
            id="higher-incarnation-replaces",
        ),
        pytest.param(
            R3,
            [
                *JOIN_N1,
                obs("r1", s("n", 1, 2)),
                obs("r2", s("n", 1, 2)),
                obs("r1", a("n", 2, 3)),
                obs("r2", a("n", 2, 3)),
            ],
            [("n", 2, ALIVE)],
            3,
            id="rejoin-after-death",
        ),
        pytest.param(R5, [obs(r, a("n", 1, 1)) for r in R5[:2]], [], 0, id="5-need-3-alive"),
        pytest.param(
            R5, [obs(r, a("n", 1, 1)) for r in R5[:3]], [("n", 1, ALIVE)], 1, id="5-joined-by-3"
        ),
        pytest.param(
            R5,
            [*(obs(r, a("n", 1, 1)) for r in R5), *(obs(r, s("n", 1, 2)) for r in R5[:2])],
            [("n", 1, ALIVE)],
            1,
            id="5-two-suspects-do-not-kill",
        ),
        pytest.param(
            R5,
            [*(obs(r, a("n", 1, 1)) for r in R5), *(obs(r, s("n", 1, 2)) for r in R5[2:])],
            [("n", 1, DEAD)],
            2,
            id="5-three-suspects-kill",
        ),
        pytest.param(
            R3,
            [obs("r1", a("n", 1, 1)), obs("r2", a("n", 2, 1))],
            [],
            0,
            id="alive-at-different-incarnations-is-no-quorum",
        ),
        pytest.param(
            R3,
            [obs("r1", a("n", 1, 1), s("n", 1, 2)), obs("r2", a("n", 1, 1))],
            [],
            0,
            id="only-the-latest-of-a-batch-counts",
        ),
        pytest.param(
            R3,
            [obs("r1", s("n", 1, 1)), obs("r2", s("n", 1, 1))],
            [],
            0,
            id="suspects-of-a-stranger-change-nothing",
        ),
    ],
)
def test_tally_rules(
    arbiters: tuple[str, ...],
    entries: list[bytes],
    expected: list[tuple[str, int, MemberState]],
    epoch: int,
) -> None:
    state = log(arbiters, *entries).state
    assert members(state) == expected
    assert state.epoch == epoch
    assert state.view().epoch == epoch


def test_tally_single_suspicion_never_kills_even_repeated() -> None:
    feed = log(R3, *JOIN_N1)
    for seq in range(2, 50):
        (result,) = feed(obs("r2", s("n", 1, seq)))
        assert result.change is None
    assert members(feed.state) == [("n", 1, ALIVE)]
    assert feed.state.suspected_by("n") == ("r2",)


def test_tally_join_result_and_labels_from_lowest_replica() -> None:
    feed = log(R3, obs("r3", a("n", 1, 1, zone="z3")))
    (result,) = feed(obs("r2", a("n", 1, 1, zone="z2")))
    assert result == ApplyResult(
        index=2,
        change=ViewChange(
            epoch=1,
            changes=(MemberChange(node_id="n", incarnation=1, state=ALIVE, labels={"zone": "z2"}),),
        ),
    )
    member = feed.state.member("n")
    assert member is not None and dict(member.labels) == {"zone": "z2"} and member.epoch == 1


def test_tally_higher_incarnation_retires_old_one_in_same_epoch() -> None:
    feed = log(R3, *JOIN_N1, obs("r1", a("n", 2, 2, v="2")))
    (result,) = feed(obs("r2", a("n", 2, 2, v="2")))
    assert result.change == ViewChange(
        epoch=2,
        changes=(
            MemberChange(node_id="n", incarnation=1, state=DEAD),
            MemberChange(node_id="n", incarnation=2, state=ALIVE, labels={"v": "2"}),
        ),
    )
    assert feed.state.epoch == 2


def test_tally_many_changes_in_one_entry_bump_epoch_once_sorted() -> None:
    feed = log(R3, obs("r1", a("b", 1, 1), a("c", 1, 1), a("a", 1, 1)), obs("r2", a("b", 1, 1)))
    assert feed.state.epoch == 1
    feed(obs("r1", a("b", 2, 2)))
    (result,) = feed(obs("r2", a("c", 1, 2), a("b", 2, 2), a("a", 1, 2)))
    assert result.change is not None and result.change.epoch == 2
    assert [(c.node_id, c.incarnation, c.state) for c in result.change.changes] == [
        ("a", 1, ALIVE),
        ("b", 1, DEAD),
        ("b", 2, ALIVE),
        ("c", 1, ALIVE),
    ]
    assert feed.state.epoch == 2


def test_tally_duplicate_application_is_idempotent() -> None:
    entry = obs("r2", a("n", 1, 1), a("m", 3, 2))
    feed = log(R3, obs("r1", a("n", 1, 1)), entry)
    before = MembershipState.from_bytes(feed.state.to_bytes())
    (again,) = feed(entry)
    assert again == ApplyResult(index=3)
    assert feed.state.epoch == before.epoch == 1
    assert feed.state.view() == before.view()
    assert feed.state.observation("r2", "m") == before.observation("r2", "m")


def test_tally_same_seq_with_other_opinion_is_not_newer() -> None:
    feed = log(R3, *JOIN_N1, obs("r1", s("n", 1, 1)))  # (1, 1) again: ignored, first wins
    assert feed.state.observation("r1", "n") == ObservationRecord(
        incarnation=1, opinion=Opinion.ALIVE, seq=1
    )


def test_tally_labels_follow_view_with_changes() -> None:
    # A rejoin without labels keeps the old ones, as View.with_changes does, so
    # a subscriber folding the changes ends with exactly the replicas' view.
    feed = log(R3, obs("r1", a("n", 1, 1, k="v")), obs("r2", a("n", 1, 1, k="v")))
    folded = feed.state.view()
    for result in feed(obs("r1", a("n", 2, 2)), obs("r2", a("n", 2, 2))):
        if result.change is not None:
            folded = folded.with_changes(result.change.epoch, result.change.changes)
    assert folded == feed.state.view()
    member = feed.state.member("n")
    assert member is not None and member.incarnation == 2 and dict(member.labels) == {"k": "v"}


UNKNOWN, STALE, FINAL, NOT_JOINING = (
    LeaveRefusal.UNKNOWN,
    LeaveRefusal.STALE,
    LeaveRefusal.FINAL,
    LeaveRefusal.NOT_JOINING,
)


@pytest.mark.parametrize(
    ("setup", "command", "refusal", "reason", "changes"),
    [
        pytest.param(
            JOIN_N1, leave("n", 1), None, "n left at incarnation 1", [("n", 1, LEFT)], id="alive"
        ),
        pytest.param(
            (),
            leave("n", 1, heard_by="r1"),
            None,
            "had not joined",
            [],
            id="joining-heard-by-the-proposer",
        ),
        pytest.param(
            (obs("r2", a("n", 1, 1)),),
            leave("n", 1),
            None,
            "had not joined",
            [],
            id="joining-heard-in-a-committed-observation",
        ),
        pytest.param(
            (obs("r2", s("n", 1, 1)),),
            leave("n", 1),
            None,
            "had not joined",
            [],
            id="joining-suspected-counts-as-heard",
        ),
        pytest.param(
            (*JOIN_N1, obs("r1", a("n", 2, 2))),
            leave("n", 2),
            None,
            "had not joined",
            [("n", 1, DEAD)],
            id="joining-newer-life-retires-the-old-one",
        ),
        pytest.param(
            (leave("n", 3, heard_by="r1"),),
            leave("n", 2),
            None,
            "already retired",
            [],
            id="second-leave-of-retired-accepted-unchanged",
        ),
        pytest.param(
            (), leave("ghost", 1), UNKNOWN, "unknown to the cluster", [], id="ghost-refused"
        ),
        pytest.param(
            (),
            leave("n", 1, heard_by="r9"),
            UNKNOWN,
            "unknown to the cluster",
            [],
            id="heard-by-a-stranger-does-not-count",
        ),
        pytest.param(
            JOIN_N1,
            leave("n", 2),
            NOT_JOINING,
            "the cluster records n alive at incarnation 1",
            [],
            id="above-the-alive-record-refused-and-kills-nothing",
        ),
        pytest.param(
            (obs("r1", a("n", 1, 1)),),
            leave("n", 2),
            NOT_JOINING,
            "has no record of n (heard at incarnation 1)",
            [],
            id="above-the-joining-incarnation-refused",
        ),
        pytest.param(
            JOIN_N1, leave("n", 0), STALE, "stale incarnation 0", [], id="stale-incarnation-refused"
        ),
        pytest.param(
            (*JOIN_N1, leave("n", 1)),
            leave("n", 1),
            FINAL,
            "already left",
            [],
            id="second-leave-refused",
        ),
        pytest.param(
            (*JOIN_N1, obs("r1", s("n", 1, 2)), obs("r2", s("n", 1, 2))),
            leave("n", 1),
            FINAL,
            "already dead",
            [],
            id="dead-cannot-leave",
        ),
    ],
)
def test_tally_leave(
    setup: tuple[bytes, ...],
    command: bytes,
    refusal: LeaveRefusal | None,
    reason: str,
    changes: list[tuple[str, int, MemberState]],
) -> None:
    feed = log(R3, *setup)
    epoch = feed.state.epoch
    before = feed.state.to_bytes()
    (result,) = feed(command)
    assert result.leave is not None
    assert result.leave == LeaveOutcome(
        request_id="q",
        node_id=result.leave.node_id,
        accepted=refusal is None,
        reason=result.leave.reason,
        epoch=epoch + (1 if changes else 0),
        joined=any(state is LEFT for _, _, state in changes),
        refusal=refusal,
        incarnation=result.leave.incarnation,
    )
    assert reason in result.leave.reason.lower()
    got = (
        []
        if result.change is None
        else [(c.node_id, c.incarnation, c.state) for c in result.change.changes]
    )
    assert got == changes
    assert feed.state.epoch == result.leave.epoch
    if refusal is not None:
        # A refused leave changes nothing at all: the whole state but the
        # applied index is as before (no record, no retirement, no epoch).
        again = log(R3, *setup)
        again(b"")  # a no-op at the same index
        assert feed.state.to_bytes() == again.state.to_bytes()
        assert before != feed.state.to_bytes()  # (only the applied index moved)


def test_tally_judge_leave_is_what_apply_decides_and_changes_nothing() -> None:
    feed = log(R3, *JOIN_N1)
    before = feed.state.to_bytes()
    cases = [("n", 1, ""), ("n", 2, ""), ("n", 2, "r1"), ("ghost", 1, ""), ("n", 0, "")]
    judged = [feed.state.judge_leave(n, i, h) for n, i, h in cases]
    assert feed.state.to_bytes() == before
    assert [r for r, _ in judged] == [None, NOT_JOINING, None, UNKNOWN, STALE]
    for (n, i, h), (refusal, _) in zip(cases, judged, strict=True):
        (result,) = log(R3, *JOIN_N1)(leave(n, i, heard_by=h))
        assert result.leave is not None and result.leave.refusal is refusal


@pytest.mark.parametrize(
    ("setup", "command", "refusal", "reason", "removed"),
    [
        pytest.param(JOIN_N1, remove("n"), None, "removed at incarnation 1", 1, id="alive"),
        pytest.param(JOIN_N1, remove("n", 1), None, "removed", 1, id="alive-at-given"),
        pytest.param(JOIN_N1, remove("n", 2), STALE, "at incarnation 1 (alive), not 2", 0),
        pytest.param((), remove("ghost"), UNKNOWN, "no record", 0, id="ghost"),
        pytest.param(
            (obs("r1", a("n", 1, 1)),),
            remove("n"),
            UNKNOWN,
            "heard at incarnation 1, not a member yet",
            0,
            id="joining-has-no-record",
        ),
        pytest.param((*JOIN_N1, leave("n", 1)), remove("n"), FINAL, "already left", 0, id="left"),
        pytest.param(
            (*JOIN_N1, obs("r1", s("n", 1, 2)), obs("r2", s("n", 1, 2))),
            remove("n"),
            FINAL,
            "already dead",
            0,
            id="dead",
        ),
    ],
)
def test_tally_remove(
    setup: tuple[bytes, ...],
    command: bytes,
    refusal: LeaveRefusal | None,
    reason: str,
    removed: int,
) -> None:
    feed = log(R3, *setup)
    epoch = feed.state.epoch
    (result,) = feed(command)
    assert result.leave is not None
    assert result.leave.refusal is refusal and result.leave.accepted is (refusal is None)
    assert reason in result.leave.reason.lower()
    if refusal is not None:
        assert result.change is None and feed.state.epoch == epoch
        return
    assert result.change is not None and feed.state.epoch == epoch + 1
    (change,) = result.change.changes
    assert (change.node_id, change.incarnation, change.state) == ("n", removed, LEFT)
    assert change.removed_by == "admin" and dict(change.labels) == {}
    assert result.leave.incarnation == removed and result.leave.joined
    # LEFT is final: the removed life's heartbeats never count again; a new
    # process under the id (a higher incarnation) joins as any would.
    feed(obs("r1", a("n", 1, 9)), obs("r2", a("n", 1, 9)))
    assert members(feed.state) == [("n", 1, LEFT)]
    feed(obs("r1", a("n", 2, 10)), obs("r2", a("n", 2, 10)))
    assert members(feed.state) == [("n", 2, ALIVE)]


def test_tally_left_incarnation_cannot_join_but_next_can() -> None:
    feed = log(R3, leave("n", 1, heard_by="r1"), *JOIN_N1)
    # Retired before it joined: no record, no epoch, and its late ALIVE
    # observations are ignored, not stored (rule 5).
    assert members(feed.state) == [] and feed.state.epoch == 0
    assert feed.state.retired("n") == 1 and feed.state.highest_incarnation("n") == 1
    assert feed.state.observation("r1", "n") is None
    feed(obs("r1", a("n", 2, 2)), obs("r2", a("n", 2, 2)))
    assert members(feed.state) == [("n", 2, ALIVE)]
    assert feed.state.epoch == 1


def test_tally_leave_while_joining_drops_its_observations_and_blocks_admission() -> None:
    # r1 heard n at 1 (one ALIVE of the two needed), then n left before r2's
    # ALIVE was committed: r2's late ALIVE must not admit a node that has gone.
    feed = log(R3, obs("r1", a("n", 1, 1)), leave("n", 1))
    assert feed.state.observation("r1", "n") is None
    (late,) = feed(obs("r2", a("n", 1, 1)))
    assert late.change is None and members(feed.state) == []


def test_tally_dead_and_left_changes_repeat_the_members_labels() -> None:
    feed = log(R3, obs("r1", a("n", 1, 1, k="v")), obs("r2", a("n", 1, 1, k="v")))
    feed(obs("r1", a("m", 1, 2, k="w")), obs("r2", a("m", 1, 2, k="w")))
    (dead,) = feed(obs("r1", s("n", 1, 3)), obs("r2", s("n", 1, 3)))[-1:]
    assert dead.change is not None
    assert [dict(c.labels) for c in dead.change.changes] == [{"k": "v"}]
    (left,) = feed(leave("m", 1))
    assert left.change is not None and dict(left.change.changes[0].labels) == {"k": "w"}


def test_tally_retired_incarnations_survive_a_snapshot() -> None:
    feed = log(R3, leave("n", 4, heard_by="r2"), *JOIN_N1)
    restored = MembershipState.from_bytes(feed.state.to_bytes())
    assert restored.retired("n") == 4
    assert restored.to_bytes() == feed.state.to_bytes()
    # A state without retired incarnations keeps the old encoding (no key).
    assert b"retired" not in log(R3, *JOIN_N1).state.to_bytes()


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        (b"garbage", "undecodable entry"),
        (b'{"v":9}', "unknown version 9"),
        (obs("r9", a("n", 1, 1)), "'r9', not a member"),
    ],
)
def test_tally_rejects_garbage_deterministically(entry: bytes, error: str) -> None:
    one, two = log(R3, JOIN_N1[0]), log(R3, JOIN_N1[0])
    before = one.state.to_bytes()
    (r1,), (r2,) = one(entry), two(entry)
    assert r1 == r2 and r1.error is not None and error in r1.error
    assert r1.change is None and r1.leave is None
    assert one.state.applied_index == 2 and one.state.epoch == 0
    assert one.state.to_bytes() == before.replace(b'"applied_index":1', b'"applied_index":2')


def test_tally_noop_entry_only_advances_index() -> None:
    feed = log(R3, JOIN_N1[0])
    assert feed(b"") == [ApplyResult(index=2)]
    assert feed.state.applied_index == 2


def test_tally_apply_index_must_grow() -> None:
    state = MembershipState(R3)
    state.apply(5, b"")
    with pytest.raises(AssertionError):
        state.apply(5, b"")


@pytest.mark.parametrize("arbiters", [[], [""], ["r1", "r1"]])
def test_tally_rejects_bad_arbiters(arbiters: list[str]) -> None:
    with pytest.raises(ValueError):
        MembershipState(arbiters)


@pytest.mark.parametrize(("n", "quorum"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (7, 4)])
def test_tally_quorum_is_strict_majority(n: int, quorum: int) -> None:
    state = MembershipState([f"r{i}" for i in range(n)])
    assert state.quorum == quorum
    assert quorum * 2 > n >= (quorum - 1) * 2  # the dumb cross-check


def test_tally_queries() -> None:
    feed = log(R3, *JOIN_N1, obs("r3", s("n", 1, 4)), obs("r1", a("n", 7, 9, k="v")))
    state = feed.state
    assert state.arbiters == R3
    assert state.observation("r1", "n") == ObservationRecord(
        incarnation=7, opinion=Opinion.ALIVE, seq=9, labels=(("k", "v"),)
    )
    assert state.observation("r1", "nobody") is None
    assert state.suspected_by("n") == ("r3",)
    assert state.highest_incarnation("n") == 7
    assert state.highest_incarnation("nobody") is None
    assert state.suspected_by("nobody") == ()
    feed(obs("r2", s("j", 3, 1)), obs("r1", a("j", 3, 1)))
    assert state.member("j") is None
    assert state.suspected_by("j") == ("r2",)  # a JOINING node: its highest incarnation
    assert state.view().get("n") == state.member("n")


def test_tally_snapshot_round_trip() -> None:
    feed = log(
        R3,
        *JOIN_N1,
        obs("r1", a("m", 1, 2, x="y")),
        obs("r2", a("m", 1, 2, x="y")),
        obs("r1", s("n", 1, 3)),
        leave("m", 1),
        obs("r2", a("j", 4, 5)),
    )
    data = feed.state.to_bytes()
    copy = MembershipState.from_bytes(data)
    assert copy.to_bytes() == data
    assert copy.view() == feed.state.view()
    assert (copy.epoch, copy.applied_index, copy.quorum) == (3, 8, 2)
    more = (obs("r3", s("n", 1, 9)), obs("r3", a("j", 4, 9)))
    assert Log(copy)(*more) == feed(*more)
    assert copy.to_bytes() == feed.state.to_bytes()


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b"",
        lambda b: b"{}",
        lambda b: b.replace(b'"v":1', b'"v":2'),
        lambda b: b.replace(b'"epoch":1', b'"epoch":true'),
        lambda b: b.replace(b'"r1"', b'"rX"', 1),
        lambda b: b.replace(b",", b", "),
        lambda b: b.replace(b'"ALIVE"', b'"JOINING"'),
        lambda b: b.replace(b'"alive"', b'"maybe"'),
        lambda b: b[:-5],
    ],
)
def test_tally_snapshot_rejects_invalid(mutate: object) -> None:
    data = log(R3, *JOIN_N1).state.to_bytes()
    assert callable(mutate)
    with pytest.raises(SnapshotDecodeError):
        MembershipState.from_bytes(mutate(data))


# -- determinism and invariants over random command streams ------------------

_NODES = ("a", "b", "c")
_REPLICAS = (*R3, "r9")  # r9 is not an arbiter: its batches are rejected
_observation = st.builds(
    Observation,
    node_id=st.sampled_from(_NODES),
    incarnation=st.integers(0, 3),
    opinion=st.sampled_from(Opinion),
    seq=st.integers(0, 8),
    labels=st.sampled_from([(), (("k", "1"),), (("k", "2"), ("z", ""))]),
)
_entry = st.one_of(
    st.builds(
        ObserveBatch,
        replica_id=st.sampled_from(_REPLICAS),
        observations=st.lists(_observation, max_size=4).map(tuple),
    ).map(encode),
    st.builds(
        Leave,
        node_id=st.sampled_from(_NODES),
        incarnation=st.integers(0, 3),
        request_id=st.just("q"),
        heard_by=st.sampled_from(["", "r1", "r9"]),
    ).map(encode),
    st.builds(
        Remove,
        node_id=st.sampled_from(_NODES),
        incarnation=st.integers(0, 3),
        by=st.just("admin"),
        request_id=st.just("q"),
    ).map(encode),
    st.sampled_from([b"", b"junk", b"{}"]),
)


def _check_invariants(state: MembershipState, result: ApplyResult, folded: View) -> None:
    assert folded == state.view()
    for node in _NODES:
        latest = [state.observation(r, node) for r in R3]
        record = state.member(node)
        alive = Counter(o.incarnation for o in latest if o and o.opinion is Opinion.ALIVE)
        for inc, count in alive.items():  # no ALIVE quorum left unapplied
            assert count < state.quorum or (record is not None and record.incarnation >= inc)
        if record is not None and record.state is ALIVE:  # no SUSPECT quorum left unapplied
            assert len(state.suspected_by(node)) < state.quorum
    if result.leave is not None and not result.leave.accepted:
        assert result.change is None  # a refused Leave or Remove changes nothing (rule 5d)
    if result.change is not None:
        changes = result.change.changes
        assert [c.node_id for c in changes] == sorted(c.node_id for c in changes)
        # Only an administrator's removal carries removed_by, on a LEFT (rule 5a).
        assert all(c.state is LEFT for c in changes if c.removed_by)
        for i, c in enumerate(changes):
            # An old life retired by a newer one (rule 3) or by a leave of a
            # newer incarnation that never joined (rule 5) needs no suspicion.
            retired = (i + 1 < len(changes) and changes[i + 1].node_id == c.node_id) or (
                result.leave is not None and state.retired(c.node_id) > c.incarnation
            )
            if c.state is DEAD and not retired:  # a death needs a quorum of suspects (rule 4)
                votes = state.death_votes(c.node_id)
                assert len(votes) >= state.quorum
                # ... and names them as its evidence (rule 4a)
                assert tuple(e.arbiter_id for e in c.evidence) == votes


@settings(max_examples=200, deadline=None)
@given(st.lists(_entry, max_size=40), st.integers(0, 40))
def test_tally_is_deterministic_and_keeps_invariants(entries: list[bytes], cut: int) -> None:
    one, two = MembershipState(R3), MembershipState(list(reversed(R3)))
    folded = View()
    changed = 0
    restored: MembershipState | None = None
    for index, entry in enumerate(entries, start=1):
        result = one.apply(index, entry)
        assert two.apply(index, entry) == result
        if restored is not None:
            assert restored.apply(index, entry) == result
        if result.change is not None:
            changed += 1
            assert result.change.epoch == one.epoch == changed
            folded = folded.with_changes(result.change.epoch, result.change.changes)
        assert one.epoch == changed
        _check_invariants(one, result, folded)
        if index == cut:
            restored = MembershipState.from_bytes(one.to_bytes())
    assert one.to_bytes() == two.to_bytes()
    assert one.view() == two.view()
    if restored is not None:
        assert restored.to_bytes() == one.to_bytes()


def test_tally_suspicion_of_a_later_incarnation_kills_the_recorded_one() -> None:
    # Simulator seed 142: n1 ALIVE at 1 restarts as 2, is heard (never admitted),
    # then dies; every replica's latest observation is SUSPECT at 2.
    from arbiter.core.commands import Observation, ObserveBatch, Opinion, encode
    from membership.shared.view import MemberState as MS

    st = MembershipState(["a1", "a2", "a3"])
    index = 0

    def obs(r: str, inc: int, op: Opinion, seq: int) -> None:
        nonlocal index
        index += 1
        st.apply(
            index,
            encode(
                ObserveBatch(
                    replica_id=r,
                    observations=(Observation(node_id="n1", incarnation=inc, opinion=op, seq=seq),),
                )
            ),
        )

    for r in ("a1", "a2"):
        obs(r, 1, Opinion.ALIVE, 1)
    assert st.member("n1").state is MS.ALIVE  # type: ignore[union-attr]
    obs("a1", 2, Opinion.SUSPECT, 5)
    assert st.member("n1").state is MS.ALIVE  # type: ignore[union-attr]  # one is not a quorum
    obs("a2", 2, Opinion.SUSPECT, 5)
    m = st.member("n1")
    assert m is not None and m.state is MS.DEAD and m.incarnation == 1


def test_tally_first_instance_id_wins_and_changes_no_view() -> None:
    from arbiter.core.commands import Bootstrap

    feed = log(R3, *JOIN_N1)
    epoch = feed.state.epoch
    assert feed.state.instance == ""
    (first,) = feed(encode(Bootstrap(instance="ab12")))
    assert first.change is None and first.error is None
    (second,) = feed(encode(Bootstrap(instance="cd34")))  # a later leader's: ignored
    assert second.change is None and feed.state.instance == "ab12"
    assert feed.state.epoch == epoch
    restored = MembershipState.from_bytes(feed.state.to_bytes())
    assert restored.instance == "ab12" and restored.to_bytes() == feed.state.to_bytes()
    assert b"instance" not in log(R3, *JOIN_N1).state.to_bytes()  # older encoding kept
