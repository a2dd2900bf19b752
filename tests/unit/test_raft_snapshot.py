"""RaftNode log compaction and snapshot transfer (Raft §7, etcd's model)."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import pytest

from arbiter.core.raft import (
    Entry,
    HardState,
    InvalidInput,
    Message,
    MessageType,
    ProposalDropped,
    RaftConfig,
    RaftNode,
    Snapshot,
)
from tests.unit.raft_harness import Network, decode_applied, encode_applied
from tests.unit.raft_harness import all_applied as _all_applied
from tests.unit.raft_harness import elected as _elected

IDS3 = ["a", "b", "c"]
IDS5 = ["a", "b", "c", "d", "e"]


def _propose_all(net: Network, lead: str, data: list[bytes]) -> None:
    for d in data:
        net.propose(lead, d)


def _snapshots_to(net: Network, dst: str) -> list[Message]:
    return [m for m in net.sent if m.type is MessageType.SNAPSHOT and m.dst == dst]


def test_snapshot_compact_discards_applied_entries_and_keeps_replicating() -> None:
    net, lead = _elected(IDS3)
    data = [f"cmd{i}".encode() for i in range(10)]
    _propose_all(net, lead, data)
    assert net.run_until(lambda: _all_applied(net, data), timeout=2)
    node = net.nodes[lead]
    applied = node.status().applied
    snap = net.compact(lead)
    assert (snap.index, snap.term) == (applied, node.status().term)
    assert node.snapshot() == snap
    st = node.status()
    assert st.snapshot_index == st.last_index == applied
    assert net.disks[lead].entries == [] and net.disks[lead].snapshot == snap
    assert [e.data for e in decode_applied(snap.data) if e.data] == data
    net.propose(lead, b"after")
    assert net.run_until(lambda: _all_applied(net, [*data, b"after"]), timeout=2)
    assert not _snapshots_to(net, "b") and not _snapshots_to(net, "c")  # nobody needed it


@pytest.mark.parametrize("index", [0, 1, 99], ids=["zero", "not-above-snapshot", "unapplied"])
def test_snapshot_compact_refuses_an_index_not_between_snapshot_and_applied(index: int) -> None:
    net, lead = _elected(IDS3)
    _propose_all(net, lead, [b"x", b"y"])
    assert net.run_until(lambda: _all_applied(net, [b"x", b"y"]), timeout=2)
    net.compact(lead, 1)
    with pytest.raises(InvalidInput):
        net.nodes[lead].compact(index, b"state")


@pytest.mark.parametrize("ids", [IDS3, IDS5], ids=["3", "5"])
def test_snapshot_follower_far_behind_catches_up_by_snapshot(ids: list[str]) -> None:
    net, lead = _elected(ids, seed=2)
    laggard = next(i for i in ids if i != lead)
    net.isolate(laggard)
    data = [f"cmd{i}".encode() for i in range(40)]
    _propose_all(net, lead, data)
    others = [i for i in ids if i != laggard]
    assert net.run_until(lambda: _all_applied(net, data, others), timeout=5)
    for i in others:
        net.compact(i)
    net.recover()
    assert net.run_until(lambda: _all_applied(net, data), timeout=5)
    sent = _snapshots_to(net, laggard)
    assert len(sent) == 1, sent
    snap = sent[0].snapshot
    assert snap is not None and snap == net.nodes[lead].snapshot()
    st = net.nodes[laggard].status()
    assert st.snapshot_index == snap.index and st.applied == st.commit == snap.index
    assert net.disks[laggard].snapshot == snap and net.disks[laggard].entries == []
    # Afterwards it follows by APPEND again.
    net.propose(lead, b"after")
    assert net.run_until(lambda: _all_applied(net, [*data, b"after"]), timeout=2)
    assert len(_snapshots_to(net, laggard)) == 1


def test_snapshot_follower_answer_acks_only_the_persisted_snapshot() -> None:
    net, lead = _elected(IDS3, seed=5)
    laggard = next(i for i in IDS3 if i != lead)
    net.isolate(laggard)
    _propose_all(net, lead, [b"a", b"b", b"c"])
    assert net.run_until(lambda: _all_applied(net, [b"a", b"b", b"c"], [lead]), timeout=2)
    snap = net.compact(lead)
    node = net.nodes[laggard]
    term = net.nodes[lead].status().term
    node.step(
        Message(type=MessageType.SNAPSHOT, src=lead, dst=laggard, term=term, snapshot=snap),
        net.now,
    )
    rd = node.ready()
    assert rd.snapshot == snap
    assert rd.hard_state is not None and rd.hard_state.commit == snap.index
    assert rd.entries == () and rd.committed_entries == ()
    [resp] = rd.messages
    assert (resp.type, resp.index, resp.reject) == (MessageType.APPEND_RESP, snap.index, False)
    node.advance(rd)
    assert not node.has_ready()
    st = node.status()
    assert st.applied == st.commit == st.last_index == st.snapshot_index == snap.index


def test_snapshot_follower_ignores_a_snapshot_it_already_holds() -> None:
    net, lead = _elected(IDS3, seed=6)
    _propose_all(net, lead, [b"a", b"b"])
    assert net.run_until(lambda: _all_applied(net, [b"a", b"b"]), timeout=2)
    follower = next(i for i in IDS3 if i != lead)
    node = net.nodes[follower]
    before = node.status()
    snap = Snapshot(index=before.commit, term=before.term, data=b"unused")
    node.step(
        Message(type=MessageType.SNAPSHOT, src=lead, dst=follower, term=before.term, snapshot=snap),
        net.now,
    )
    rd = node.ready()
    assert rd.snapshot is None
    [resp] = rd.messages
    assert (resp.type, resp.index) == (MessageType.APPEND_RESP, before.commit)
    node.advance(rd)
    assert node.status().snapshot_index == before.snapshot_index


def test_snapshot_lost_snapshot_is_sent_again() -> None:
    net, lead = _elected(IDS3, seed=7)
    laggard = next(i for i in IDS3 if i != lead)
    net.isolate(laggard)
    data = [f"cmd{i}".encode() for i in range(5)]
    _propose_all(net, lead, data)
    assert net.run_until(lambda: _all_applied(net, data, [lead]), timeout=2)
    net.compact(lead)
    net.recover()
    net.drop_if = lambda m: m.type is MessageType.SNAPSHOT  # lost, heartbeats still pass
    assert net.run_until(lambda: len(_snapshots_to(net, laggard)) >= 2, timeout=5)
    net.drop_if = None
    assert net.run_until(lambda: _all_applied(net, data), timeout=5)


def test_snapshot_restart_from_snapshot_and_entries() -> None:
    net, lead = _elected(IDS3, seed=3)
    first = [f"old{i}".encode() for i in range(6)]
    _propose_all(net, lead, first)
    assert net.run_until(lambda: _all_applied(net, first), timeout=2)
    follower = next(i for i in IDS3 if i != lead)
    snap = net.compact(follower)
    second = [f"new{i}".encode() for i in range(4)]
    _propose_all(net, lead, second)
    assert net.run_until(lambda: _all_applied(net, first + second), timeout=2)
    disk = net.disks[follower]
    assert disk.snapshot == snap and disk.entries[0].index == snap.index + 1
    net.crash(follower)
    net.restart(follower)
    st = net.nodes[follower].status()
    assert st.snapshot_index == snap.index and st.last_index == disk.last_index
    assert net.run_until(lambda: _all_applied(net, first + second), timeout=5)
    net.run_for(3)
    assert _all_applied(net, first + second)  # replayed once, not twice


def test_snapshot_restart_of_every_replica_keeps_the_applied_sequence() -> None:
    net, lead = _elected(IDS3, seed=8, compact_every=4)
    data = [f"cmd{i}".encode() for i in range(15)]
    _propose_all(net, lead, data)
    assert net.run_until(lambda: _all_applied(net, data), timeout=3)
    assert all(net.nodes[i].status().snapshot_index > 0 for i in IDS3)
    for i in IDS3:
        net.crash(i)
    for i in IDS3:
        net.restart(i)
    assert net.run_until(lambda: net.stable_leader() is not None, timeout=10)
    lead = net.stable_leader()
    assert lead is not None
    net.propose(lead, b"after")
    assert net.run_until(lambda: _all_applied(net, [*data, b"after"]), timeout=3)


def _node(**kwargs: Any) -> RaftNode:
    return RaftNode(
        node_id="a", peers=IDS3, config=RaftConfig(), rng=random.Random(0), now=0.0, **kwargs
    )


def test_snapshot_restore_validates_entries_after_snapshot() -> None:
    snap = Snapshot(index=5, term=2, data=encode_applied([]))
    hs = HardState(term=3, vote=None, commit=5)
    ok = _node(snapshot=snap, hard_state=hs, entries=[Entry(term=3, index=6, data=b"x")])
    st = ok.status()
    assert (st.snapshot_index, st.applied, st.commit, st.last_index) == (5, 5, 5, 6)
    assert ok.ready().committed_entries == ()
    with pytest.raises(InvalidInput, match="contiguous"):
        _node(snapshot=snap, hard_state=hs, entries=[Entry(term=3, index=7, data=b"x")])
    with pytest.raises(InvalidInput, match="term"):
        _node(snapshot=snap, hard_state=hs, entries=[Entry(term=1, index=6, data=b"x")])
    with pytest.raises(InvalidInput, match="term"):
        _node(snapshot=snap, hard_state=HardState(term=1, vote=None, commit=0))


def test_snapshot_restore_commit_below_snapshot_is_raised_to_it() -> None:
    snap = Snapshot(index=5, term=2, data=b"")
    node = _node(snapshot=snap, hard_state=HardState(term=2, vote=None, commit=0))
    assert node.status().commit == 5


@pytest.mark.parametrize("seed", range(8))
def test_snapshot_safety_under_faults_with_frequent_compaction(seed: int) -> None:
    ids = IDS5 if seed % 2 else IDS3
    net = Network(ids, seed=seed, loss=0.1, jitter=0.1, compact_every=3)
    rng = random.Random(seed)
    for r in range(10):
        net.recover()
        for i in sorted(net.down):
            net.restart(i)
        action = rng.choice(["isolate", "crash", "none"])
        if action == "isolate":
            net.isolate(rng.choice(ids))
        elif action == "crash":
            net.crash(rng.choice(ids))
        for k in range(4):
            net.run_for(rng.uniform(0.2, 0.6))
            with contextlib.suppress(ProposalDropped):
                net.propose(rng.choice(sorted(net.nodes)), f"{seed}-{r}-{k}".encode())
    net.recover()
    for i in sorted(net.down):
        net.restart(i)
    net.loss = 0.0
    assert net.run_until(lambda: net.stable_leader() is not None, timeout=30)
    lead = net.stable_leader()
    assert lead is not None
    net.propose(lead, b"final")
    assert net.run_until(
        lambda: (
            len({tuple(net.applied[i]) for i in ids}) == 1 and b"final" in net.data_applied(lead)
        ),
        timeout=30,
    )
    assert any(m.type is MessageType.SNAPSHOT for m in net.sent)  # transfer was exercised
