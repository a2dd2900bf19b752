"""Snapshots on the peer wire: cut into chunks under the size limit, reassembled in order."""

from __future__ import annotations

import pytest

from arbiter.core.raft import ArbiterConfiguration, Message, MessageType, Snapshot
from arbiter.core.raft.codec import snapshot_payload
from arbiter.server.consensus.peers import SnapshotAssembler, from_proto, to_protos

CONF = ArbiterConfiguration(voters={"a1": "h:1", "a2": "h:2"}, learners={"a4": "h:4"}, index=40)


def _snapshot_msg(size: int, conf: ArbiterConfiguration | None = None) -> Message:
    data = bytes(i % 251 for i in range(size))
    snap = Snapshot(index=42, term=3, data=data, configuration=conf)
    return Message(type=MessageType.SNAPSHOT, src="a1", dst="a2", term=3, commit=42, snapshot=snap)


@pytest.mark.parametrize("conf", [None, CONF], ids=["no-config", "config"])
@pytest.mark.parametrize("size", [0, 1, 1000, 1024, 5000], ids=lambda n: f"{n}B")
def test_peers_snapshot_round_trips_through_chunks(
    size: int, conf: ArbiterConfiguration | None
) -> None:
    msg = _snapshot_msg(size, conf)
    assert msg.snapshot is not None
    pbs = to_protos(msg, "c", chunk=1024)
    assert len(pbs) == max(1, -(-len(snapshot_payload(msg.snapshot)) // 1024))
    assert all(len(pb.snapshot_chunk) <= 1024 for pb in pbs)
    asm = SnapshotAssembler()
    out = [asm.add(pb) for pb in pbs]
    assert out[:-1] == [None] * (len(pbs) - 1)
    assert out[-1] == msg


def test_peers_snapshot_with_a_lost_chunk_is_dropped_and_the_next_one_completes() -> None:
    msg = _snapshot_msg(3000)
    pbs = to_protos(msg, "c", chunk=1024)
    asm = SnapshotAssembler()
    assert asm.add(pbs[0]) is None
    assert asm.add(pbs[2]) is None  # pbs[1] was lost: incomplete, dropped
    assert [asm.add(pb) for pb in pbs][-1] == msg  # the resend is whole


def test_peers_snapshot_chunks_beyond_announced_size_are_refused() -> None:
    pbs = to_protos(_snapshot_msg(10), "c", chunk=1024)
    pbs[0].snapshot_size = 5
    with pytest.raises(ValueError, match="exceed"):
        SnapshotAssembler().add(pbs[0])


def test_peers_other_messages_are_one_wire_message_each() -> None:
    msg = Message(type=MessageType.HEARTBEAT, src="a1", dst="a2", term=3, commit=7)
    [pb] = to_protos(msg, "c")
    assert from_proto(pb) == msg
