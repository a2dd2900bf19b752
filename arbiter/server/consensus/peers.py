"""Replica-to-replica transport: Raft messages over one gRPC client stream per peer.

Raft messages are one-way and Raft tolerates loss, duplication and
reordering, so the transport is simple and never blocks the driver: each
peer has a bounded outbox; when it is full the oldest message is dropped.
Only the newest stream of a peer takes messages from its outbox.
A sender task per peer keeps a client stream open and reconnects with
jittered exponential backoff (tenacity's retry loop, waiting
:class:`membership.shared.backoff.Backoff`, the SDK's one formula); a failure is
reported to Raft as a hint (``report_unreachable``), never as a verdict.

A SNAPSHOT travels as consecutive chunks of at most ``SNAPSHOT_CHUNK`` bytes
on one stream (the server's receive limit is the public API's, 64 KiB by
default); the receiver reassembles them per stream and delivers one
message. A chunk lost to a full outbox or a broken stream leaves an
incomplete snapshot that is dropped; Raft sends the snapshot again.

The set of peers follows the arbiter configuration in force
(:meth:`PeerTransport.set_peers`, :attr:`PeerServicer.known`): a peer added
gets a sender task and a channel at once; a removed one's task is cancelled,
its outbox dropped and its channel closed ``LINGER`` seconds later (what
was queued for it, such as the commit of its own removal, still leaves); a
peer whose address changed is removed and added again at once. Messages
for a peer not in the set are dropped with a DEBUG line (Raft tolerates
loss).

A removed replica may never receive the entry that removed it (the leader
stops sending to it at once). The peer servicer therefore refuses a sender
that was in an earlier configuration and is in none now with
PERMISSION_DENIED ``replica X was removed from the arbiter group`` (the
``REMOVED`` text), and the transport reports such an answer with
``removed_by(peer)``; the server stops once a majority of its voters say so
(arbiter/server/app.py), as an etcd member told "removed" by its peers does.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from tenacity import AsyncRetrying, retry_if_exception_type

from arbiter.core.raft import Message, MessageType
from arbiter.server.consensus.peercodec import (
    SNAPSHOT_CHUNK,
    SnapshotAssembler,
    from_proto,
    to_protos,
)
from arbiter.server.net.authz import AllowAll, Authorizer
from arbiter.v1 import peer_pb2, peer_pb2_grpc
from membership.shared.backoff import Backoff

__all__ = [
    "SNAPSHOT_CHUNK",
    "PeerServicer",
    "PeerTransport",
    "SnapshotAssembler",
    "from_proto",
    "to_protos",
]

log = logging.getLogger("arbiter.peers")

OUTBOX_LIMIT = 1024
# Seconds a peer that left the configuration is still sent to (its queued messages).
LINGER = 1.0
# The refusal's words for a sender that was removed from the group (module docstring).
REMOVED = "was removed from the arbiter group"
# A stream that takes no queued message for STALL_LIMIT seconds is reopened.
STALL_CHECK = 0.5
STALL_LIMIT = 2.0


class _StreamBroken(Exception):
    pass


def _channel(
    address: str, options: list[tuple[str, int]], credentials: grpc.ChannelCredentials | None
) -> grpc.aio.Channel:
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, credentials, options=options)


class _Peer:
    def __init__(
        self,
        peer_id: str,
        address: str,
        options: list[tuple[str, int]],
        credentials: grpc.ChannelCredentials | None,
    ) -> None:
        self.peer_id = peer_id
        self.address = address
        self.outbox: collections.deque[peer_pb2.RaftMessage] = collections.deque(
            maxlen=OUTBOX_LIMIT
        )
        self.ready = asyncio.Event()
        self.options = options
        self.credentials = credentials
        self.channel = _channel(address, options, credentials)
        self.stub = peer_pb2_grpc.PeerStub(self.channel)
        self.task: asyncio.Task[None] | None = None
        self.connected = False
        self.refused = False
        # Bumped for every new stream; a request iterator of an older one stops.
        self.generation = 0
        # When the stream last took a message from the outbox (monotonic seconds).
        self.last_pull = 0.0
        # Set once it left the configuration: it is let go when this fires.
        self.linger: asyncio.TimerHandle | None = None


class PeerTransport:
    """Sends Raft messages to the other replicas.

    Args:
        self_id: this replica's id.
        peers: id -> ``host:port`` for every other replica.
        cluster: cluster name stamped on every message.
        report_unreachable: called with a peer id when sending to it fails.
        channel_options: gRPC channel options (keepalive).
        credentials: TLS client credentials (this replica's own certificate
            as the client certificate); None for plaintext.
    """

    def __init__(
        self,
        *,
        self_id: str,
        peers: dict[str, str],
        cluster: str,
        report_unreachable: Callable[[str], None],
        channel_options: list[tuple[str, int]],
        credentials: grpc.ChannelCredentials | None = None,
        removed_by: Callable[[str], None] = lambda peer: None,
    ) -> None:
        self._removed_by = removed_by
        self._self_id = self_id
        self._cluster = cluster
        self._report = report_unreachable
        self._credentials = credentials
        self._options = channel_options
        self._started = False
        self._closing: set[asyncio.Task[None]] = set()
        self._peers = {
            pid: _Peer(pid, addr, channel_options, credentials)
            for pid, addr in peers.items()
            if pid != self_id
        }

    @property
    def peers(self) -> dict[str, str]:
        """The peers sent to now: id -> ``host:port`` (this replica excluded)."""
        return {pid: p.address for pid, p in self._peers.items()}

    def set_peers(self, peers: dict[str, str]) -> None:
        """Follows a new configuration: opens streams to added peers, closes removed ones'.

        Args:
            peers: every replica of the configuration in force (voters and
                learners), id -> ``host:port``; this replica's own id is skipped.
        """
        wanted = {pid: addr for pid, addr in peers.items() if pid != self._self_id}
        for pid in list(self._peers):
            peer = self._peers[pid]
            if wanted.get(pid) == peer.address:
                if peer.linger is not None:  # back before it was let go
                    peer.linger.cancel()
                    peer.linger = None
            elif pid not in wanted and peer.linger is None:
                # Messages queued for it (the commit of its own removal) still leave.
                log.info("raft transport: %s (%s) left the configuration", pid, peer.address)
                peer.linger = asyncio.get_running_loop().call_later(LINGER, self._let_go, pid, peer)
            elif pid in wanted:  # another address: a new peer
                self._let_go(pid, peer)
        for pid, addr in wanted.items():
            if pid not in self._peers:
                log.info("raft transport: %s (%s) joined the configuration", pid, addr)
                peer = _Peer(pid, addr, self._options, self._credentials)
                self._peers[pid] = peer
                if self._started:
                    self._start_sender(peer)

    def _let_go(self, pid: str, peer: _Peer) -> None:
        if self._peers.get(pid) is peer:
            del self._peers[pid]
        task = asyncio.get_running_loop().create_task(self._retire(peer))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _retire(peer: _Peer) -> None:
        peer.outbox.clear()
        if peer.task is not None:
            peer.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await peer.task
        await peer.channel.close(grace=None)

    def _start_sender(self, peer: _Peer) -> None:
        peer.task = asyncio.get_running_loop().create_task(
            self._sender(peer), name=f"raft-send-{peer.peer_id}"
        )

    def set_credentials(self, credentials: grpc.ChannelCredentials) -> None:
        """New TLS client credentials (rotation): each peer's next connection uses
        them; a stream open now stays on its connection."""
        self._credentials = credentials

    async def _renew_channel(self, peer: _Peer) -> None:
        """Between two streams: a new channel when the credentials changed."""
        if peer.credentials is self._credentials:
            return
        old = peer.channel
        peer.credentials = self._credentials
        peer.channel = _channel(peer.address, peer.options, peer.credentials)
        peer.stub = peer_pb2_grpc.PeerStub(peer.channel)
        await old.close(grace=None)

    def start(self) -> None:
        """Starts one sender task per peer."""
        self._started = True
        for peer in self._peers.values():
            self._start_sender(peer)

    async def close(self) -> None:
        """Stops the sender tasks and closes the channels."""
        for task in list(self._closing):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for peer in self._peers.values():
            if peer.linger is not None:
                peer.linger.cancel()
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
        if peer is None:  # not (or no longer) in the configuration in force
            log.debug("no peer %s for raft message %s", msg.dst, msg.type.value)
            return
        if not peer.outbox:
            peer.last_pull = time.monotonic()  # the wait to be taken starts now
        peer.outbox.extend(to_protos(msg, self._cluster))
        peer.ready.set()

    async def _messages(self, peer: _Peer, generation: int) -> AsyncIterator[peer_pb2.RaftMessage]:
        # Only the newest stream may take messages. gRPC can keep pulling from
        # the iterator of a call that already failed; without this check such
        # stale readers stole (and lost) the first messages after every
        # reconnect, which delayed elections by seconds.
        while peer.generation == generation:
            while peer.outbox and peer.generation == generation:
                peer.last_pull = time.monotonic()
                head = peer.outbox[0]
                yield head
                # Resumed: gRPC wrote it. Only now is it taken off the outbox, so
                # a message handed to a call that failed is sent again by the next
                # stream (Raft ignores the rare duplicate) instead of being lost.
                if peer.outbox and peer.outbox[0] is head:
                    peer.outbox.popleft()
            if peer.generation != generation:
                return
            peer.last_pull = time.monotonic()
            peer.ready.clear()
            await peer.ready.wait()

    async def _await_call(self, peer: _Peer, call: Any) -> None:
        """Waits for the stream to end; cancels it when it stopped taking messages.

        A stream whose connection hangs (peer paused, half-open link) takes no
        more messages long before keepalive notices; Raft needs them now.
        """
        task = asyncio.ensure_future(call)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=STALL_CHECK)
                if done:
                    task.result()
                    return
                if peer.outbox and time.monotonic() - peer.last_pull > STALL_LIMIT:
                    log.warning(
                        "raft stream to %s took no message for %.1fs; reopening it",
                        peer.peer_id,
                        time.monotonic() - peer.last_pull,
                    )
                    call.cancel()
                    raise _StreamBroken()
        finally:
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()  # a call that failed as it was given up: retrieved, not logged
            # This stream is over: its request iterator must not take the
            # messages queued for the next one (during the backoff too).
            peer.generation += 1
            peer.ready.set()

    async def _sender(self, peer: _Peer) -> None:
        # Never ends by itself: a sender that died silently would leave Raft
        # unable to reach that peer (an election needs the followers to talk).
        while True:
            try:
                await self._stream(peer)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("raft sender to %s failed; restarting it", peer.peer_id)
                peer.outbox.clear()
                await asyncio.sleep(0.1)

    def _unreachable(self, peer: _Peer) -> None:
        try:
            self._report(peer.peer_id)
        except Exception:
            log.exception("reporting %s unreachable failed", peer.peer_id)

    async def _stream(self, peer: _Peer) -> None:
        retrying = AsyncRetrying(
            wait=Backoff(0.05, 1.0),
            retry=retry_if_exception_type((grpc.aio.AioRpcError, _StreamBroken)),
        )
        async for attempt in retrying:
            with attempt:
                await self._renew_channel(peer)
                peer.generation += 1
                peer.ready.set()  # stale readers wake, see the new generation and stop
                call = peer.stub.Raft(self._messages(peer, peer.generation))
                peer.last_pull = time.monotonic()
                try:
                    await self._await_call(peer, call)
                except grpc.aio.AioRpcError as e:
                    refused = e.code() in (
                        grpc.StatusCode.FAILED_PRECONDITION,
                        grpc.StatusCode.PERMISSION_DENIED,
                    )
                    if REMOVED in (e.details() or ""):
                        self._removed_by(peer.peer_id)
                    if refused and not peer.refused:
                        peer.refused = True  # once: it is retried for ever
                        log.error(
                            "replica %s (%s) refuses our raft traffic: %s",
                            peer.peer_id,
                            peer.address,
                            e.details(),
                        )
                    elif peer.connected or attempt.retry_state.attempt_number == 3:
                        log.info(
                            "raft stream to %s (%s) broke: %s",
                            peer.peer_id,
                            peer.address,
                            e.code().name,
                        )
                    peer.connected = False
                    # The outbox is kept (it is bounded): a message queued while
                    # the channel reconnects (a vote, say) is still current when
                    # the next attempt succeeds; an old one is harmless to Raft.
                    self._unreachable(peer)
                    raise
                raise _StreamBroken()


class PeerServicer(peer_pb2_grpc.PeerServicer):
    """Receives Raft messages from other replicas and steps them into the driver.

    Args:
        cluster: this cluster's name; messages stamped with another are refused.
        deliver: called with each decoded message.
        known: the replica ids of the configuration in force; other senders
            are refused. Replaced as the configuration changes (:attr:`known`).
        authz: who may send as which replica (checked on each stream's first
            message: under mutual TLS the certificate must be ``arbiter/<src>``;
            a later message claiming another ``src`` ends the stream).
    """

    def __init__(
        self,
        *,
        cluster: str,
        deliver: Callable[[Message], None],
        known: set[str],
        authz: Authorizer | None = None,
    ) -> None:
        self.authz: Authorizer = authz or AllowAll()
        self._cluster = cluster
        self._deliver = deliver
        self._refused: set[str] = set()
        self.known = known
        # Replicas of an earlier configuration that are in none now (REMOVED).
        self.removed: set[str] = set()
        self._closing = False

    def close(self) -> None:
        """Shutdown: every Raft stream ends at its next message (peers send one every
        Raft heartbeat interval), so none is still open when the server stops and
        none has to be cancelled mid-call."""
        self._closing = True

    def _refuse(self, src: str, why: str) -> None:
        if src not in self._refused:  # once per sender: it retries forever
            self._refused.add(src)
            # A replica removed on purpose is a planned change, not a fault.
            log.log(
                logging.WARNING if src in self.removed else logging.ERROR,
                "refusing raft traffic: %s",
                why,
            )

    async def Raft(
        self,
        request_iterator: AsyncIterator[peer_pb2.RaftMessage],
        context: grpc.aio.ServicerContext,
    ) -> peer_pb2.RaftStreamClosed:
        assembler = SnapshotAssembler()
        sender: str | None = None
        async for pb in request_iterator:
            if self._closing:
                break
            if sender is None:
                refusal = self.authz.replica(context, pb.src)
                if refusal is not None:
                    self._refuse(f"tls:{pb.src}", f"{context.peer()} as {pb.src}: {refusal}")
                    await context.abort(refusal.code, str(refusal))
                sender = pb.src
            elif pb.src != sender:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"src changed from {sender!r} to {pb.src!r} within one raft stream",
                )
            if pb.cluster != self._cluster:
                why = (
                    f"replica {pb.src!r} is in cluster {pb.cluster!r}, this one in "
                    f"{self._cluster!r} (name@digest of --peers): every replica must be "
                    "given the same --cluster and --peers"
                )
                self._refuse(pb.src, why)
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, why)
            if pb.src not in self.known:
                why = f"unknown replica {pb.src!r} (not in the configuration in force)"
                if pb.src in self.removed:
                    why = f"replica {pb.src!r} {REMOVED} (not in the configuration in force)"
                self._refuse(pb.src, why)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
            try:
                if pb.type == MessageType.SNAPSHOT.value:
                    whole = assembler.add(pb)
                    if whole is None:
                        continue
                    msg = whole
                else:
                    msg = from_proto(pb)
            except ValueError as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad raft message: {e}")
            self._deliver(msg)
        return peer_pb2.RaftStreamClosed()
