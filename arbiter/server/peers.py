"""Replica-to-replica transport: Raft messages over one gRPC client stream per peer.

Raft messages are one-way and Raft tolerates loss, duplication and
reordering, so the transport is simple and never blocks the driver: each
peer has a bounded outbox; when it is full the oldest message is dropped.
A sender task per peer keeps a client stream open and reconnects with
jittered exponential backoff (tenacity); a failure is reported to Raft as a
hint (``report_unreachable``), never as a verdict.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Callable

import grpc
from tenacity import AsyncRetrying, retry_if_exception_type, wait_random_exponential

from arbiter.core.raft import Entry, Message, MessageType
from arbiter.v1 import peer_pb2, peer_pb2_grpc

__all__ = ["PeerServicer", "PeerTransport", "from_proto", "to_proto"]

log = logging.getLogger("arbiter.peers")

OUTBOX_LIMIT = 1024


def to_proto(msg: Message, cluster: str) -> peer_pb2.RaftMessage:
    """Encodes a core Raft message for the wire."""
    return peer_pb2.RaftMessage(
        type=msg.type.value,
        src=msg.src,
        dst=msg.dst,
        term=msg.term,
        log_term=msg.log_term,
        index=msg.index,
        entries=[peer_pb2.RaftEntry(term=e.term, index=e.index, data=e.data) for e in msg.entries],
        commit=msg.commit,
        reject=msg.reject,
        reject_hint=msg.reject_hint,
        cluster=cluster,
    )


def from_proto(pb: peer_pb2.RaftMessage) -> Message:
    """Decodes a wire Raft message.

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
        entries=tuple(Entry(term=e.term, index=e.index, data=e.data) for e in pb.entries),
        commit=pb.commit,
        reject=pb.reject,
        reject_hint=pb.reject_hint,
    )


class _StreamBroken(Exception):
    pass


class _Peer:
    def __init__(self, peer_id: str, address: str, options: list[tuple[str, int]]) -> None:
        self.peer_id = peer_id
        self.address = address
        self.outbox: collections.deque[peer_pb2.RaftMessage] = collections.deque(
            maxlen=OUTBOX_LIMIT
        )
        self.ready = asyncio.Event()
        self.channel = grpc.aio.insecure_channel(address, options=options)
        self.stub = peer_pb2_grpc.PeerStub(self.channel)
        self.task: asyncio.Task[None] | None = None
        self.connected = False


class PeerTransport:
    """Sends Raft messages to the other replicas.

    Args:
        self_id: this replica's id.
        peers: id -> ``host:port`` for every other replica.
        cluster: cluster name stamped on every message.
        report_unreachable: called with a peer id when sending to it fails.
        channel_options: gRPC channel options (keepalive).
    """

    def __init__(
        self,
        *,
        self_id: str,
        peers: dict[str, str],
        cluster: str,
        report_unreachable: Callable[[str], None],
        channel_options: list[tuple[str, int]],
    ) -> None:
        self._self_id = self_id
        self._cluster = cluster
        self._report = report_unreachable
        self._peers = {
            pid: _Peer(pid, addr, channel_options) for pid, addr in peers.items() if pid != self_id
        }

    def start(self) -> None:
        """Starts one sender task per peer."""
        for peer in self._peers.values():
            peer.task = asyncio.get_running_loop().create_task(
                self._sender(peer), name=f"raft-send-{peer.peer_id}"
            )

    async def close(self) -> None:
        """Stops the sender tasks and closes the channels."""
        for peer in self._peers.values():
            if peer.task is not None:
                peer.task.cancel()
        for peer in self._peers.values():
            if peer.task is not None:
                try:
                    await peer.task
                except (asyncio.CancelledError, Exception):
                    pass
            await peer.channel.close(grace=None)

    def send(self, msg: Message) -> None:
        """Queues ``msg`` for its destination; never blocks (drops the oldest when full)."""
        peer = self._peers.get(msg.dst)
        if peer is None:
            log.warning("no peer %s for raft message %s", msg.dst, msg.type.value)
            return
        peer.outbox.append(to_proto(msg, self._cluster))
        peer.ready.set()

    async def _messages(self, peer: _Peer) -> AsyncIterator[peer_pb2.RaftMessage]:
        while True:
            while peer.outbox:
                yield peer.outbox.popleft()
            peer.ready.clear()
            await peer.ready.wait()

    async def _sender(self, peer: _Peer) -> None:
        retrying = AsyncRetrying(
            wait=wait_random_exponential(multiplier=0.05, max=1.0),
            retry=retry_if_exception_type((grpc.aio.AioRpcError, _StreamBroken)),
        )
        async for attempt in retrying:
            with attempt:
                call = peer.stub.Raft(self._messages(peer))
                try:
                    await call
                except grpc.aio.AioRpcError as e:
                    if peer.connected or attempt.retry_state.attempt_number == 3:
                        log.info(
                            "raft stream to %s (%s) broke: %s",
                            peer.peer_id,
                            peer.address,
                            e.code().name,
                        )
                    peer.connected = False
                    # Messages queued for a dead peer are stale by the time it is back.
                    peer.outbox.clear()
                    self._report(peer.peer_id)
                    raise
                raise _StreamBroken()


class PeerServicer(peer_pb2_grpc.PeerServicer):
    """Receives Raft messages from other replicas and steps them into the driver.

    Args:
        cluster: this cluster's name; messages stamped with another are refused.
        deliver: called with each decoded message.
        known: the configured replica ids; other senders are refused.
    """

    def __init__(
        self, *, cluster: str, deliver: Callable[[Message], None], known: set[str]
    ) -> None:
        self._cluster = cluster
        self._deliver = deliver
        self._known = known

    async def Raft(
        self,
        request_iterator: AsyncIterator[peer_pb2.RaftMessage],
        context: grpc.aio.ServicerContext,
    ) -> peer_pb2.RaftStreamClosed:
        async for pb in request_iterator:
            if pb.cluster != self._cluster:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"cluster mismatch: this replica is in {self._cluster!r}, "
                    f"sender in {pb.cluster!r}",
                )
            if pb.src not in self._known:
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED, f"unknown replica {pb.src!r}"
                )
            try:
                msg = from_proto(pb)
            except ValueError as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad raft message: {e}")
            self._deliver(msg)
        return peer_pb2.RaftStreamClosed()
