"""How late the consensus process is in hearing its workers' heartbeats (sans-I/O).

Rules:

1. Every BATCH carries the worker's send time; everything that worker read
   before it is in that batch or an earlier one. So, per worker, the
   consensus process has heard every heartbeat the worker received up to the
   send time of the latest batch it took in (:meth:`Horizon.heard`), and its
   lateness is ``now`` minus the earliest of those times over the workers
   serving (:meth:`Horizon.lateness`). The driver ticks its detectors no
   later than ``now`` minus that (``Driver.add_lateness_source``): no node
   is suspected for a heartbeat still in a worker's batch, or in a worker
   whose loop runs late (Lifeguard's local health awareness: Dadgar,
   Phillips and Currey, "Lifeguard: Local Health Awareness for More
   Accurate Failure Detection", 2018). It is a backlog too: shedding reads
   it (``arbiter/server/load/monitor.py`` rule 4).
1a. A batch also carries the worker's own lateness when it left (worker.py
   rule 7: its loop's stall, its streams' read lag): a worker starved of
   CPU wakes, flushes a batch at once and only then reads what gRPC kept
   for it, so what it has *heard* goes only up to the send time minus that
   (:meth:`Horizon.hearing`). That is a lateness for detection only
   (``backlog=False``): a join storm raises every stream's read lag for a
   moment, and shedding the storm's joins for it only moves them later
   (shedding them for it made a 1,000-node join under busy neighbours
   take 39 s in 282 epochs).
2. A worker that starts is heard up to its start; one that is gone (its
   streams ended with it) counts no more (:meth:`Horizon.left`).
3. Workers send a batch, empty if need be, at least every
   ``IDLE_FLUSH`` seconds, so a worker with nothing to say costs the
   replica's detection at most that much. A worker overdue by more than
   the supervisor's limit is taken for wedged (:meth:`Horizon.overdue`):
   it is killed and restarted, so one stopped worker cannot keep a replica
   from suspecting anyone.
"""

from __future__ import annotations

__all__ = ["IDLE_FLUSH", "Horizon"]

# Seconds between two batches of a worker with no heartbeat to send (rule 3).
IDLE_FLUSH = 0.02


class Horizon:
    """Per worker, up to when its heartbeats have been heard here (module rules)."""

    def __init__(self) -> None:
        self._until: dict[int, float] = {}
        self._heard: dict[int, float] = {}  # rule 1a: send time minus the worker's lateness

    def joined(self, worker: int, now: float) -> None:
        """Worker ``worker`` serves from ``now`` (monotonic seconds; rule 2)."""
        self._until[worker] = now
        self._heard[worker] = now

    def heard(self, worker: int, sent_at: float, late: float = 0.0) -> None:
        """A batch of ``worker`` sent at ``sent_at`` (monotonic seconds) was taken in
        (rule 1), the worker ``late`` seconds behind in hearing its nodes then (rule 1a)."""
        if sent_at > self._until.get(worker, float("-inf")):
            self._until[worker] = sent_at
        heard = sent_at - late  # rule 1a
        if heard > self._heard.get(worker, float("-inf")):
            self._heard[worker] = heard

    def left(self, worker: int) -> None:
        """Worker ``worker`` is gone (rule 2)."""
        self._until.pop(worker, None)
        self._heard.pop(worker, None)

    def lateness(self, now: float) -> float:
        """Seconds this replica is late in hearing its workers at ``now`` (>= 0)."""
        if not self._until:
            return 0.0
        return max(0.0, now - min(self._until.values()))

    def hearing(self, now: float) -> float:
        """Seconds this replica has not heard at ``now`` through its workers, their own
        lateness included (rule 1a; >= :meth:`lateness` minus the workers' lateness)."""
        if not self._heard:
            return 0.0
        return max(0.0, now - min(self._heard.values()))

    def overdue(self, now: float, limit: float) -> list[int]:
        """Workers not heard from for more than ``limit`` seconds (rule 3)."""
        return sorted(w for w, t in self._until.items() if now - t > limit)
