"""A worker's heartbeats to the consensus process in batches, and their verdicts back.

Rules:

1. A heartbeat waits for its verdict (:meth:`Batcher.ask`): the lease in an
   ack is a promise of the detector that holds the node (observer rule 4),
   so it comes from the consensus process, never from a cache here. Each
   stream has at most one heartbeat waiting, so what waits is bounded by
   the streams open.
2. A batch leaves ``FLUSH_AFTER`` seconds after its first heartbeat, or at
   once with ``MAX_BATCH`` heartbeats, whichever comes first; with nothing
   to send, an empty batch leaves every ``IDLE_FLUSH`` seconds (the
   consensus process's horizon, :mod:`arbiter.server.ingest.lateness`).
   Every batch is stamped with its send time and carries the worker's own
   lateness at that moment (``lateness``: its loop's stalls and its streams'
   read lag, worker.py rule 7): a worker starved of CPU wakes, flushes an
   empty batch on time and only then reads the heartbeats gRPC kept for it,
   so its send time alone says more than it has heard.
3. The counts of heartbeats read, acks written and streams open since the
   last batch ride on each batch, and add up in the consensus process's
   counters (:class:`arbiter.server.consensus.counters.Counters`), and so does the
   worker's latest load sample (``monitor``: utilisation, time on a CPU), which
   the consensus process's load monitor takes the maximum with
   (:mod:`arbiter.server.load.monitor` rule 1), and the inter-arrival histogram of
   the heartbeats read since the last batch (``interarrival``), which adds up
   in the consensus process's (the metric ``membership_heartbeat_interarrival_seconds``).
4. When the channel is gone, every heartbeat waiting fails with
   :class:`ChannelClosed` (its stream ends with UNAVAILABLE) and so does
   every later one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from arbiter.server.consensus.counters import INTERARRIVAL_BUCKETS, Buckets
from arbiter.server.ingest import frames
from arbiter.server.ingest.lateness import IDLE_FLUSH

__all__ = ["FLUSH_AFTER", "MAX_BATCH", "Batcher", "ChannelClosed", "ReplicaStatus"]

FLUSH_AFTER = 0.002  # seconds a heartbeat waits for others to share its batch
MAX_BATCH = 256  # heartbeats in one batch at most


class ChannelClosed(Exception):
    """The channel to the consensus process is gone (rule 4)."""


class ReplicaStatus:
    """The replica's status as one VERDICTS frame gave it (frames.STATUS), with the
    arbiter set on the wire (protobuf messages, built once per configuration)."""

    __slots__ = (
        "arbiters",
        "base",
        "config_index",
        "epoch",
        "in_quorum",
        "instance",
        "interval",
        "leader",
    )

    def __init__(self, status: tuple[Any, ...], arbiters: list[Any]) -> None:
        (
            self.epoch,
            self.in_quorum,
            self.leader,
            self.interval,
            self.instance,
            self.config_index,
            _,
        ) = status
        self.arbiters = arbiters
        self.base = b""  # the ack's fields common to the batch, encoded (worker.py rule 4)


class Batcher:
    """Heartbeats out in batches, verdicts back (module rules); one per worker.

    Args:
        write: writes one frame's bytes to the channel (must not block).
        make_arbiters: the wire form of a VERDICTS frame's arbiter tuples
            (``(id, address, voter)``).
        prepare: called once with each batch's :class:`ReplicaStatus` before its
            heartbeats are resolved (the worker encodes the acks' common part).
    """

    def __init__(self, write: Any, make_arbiters: Any, prepare: Any = None) -> None:
        self._write = write
        self._make_arbiters = make_arbiters
        self.prepare = prepare
        self._loop = asyncio.get_running_loop()
        self._entries: list[tuple[Any, ...]] = []
        self._futures: list[asyncio.Future[tuple[Any, ReplicaStatus]]] = []
        self._closed_tokens: list[int] = []
        self._in_flight: dict[int, list[asyncio.Future[tuple[Any, ReplicaStatus]]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._batch_id = 0
        self._last_sent = time.monotonic()
        self._arbiters: tuple[int, list[Any]] = (-1, [])
        self.closed: BaseException | None = None
        self.heartbeats = 0  # read since the last batch (rule 3)
        self.acks = 0
        self.streams = 0  # open now
        self.batches = 0
        self.monitor: Any = None  # the worker's LoadMonitor (rule 3); None: load 0
        # Seconds of the recent past this worker could not hear, at monotonic now
        # (rule 2; worker.py rule 7).
        self.lateness: Callable[[float], float] = lambda now: 0.0
        self.interarrival = Buckets(INTERARRIVAL_BUCKETS)  # since the last batch (rule 3)

    def ask(self, entry: tuple[Any, ...]) -> asyncio.Future[tuple[Any, ReplicaStatus]]:
        """Queues one heartbeat (frames.ENTRY); the future gives (verdict, status).

        Raises:
            ChannelClosed: the channel is gone (rule 4).
        """
        if self.closed is not None:
            raise ChannelClosed(str(self.closed))
        fut: asyncio.Future[tuple[Any, ReplicaStatus]] = self._loop.create_future()
        self._entries.append(entry)
        self._futures.append(fut)
        if len(self._entries) >= MAX_BATCH:
            self.flush()
        elif self._timer is None:
            self._timer = self._loop.call_later(FLUSH_AFTER, self.flush)
        return fut

    def stream_closed(self, token: int) -> None:
        """The stream of ``token`` ended: the consensus process forgets its labels."""
        self._closed_tokens.append(token)

    def flush(self) -> None:
        """Sends what is queued now as one batch (rule 2), an empty one too."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.closed is not None:
            return
        self._batch_id += 1
        now = time.monotonic()
        entries, self._entries = self._entries, []
        futures, self._futures = self._futures, []
        closed, self._closed_tokens = self._closed_tokens, []
        counts = (self.heartbeats, self.acks, self.streams)
        self.heartbeats = self.acks = 0
        self._last_sent = now
        self.batches += 1
        if futures:
            self._in_flight[self._batch_id] = futures
        m = self.monitor
        load = (0.0, 0.0) if m is None else (m.utilisation, m.cpu)
        ia, hist = self.interarrival, None
        if any(ia.counts):
            hist = (tuple(ia.counts), ia.sum)
            self.interarrival = Buckets(INTERARRIVAL_BUCKETS)
        late = self.lateness(now)  # rule 2
        self._write(
            frames.encode(
                frames.BATCH, self._batch_id, now, entries, closed, counts, load, hist, late
            )
        )

    async def run_idle(self) -> None:
        """Sends an empty batch whenever none left for IDLE_FLUSH seconds (rule 2)."""
        while self.closed is None:
            wait = self._last_sent + IDLE_FLUSH - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            self.flush()

    def on_verdicts(
        self, batch_id: int, verdicts: tuple[Any, ...], status: tuple[Any, ...]
    ) -> None:
        """Resolves the heartbeats of batch ``batch_id`` with their verdicts."""
        futures = self._in_flight.pop(batch_id, None)
        if futures is None:
            return
        index, arbiters = status[5], status[6]
        if arbiters is not None and index != self._arbiters[0]:
            self._arbiters = (index, self._make_arbiters(arbiters))
        st = ReplicaStatus(status, self._arbiters[1])
        if self.prepare is not None:
            self.prepare(st)
        for fut, verdict in zip(futures, verdicts, strict=True):
            if not fut.done():
                fut.set_result((verdict, st))

    def close(self, why: BaseException) -> None:
        """The channel is gone: every waiting and later heartbeat fails (rule 4)."""
        if self.closed is not None:
            return
        self.closed = why
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for fut in [*self._futures, *(f for fs in self._in_flight.values() for f in fs)]:
            if not fut.done():
                fut.set_exception(ChannelClosed(str(why)))
        self._futures, self._in_flight = [], {}
