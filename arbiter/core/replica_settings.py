"""What a replica core needs besides Raft's own configuration: lease, retry, grace, retention.

Kept apart from :mod:`arbiter.core.replica` (which re-exports it) so that
the composition there stays within the module size the layering test sets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
        heartbeat_budget: heartbeats per second this replica should handle
            at most; the suggested interval grows with the number of nodes
            to stay within it (:func:`arbiter.core.detection.interval.suggest_interval`);
            ``inf`` always suggests ``heartbeat_interval``.
        max_heartbeat_interval: the longest interval suggested or accepted
            from a node, seconds (>= heartbeat_interval).
        retention: when DEAD and LEFT records are forgotten (replica rule 8); the
            default forgets nothing.
        observation_batch_interval: seconds between two batches of held
            (joining) ALIVE observations on the leader; the other replicas
            follow its commits and wait at most twice this
            (:mod:`arbiter.core.batching`); 0 proposes every owed
            observation on every tick.
    """

    lease: float
    observation_retry: float
    restart_grace: float
    heartbeat_interval: float
    snapshot_every: int = 0
    heartbeat_budget: float = math.inf
    max_heartbeat_interval: float = math.inf
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    observation_batch_interval: float = 0.0

    def lease_for(self, interval: float) -> float:
        """Seconds of lease for a node heartbeating every ``interval`` seconds.

        ``lease`` is the lease at ``heartbeat_interval``; it scales with the
        interval, as the detector's suspicion time does.
        """
        return self.lease * interval / self.heartbeat_interval
