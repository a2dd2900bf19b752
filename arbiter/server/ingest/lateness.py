"""How late the consensus process is in hearing its workers' heartbeats (sans-I/O).

Rules:

1. Every BATCH carries the time up to which the worker has heard its
   nodes: its send time minus the worker's own lateness (its loop's stalls,
   and the read lag of its streams measured from the heartbeats' send
   times: worker.py rule 7, batcher rule 2); everything the worker read before the send is in that
   batch or an earlier one. So, per worker, the consensus process has heard
   every heartbeat sent to it up to the stamp of the latest batch it took
   in (:meth:`Horizon.heard`: the latest stamp, never going back), and its
   lateness is ``now`` minus the earliest of those times over the workers
   serving (:meth:`Horizon.lateness`). The driver ticks its detectors no
   later than ``now`` minus that (``Driver.add_lateness_source``): no node
   is suspected for a heartbeat still in a worker's batch, or in a worker
   whose loop runs late (Lifeguard's local health awareness: Dadgar,
   Phillips and Currey, "Lifeguard: Local Health Awareness for More
   Accurate Failure Detection", 2018).
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

    def joined(self, worker: int, now: float) -> None:
        """Worker ``worker`` serves from ``now`` (monotonic seconds; rule 2)."""
        self._until[worker] = now

    def heard(self, worker: int, sent_at: float) -> None:
        """A batch of ``worker`` stamped ``sent_at`` (heard until, monotonic seconds)
        was taken in (rule 1)."""
        if sent_at > self._until.get(worker, float("-inf")):
            self._until[worker] = sent_at

    def left(self, worker: int) -> None:
        """Worker ``worker`` is gone (rule 2)."""
        self._until.pop(worker, None)

    def lateness(self, now: float) -> float:
        """Seconds this replica is late in hearing its workers at ``now`` (>= 0)."""
        if not self._until:
            return 0.0
        return max(0.0, now - min(self._until.values()))

    def overdue(self, now: float, limit: float) -> list[int]:
        """Workers not heard from for more than ``limit`` seconds (rule 3)."""
        return sorted(w for w, t in self._until.items() if now - t > limit)
