"""What a replica core needs besides Raft's own configuration: lease, retry, grace, retention.

Kept apart from :mod:`arbiter.core.replica` (which re-exports it) so that
the composition there stays within the module size the layering test sets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from arbiter.core.compaction import MIN_COMPACT_BYTES
from arbiter.core.detection.interval import IntervalGovernor, LoadPolicy, load_cap
from arbiter.core.retention import RetentionPolicy

__all__ = ["ReplicaSettings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaSettings:
    """What a replica core needs besides Raft's own configuration.

    Attributes:
        lease: seconds of lease granted per accepted heartbeat (<= detection time).
        observation_retry: seconds before an uncommitted observation is proposed again.
        restart_grace: seconds after start without casting suspicion (one maximum lease).
        heartbeat_interval: seconds between heartbeats suggested to nodes of a
            small cluster (H0); the detector scales its timeout with it.
        snapshot_every: applied log entries between two snapshots of the
            state machine (rule 5); 0 never snapshots.
        snapshot_bytes: the fewest bytes of applied entries that call for a
            snapshot before ``snapshot_every`` entries, when they are also at
            least the last snapshot's size (:mod:`arbiter.core.compaction`).
        heartbeat_budget: heartbeats per second this replica should handle
            at most; the suggested interval grows with the number of nodes
            to stay within it (:func:`arbiter.core.detection.interval.suggest_interval`);
            ``inf`` always suggests ``heartbeat_interval``.
        max_heartbeat_interval: H_max, the cap of the suggested interval up to
            ``heartbeat_budget * max_heartbeat_interval`` nodes, seconds (>=
            heartbeat_interval); it grows beyond (interval rule 3).
        max_nodes: the most nodes a replica tracks; the longest interval ever
            suggested or accepted is the load cap at this many
            (:attr:`ceiling`, interval rule 5); 0: ``max_heartbeat_interval``.
        load_policy: how the measured load moves the interval (interval rule 4).
        retention: when DEAD and LEFT records are forgotten (replica rule 8); the
            default forgets nothing.
        observation_batch_interval: seconds between two batches of held
            (joining) ALIVE observations on the leader; the other replicas
            follow its commits and wait at most twice this
            (:mod:`arbiter.core.batching`); 0 proposes every owed
            observation on every tick.
        max_grace: the longest grace window a node is granted, seconds
            (``arbiter/core/grace_windows.py``); an ask for more gets this much.
    """

    lease: float
    observation_retry: float
    restart_grace: float
    heartbeat_interval: float
    snapshot_every: int = 0
    snapshot_bytes: int = MIN_COMPACT_BYTES
    heartbeat_budget: float = math.inf
    max_heartbeat_interval: float = math.inf
    max_nodes: int = 0
    load_policy: LoadPolicy = field(default_factory=LoadPolicy)
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    observation_batch_interval: float = 0.0
    max_grace: float = 300.0

    @property
    def ceiling(self) -> float:
        """The longest interval suggested or accepted from a node, seconds (interval rule 5)."""
        if self.max_nodes <= 0 or math.isinf(self.heartbeat_budget):
            return self.max_heartbeat_interval
        if math.isinf(self.max_heartbeat_interval):
            return math.inf
        return max(
            self.max_heartbeat_interval,
            load_cap(
                self.max_nodes, budget=self.heartbeat_budget, maximum=self.max_heartbeat_interval
            ),
        )

    def governor(self) -> IntervalGovernor:
        """A new :class:`IntervalGovernor` with these settings (the suggested interval)."""
        return IntervalGovernor(
            base=self.heartbeat_interval,
            budget=self.heartbeat_budget,
            maximum=max(self.heartbeat_interval, self.max_heartbeat_interval),
            ceiling=max(self.heartbeat_interval, self.ceiling),
            policy=self.load_policy,
        )

    @property
    def max_lateness(self) -> float:
        """The most lateness the detectors are shifted by (replica rule 9), seconds:
        the longest lease (the lease at :attr:`ceiling`), or 4 leases without a ceiling."""
        ceiling = self.ceiling
        return self.lease_for(ceiling) if math.isfinite(ceiling) else 4 * self.lease

    def lease_for(self, interval: float) -> float:
        """Seconds of lease for a node heartbeating every ``interval`` seconds.

        ``lease`` is the lease at ``heartbeat_interval``; it scales with the
        interval, as the detector's suspicion time does.
        """
        return self.lease * interval / self.heartbeat_interval
