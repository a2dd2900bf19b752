"""A node's heartbeat link to one arbiter: its streams, supervised, hedged when one wedges.

One :class:`HeartbeatLink` per arbiter, all independent: a link that is
stuck never delays another: one frozen arbiter must not stop the heartbeats
to the others (failure class "keepalive starved by blocked writes" in
docs/architecture.md: on a dead link writes block, and even gRPC's keepalive
ping waits behind them, grpc/grpc#15871).

Rules:

1. Each heartbeat stream has a TCP connection of its own
   (:meth:`membership._arbiters.transport.Channels.fresh`); closing the stream closes
   its connection.
2. Every heartbeat is handed to every open stream that takes one (rule 3);
   each stream writes from a task of its own and writes only the newest
   heartbeat handed to it, so a stream whose writes are stuck (flow control
   on a dead link) drops stale heartbeats instead of queueing them, and
   blocks nothing else.
3. Which stream takes a heartbeat, and when a stream is hedged or abandoned,
   is decided by :mod:`membership._node.linkrules` (sans-I/O): a stream carries one
   heartbeat at a time until an ack grants a lease (slow start); a silent
   stream gets a second one on a fresh connection (hedging, after
   ``hedge_after``) and is given up (after ``ack_timeout``), but only while
   another arbiter's link answers; when every link is silent alike, a stream
   is given up after ``stall_timeout`` only. A stream is abandoned even while
   its writes are stuck.
4. Once a hedge and the stream beside it are both open, the first to ack
   wins and the other is closed with its connection.
5. After a stream that never acked, the next one waits a jittered
   exponential backoff (:class:`membership.shared.backoff.Backoff`); after one that
   was healthy, a short jitter only. A refusal that carries a retry hint
   (RESOURCE_EXHAUSTED with ``grpc-retry-pushback-ms``, gRFC A6: an arbiter
   shedding new nodes) is honoured: the next stream waits at least that
   long, logged at INFO, not as an error (the node heartbeats the other
   arbiters meanwhile).
6. A stream speaks for one incarnation (the replica refuses another on it):
   when the node moves to a new incarnation, its streams are closed and a
   new one is opened at once for the new life.
7. The link never ends silently: it logs what failed and goes on, until the
   session ends or the client closes. A refusal that names a cluster
   mismatch (FAILED_PRECONDITION from a replica of another cluster) ends it
   with :class:`~membership.shared.errors.ClusterMismatch`, for the client to end;
   so does a refusal of this client's certificate (PERMISSION_DENIED or
   UNAUTHENTICATED), with :class:`~membership.shared.errors.PermissionDenied`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from membership._aiotools import reap
from membership._arbiters.transport import Channels
from membership._node.linkrules import (
    LinkTimings,
    StreamClock,
    abandon_after,
    hedge_due,
    next_check,
)
from membership.shared.backoff import Backoff, retry_pushback
from membership.shared.errors import ClusterMismatch, PermissionDenied
from membership.v1 import membership_pb2 as pb

__all__ = ["HeartbeatLink", "LinkTimings"]

log = logging.getLogger("membership.heartbeats")


class LinkOwner(Protocol):
    """What a link needs from the client that owns it."""

    def timings(self) -> LinkTimings:
        """The current timings."""
        ...

    def incarnation(self) -> int:
        """The incarnation the node heartbeats at now."""
        ...

    def next_request(self, address: str, now: float) -> tuple[int, pb.HeartbeatRequest]:
        """The next heartbeat for ``address``, recorded as sent at ``now``: (seq, request)."""
        ...

    def others_answer(self, address: str, now: float) -> bool:
        """True when the link to ``address`` is the odd one out at ``now``: another
        arbiter's answers (:func:`membership._node.linkrules.odd_one_out`)."""
        ...

    def on_ack(self, address: str, ack: pb.HeartbeatAck, now: float) -> None:
        """Takes one ack (may raise ClusterMismatch)."""
        ...

    def expected_cluster(self) -> str:
        """The cluster identity every arbiter must have ("" while unknown)."""
        ...

    def finished(self) -> bool:
        """True once heartbeats must stop (session ended, client closing)."""
        ...


# A refusal of the caller's certificate: no retry can change it.
_DENIED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)


class _Stream:
    """One heartbeat stream on a connection of its own (rules 1, 2)."""

    def __init__(
        self,
        address: str,
        channel: grpc.aio.Channel,
        call: grpc.aio.StreamStreamCall,
        on_ack: Callable[[_Stream, pb.HeartbeatAck], None],
        cluster: str,
        hedge: bool,
    ) -> None:
        self.address = address
        self.channel = channel
        self.call = call
        self.clock = StreamClock(hedge=hedge)  # acks and unacked heartbeats (rule 3)
        self.incarnation = 0  # of the heartbeats it carries (rule 6); 0 before the first
        self._pending: pb.HeartbeatRequest | None = None
        self._cluster = cluster
        self._wake = asyncio.Event()
        self._on_ack = on_ack
        loop = asyncio.get_running_loop()
        self.reader = loop.create_task(self._read(), name=f"heartbeat-read-{address}")
        self.writer = loop.create_task(self._write(), name=f"heartbeat-write-{address}")

    def offer(self, seq: int, request: pb.HeartbeatRequest, now: float) -> None:
        """Hands over the newest heartbeat; an older one not yet written is dropped."""
        self.incarnation = request.incarnation
        self.clock.sent(seq, now)
        self._pending = request
        self._wake.set()

    def ended(self) -> bool:
        """True once the stream is over (its reader or writer finished)."""
        return self.reader.done() or self.writer.done()

    def outcome(self) -> str:
        """Why an ended stream ended, in words."""
        for task in (self.reader, self.writer):
            if task.done() and not task.cancelled():
                exc = task.exception()
                if isinstance(exc, grpc.aio.AioRpcError):
                    return f"{exc.code().name}: {exc.details()}"
                if exc is not None:
                    return repr(exc)
        return "the arbiter ended the stream"

    def error(self) -> grpc.aio.AioRpcError | None:
        """The gRPC error the stream ended with, if any."""
        for task in (self.reader, self.writer):
            if task.done() and not task.cancelled():
                exc = task.exception()
                if isinstance(exc, grpc.aio.AioRpcError):
                    return exc
        return None

    async def _write(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            request, self._pending = self._pending, None
            if request is None:
                continue
            if self._cluster:
                # Checked by the replica before it acts on the heartbeat; once
                # per stream is enough (the replica checks every one that has it).
                request.cluster = self._cluster
                self._cluster = ""
            await self.call.write(request)

    async def _read(self) -> None:
        while True:
            ack = await self.call.read()
            if ack is grpc.aio.EOF:
                return
            self.clock.ack(ack.seq, time.monotonic(), ack.lease_seconds)
            self._on_ack(self, ack)

    async def close(self) -> None:
        """Cancels the call, stops both tasks and closes the connection."""
        self.call.cancel()
        await reap(self.reader)
        await reap(self.writer)
        await self.channel.close(grace=None)


class HeartbeatLink:
    """Heartbeats of one node to one arbiter (see the module rules).

    Args:
        address: the arbiter's ``host:port``.
        owner: the client (timings, requests, ack handling).
        channels: where fresh connections come from.
        backoff: the reconnect backoff (rule 5).

    Attributes:
        up: True while a stream of this link had an ack within the ack timeout.
        last_error: the latest failure, in words ("" when none since the last ack).
    """

    def __init__(
        self, address: str, *, owner: LinkOwner, channels: Channels, backoff: Backoff
    ) -> None:
        self.address = address
        self._owner = owner
        self._channels = channels
        self._backoff = backoff
        self._streams: list[_Stream] = []
        self._changed = asyncio.Event()
        self.up = False
        self.last_error = ""
        self._failures = 0
        self._pushback_until = 0.0  # monotonic; no new stream before it (rule 5)
        self._closing: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Supervises the link until the owner is finished (rule 7).

        Raises:
            ClusterMismatch: the arbiter belongs to another cluster.
            PermissionDenied: the arbiter refused our certificate for this node.
        """
        try:
            while not self._owner.finished():
                try:
                    await self._serve()
                except (asyncio.CancelledError, ClusterMismatch, PermissionDenied):
                    raise
                except Exception:
                    log.exception("heartbeat link to %s failed; restarting it", self.address)
                    await self._drop_all()
                    await asyncio.sleep(self._backoff.maximum)
        finally:
            self.up = False
            await self._drop_all()

    # --- the loop ---------------------------------------------------------------------

    async def _serve(self) -> None:
        next_beat = time.monotonic()
        while not self._owner.finished():
            if not self._streams:
                if self._failures:
                    wait = self._backoff.delay(self._failures)
                    await asyncio.sleep(max(wait, self._pushback_until - time.monotonic()))
                    if self._owner.finished():
                        return
                self._open()
                next_beat = time.monotonic()
            now = time.monotonic()
            t = self._owner.timings()
            if now >= next_beat:
                self._beat(now)
                next_beat = now + t.interval
            # Wake for the next heartbeat, the next hedge or abandon deadline,
            # an ack that changes the streams, or a stream that ended.
            others = self._owner.others_answer(self.address, now)
            deadline = min(next_beat, next_check(self.clocks(), t, others, now))
            self._changed.clear()
            ended: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._changed.wait())]
            ended += [st.reader for st in self._streams] + [st.writer for st in self._streams]
            await asyncio.wait(
                ended, timeout=max(0.0, deadline - time.monotonic()), return_when="FIRST_COMPLETED"
            )
            ended[0].cancel()
            await self._check(time.monotonic(), t)

    def clocks(self) -> list[StreamClock]:
        """What the link rules know of each open stream (:mod:`membership._node.linkrules`)."""
        return [st.clock for st in self._streams]

    def _beat(self, now: float) -> None:
        incarnation = self._owner.incarnation()
        stale = [st for st in self._streams if st.incarnation not in (0, incarnation)]
        if stale:
            # Rule 6: a new life gets a new stream, at once (no backoff: nothing failed).
            for st in stale:
                self._close_later(st)
            if not self._streams:
                self._open()
        takers = [st for st in self._streams if st.clock.takes_heartbeat()]
        if not takers:
            return  # rule 3 (slow start): the only stream waits for its first ack
        seq, request = self._owner.next_request(self.address, now)
        for st in takers:
            st.offer(seq, request, now)

    def _close_later(self, st: _Stream) -> None:
        """Takes ``st`` out of the link and closes it in the background."""
        self._streams.remove(st)
        task = asyncio.get_running_loop().create_task(st.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _open(self) -> _Stream:
        channel, stub = self._channels.fresh(self.address)
        st = _Stream(
            self.address,
            channel,
            stub.Heartbeat(),
            self._acked,
            self._owner.expected_cluster(),
            hedge=bool(self._streams),
        )
        self._streams.append(st)
        return st

    async def _check(self, now: float, t: LinkTimings) -> None:
        others = self._owner.others_answer(self.address, now)
        for st in list(self._streams):
            silence = st.clock.silence(now)
            if st.ended():
                await self._ended(st)
            elif silence > abandon_after(st.clock, t, others):
                # Rule 3 (linkrules rule 4): abandoned even if its writes are stuck.
                reason = f"no ack for {silence:.2f}s"
                if not others:
                    reason += " (no arbiter answers: the node or every arbiter stalls)"
                if st.clock.acked:
                    log.info("heartbeat stream to %s ended: %s", self.address, reason)
                self._fail(st, f"no ack from {self.address} for {silence:.2f}s")
                await self._drop(st)
        if hedge_due(self.clocks(), t, others, now):
            # Rule 3 (linkrules rule 3): a healthy stream went silent while another
            # arbiter answers: a fresh connection beside it. (A stream that never
            # acked is not hedged: its failure goes through the backoff, or an
            # unreachable arbiter would get a new connection every hedge_after.)
            log.info(
                "no ack from %s for %.2fs: trying a new connection beside the old one",
                self.address,
                self._streams[0].clock.silence(now),
            )
            self._open()
            self._beat(now)

    async def _ended(self, st: _Stream) -> None:
        err = st.error()
        if err is not None and err.code() == grpc.StatusCode.FAILED_PRECONDITION:
            detail = err.details() or ""
            if "cluster mismatch" in detail:
                await self._drop(st)
                raise ClusterMismatch(f"{self.address}: {detail}")
        if err is not None and err.code() in _DENIED:
            await self._drop(st)
            raise PermissionDenied(f"{self.address}: {err.code().name}: {err.details()}")
        reason = st.outcome()
        pushback = retry_pushback(err.trailing_metadata()) if err is not None else None
        if pushback is not None and err is not None:
            # Rule 5: the arbiter sheds load and says when to come back.
            self._pushback_until = time.monotonic() + pushback
            log.info("arbiter %s asks us to retry in %.2fs: %s", self.address, pushback, reason)
        elif err is not None and err.code() in (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.FAILED_PRECONDITION,
        ):
            log.error("arbiter %s refused our heartbeats: %s", self.address, reason)
        elif st.clock.acked:
            log.info("heartbeat stream to %s ended: %s", self.address, reason)
        self._fail(st, reason)
        await self._drop(st)

    def _fail(self, st: _Stream, reason: str) -> None:
        self.last_error = reason
        if not st.clock.acked:
            self._failures += 1
        elif len(self._streams) == 1:
            self._failures = 1  # rule 5: a short jitter before the next stream
        if len(self._streams) == 1:
            self.up = False

    def _acked(self, st: _Stream, ack: pb.HeartbeatAck) -> None:
        now = time.monotonic()
        self._failures = 0
        losers = [other for other in self._streams if other is not st]
        if losers:
            # Rule 3: of two open streams, the first to ack wins.
            for other in losers:
                self._close_later(other)
            log.info(
                "heartbeats to %s go on over the %s connection",
                self.address,
                "new" if st.clock.hedge else "old",
            )
            self._changed.set()
        if not self.up:
            log.debug("heartbeat stream to %s is up", self.address)
        self.up = True
        self.last_error = ""
        self._owner.on_ack(self.address, ack, now)

    async def _drop(self, st: _Stream) -> None:
        if st in self._streams:
            self._streams.remove(st)
        await st.close()

    async def _drop_all(self) -> None:
        for st in list(self._streams):
            await self._drop(st)
        for task in list(self._closing):
            await reap(task)
