"""Replica snapshots: restore at start, compaction every N entries or by bytes, a leader's
snapshot applied."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from arbiter.core.compaction import MIN_COMPACT_BYTES, Compaction
from arbiter.core.detection import MissedHeartbeatDetector
from arbiter.core.raft import Entry, HardState, Message, RaftConfig, Role, Snapshot
from arbiter.core.replica import Replica, ReplicaSettings, RestoreError
from arbiter.core.tally import MembershipState
from membership.shared.view import MemberState

IDS = ["a1", "a2", "a3"]


@dataclass
class _Disk:
    hard_state: HardState | None = None
    entries: list[Entry] = field(default_factory=list)
    snapshot: Snapshot | None = None


def _replica(
    rid: str,
    disk: _Disk,
    now: float,
    every: int,
    ids: list[str] = IDS,
    rng: random.Random | None = None,
    snapshot_bytes: int = MIN_COMPACT_BYTES,
) -> Replica:
    return Replica(
        replica_id=rid,
        replica_ids=ids,
        raft_config=RaftConfig(),
        settings=ReplicaSettings(
            lease=0.5,
            observation_retry=0.2,
            restart_grace=0.5,
            heartbeat_interval=0.1,
            snapshot_every=every,
            snapshot_bytes=snapshot_bytes,
        ),
        detector=MissedHeartbeatDetector(interval=0.1, missed_limit=5),
        rng=rng or random.Random(rid),
        now=now,
        seq_base=int(now * 1e6) + 1,
        hard_state=disk.hard_state,
        entries=disk.entries,
        snapshot=disk.snapshot,
    )


class _Group:
    """Three replicas exchanging messages instantly; ``down`` ones hear nothing."""

    def __init__(self, every: int, snapshot_bytes: int = MIN_COMPACT_BYTES) -> None:
        self.every = every
        self.snapshot_bytes = snapshot_bytes
        self.now = 0.0
        self.disks = {r: _Disk() for r in IDS}
        self.reps = {r: self._replica(r) for r in IDS}
        self.down: set[str] = set()
        self.queue: list[Message] = []
        self.restored: list[str] = []

    def _replica(self, rid: str) -> Replica:
        return _replica(
            rid, self.disks[rid], self.now, self.every, snapshot_bytes=self.snapshot_bytes
        )

    def restart(self, rid: str) -> None:
        self.reps[rid] = self._replica(rid)
        self.down.discard(rid)

    def _flush(self, rid: str) -> None:
        rep, disk = self.reps[rid], self.disks[rid]
        while rep.has_ready():
            rd = rep.ready()
            if rd.snapshot is not None:
                disk.snapshot, disk.entries = rd.snapshot, []
                self.restored.append(rid)
            if rd.hard_state is not None:
                disk.hard_state = rd.hard_state
            if rd.entries:
                base = disk.snapshot.index if disk.snapshot else 0
                del disk.entries[rd.entries[0].index - base - 1 :]
                disk.entries.extend(rd.entries)
            self.queue.extend(rd.messages)
            rep.advance(rd)
        snap = rep.maybe_compact()
        if snap is not None:
            base = disk.snapshot.index if disk.snapshot else 0
            del disk.entries[: snap.index - base]
            disk.snapshot = snap

    def run(self, seconds: float, heartbeats: dict[str, set[str]] | None = None) -> None:
        """Advances time in 10 ms steps; nodes in ``heartbeats`` beat to the given replicas."""
        end = self.now + seconds
        while self.now < end:
            self.now += 0.01
            for node, to in (heartbeats or {}).items():
                for rid in sorted(to - self.down):
                    self.reps[rid].heartbeat(node, 1, {}, self.now)
            for rid in IDS:
                if rid not in self.down:
                    self.reps[rid].tick(self.now)
                    self._flush(rid)
            while self.queue:
                msg = self.queue.pop(0)
                if msg.dst not in self.down and msg.src not in self.down:
                    self.reps[msg.dst].step(msg, self.now)
                    self._flush(msg.dst)

    def join(self, count: int, to: set[str]) -> dict[str, set[str]]:
        """Nodes n0..n{count-1} start heartbeating one after another (one entry each, or so)."""
        nodes: dict[str, set[str]] = {}
        for i in range(count):
            nodes[f"n{i}"] = to
            self.run(0.2, nodes)
        return nodes

    def leader(self) -> str | None:
        return next(
            (r for r in IDS if r not in self.down and self.reps[r].status().role is Role.LEADER),
            None,
        )


def test_replica_compacts_every_n_applied_entries_and_restarts_from_snapshot() -> None:
    g = _Group(every=5)
    g.run(2.0)
    nodes = g.join(12, set(IDS))
    lead = g.leader()
    assert lead is not None
    st = g.reps[lead].status()
    assert st.snapshot_index > 0 and st.applied - st.snapshot_index < 5
    view = g.reps[lead].state.view()
    assert {m.node_id for m in view.alive()} == set(nodes)
    for r in IDS:  # every replica compacted its own log
        disk = g.disks[r]
        assert disk.snapshot is not None and disk.snapshot.index > 0
        assert not disk.entries or disk.entries[0].index == disk.snapshot.index + 1
    # Restart every replica from its disk: same view at the same epoch.
    g.reps = {r: _replica(r, g.disks[r], g.now, 5) for r in IDS}
    for r in IDS:
        g._flush(r)  # replays the committed entries after the snapshot
        assert g.reps[r].state.view() == view
    assert not g.restored  # nobody needed a leader's snapshot


def test_replica_compacts_once_its_log_holds_more_bytes_than_the_snapshot() -> None:
    """Compaction rule 2: long before snapshot_every entries, a log holding as many bytes
    as the last snapshot (and the floor) is compacted; the view survives a restart."""
    g = _Group(every=1000, snapshot_bytes=1500)
    g.run(2.0)
    nodes = g.join(12, set(IDS))
    view = g.reps[IDS[0]].state.view()
    assert {m.node_id for m in view.alive()} == set(nodes)
    for r in IDS:
        disk, st = g.disks[r], g.reps[r].status()
        assert disk.snapshot is not None and 0 < disk.snapshot.index <= st.applied < 1000
        # what the log still holds is less than a snapshot's worth (or the floor), give
        # or take the entry that crossed it
        held = [len(e.data) for e in disk.entries if e.index <= st.applied]
        assert sum(held) < max(1500, len(disk.snapshot.data)) + max(held, default=0)
    g.reps = {r: g._replica(r) for r in IDS}
    for r in IDS:
        g._flush(r)  # replays the committed entries after the snapshot
        assert g.reps[r].state.view() == view


@pytest.mark.parametrize(
    ("every", "entries", "applied_bytes", "snapshot_bytes", "due"),
    [
        (0, 50, 10**6, 0, False),  # 0 never compacts, whatever the bytes
        (5, 0, 10**6, 0, False),  # nothing applied since the snapshot
        (5, 5, 0, 0, True),  # rule 1: every entries
        (1000, 4, 99, 0, False),  # below the floor (100)
        (1000, 4, 100, 0, True),  # rule 2: the floor, and the snapshot is smaller
        (1000, 4, 150, 200, False),  # fewer bytes than the snapshot holds
        (1000, 4, 200, 200, True),
    ],
)
def test_compaction_due(
    every: int, entries: int, applied_bytes: int, snapshot_bytes: int, due: bool
) -> None:
    c = Compaction(min_bytes=100)
    c.applied([Entry(index=1, term=1, data=b"x" * applied_bytes)])
    assert c.applied_bytes == applied_bytes
    assert c.due(every, entries, snapshot_bytes) is due
    c.reset()
    assert c.applied_bytes == 0 and c.due(1000, entries, 0) is False


@pytest.mark.parametrize(
    ("every", "snapshot_bytes"),
    [(4, MIN_COMPACT_BYTES), (1000, 1500)],
    ids=["every-4-entries", "by-bytes"],
)
def test_replica_far_behind_takes_leaders_snapshot_before_entries(
    every: int, snapshot_bytes: int
) -> None:
    # A log compacted by bytes (compaction rule 2) is a snapshot like any other for
    # Raft: the laggard needs entries the leader no longer has, so it gets the snapshot.
    g = _Group(every=every, snapshot_bytes=snapshot_bytes)
    g.run(2.0)
    lead = g.leader()
    assert lead is not None
    laggard = next(r for r in IDS if r != lead)
    g.down.add(laggard)
    nodes = g.join(12, set(IDS))
    assert g.reps[lead].status().snapshot_index > g.reps[laggard].status().last_index
    g.restart(laggard)  # from its own, stale disk
    g.run(2.0, nodes)
    assert g.restored == [laggard]
    assert g.reps[laggard].state.view() == g.reps[lead].state.view()
    assert g.reps[laggard].state.epoch == g.reps[lead].state.epoch > 0


def test_replica_restore_from_snapshot_starts_with_its_view() -> None:
    state = MembershipState(IDS)
    g = _Group(every=0)
    g.run(2.0, {"n1": set(IDS)})
    lead = g.leader()
    assert lead is not None
    rep = g.reps[lead]
    snap = rep.raft.compact(rep.status().applied, rep.state.to_bytes())
    hs = HardState(term=snap.term, vote=None, commit=snap.index)
    restored = _replica(lead, _Disk(hard_state=hs, snapshot=snap), g.now, 0)
    assert restored.state.view() == rep.state.view() != state.view()
    member = restored.state.member("n1")
    assert member is not None and member.state is MemberState.ALIVE
    assert restored.status().applied == snap.index


@pytest.mark.parametrize(
    ("ids", "data_of", "match"),
    [
        (["a1", "a2", "a4"], None, "configured with a1, a2, a4"),
        (IDS, b"not json", "snapshot at index 3"),
        (IDS, "wrong-index", "applied to 0"),
    ],
    ids=["other-arbiters", "undecodable", "index-mismatch"],
)
def test_replica_restore_refuses_a_snapshot_that_does_not_fit(
    ids: list[str], data_of: bytes | str | None, match: str
) -> None:
    state = MembershipState(IDS)
    state.apply(1, b"")
    state.apply(2, b"")
    state.apply(3, b"")
    if data_of is None:
        data = state.to_bytes()
    elif data_of == "wrong-index":
        data = MembershipState(IDS).to_bytes()
    else:
        assert isinstance(data_of, bytes)
        data = data_of
    snap = Snapshot(index=3, term=1, data=data)
    disk = _Disk(hard_state=HardState(term=1, vote=None, commit=3), snapshot=snap)
    with pytest.raises(RestoreError, match=match):
        _replica(ids[0], disk, 0.0, 0, ids=ids)


def test_replica_cluster_gets_one_instance_id_that_survives_leaders_and_restarts() -> None:
    # A leader of a cluster without an instance id proposes one (replica rule
    # 6); every replica applies the first, later leaders propose nothing more,
    # and it survives compaction and restarts (it is in the snapshot).
    g = _Group(every=3)
    g.run(3.0)
    first = g.leader()
    assert first is not None
    instances = {r: g.reps[r].state.instance for r in IDS}
    assert len(set(instances.values())) == 1 and instances[first], instances
    instance = instances[first]
    assert all(c in "0123456789abcdef" for c in instance) and len(instance) == 26
    g.join(4, set(IDS))  # enough entries for a snapshot on every replica
    g.down.add(first)
    g.run(4.0)
    second = g.leader()
    assert second is not None and second != first
    g.restart(first)
    g.run(2.0)
    assert {g.reps[r].state.instance for r in IDS} == {instance}
    assert all(g.disks[r].snapshot is not None for r in IDS)
    assert MembershipState.from_bytes(g.disks[first].snapshot.data).instance == instance  # type: ignore[union-attr]


def test_replica_instance_ids_differ_between_two_fresh_clusters() -> None:
    one = _Group(every=100)
    two = _Group(every=100)
    for r in IDS:  # another random source, as a cluster started again on fresh data dirs
        two.reps[r] = _replica(r, two.disks[r], 0.0, 100, rng=random.Random(f"{r}-again"))
    for g in (one, two):
        g.run(3.0)
    a, b = one.reps["a1"].state.instance, two.reps["a1"].state.instance
    assert a and b and a != b
