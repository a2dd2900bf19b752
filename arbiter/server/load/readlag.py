"""How late this replica reads heartbeats: queueing delay from the nodes' send times.

A replica that falls behind leaves heartbeats queued where its event loop does
not see them (gRPC's receive buffers, HTTP/2 flow control): its loop turns on
time, each turn reading a slice of a growing queue, so the loop's lateness
(:mod:`arbiter.server.load.looplag`) reads small while every node's heartbeats
reach the detector later and later. Measured in a 3,000-node join storm: acks
25 to 30 s late, thousands of nodes suspected for a silence the replica
itself made. This module measures that delay so that no node is suspected
for it (observer rule 6, Lifeguard's local health: Dadgar, Phillips and
Currey, "Lifeguard: Local Health Awareness for More Accurate Failure
Detection", DSN Workshops 2018, arXiv:1707.00788).

Rules:

1. Queueing delay, as LEDBAT measures it (RFC 6817, section 3.4: one-way
   delay minus a base delay): a heartbeat carries its node's wall clock at
   sending (``send_time_unix``); ``d = receive wall time - send time`` holds
   the clocks' offset plus the network delay plus the time it waited to be
   read. Per stream, the base is the smallest ``d`` seen over the last one
   to two minutes (two buckets of :data:`BASE_BUCKET` seconds, as RFC 6817's
   base delay history, so a clock stepped backwards is forgotten), and
   ``d - base`` is the heartbeat's queueing delay: the offset cancels, so no
   clock synchronisation is assumed. Heartbeats without a send time (0) are
   not measured.
1a. A stream born while the replica is behind (a join storm) has no
   uncongested heartbeat to take its base from: its first heartbeat already
   waited about as long as the others read now. So its base starts at its
   first ``d`` minus the replica's read lag at that moment (rule 2, from the
   streams already measured), and falls to any smaller ``d`` later. Without
   this a storm's streams, all born late, each took their own delay for a base
   and the replica read no lag while it was 10 s behind (3,000 nodes).
2. The replica's read lag is the median queueing delay of the last
   :data:`WINDOW` heartbeats read, when the latest was read less than
   :data:`STALE` seconds ago (else 0: a loop that reads nothing is the loop
   lag monitor's to see). The median, not the maximum: one node with a slow
   link or a wrong clock delays its own heartbeats only; a replica behind
   delays everyone's.
3. The driver takes it as a lateness source (``Driver.add_lateness_source``):
   the detectors' silence is measured up to ``now`` minus it, bounded by the
   core (``ReplicaSettings.max_lateness``).

Each ingest worker measures its own streams the same way and stamps its
batches with it (``arbiter/server/ingest/worker.py`` rule 7,
``arbiter/server/ingest/lateness.py`` rule 1).
"""

from __future__ import annotations

import math
from array import array

__all__ = ["BASE_BUCKET", "STALE", "WINDOW", "ReadLag", "StreamBase"]

# Seconds of one bucket of a stream's base delay history (rule 1).
BASE_BUCKET = 60.0
# Heartbeats whose queueing delays make up the read lag (rule 2).
WINDOW = 64
# Seconds after the latest heartbeat read when the read lag counts no more (rule 2).
STALE = 1.0


class StreamBase:
    """One stream's base delay (rule 1): the smallest ``receive - send`` over the
    current and the previous bucket of :data:`BASE_BUCKET` seconds."""

    __slots__ = ("_current", "_previous", "_rotate_at")

    def __init__(self) -> None:
        self._current = math.inf
        self._previous = math.inf
        self._rotate_at = -math.inf

    def queued(self, delay: float, now: float, lag: ReadLag | None = None) -> float:
        """The queueing delay of one heartbeat, seconds (>= 0).

        Args:
            delay: receive wall time minus the heartbeat's send time, seconds
                (any sign: the clocks' offset is in it).
            now: monotonic seconds, for the buckets.
            lag: the replica's read lag, read at the stream's first heartbeat
                only (rule 1a); None: the first heartbeat is the base.
        """
        if self._rotate_at == -math.inf and lag is not None:  # rule 1a
            self._current = delay - lag.lateness(now)
        if now >= self._rotate_at:
            self._previous, self._current = self._current, math.inf
            self._rotate_at = now + BASE_BUCKET
        if delay < self._current:
            self._current = delay
        base = self._current if self._current < self._previous else self._previous
        return delay - base


class ReadLag:
    """The replica's read lag (rule 2), fed one queueing delay per heartbeat read.

    Args:
        window: heartbeats whose delays are kept (> 0).
        stale: seconds after the latest sample when the lag reads 0 (> 0).

    Raises:
        ValueError: a window or stale that is not positive.
    """

    __slots__ = ("_at", "_cache", "_i", "_n", "_ring", "stale")

    def __init__(self, window: int = WINDOW, stale: float = STALE) -> None:
        if window <= 0 or not stale > 0:
            raise ValueError(f"need window > 0 and stale > 0, got {window}, {stale}")
        self._ring = array("d", bytes(8 * window))
        self._i = 0
        self._n = 0
        self._at = -math.inf
        self._cache: tuple[float, float] | None = None  # (at, lag) of the last median
        self.stale = stale

    def add(self, queued: float, now: float) -> None:
        """Records one heartbeat's queueing delay (seconds, >= 0) read at ``now``
        (monotonic seconds)."""
        ring = self._ring
        ring[self._i] = queued
        self._i = (self._i + 1) % len(ring)
        if self._n < len(ring):
            self._n += 1
        self._at = now
        self._cache = None

    def lateness(self, now: float) -> float:
        """The read lag at ``now`` (monotonic seconds), seconds (>= 0): the median of the
        kept delays, 0 when nothing was read for ``stale`` seconds."""
        if self._n == 0 or now - self._at > self.stale:
            return 0.0
        if self._cache is None:
            kept = sorted(self._ring[: self._n])
            self._cache = (self._at, kept[len(kept) // 2])
        return max(0.0, self._cache[1])
