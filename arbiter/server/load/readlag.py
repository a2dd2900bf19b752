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
1b. Streams from one host share its clock, so they share a base: the host's
   base is the smallest ``d`` of any of its streams over the last one to two
   minutes (:class:`HostBases`, keyed by the peer's address without its port),
   and a new stream's base starts no higher than its host's. Rule 1a alone
   reads the lag from streams already measured, and in a join storm those are
   the storm's own streams, every one born late. With the
   host's base a stream's first heartbeat is measured too: how long the
   stream waited to be accepted (rule 2a). A host whose clock runs ahead of
   another behind the same address (a NAT) makes the other's new streams read
   late by the difference until their own base takes over (one to two
   minutes): the replica then suspects later, never sooner.
2. The replica's read lag is the median queueing delay of the last
   :data:`WINDOW` heartbeats read, when the latest was read less than
   :data:`STALE` seconds ago (else 0: a loop that reads nothing is the loop
   lag monitor's to see). The median, not the maximum: one node with a slow
   link or a wrong clock delays its own heartbeats only; a replica behind
   delays everyone's.
2a. The accept lag. A replica behind in *accepting* streams reads its old
   streams on time, so their delays make the median of rule 2 small, while
   new streams wait: traced in a 1,000-node join under four busy loops, the
   first heartbeats a replica read waited 0.6, then 1.3, then 2.1 s over two
   seconds, its rule-2 lag read 0.07 s, and it suspected 162 nodes the log said
   were ALIVE but whose streams it had not read yet (observer rule 5); it read
   them 0.1 s later. So the first heartbeats of streams whose base came from
   their host (rule 1b: a measured delay, not rule 1a's echo of the lag) are
   kept apart, the last :data:`ACCEPT_WINDOW` of them, and the median of those
   read in the last :data:`ACCEPT_STALE` seconds is lag too:
   a stream waiting now is likely to wait about as long as the ones just
   accepted. Rule 1a reads only rule 2's median, so the accept lag cannot feed
   itself through new streams' bases.
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

__all__ = [
    "ACCEPT_STALE",
    "ACCEPT_WINDOW",
    "BASE_BUCKET",
    "STALE",
    "WINDOW",
    "HostBases",
    "ReadLag",
    "StreamBase",
    "host_of",
]

# Seconds of one bucket of a stream's base delay history (rule 1).
BASE_BUCKET = 60.0
# Heartbeats whose queueing delays make up the read lag (rule 2).
WINDOW = 64
# Seconds after the latest heartbeat read when the read lag counts no more (rule 2).
STALE = 1.0
# First heartbeats whose queueing delays make up the accept lag (rule 2a).
ACCEPT_WINDOW = 16
# Seconds a first heartbeat read counts in the accept lag (rule 2a).
ACCEPT_STALE = 2.0


class StreamBase:
    """One stream's base delay (rule 1): the smallest ``receive - send`` over the
    current and the previous bucket of :data:`BASE_BUCKET` seconds."""

    __slots__ = ("_current", "_previous", "_rotate_at")

    def __init__(self) -> None:
        self._current = math.inf
        self._previous = math.inf
        self._rotate_at = -math.inf

    def queued(
        self,
        delay: float,
        now: float,
        lag: ReadLag | None = None,
        host: StreamBase | None = None,
    ) -> float:
        """The queueing delay of one heartbeat, seconds (>= 0).

        Args:
            delay: receive wall time minus the heartbeat's send time, seconds
                (any sign: the clocks' offset is in it).
            now: monotonic seconds, for the buckets.
            lag: the replica's read lag, read at the stream's first heartbeat
                only (rule 1a), and given that heartbeat's delay when its base
                came from its host (rule 2a); None: the first heartbeat is the base.
            host: the base of the stream's host (rule 1b, from
                :meth:`HostBases.of`), updated with ``delay``; None: none.
        """
        measured = False  # rule 2a: a first heartbeat whose base came from its host
        if self._rotate_at == -math.inf:
            start = math.inf if lag is None else delay - lag.median(now)  # rule 1a
            if host is not None:
                floor = host.floor(now)  # rule 1b
                if floor < start:
                    start, measured = floor, True
            self._current = start
        if host is not None:
            host.see(delay, now)
        self.see(delay, now)
        base = self._current if self._current < self._previous else self._previous
        if measured and lag is not None:
            lag.accepted(delay - base, now)
        return delay - base

    def see(self, delay: float, now: float) -> None:
        """Takes one ``receive - send`` (seconds) at ``now`` (monotonic seconds) into
        the buckets (rule 1)."""
        if now >= self._rotate_at:
            self._previous, self._current = self._current, math.inf
            self._rotate_at = now + BASE_BUCKET
        if delay < self._current:
            self._current = delay

    def floor(self, now: float) -> float:
        """The base at ``now`` (monotonic seconds), seconds; infinite when nothing was
        seen in the last one to two buckets."""
        if now >= self._rotate_at + BASE_BUCKET:
            return math.inf  # both buckets are older than that
        if now >= self._rotate_at:
            return self._current  # the previous bucket has run out
        return self._current if self._current < self._previous else self._previous


def host_of(peer: str | None) -> str | None:
    """The host part of a gRPC peer address (``ipv4:10.0.0.7:50412`` ->
    ``ipv4:10.0.0.7``, ``ipv6:[::1]:50412`` -> ``ipv6:[::1]``); a unix socket's
    address whole; None for no address."""
    if not peer:
        return None
    if peer.startswith(("ipv4:", "ipv6:")):
        host, sep, port = peer.rpartition(":")
        if sep and port.isdigit():
            return host
    return peer


class HostBases:
    """The base delay of each peer host (rule 1b): one :class:`StreamBase` per host,
    shared by that host's streams. Hosts not seen for two buckets are forgotten
    (checked at most once a bucket), so memory follows the hosts of the last
    two minutes."""

    __slots__ = ("_hosts", "_prune_at")

    def __init__(self) -> None:
        self._hosts: dict[str, StreamBase] = {}
        self._prune_at = -math.inf

    def of(self, peer: str | None, now: float) -> StreamBase | None:
        """The base of ``peer``'s host (a gRPC peer address), None without an address.
        ``now``: monotonic seconds."""
        host = host_of(peer)
        if host is None:
            return None
        if now >= self._prune_at:
            self._prune_at = now + BASE_BUCKET
            stale = [h for h, b in self._hosts.items() if b.floor(now) == math.inf]
            for h in stale:
                del self._hosts[h]
        base = self._hosts.get(host)
        if base is None:
            base = self._hosts[host] = StreamBase()
        return base

    def __len__(self) -> int:
        return len(self._hosts)


class ReadLag:
    """The replica's read lag (rule 2), fed one queueing delay per heartbeat read.

    Args:
        window: heartbeats whose delays are kept (> 0).
        stale: seconds after the latest sample when the lag reads 0 (> 0).

    Raises:
        ValueError: a window or stale that is not positive.
    """

    __slots__ = ("_accept", "_at", "_cache", "_i", "_n", "_ring", "stale")

    def __init__(self, window: int = WINDOW, stale: float = STALE) -> None:
        if window <= 0 or not stale > 0:
            raise ValueError(f"need window > 0 and stale > 0, got {window}, {stale}")
        self._ring = array("d", bytes(8 * window))
        self._i = 0
        self._n = 0
        self._at = -math.inf
        self._cache: tuple[float, float] | None = None  # (at, lag) of the last median
        self.stale = stale
        self._accept = _Median(ACCEPT_WINDOW, ACCEPT_STALE)  # rule 2a

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

    def accepted(self, queued: float, now: float) -> None:
        """Records the queueing delay (seconds, >= 0) of a stream's first heartbeat read
        at ``now`` (monotonic seconds), measured against its host's base (rule 2a)."""
        self._accept.add(queued, now)

    def lateness(self, now: float) -> float:
        """The read lag at ``now`` (monotonic seconds), seconds (>= 0): the larger of
        :meth:`median` and :meth:`accept_lag`."""
        median, accept = self.median(now), self.accept_lag(now)
        return accept if accept > median else median

    def accept_lag(self, now: float) -> float:
        """Rule 2a at ``now`` (monotonic seconds), seconds (>= 0): the median delay of the
        last first heartbeats measured that were read in the last :data:`ACCEPT_STALE` s
        (0 without any)."""
        return self._accept.value(now)

    def median(self, now: float) -> float:
        """Rule 2 at ``now`` (monotonic seconds), seconds (>= 0): the median of the
        kept delays, 0 when nothing was read for ``stale`` seconds."""
        if self._n == 0 or now - self._at > self.stale:
            return 0.0
        if self._cache is None:
            kept = sorted(self._ring[: self._n])
            self._cache = (self._at, kept[len(kept) // 2])
        return max(0.0, self._cache[1])


class _Median:
    """The median of the last ``window`` samples taken less than ``stale`` seconds ago
    (rule 2a; fed once per stream, not per heartbeat)."""

    __slots__ = ("_at", "_i", "_ring", "_window", "stale")

    def __init__(self, window: int, stale: float) -> None:
        self._ring: list[tuple[float, float]] = []  # (monotonic seconds, sample)
        self._window = window
        self._i = 0
        self._at = -math.inf
        self.stale = stale

    def add(self, sample: float, now: float) -> None:
        """Takes one sample (seconds) at ``now`` (monotonic seconds)."""
        ring = self._ring
        if len(ring) < self._window:
            ring.append((now, sample))
        else:
            ring[self._i] = (now, sample)
            self._i = (self._i + 1) % self._window
        self._at = now

    def value(self, now: float) -> float:
        """The median at ``now`` of the samples younger than ``stale``, 0 without any."""
        if now - self._at > self.stale:
            return 0.0  # the common case, and the cheap one
        since = now - self.stale
        kept = sorted(v for at, v in self._ring if at >= since)
        return max(0.0, kept[len(kept) // 2]) if kept else 0.0
