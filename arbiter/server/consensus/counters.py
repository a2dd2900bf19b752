"""What a replica counts as it goes, for its metrics (:mod:`arbiter.server.ops.metrics`, rule 1).

Plain integers and bucket lists touched on the event loop thread, with no
prometheus-client call on the hot path; the collector in
:mod:`arbiter.server.ops.metrics` reads them when Prometheus scrapes. Kept apart
so that the driver, which counts, does not import the metrics server.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Sequence

from prometheus_client.core import HistogramMetricFamily

__all__ = [
    "DELIVERY_BUCKETS",
    "FSYNC_BUCKETS",
    "INTERARRIVAL_BUCKETS",
    "LOOP_LAG_BUCKETS",
    "Buckets",
    "Counters",
]

# Bucket upper bounds (seconds). Heartbeats come every 0.15 s by default
# (up to max_heartbeat_interval, 0.6 s): the buckets resolve the interval
# and the gaps that lead to a suspicion (D = 0.75 s by default).
INTERARRIVAL_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)
# One fsync of a Ready: milliseconds on an SSD, tens on a busy disk.
FSYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# Event-loop lag per wake-up of the monitor (0.05 s period): 0.2 s is a stall.
LOOP_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5)
# From applying a committed change to handing it to a subscriber's stream: fine
# around the 50 ms a fan-out to 1,000 subscribers is held to (issue 12).
DELIVERY_BUCKETS = (
    *(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.035, 0.05, 0.075, 0.1),
    *(0.25, 0.5, 1.0, 2.5),
)
# Changes whose apply time is kept for the commit-to-subscriber latency.
_APPLIED_KEPT = 1024


class Buckets:
    """A histogram as plain numbers: one bisect and two additions per observation.

    Args:
        bounds: the buckets' upper bounds, increasing (seconds); +Inf is added.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"bucket bounds must increase strictly: {bounds}")
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Adds one observation (seconds)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def family(self, name: str, documentation: str, arbiter: str) -> HistogramMetricFamily:
        """The Prometheus histogram (cumulative buckets) of what was observed so far,
        labelled ``arbiter``."""
        counts = list(self.counts)  # one copy: the loop may observe meanwhile
        total = 0
        buckets: list[tuple[str, float]] = []
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            total += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), total))
        fam = HistogramMetricFamily(name, documentation, labels=["arbiter"])
        fam.add_metric([arbiter], buckets, self.sum)
        return fam


class Counters:
    """What the replica counts as it goes (rule 1); read by :class:`ReplicaCollector`.

    Attributes:
        heartbeats: heartbeats received on every stream (refused ones included).
        acks: heartbeat acks handed to gRPC.
        deaths: members this replica applied as DEAD (not while replaying its log).
        turn_failures: driver turns that raised (a bug; logged, and the loop went on).
        interarrival: seconds between two heartbeats of one stream.
        fsync: seconds per write of a Ready (SQLite commit with fsync).
        loop_lag: seconds the event loop woke up late, per monitor wake-up.
        delivery: seconds from applying a committed change here to handing it
            to a subscriber's stream (per subscriber).
    """

    __slots__ = (
        "_applied",
        "acks",
        "deaths",
        "delivery",
        "fsync",
        "heartbeats",
        "interarrival",
        "loop_lag",
        "turn_failures",
    )

    def __init__(self) -> None:
        self.heartbeats = 0
        self.acks = 0
        self.deaths = 0
        self.turn_failures = 0
        self.interarrival = Buckets(INTERARRIVAL_BUCKETS)
        self.fsync = Buckets(FSYNC_BUCKETS)
        self.loop_lag = Buckets(LOOP_LAG_BUCKETS)
        self.delivery = Buckets(DELIVERY_BUCKETS)
        self._applied: collections.OrderedDict[int, float] = collections.OrderedDict()

    def applied(self, epoch: int, now: float) -> None:
        """Records that the change to ``epoch`` was applied at ``now`` (monotonic seconds)."""
        self._applied[epoch] = now
        if len(self._applied) > _APPLIED_KEPT:
            self._applied.popitem(last=False)

    def delivered(self, epoch: int, now: float) -> None:
        """A subscriber's stream took the change to ``epoch`` at ``now``: observes the latency."""
        at = self._applied.get(epoch)
        if at is not None:
            self.delivery.observe(max(0.0, now - at))
