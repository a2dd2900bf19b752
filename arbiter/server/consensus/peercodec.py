"""The wire form of Raft messages between replicas (arbiter.v1), snapshots in chunks.

A SNAPSHOT travels as consecutive chunks of at most ``SNAPSHOT_CHUNK`` bytes
on one stream (the server's receive limit is the public API's, 64 KiB by
default); the receiver reassembles them per stream (:class:`SnapshotAssembler`)
and delivers one message. Split from :mod:`arbiter.server.consensus.peers`, which
re-exports these names.
"""

from __future__ import annotations

import dataclasses
import logging

from arbiter.core.raft import Message, MessageType, Snapshot
from arbiter.core.raft.codec import (
    entry_from_payload,
    entry_payload,
    snapshot_from_payload,
    snapshot_payload,
)
from arbiter.v1 import peer_pb2

__all__ = ["SNAPSHOT_CHUNK", "SnapshotAssembler", "from_proto", "to_protos"]

log = logging.getLogger("arbiter.peers")

# Bytes of snapshot data per wire message: well under the 64 KiB receive limit.
SNAPSHOT_CHUNK = 32 * 1024


def to_protos(
    msg: Message, cluster: str, chunk: int = SNAPSHOT_CHUNK
) -> list[peer_pb2.RaftMessage]:
    """Encodes a core Raft message for the wire: one message, or a SNAPSHOT's chunks."""
    snap = msg.snapshot
    if snap is None:
        return [_to_proto(msg, cluster)]
    payload = snapshot_payload(snap)  # the data and the configuration at its index
    size = len(payload)
    out = []
    for offset in range(0, max(size, 1), chunk):
        pb = _to_proto(msg, cluster)
        pb.index, pb.log_term = snap.index, snap.term
        pb.snapshot_chunk = payload[offset : offset + chunk]
        pb.snapshot_offset, pb.snapshot_size = offset, size
        out.append(pb)
    return out


def _to_proto(msg: Message, cluster: str) -> peer_pb2.RaftMessage:
    return peer_pb2.RaftMessage(
        type=msg.type.value,
        src=msg.src,
        dst=msg.dst,
        term=msg.term,
        log_term=msg.log_term,
        index=msg.index,
        entries=[
            peer_pb2.RaftEntry(term=e.term, index=e.index, data=entry_payload(e))
            for e in msg.entries
        ],
        commit=msg.commit,
        reject=msg.reject,
        reject_hint=msg.reject_hint,
        cluster=cluster,
    )


def from_proto(pb: peer_pb2.RaftMessage, snapshot: Snapshot | None = None) -> Message:
    """Decodes a wire Raft message (a SNAPSHOT with its reassembled ``snapshot``).

    Raises:
        ValueError: for an unknown message type.
    """
    return Message(
        type=MessageType(pb.type),
        src=pb.src,
        dst=pb.dst,
        term=pb.term,
        log_term=pb.log_term,
        index=pb.index,
        entries=tuple(entry_from_payload(e.term, e.index, e.data) for e in pb.entries),
        commit=pb.commit,
        reject=pb.reject,
        reject_hint=pb.reject_hint,
        snapshot=snapshot,
    )


class SnapshotAssembler:
    """Reassembles the chunks of SNAPSHOT messages arriving in order on one stream."""

    def __init__(self) -> None:
        self._key: tuple[str, int, int, int, int] | None = None
        self._buf = bytearray()

    def add(self, pb: peer_pb2.RaftMessage) -> Message | None:
        """Takes one chunk; returns the whole message once its last chunk is in.

        Raises:
            ValueError: for a chunk beyond the announced size.
        """
        key = (pb.src, pb.term, pb.index, pb.log_term, pb.snapshot_size)
        if pb.snapshot_offset == 0:
            self._key, self._buf = key, bytearray()
        elif key != self._key or pb.snapshot_offset != len(self._buf):
            log.info("incomplete snapshot from %s dropped (a chunk was lost)", pb.src)
            self._key, self._buf = None, bytearray()
            return None
        self._buf += pb.snapshot_chunk
        if len(self._buf) > pb.snapshot_size:
            raise ValueError(f"snapshot chunks exceed the announced {pb.snapshot_size} bytes")
        if len(self._buf) < pb.snapshot_size:
            return None
        snap = snapshot_from_payload(pb.index, pb.log_term, bytes(self._buf))
        self._key, self._buf = None, bytearray()
        # On the wire index and log_term carried the snapshot's position; in the core it is
        # in the snapshot, and a SNAPSHOT's own index and log_term are unused (0).
        return dataclasses.replace(from_proto(pb, snap), index=0, log_term=0)
