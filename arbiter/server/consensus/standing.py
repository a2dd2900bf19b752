"""What every heartbeat ack of a replica shares at one moment, handed out by identity.

Rules:

1. :class:`Standing` holds the epoch, quorum, leader, suggested interval and
   instance; :meth:`Standings.now` returns the same object for as long as
   none of them changed, so that an ack builder
   (arbiter/server/api/heartbeat_path.py, rule 4) knows "nothing changed" by
   identity and copies its cached template.
2. On every heartbeat the quorum (it changes with time alone: ``now`` is
   compared with Raft's ``quorum_until()``, read when the standing is made
   and afresh while out of quorum), the applied epoch, the known leader and
   the number of tracked nodes (which the interval follows) are compared
   with the current object: cheap reads, no allocation. A leader that
   steps down on a peer's message changes ``leader``, so it is seen at once.
   Everything, the instance and an interval that follows something else
   (load) included, is recomputed by :meth:`Standings.refresh`, which the
   driver calls after every turn (at least every 50 ms).
3. A change of the suggested interval is logged (INFO) with the node count,
   the budget and the suspicion time it gives.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from arbiter.config import ArbiterConfig
    from arbiter.core.replica import Replica

log = logging.getLogger("arbiter.driver")

__all__ = ["Standing", "Standings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Standing:
    """What every heartbeat ack of a replica shares at one moment (module rule 1).

    Attributes:
        epoch: the applied view epoch.
        in_quorum: the replica has a leader it can reach (or leads a quorum).
        leader_id: the leader's id, "" when unknown.
        interval: seconds between heartbeats suggested to nodes.
        instance: the cluster's instance id ("" before the Bootstrap applies).
    """

    epoch: int
    in_quorum: bool
    leader_id: str
    interval: float
    instance: str


class Standings:
    """The current :class:`Standing` of one replica (module rules).

    Args:
        replica: the replica's core.
        config: the replica's configuration (for the interval's log line).
        healthy: False once the replica must not take part (it reports no quorum then).
    """

    def __init__(
        self, replica: Replica, config: ArbiterConfig, healthy: Callable[[], bool]
    ) -> None:
        self._replica = replica
        self._config = config
        self._healthy = healthy
        self._last_interval = config.heartbeat_interval
        self._current: Standing | None = None
        self._tracked = -1  # nodes tracked when _current was made
        self._until = -math.inf  # in quorum before this, monotonic seconds (rule 2)

    def now(self, now: float) -> Standing:
        """The standing at ``now`` (monotonic seconds): the same object while rule 2's
        reads match it."""
        st = self._current
        replica = self._replica
        if st is not None and not st.in_quorum:
            self._until = replica.raft.quorum_until()  # rare: read afresh until back in
        in_quorum = now < self._until and self._healthy()
        if (
            st is None
            or in_quorum is not st.in_quorum
            or self._tracked != replica.observer.tracked()
            or st.epoch != replica.state.epoch
            or st.leader_id != (replica.raft.leader or "")
        ):
            return self._make(now)
        return st

    def refresh(self, now: float) -> Standing:
        """Recomputes everything (a driver turn); a new object only when something changed."""
        return self._make(now)

    def _make(self, now: float) -> Standing:
        replica = self._replica
        self._until = replica.raft.quorum_until()
        in_quorum = now < self._until and self._healthy()
        self._tracked = replica.observer.tracked()
        st = Standing(
            epoch=replica.state.epoch,
            in_quorum=in_quorum,
            leader_id=replica.raft.leader or "",
            interval=self.interval(),
            instance=replica.state.instance,
        )
        current = self._current
        if current is not None and current == st:
            return current  # equal: the same object, so acks keep their template
        self._current = st
        return st

    def interval(self) -> float:
        """Seconds between heartbeats to suggest now (the core's; rule 3 logs a change)."""
        replica = self._replica
        interval = replica.suggested_interval()
        if interval != self._last_interval:
            cfg = self._config
            log.info(
                "arbiter %s suggests a heartbeat interval of %.3fs to its %d nodes "
                "(budget %g heartbeats/s; suspicion after %.2fs)",
                replica.replica_id,
                interval,
                replica.observer.tracked(),
                cfg.heartbeat_budget,
                interval * cfg.missed_heartbeats,
            )
            self._last_interval = interval
        return interval
