"""One replica's DEGRADED marks and detector readings of its nodes, for views, status and metrics.

The rules are :mod:`arbiter.core.degraded` (pure); this module feeds them
what the replica has: its ALIVE members with their ``job`` label (the
applied view), its failure detector's inter-arrival statistics and
suspicion level, and the status board's health flags and step histories.

Rules:

1. Marks are judged at most once per ``every`` seconds (half a second by
   default) and shared by every reader until then (``GetView``, every
   subscriber's status updates, the metrics), so 1,000 subscribers cost one
   judgement, not 1,000; O(nodes log nodes) each.
2. Only ALIVE members are judged; a node's detector statistics count only
   when the detector heard it at its member incarnation, and its status only
   when the board holds that incarnation's. JOINING nodes, DEAD and LEFT
   records carry no mark.
3. Nothing here writes: a mark is never proposed, never committed, never a
   view change (arbiter/core/degraded.py rule 1).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from arbiter.core.degraded import DegradedPolicy, NodeSignals, judge
from membership.shared.view import Degradation, MemberState

if TYPE_CHECKING:
    from arbiter.server.consensus.driver import Driver
    from arbiter.server.fanout.statusboard import StatusBoard

__all__ = ["JOB_LABEL", "DegradedMarks"]

# The label that names a member's training job (the ranks of the same job
# share it too): the step-rate rule compares the members that share it.
JOB_LABEL = "job"


class DegradedMarks:
    """The replica's DEGRADED marks (see the module rules).

    Args:
        driver: the replica's driver (its applied view and detector).
        board: the latest status each node reported here.
        policy: the thresholds.
        every: seconds a judgement is reused (rule 1).
    """

    def __init__(
        self, driver: Driver, board: StatusBoard, policy: DegradedPolicy, every: float = 0.5
    ) -> None:
        self._driver = driver
        self._board = board
        self._policy = policy
        self._every = every
        self._at = -float("inf")
        self._marks: Mapping[str, tuple[Degradation, ...]] = {}

    def marks(self, now: float | None = None) -> Mapping[str, tuple[Degradation, ...]]:
        """node id -> its DEGRADED marks (only the DEGRADED nodes), as of at most
        ``every`` seconds before ``now`` (monotonic seconds; default the clock)."""
        now = time.monotonic() if now is None else now
        if now - self._at >= self._every:
            self._marks = judge(self._signals(now), self._policy)
            self._at = now
        return self._marks

    def _signals(self, now: float) -> list[NodeSignals]:
        detector = self._driver.observer.detector
        heard = self._driver.heard
        signals = []
        for m in self._driver.state.view().members:
            if m.state is not MemberState.ALIVE:
                continue
            entry = self._board.get(m.node_id)
            if entry is not None and entry.incarnation != m.incarnation:
                entry = None
            status = entry.status if entry is not None else None
            signals.append(
                NodeSignals(
                    node_id=m.node_id,
                    job=m.labels.get(JOB_LABEL),
                    inter_arrival=(
                        detector.inter_arrival(m.node_id)
                        if heard(m.node_id) == m.incarnation
                        else None
                    ),
                    step_rate=(
                        entry.steps.rate(now)
                        if entry is not None and entry.steps is not None
                        else None
                    ),
                    healthy=(
                        status.healthy
                        if status is not None and status.HasField("healthy")
                        else None
                    ),
                    health_reason=status.health_reason if status is not None else "",
                )
            )
        return signals

    def suspicion(self, node_id: str, incarnation: int, now: float) -> tuple[float, str] | None:
        """The detector's suspicion level of the node at ``now`` and the detector's kind
        ("phi": phi; "missed": missed intervals), or None when it does not track
        that incarnation."""
        if self._driver.heard(node_id) != incarnation:
            return None
        detector = self._driver.observer.detector
        try:
            return detector.suspicion(node_id, now), detector.kind
        except KeyError:
            return None
