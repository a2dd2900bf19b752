"""The leader gathers the replicas' ALIVE batches into its cut (arbiter/core/gathering.py):
the entry (commands rule 2b), its tally (tally rule 2b), what is gathered, and a group of
replicas joining a storm's slice in one epoch."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbiter.core.commands import (
    RULES,
    Bootstrap,
    CommandDecodeError,
    Leave,
    Observation,
    ObserveBatch,
    ObserveBatches,
    Opinion,
    decode,
    encode,
)
from arbiter.core.detection import MissedHeartbeatDetector
from arbiter.core.gathering import GATHER_RULES, Gather, gatherable
from arbiter.core.raft import Entry, EntryType, Message, MessageType, RaftConfig, Role
from arbiter.core.replica import Replica, ReplicaSettings
from arbiter.core.tally import MembershipState
from membership.shared.view import MemberState

R3 = ("r1", "r2", "r3")


def a(node: str, inc: int = 1, seq: int = 1) -> Observation:
    return Observation(node_id=node, incarnation=inc, opinion=Opinion.ALIVE, seq=seq)


def s(node: str, inc: int = 1, seq: int = 2) -> Observation:
    return Observation(node_id=node, incarnation=inc, opinion=Opinion.SUSPECT, seq=seq)


def batch(replica: str, *observations: Observation) -> ObserveBatch:
    return ObserveBatch(replica_id=replica, observations=observations)


def apply(state: MembershipState, command: object) -> object:
    return state.apply(state.applied_index + 1, encode(command))  # type: ignore[arg-type]


# --- the entry (commands rule 2b) --------------------------------------------------------


def test_gathering_entry_round_trips_and_is_canonical() -> None:
    c = ObserveBatches(batches=(batch("r2", a("n1"), a("n2")), batch("r1", a("n1", seq=7))))
    data = encode(c)
    assert decode(data) == c
    assert encode(decode(data)) == data
    assert data.startswith(b'{"batches":[{"obs":')  # sorted keys, compact


@pytest.mark.parametrize(
    "text",
    [
        b'{"batches":[],"type":"observe_batches","v":1}',  # fewer than two
        b'{"batches":[{"obs":[],"replica":"r1"}],"type":"observe_batches","v":1}',
        b'{"batches":[{"obs":[],"replica":"r1","x":1},{"obs":[],"replica":"r2"}],'
        b'"type":"observe_batches","v":1}',  # an unknown field
        b'{"batches":[{"obs":[]},{"obs":[],"replica":"r2"}],"type":"observe_batches","v":1}',
        b'{"batches":{"r1":[]},"type":"observe_batches","v":1}',  # not a list
    ],
)
def test_gathering_entry_decoding_is_strict(text: bytes) -> None:
    with pytest.raises(CommandDecodeError):
        decode(text)


def test_gathering_entry_needs_two_batches() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        ObserveBatches(batches=(batch("r1", a("n1")),))


def test_gathering_rules_version_is_this_codes() -> None:
    assert RULES >= GATHER_RULES  # a leader raises the state's to it (tally rule 10)


# --- the tally (tally rule 2b) -----------------------------------------------------------


def test_gathering_tally_one_entry_of_three_replicas_is_one_epoch() -> None:
    state = MembershipState(R3)
    nodes = [f"n{i}" for i in range(50)]
    result = apply(
        state,
        ObserveBatches(batches=tuple(batch(r, *(a(n) for n in nodes)) for r in R3)),
    )
    assert result.change is not None and result.change.epoch == 1  # type: ignore[attr-defined]
    assert state.epoch == 1
    assert sorted(m.node_id for m in state.view().members if m.state is MemberState.ALIVE) == (
        sorted(nodes)
    )


def test_gathering_tally_skips_a_batch_of_a_non_member_and_applies_the_rest() -> None:
    state = MembershipState(R3)
    result = apply(
        state,
        ObserveBatches(batches=(batch("r1", a("n1")), batch("r9", a("n1")), batch("r2", a("n1")))),
    )
    assert "r9" in (result.error or "")  # type: ignore[attr-defined]
    assert [(m.node_id, m.state) for m in state.view().members] == [("n1", MemberState.ALIVE)]
    again = MembershipState(R3)
    apply(again, ObserveBatches(batches=(batch("r1", a("n1")), batch("r9", a("n1")))))
    assert again.view().members == ()  # r9 never counts: one opinion is not a quorum


_batches = st.lists(
    st.tuples(
        st.sampled_from(R3),
        st.lists(
            st.tuples(st.sampled_from(["n1", "n2", "n3"]), st.integers(1, 3), st.integers(1, 5)),
            min_size=1,
            max_size=4,
        ),
    ),
    min_size=2,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(_batches)
def test_gathering_tally_decides_from_the_newest_observations_as_one_batch_each(
    spec: list[tuple[str, list[tuple[str, int, int]]]],
) -> None:
    # Tally rule 2b: the gathered entry decides as if each replica had sent one batch of
    # its newest observations (highest incarnation, seq), the same on every replica.
    batches = tuple(batch(r, *(a(n, i, q) for n, i, q in obs)) for r, obs in spec)
    gathered = MembershipState(R3)
    apply(gathered, ObserveBatches(batches=batches))
    newest: dict[str, dict[str, Observation]] = {}
    for b in batches:
        for o in b.observations:
            old = newest.setdefault(b.replica_id, {}).get(o.node_id)
            if old is None or (o.incarnation, o.seq) > (old.incarnation, old.seq):
                newest[b.replica_id][o.node_id] = o
    one_each = MembershipState(R3)
    merged = tuple(batch(r, *sorted(newest[r].values(), key=lambda o: o.node_id)) for r in newest)
    if len(merged) >= 2:
        apply(one_each, ObserveBatches(batches=merged))
    else:
        apply(one_each, merged[0])
    assert gathered.view().members == one_each.view().members
    assert gathered.epoch == one_each.epoch <= 1
    # and never two lives of a node ALIVE at once (the tally asserts it too)
    ids = [m.node_id for m in gathered.view().members]
    assert len(ids) == len(set(ids))


# --- what the leader gathers (gathering rule 2) ------------------------------------------


def _entry(command: object) -> Entry:
    return Entry(term=0, index=0, data=encode(command))  # type: ignore[arg-type]


def test_gathering_keeps_a_followers_alive_batch_in_arrival_order() -> None:
    state, g = MembershipState(R3), Gather()
    assert g.offer("r2", [_entry(batch("r2", a("n1")))], 5.0, state)
    assert g.offer("r3", [_entry(batch("r3", a("n1"), a("n2")))], 5.1, state)
    assert len(g) == 2 and g.oldest == 5.0
    assert [b.replica_id for b in g.take()] == ["r2", "r3"]
    assert len(g) == 0 and g.oldest is None


def test_gathering_keeps_one_batch_per_replica_with_its_newest_observations() -> None:
    # A follower's retry of a batch still waiting at the leader adds nothing to the entry.
    state, g = MembershipState(R3), Gather()
    g.offer("r2", [_entry(batch("r2", a("n2", seq=3), a("n1", seq=4)))], 1.0, state)
    g.offer("r3", [_entry(batch("r3", a("n1")))], 1.1, state)
    g.offer("r2", [_entry(batch("r2", a("n1", seq=4), a("n2", seq=2), a("n3", seq=5)))], 1.2, state)
    assert g.oldest == 1.0
    (r2, r3) = g.take()
    assert r2 == batch("r2", a("n1", seq=4), a("n2", seq=3), a("n3", seq=5))
    assert r3 == batch("r3", a("n1"))


@pytest.mark.parametrize(
    ("sender", "entries"),
    [
        pytest.param("r2", [_entry(batch("r2", a("n1"), s("n2")))], id="a-suspicion"),
        pytest.param("r2", [_entry(batch("r3", a("n1")))], id="another-replicas-batch"),
        pytest.param("r2", [_entry(batch("r2"))], id="empty"),
        pytest.param(
            "r2", [_entry(Leave(node_id="n1", incarnation=1, request_id="q"))], id="a-leave"
        ),
        pytest.param("r2", [Entry(term=0, index=0, data=b"{not json")], id="undecodable"),
        pytest.param("r2", [Entry(term=0, index=0, data=b"")], id="a-no-op"),
        pytest.param(
            "r2",
            [Entry(term=0, index=0, data=b"x", type=EntryType.CONFIG)],
            id="a-configuration-change",
        ),
        pytest.param(
            "r2",
            [_entry(batch("r2", a("n1"))), _entry(batch("r2", s("n1", seq=9)))],
            id="one-of-two-is-a-suspicion",
        ),
    ],
)
def test_gathering_steps_anything_else_into_raft_at_once(sender: str, entries: list[Entry]) -> None:
    state, g = MembershipState(R3), Gather()
    assert not g.offer(sender, entries, 1.0, state)
    assert len(g) == 0  # nothing kept: the caller steps the message as before


def test_gathering_never_holds_a_refutation_of_the_senders_committed_suspicion() -> None:
    state = MembershipState(R3)
    for r in ("r1", "r2"):
        apply(state, batch(r, a("n1")))
    apply(state, batch("r2", s("n1", seq=5)))  # r2 suspects n1 (one opinion: still ALIVE)
    refuting = batch("r2", a("n1", seq=6))
    assert not gatherable(refuting, "r2", state)  # urgent: batching rule 6
    assert gatherable(batch("r3", a("n1", seq=6)), "r3", state)


def test_gathering_drop_counts_what_a_deposed_leader_held() -> None:
    state, g = MembershipState(R3), Gather()
    g.offer("r2", [_entry(batch("r2", a("n1")))], 1.0, state)
    g.offer("r3", [_entry(batch("r3", a("n1")))], 1.0, state)
    assert g.drop() == 2 and g.dropped == 2 and len(g) == 0


# --- three replicas (replica rule 2; gathering rules 1 to 4) -----------------------------


def _replica(rid: str, interval: float) -> Replica:
    return Replica(
        replica_id=rid,
        replica_ids=list(R3),
        raft_config=RaftConfig(),
        settings=ReplicaSettings(
            lease=0.5,
            observation_retry=0.5,
            restart_grace=0.0,
            heartbeat_interval=0.1,
            observation_batch_interval=interval,
        ),
        detector=MissedHeartbeatDetector(interval=0.1, missed_limit=5),
        rng=random.Random(rid),
        now=0.0,
        seq_base=1,
    )


class _Group:
    """Three replicas exchanging messages after ``delay`` seconds, in memory."""

    def __init__(self, interval: float, delay: float = 0.002) -> None:
        self.now, self.delay = 0.0, delay
        self.reps = {r: _replica(r, interval) for r in R3}
        self.queue: list[tuple[float, Message]] = []
        self.entries: list[tuple[str, bool]] = []  # (kind, moved the view) at r1

    def _flush(self, rep: Replica) -> None:
        while rep.has_ready():
            rd = rep.ready()
            self.queue.extend((self.now + self.delay, m) for m in rd.messages)
            before = rep.state.epoch
            for e in rd.committed_entries:
                if rep.replica_id == "r1" and e.data and e.type is EntryType.NORMAL:
                    kind = type(decode(e.data)).__name__
                    self.entries.append((kind, False))
            rep.advance(rd)
            if rep.replica_id == "r1" and rep.state.epoch != before and self.entries:
                self.entries[-1] = (self.entries[-1][0], True)

    def run(
        self,
        seconds: float,
        nodes: dict[str, float] | None = None,
        lag: dict[str, float] | None = None,
    ) -> None:
        """Runs ``seconds``; ``nodes``: node id -> when it starts (seconds from now), each
        then heartbeating every replica every 0.1 s; ``lag``: replica id -> seconds after a
        node's start before that replica hears it (a loaded replica reads late)."""
        start, end = self.now, self.now + seconds
        while self.now < end:
            self.now = round(self.now + 0.001, 6)
            if nodes and round(self.now * 1000) % 100 == 0:  # every 0.1 s
                for rid, rep in self.reps.items():
                    late = (lag or {}).get(rid, 0.0)
                    for n, t0 in nodes.items():
                        if self.now >= start + t0 + late:
                            rep.heartbeat(n, 1, {}, self.now)
            for rep in self.reps.values():
                rep.tick(self.now)
                self._flush(rep)
            due = [m for t, m in self.queue if t <= self.now]
            self.queue = [(t, m) for t, m in self.queue if t > self.now]
            for msg in due:
                self.reps[msg.dst].step(msg, self.now)
                self._flush(self.reps[msg.dst])

    def leader(self) -> Replica:
        (lead,) = [r for r in self.reps.values() if r.status().role is Role.LEADER]
        return lead

    def alive(self) -> int:
        view = self.reps["r1"].state.view()
        return sum(1 for m in view.members if m.state is MemberState.ALIVE)


def _storm(
    interval: float, spread: float = 0.0, leader_lag: float = 0.0, follower_lag: float = 0.0
) -> tuple[_Group, int]:
    """40 nodes starting within ``spread`` seconds; the leader hears each ``leader_lag``
    and the second follower ``follower_lag`` seconds late. Returns the group and the
    epochs until all are ALIVE."""
    g = _Group(interval)
    g.run(3.0)  # a leader, and its Bootstrap raising the rules version
    lead = g.leader()
    assert lead.state.rules == RULES
    second = [r for r in R3 if r != lead.replica_id][1]
    epoch0, g.entries = g.reps["r1"].state.epoch, []
    nodes = {f"n{i}": spread * i / 40 for i in range(40)}
    g.run(1.5 + spread, nodes, {lead.replica_id: leader_lag, second: follower_lag})
    assert g.alive() == 40
    return g, g.reps["r1"].state.epoch - epoch0


def test_gathering_a_slice_heard_by_every_replica_is_one_entry_and_one_epoch() -> None:
    g, epochs = _storm(0.2)
    assert epochs == 1, g.entries
    assert ("ObserveBatches", True) in g.entries
    # the followers' batches were gathered: no follower's own entry moved the view
    assert [kind for kind, moved in g.entries if moved] == ["ObserveBatches"]


def test_gathering_a_storm_read_late_by_the_leader_is_one_epoch_per_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The bench's case (docs/scale.md): the leader, the busiest replica, hears each node
    # 0.3 s late and one follower 0.12 s late. Without gathering, the followers' held
    # observations go out after their follow wait, complete quorums between themselves and
    # the leader's late ones complete others: more entries move the view than the leader
    # cuts. With it, only the leader's cuts do.
    g, epochs = _storm(0.2, spread=1.0, leader_lag=0.3, follower_lag=0.12)
    assert all(kind == "ObserveBatches" for kind, moved in g.entries if moved), g.entries
    monkeypatch.setattr("arbiter.core.replica.GATHER_RULES", RULES + 1)  # as older code
    old, old_epochs = _storm(0.2, spread=1.0, leader_lag=0.3, follower_lag=0.12)
    assert "ObserveBatches" not in {kind for kind, _ in old.entries}
    assert epochs < old_epochs, (epochs, old_epochs)


def test_gathering_is_off_without_pacing_one_entry_per_replica() -> None:
    g, _epochs = _storm(0.0)  # batching rule 4: everything at once, nothing gathered
    assert "ObserveBatches" not in {kind for kind, _ in g.entries}
    assert len(g.entries) >= 2


def test_gathering_is_off_below_its_rules_version() -> None:
    g = _Group(0.2)
    g.run(3.0)
    lead = g.leader()
    lead.state._rules = GATHER_RULES - 1  # as a state an older leader wrote
    follower = next(r for r in g.reps.values() if r is not lead)
    msg = Message(
        type=MessageType.PROPOSE,
        src=follower.replica_id,
        dst=lead.replica_id,
        term=0,
        entries=(_entry(batch(follower.replica_id, a("n1"))),),
    )
    lead.step(msg, g.now)
    assert len(lead.gather) == 0  # stepped into Raft, not gathered
    lead.state._rules = RULES
    lead.step(msg, g.now)
    assert len(lead.gather) == 1


def test_gathering_bootstrap_raises_the_rules_version_to_gathering() -> None:
    state = MembershipState(R3)
    apply(state, Bootstrap(instance="ab", rules=RULES))
    assert state.rules >= GATHER_RULES
