"""Unit tests of arbiter.core.ranks and of the tally's ranks: stable, dense, replicated."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbiter.core.commands import (
    RULES,
    Bootstrap,
    Leave,
    Observation,
    ObserveBatch,
    Opinion,
    encode,
)
from arbiter.core.ranks import assign, derive, update
from arbiter.core.tally import MembershipState, SnapshotDecodeError
from membership.shared.view import JobRanks, Member, MemberState, View

R3 = ("r1", "r2", "r3")
RULES_ON = encode(Bootstrap(instance="ab", rules=RULES))


def alive(node: str, inc: int, seq: int, job: str | None = "j1") -> list[bytes]:
    labels = (("job", job),) if job is not None else ()
    o = Observation(node_id=node, incarnation=inc, opinion=Opinion.ALIVE, seq=seq, labels=labels)
    return [encode(ObserveBatch(replica_id=r, observations=(o,))) for r in R3[:2]]


def suspect(node: str, inc: int, seq: int) -> list[bytes]:
    o = Observation(node_id=node, incarnation=inc, opinion=Opinion.SUSPECT, seq=seq)
    return [encode(ObserveBatch(replica_id=r, observations=(o,))) for r in R3[:2]]


def batch(*observations: Observation) -> list[bytes]:
    return [encode(ObserveBatch(replica_id=r, observations=observations)) for r in R3[:2]]


class Feed:
    """A tally fed consecutive log indexes; remembers the ranks each change emitted."""

    def __init__(self, *entries: bytes, rules: bool = True) -> None:
        self.state = MembershipState(R3)
        self.emitted: list[JobRanks] = []
        self.folded = View()
        if rules:
            self(RULES_ON)
        self(*entries)

    def __call__(self, *entries: bytes) -> None:
        for e in entries:
            result = self.state.apply(self.state.applied_index + 1, e)
            if result.change is not None:
                self.emitted += result.change.ranks
                c = result.change
                self.folded = self.folded.with_changes(c.epoch, c.changes, c.ranks)
            assert self.folded == self.state.view()  # a subscriber's fold is the view

    def ranks(self, job: str = "j1") -> dict[str, int]:
        assignment = self.state.job(job)
        return dict(assignment.ranks) if assignment else {}


@pytest.mark.parametrize(
    ("previous", "members", "expected"),
    [
        ({}, ["b", "a", "c"], {"a": 0, "b": 1, "c": 2}),  # joins in node_id order
        ({"a": 0, "b": 1}, ["a", "b", "c"], {"a": 0, "b": 1, "c": 2}),  # a join takes the next
        ({"a": 0, "b": 1, "c": 2}, ["a", "c"], {"a": 0, "c": 1}),  # the highest into the gap
        ({"a": 0, "b": 1, "c": 2}, ["b", "c"], {"c": 0, "b": 1}),
        ({"a": 0, "b": 1, "c": 2}, ["a", "b"], {"a": 0, "b": 1}),  # the last one: nobody moves
        # Two gaps: the lowest gap takes the highest rank, repeated.
        ({"a": 0, "b": 1, "c": 2, "d": 3, "e": 4}, ["b", "d", "e"], {"e": 0, "b": 1, "d": 2}),
        # A death and a join in one entry: the join fills the gap, nobody moves.
        ({"a": 0, "b": 1, "c": 2}, ["a", "c", "d"], {"a": 0, "c": 2, "d": 1}),
        ({"a": 0, "b": 1}, [], {}),
    ],
)
def test_ranks_assign_rule(
    previous: dict[str, int], members: list[str], expected: dict[str, int]
) -> None:
    assert assign(previous, members) == expected


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from("abcdefgh"), unique=True),
    st.lists(st.sampled_from("abcdefghij"), unique=True),
)
def test_ranks_assign_is_dense_and_keeps_every_rank_it_can(
    before: list[str], after: list[str]
) -> None:
    previous = assign({}, before)
    ranks = assign(previous, after)
    assert set(ranks) == set(after)
    assert sorted(ranks.values()) == list(range(len(after)))
    # Every survivor whose rank still fits keeps it (rule 2).
    assert all(ranks[n] == r for n, r in previous.items() if n in ranks and r < len(after))


def test_ranks_derive_orders_by_epoch_then_node_id() -> None:
    members = [
        Member(node_id="z", incarnation=1, state=MemberState.ALIVE, labels={"job": "j"}, epoch=1),
        Member(node_id="b", incarnation=1, state=MemberState.ALIVE, labels={"job": "j"}, epoch=2),
        Member(node_id="a", incarnation=1, state=MemberState.ALIVE, labels={"job": "j"}, epoch=2),
        Member(node_id="d", incarnation=1, state=MemberState.DEAD, labels={"job": "j"}, epoch=3),
        Member(node_id="n", incarnation=1, state=MemberState.ALIVE, epoch=1),
    ]
    assert derive(members) == {"j": {"z": 0, "a": 1, "b": 2}}


def test_tally_ranks_stable_across_an_unrelated_join_and_death() -> None:
    f = Feed(
        *batch(
            *(
                Observation(
                    node_id=n, incarnation=1, opinion=Opinion.ALIVE, seq=1, labels=(("job", "j1"),)
                )
                for n in ("n1", "n2", "n3")
            )
        )
    )
    assert f.ranks() == {"n1": 0, "n2": 1, "n3": 2}
    first = f.state.job("j1")
    assert first is not None and first.epoch == f.state.epoch
    f(*alive("x1", 1, 1, job="j2"), *alive("x0", 1, 1, job=None))  # another job, no job
    f(*suspect("x1", 1, 2))
    assert f.state.job("j1") == first  # untouched: same assignment, same epoch
    assert f.state.job("j2") is None  # its only member died: the job is gone
    assert [j.job for j in f.emitted] == ["j1", "j2", "j2"]
    assert f.emitted[-1].ranks == {} and f.emitted[-1].world_size == 0
    x0 = f.state.member("x0")
    assert x0 is not None and x0.rank is None and f.state.view().world_size("x0") == 0


def test_tally_ranks_dense_after_a_death_and_a_join_takes_the_next_rank() -> None:
    f = Feed(*alive("n1", 1, 1), *alive("n2", 1, 1), *alive("n3", 1, 1))
    assert f.ranks() == {"n1": 0, "n2": 1, "n3": 2}
    f(*suspect("n1", 1, 2))
    assert f.ranks() == {"n3": 0, "n2": 1}  # the highest rank moved into the gap
    n3 = f.state.member("n3")
    assert n3 is not None and (n3.rank, f.state.view().world_size("n3")) == (0, 2)
    assert n3.epoch < f.state.epoch  # a rank move is not a state change: its epoch stays
    assert f.emitted[-1] == JobRanks(job="j1", epoch=f.state.epoch, ranks={"n3": 0, "n2": 1})
    f(*alive("n4", 1, 1))
    assert f.ranks() == {"n3": 0, "n2": 1, "n4": 2}
    f(encode(Leave(node_id="n2", incarnation=1, request_id="q")))  # a leave as a death
    assert f.ranks() == {"n3": 0, "n4": 1}


def test_tally_ranks_a_restart_in_one_entry_keeps_the_rank_with_a_new_assignment() -> None:
    f = Feed(*alive("n1", 1, 1), *alive("n2", 1, 1))
    before = f.state.job("j1")
    f(*alive("n1", 2, 3))  # DEAD at 1 and ALIVE at 2 in one entry (tally rule 3)
    after = f.state.job("j1")
    assert before is not None and after is not None
    assert after.ranks == before.ranks and after.epoch > before.epoch  # re-form, same ranks
    f(*alive("n2", 2, 3, job="j9"))  # a new life in another job
    assert f.ranks() == {"n1": 0} and f.ranks("j9") == {"n2": 0}


def test_tally_ranks_identical_on_every_replica_and_after_a_snapshot() -> None:
    entries = [*alive("n1", 1, 1), *alive("n2", 1, 1), *alive("n3", 1, 1), *suspect("n2", 1, 2)]
    one, two = Feed(*entries), Feed()
    restored = MembershipState.from_bytes(one.state.to_bytes())
    two(*entries)
    assert one.state.view() == two.state.view() == restored.view()
    assert restored.to_bytes() == one.state.to_bytes()
    one(*alive("n5", 1, 1))
    restored.apply(restored.applied_index + 1, alive("n5", 1, 1)[0])
    restored.apply(restored.applied_index + 1, alive("n5", 1, 1)[1])
    assert restored.view() == one.state.view()


def test_tally_ranks_old_snapshot_loads_and_a_bootstrap_derives_them_everywhere() -> None:
    # A cluster that ran before ranks: no rules key, no ranks (snapshot rule 2).
    entries = [*alive("n2", 1, 1), *alive("n1", 1, 1), *alive("n3", 1, 1, job="j2")]
    old = Feed(*entries, rules=False)
    data = old.state.to_bytes()
    assert b'"rules"' not in data and b'"jobs"' not in data
    # Two replicas: one restored that snapshot, one replays the log from index 1.
    restored = MembershipState.from_bytes(data)
    replayed = Feed(rules=False)
    replayed(*entries)
    assert restored.view().jobs == () and restored.member("n1").rank is None  # type: ignore[union-attr]
    epoch = restored.epoch
    for state in (restored, replayed.state):
        result = state.apply(state.applied_index + 1, RULES_ON)
        assert result.change is not None and result.change.changes == ()
        assert result.change.epoch == epoch + 1
        assert result.change.ranks == (
            JobRanks(job="j1", epoch=epoch + 1, ranks={"n2": 0, "n1": 1}),  # by join epoch
            JobRanks(job="j2", epoch=epoch + 1, ranks={"n3": 0}),
        )
    assert restored.view() == replayed.state.view()
    again = restored.apply(restored.applied_index + 1, RULES_ON)  # once only
    assert again.change is None and restored.rules == RULES


def test_tally_ranks_of_a_fresh_cluster_need_no_derivation() -> None:
    f = Feed()
    assert f.state.epoch == 0 and f.state.rules == RULES  # the bootstrap changed no view


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: s.replace(f'"rules":{RULES}', '"rules":1'),  # ranks below rules 2
        lambda s: s.replace('["n1",0]', '["n1",2]'),  # not dense
        lambda s: s.replace('["n1",0]', '["ghost",0]'),  # no such member
        lambda s: s.replace('"jobs":[["j1"', '"jobs":[["j9"'),  # not that job's member
        lambda s: s.replace(',"jobs":[["j1",2,[["n1",0],["n2",1]]]]', ""),  # a member unranked
    ],
)
def test_tally_ranks_snapshot_rejects_inconsistent_ranks(mutate: object) -> None:
    f = Feed(*alive("n1", 1, 1), *alive("n2", 1, 1))
    text = f.state.to_bytes().decode()
    assert '"jobs":[["j1",2,[["n1",0],["n2",1]]]]' in text
    bad = mutate(text)  # type: ignore[operator]
    assert bad != text
    with pytest.raises(SnapshotDecodeError):
        MembershipState.from_bytes(bad.encode())


_NODES = ("n1", "n2", "n3", "n4")
_obs = st.builds(
    Observation,
    node_id=st.sampled_from(_NODES),
    incarnation=st.integers(1, 3),
    opinion=st.sampled_from(Opinion),
    seq=st.integers(0, 6),
    labels=st.sampled_from([(("job", "j1"),), (("job", "j2"),), ()]),
).map(
    lambda o: (
        o
        if o.opinion is Opinion.ALIVE
        else Observation(node_id=o.node_id, incarnation=o.incarnation, opinion=o.opinion, seq=o.seq)
    )
)
_entries = st.lists(
    st.builds(
        ObserveBatch,
        replica_id=st.sampled_from(R3),
        observations=st.lists(_obs, max_size=3).map(tuple),
    ).map(encode),
    max_size=20,
)


@settings(max_examples=40, deadline=None)
@given(_entries, st.integers(0, 20))
def test_tally_ranks_always_dense_replicated_and_folded(entries: list[bytes], cut: int) -> None:
    one, two = Feed(), Feed()
    restored: MembershipState | None = None
    for i, entry in enumerate(entries):
        epoch = one.state.epoch
        one(entry)
        two(entry)  # the fold is checked against the view at every entry
        assert one.state.view() == two.state.view()
        view = one.state.view()
        for j in view.jobs:
            assert sorted(j.ranks.values()) == list(range(j.world_size))
            # Made before this entry, or by it (then at its epoch: ranks rule 5).
            assert 0 < j.epoch <= epoch or j.epoch == view.epoch > epoch
        ranked = {n for j in view.jobs for n in j.ranks}
        for m in view.members:
            in_job = m.state is MemberState.ALIVE and bool(m.labels.get("job"))
            assert (m.node_id in ranked) == in_job == (m.rank is not None)
        if restored is not None:
            restored.apply(restored.applied_index + 1, entry)
            assert restored.view() == view
        if i == cut:
            restored = MembershipState.from_bytes(one.state.to_bytes())


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from("abcdefgh"), unique=True),
    st.lists(st.sampled_from("abcdefghij"), unique=True),
)
def test_ranks_update_in_place_is_what_assign_states(before: list[str], after: list[str]) -> None:
    # The tally's O(changes) update against the plain statement of rules 2 to 4.
    previous = assign({}, before)
    ranks = dict(previous)
    by_rank: list[str | None] = [None] * len(ranks)
    for n, r in ranks.items():
        by_rank[r] = n
    moved = update(ranks, by_rank, set(before) - set(after), set(after) - set(before))
    assert ranks == assign(previous, after)
    assert by_rank == [n for n, _ in sorted(ranks.items(), key=lambda i: i[1])]
    assert moved == {n: r for n, r in ranks.items() if previous.get(n) != r}


def test_view_folds_ranks_of_members_it_does_not_hold() -> None:
    # A watcher that resumes after an epoch folds changes onto the view it has (maybe
    # none): ranks naming members it never saw are kept in the job, not an error.
    change = JobRanks(job="j1", epoch=5, ranks={"n1": 0, "n2": 1})
    view = View().with_changes(5, (), (change,))
    assert view.jobs == (change,) and view.members == ()
