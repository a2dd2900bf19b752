"""DEGRADED: a node that heartbeats but is unhealthy (a gray failure), as status.

A node can answer every heartbeat on time and still hold its job back: its
heartbeats arrive in bursts (a NIC dropping packets, a host swapping, GC or
GIL pauses just short of the detection time), its training steps come far
slower than its peers' (a throttled GPU, a bad link in its ring), or the
application knows it is sick (ECC errors, a failed health check). Each
replica marks such a node DEGRADED, with the cause and the figures, from
what it already has: its failure detector's inter-arrival statistics
(``arbiter/core/detection/base.py`` rule 7) and the status the node reports.

Rules:

1. DEGRADED is one replica's status of a node, like SUSPECT: it is never
   proposed, never committed, never a view change, never a death, and the
   epoch does not move. It is decided here, from arguments only (sans-I/O):
   :func:`judge` is a pure function of the nodes' :class:`NodeSignals`.
2. Jitter ("jitter"). A node is DEGRADED when its heartbeat jitter exceeds
   both ``jitter_factor`` times the median jitter of the *other* nodes and
   ``jitter_floor`` times its own heartbeat interval. Only nodes with at least
   ``min_samples`` inter-arrival samples count, the node itself and the
   others (a cold start is never DEGRADED); at least one other node must.
   The floor keeps a node whose jitter is tiny in absolute terms (a few
   milliseconds on a quiet LAN, where the median is a fraction of one) from
   being called degraded.
3. Step rate ("step_rate"). The rate of a node is the growth of the
   ``step`` in its status over the last ``step_window`` seconds
   (:class:`StepHistory`: steps per second). A node is DEGRADED when its rate
   is below ``step_fraction`` times the median rate of the other members
   with the same ``job`` label that have a rate. Judged only when the node's
   history covers a whole window (a cold start or a restart from a
   checkpoint is not judged) and the peers' median advanced at least
   ``min_steps`` steps over the window (a job whose steps take minutes
   would otherwise compare whole steps against fractions of one; a job
   that is paused, every member checkpointing, is nobody's fault).
   A node whose step stopped moving is judged by the same rule: its rate
   falls to 0 as the window passes.
4. Health flag ("unhealthy"). A node whose status says ``healthy = false``
   (``client.report(healthy=False, reason=...)``) is DEGRADED at once, with
   the application's reason.
5. Causes are independent: a node may be DEGRADED for several at once, and
   each is reported (in the order of :data:`membership.shared.view.DEGRADED_CAUSES`).
   The median of the others is taken without the node itself, so two nodes
   are enough to compare (each with the other).
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from arbiter.core.detection import InterArrival
from membership.shared.errors import InvalidArgument
from membership.shared.view import Degradation

__all__ = ["DegradedPolicy", "NodeSignals", "StepHistory", "judge"]

# StepHistory keeps one anchor per this fraction of its window at most, so a
# node stepping 1,000 times a second costs the same ~17 entries as a slow one.
_ANCHORS_PER_WINDOW = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class DegradedPolicy:
    """The thresholds of the DEGRADED rules (``ArbiterConfig.degraded_*``; README
    "Degraded nodes").

    Attributes:
        jitter_factor: rule 2, a node's jitter over the others' median (> 1).
        jitter_floor: rule 2, the least jitter that counts, as a fraction of the
            node's heartbeat interval (>= 0).
        min_samples: rule 2, inter-arrival samples a node needs to be judged
            or to count for the others (>= 2).
        step_fraction: rule 3, a node's step rate under this fraction of its
            job's median is DEGRADED (0 < fraction < 1).
        step_window: rule 3, seconds of step history a rate is taken over (> 0).
        min_steps: rule 3, steps the peers' median must advance in a window
            for the job to be judged (>= 1).
    """

    jitter_factor: float = 4.0
    jitter_floor: float = 0.2
    min_samples: int = 32
    step_fraction: float = 0.5
    step_window: float = 30.0
    min_steps: int = 10

    def validate(self) -> DegradedPolicy:
        """Checks every threshold.

        Returns:
            self.

        Raises:
            InvalidArgument: naming the ``degraded_*`` field and its range.
        """
        checks = (
            ("degraded_jitter_factor", self.jitter_factor, self.jitter_factor > 1, "> 1"),
            ("degraded_jitter_floor", self.jitter_floor, self.jitter_floor >= 0, ">= 0"),
            ("degraded_min_samples", self.min_samples, self.min_samples >= 2, ">= 2"),
            (
                "degraded_step_fraction",
                self.step_fraction,
                0 < self.step_fraction < 1,
                "in (0, 1)",
            ),
            ("degraded_step_window", self.step_window, self.step_window > 0, "> 0 seconds"),
            ("degraded_min_steps", self.min_steps, self.min_steps >= 1, ">= 1"),
        )
        for name, value, ok, rule in checks:
            if not (ok and math.isfinite(value)):
                raise InvalidArgument(f"{name} must be {rule}, got {value}")
        return self


class StepHistory:
    """One node's training step over time, for its step rate (rule 3). Time is an argument.

    Keeps the latest step and a few anchors ``(time first seen, step)`` at
    least ``window / 16`` seconds apart, back to the newest one at least a
    window old: bounded memory whatever the step rate.

    Memory (one per node on every replica): the anchors are two flat arrays
    (doubles and 64-bit steps, 16 bytes an anchor, about 0.5 KiB for the 17
    or so a window holds), allocated at the first step, so a node that
    reports no step costs only this object. A deque of tuples cost about
    0.6 KiB empty and 2.4 KiB full.

    Args:
        window: seconds the rate is taken over (> 0).
    """

    __slots__ = ("_last", "_steps", "_times", "_window")

    def __init__(self, window: float) -> None:
        self._window = window
        self._times: array[float] | None = None  # when each anchor was first seen, seconds
        self._steps: array[int] | None = None  # its step (status ``step``: int64, >= 0)
        self._last: int | None = None

    def observe(self, step: int, now: float) -> None:
        """Records the node's ``step`` as reported at ``now`` (monotonic seconds).

        A step below the last one (a restart from a checkpoint) starts the
        history again: the node is not judged for a window.
        """
        last = self._last
        times, steps = self._times, self._steps
        if times is None or steps is None:
            times, steps = self._times, self._steps = array("d"), array("q")
        if last is not None and step < last:
            del times[:], steps[:]
        elif step == last:
            return
        self._last = step
        if not times or now - times[-1] >= self._window / _ANCHORS_PER_WINDOW:
            times.append(now)
            steps.append(step)
        self._drop(now)

    def rate(self, now: float) -> tuple[float, int] | None:
        """``(steps per second, steps advanced)`` over the window ending at ``now``,
        or None while the history covers less than a window (rule 3)."""
        self._drop(now)
        times, steps = self._times, self._steps
        if not times or not steps or self._last is None:
            return None
        span = now - times[0]
        if span < self._window:
            return None
        return (self._last - steps[0]) / span, self._last - steps[0]

    def _drop(self, now: float) -> None:
        """Keeps the newest anchor at least a window old, and none older."""
        times, steps = self._times, self._steps
        if times is None or steps is None:
            return
        k = 0
        while len(times) - k >= 2 and times[k + 1] <= now - self._window:
            k += 1
        if k:
            del times[:k], steps[:k]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSignals:
    """What one replica knows of one ALIVE node, for :func:`judge`.

    Attributes:
        node_id: the node.
        job: its ``job`` label (None: none; rule 3 does not apply).
        inter_arrival: its detector's statistics (None: not tracked here).
        step_rate: ``(steps per second, steps advanced)`` over the window
            (:meth:`StepHistory.rate`; None: unknown or too short).
        healthy: the health flag of its status (None: not said).
        health_reason: the reason given with ``healthy = false``.
    """

    node_id: str
    job: str | None = None
    inter_arrival: InterArrival | None = None
    step_rate: tuple[float, int] | None = None
    healthy: bool | None = None
    health_reason: str = ""


def _median_without(values: list[float], value: float) -> float | None:
    """The median of sorted ``values`` with one occurrence of ``value`` taken out."""
    n = len(values) - 1
    if n <= 0:
        return None
    i = bisect.bisect_left(values, value)

    def at(k: int) -> float:
        return values[k if k < i else k + 1]

    mid = n // 2
    return at(mid) if n % 2 else (at(mid - 1) + at(mid)) / 2


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _jitter(signals: list[NodeSignals], policy: DegradedPolicy) -> dict[str, Degradation]:
    """Rule 2."""
    judged = [
        (s.node_id, s.inter_arrival)
        for s in signals
        if s.inter_arrival is not None and s.inter_arrival.samples >= policy.min_samples
    ]
    values = sorted(ia.jitter for _, ia in judged)
    out: dict[str, Degradation] = {}
    for node_id, ia in judged:
        median = _median_without(values, ia.jitter)
        if median is None:
            continue
        if ia.jitter > policy.jitter_factor * median and ia.jitter > policy.jitter_floor * (
            ia.interval
        ):
            times = f"{ia.jitter / median:.1f}x" if median > 0 else "far above"
            out[node_id] = Degradation(
                cause="jitter",
                reason=(
                    f"heartbeat jitter {_ms(ia.jitter)}, {times} the median {_ms(median)} of "
                    f"{len(values) - 1} other node(s) (interval {_ms(ia.interval)})"
                ),
            )
    return out


def _step_rate(signals: list[NodeSignals], policy: DegradedPolicy) -> dict[str, Degradation]:
    """Rule 3."""
    jobs: dict[str, list[tuple[str, float, int]]] = {}
    for s in signals:
        if s.job is not None and s.step_rate is not None:
            jobs.setdefault(s.job, []).append((s.node_id, *s.step_rate))
    out: dict[str, Degradation] = {}
    for job, members in jobs.items():
        rates = sorted(r for _, r, _ in members)
        advanced = sorted(float(a) for _, _, a in members)
        for node_id, rate, steps in members:
            median = _median_without(rates, rate)
            peers_advanced = _median_without(advanced, float(steps))
            if median is None or peers_advanced is None or peers_advanced < policy.min_steps:
                continue
            if rate < policy.step_fraction * median:
                out[node_id] = Degradation(
                    cause="step_rate",
                    reason=(
                        f"{rate:.3g} steps/s, {rate / median:.2f}x the median {median:.3g} of "
                        f"{len(members) - 1} other member(s) of job {job} over "
                        f"{policy.step_window:g}s"
                    ),
                )
    return out


def judge(
    signals: Iterable[NodeSignals], policy: DegradedPolicy
) -> Mapping[str, tuple[Degradation, ...]]:
    """Which nodes are DEGRADED, and why (module rules 2 to 5).

    Args:
        signals: one entry per ALIVE node this replica knows (each node once).
        policy: the thresholds.

    Returns:
        node id -> its marks, in the order jitter, step_rate, unhealthy;
        only the DEGRADED nodes. O(n log n) in the nodes.
    """
    nodes = list(signals)
    jitter = _jitter(nodes, policy)
    steps = _step_rate(nodes, policy)
    out: dict[str, tuple[Degradation, ...]] = {}
    for s in nodes:
        marks = [m for m in (jitter.get(s.node_id), steps.get(s.node_id)) if m is not None]
        if s.healthy is False:
            reason = s.health_reason or "the application reports it unhealthy"
            marks.append(Degradation(cause="unhealthy", reason=reason))
        if marks:
            out[s.node_id] = tuple(marks)
    return out
