"""What every failure detector of a replica shares (docs/architecture.md, "Failure detection").

The interface the shell drives (:class:`FailureDetector`), a node's local
state (:class:`DetectorState`) and the deadline machinery both detectors are
built on (:class:`DeadlineDetector`): per-node tracks and a timing wheel of
their deadlines. The detectors themselves say only when a node is due:
:class:`~arbiter.core.detection.missed.MissedHeartbeatDetector` (``missed.py``,
a fixed number of missed intervals) and
:class:`~arbiter.core.detection.phi.PhiAccrualDetector` (``phi.py``, phi
accrual).

Sans-I/O: time is the argument ``now`` (monotonic seconds, from the shell's
clock); nothing here reads a clock, sleeps or logs. The shell calls
:meth:`FailureDetector.heartbeat` for every heartbeat it receives, sleeps until
:meth:`FailureDetector.next_deadline` (or until a message arrives) and then
calls :meth:`FailureDetector.tick`, which reports the nodes that turned SUSPECT.
What the replica does with a suspicion (propose a SUSPECT observation) is the
shell's business: a local suspicion is one opinion, never a death.

Rules of every :class:`DeadlineDetector` (rules 2 and 4 are completed by each
detector's own module):

Rule 1. A node is tracked from its first heartbeat until :meth:`remove`
    (which forgets it entirely; removing an untracked node does nothing). The
    first heartbeat makes it HEALTHY.
Rule 2. Its deadline is the detector's own (for the missed-heartbeat
    detector ``last_heard + interval * missed_limit``), but never before
    ``hold_until``. A HEALTHY node turns SUSPECT at the first :meth:`tick`
    whose ``now`` is at or past its deadline, and that tick reports it
    exactly once. (At, not strictly past: :meth:`next_deadline` is then a
    time at which the report really happens, so a simulator that jumps its
    clock straight to the deadline makes progress.)
Rule 3. A heartbeat moves ``last_heard`` to ``now`` and turns a SUSPECT node
    HEALTHY again; ``heartbeat`` returns True exactly when the node turns
    HEALTHY (first heartbeat, or SUSPECT -> HEALTHY). Time never runs
    backwards for a node: ``now`` below its ``last_heard`` raises ValueError.
Rule 4. ``interval`` is per node: a heartbeat may carry a new one (the
    interval the replica suggested in its last ack); it then sticks until
    another heartbeat changes it. Nodes start with the detector's default.
Rule 5. :meth:`hold` is a lease promise: the node does not turn SUSPECT before
    ``until``. Holds only ever extend (a promise made cannot be taken back),
    and survive heartbeats. Holding a SUSPECT node raises: a replica grants
    no lease to a node it suspects (``arbiter/core/observer.py``, rule 4).
Rule 6. Deadlines live in the hashed timing wheel of ``wheel.py`` (Varghese
    and Lauck, SOSP 1987), keyed by node id: a HEALTHY node has exactly one
    entry, at its exact deadline; a SUSPECT or untracked node has none. Every
    heartbeat or hold moves the entry to the node's new deadline in O(1); a
    tick costs O(suspected + wheel slots walked since the last tick), not
    O(nodes); :meth:`~DeadlineDetector.next_deadline` is exact and O(1) while
    its cached minimum holds (the cost when it does not is in ``wheel.py``).
    A superseded deadline leaves its wheel slot at once; beyond one wheel
    revolution (4 s by default) it leaves an overflow heap item behind, which
    a token marks stale and which is never acted upon. ``tick(now)`` with
    ``now`` earlier than a previous tick is allowed and exact (rule 3 is the
    only rule about time order, per node); a NaN ``now`` raises ValueError.
Rule 7. Inter-arrival statistics (:meth:`DeadlineDetector.inter_arrival`, for
    the DEGRADED rules of ``arbiter/core/degraded.py``, never for suspicion):
    every heartbeat of a HEALTHY node at an unchanged interval is one sample
    of its inter-arrival time ``gap``. The mean is smoothed with gain 1/8 (as
    TCP's SRTT, RFC 6298) and the jitter, the smoothed absolute deviation of
    ``gap`` from that mean, with gain 1/16 (RFC 3550 section 6.4.1's
    interarrival jitter): O(1) time and memory per heartbeat. A first
    heartbeat, a heartbeat after the detector's own deadline (a revival from
    SUSPECT, or a silence only a hold covered: a death, a pause or a grace
    window, not jitter) and a new interval start the statistics again; the jitter
    starts at 0, so it rises to the node's true jitter over about 16
    samples and a cold start under-reads it, never over-reads it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from arbiter.core.detection.wheel import DEFAULT_RESOLUTION, DEFAULT_SLOTS, TimingWheel

__all__ = ["DeadlineDetector", "DetectorState", "FailureDetector", "InterArrival"]

# Rule 7's gains: the mean (RFC 6298's alpha) and the jitter (RFC 3550's 1/16).
_MEAN_GAIN = 1.0 / 8.0
_JITTER_GAIN = 1.0 / 16.0


class DetectorState(enum.Enum):
    """A replica's local opinion of one node (never a view state)."""

    HEALTHY = "healthy"
    SUSPECT = "suspect"


@dataclass(frozen=True, slots=True, kw_only=True)
class InterArrival:
    """One node's heartbeat inter-arrival statistics on this replica (rule 7).

    Attributes:
        samples: inter-arrival times counted since the statistics (re)started.
        mean: smoothed inter-arrival time, seconds.
        jitter: smoothed absolute deviation of the inter-arrival time from
            ``mean``, seconds.
        interval: the interval the node heartbeats at (the one it declared), seconds.
    """

    samples: int
    mean: float
    jitter: float
    interval: float


class FailureDetector(Protocol):
    """What the shell needs from a per-node failure detector.

    Implementations:
    :class:`~arbiter.core.detection.missed.MissedHeartbeatDetector` (counting
    missed intervals) and :class:`~arbiter.core.detection.phi.PhiAccrualDetector`
    (phi accrual, Hayashibara et al. 2004, as in Akka).
    All times are monotonic seconds.
    """

    # The detector's name, recorded in suspicion evidence: "missed" or "phi".
    kind: str

    def heartbeat(self, node_id: str, now: float, interval: float | None = None) -> bool:
        """Records a heartbeat arrival at ``now``.

        Args:
            node_id: the node heard from.
            now: arrival time, monotonic seconds.
            interval: the heartbeat interval expected from now on, seconds;
                None keeps the node's current one.

        Returns:
            True when this arrival turns the node HEALTHY (its first heartbeat,
            or SUSPECT -> HEALTHY), False when it was HEALTHY already.
        """
        ...

    def tick(self, now: float) -> list[str]:
        """Returns the nodes that turned SUSPECT at or before ``now``, sorted.

        Each suspicion is reported once; the node is reported again only after
        a heartbeat made it HEALTHY and it was missed again.
        """
        ...

    def next_deadline(self) -> float | None:
        """The earliest ``now`` at which :meth:`tick` could report a node; None if none."""
        ...

    def state(self, node_id: str) -> DetectorState | None:
        """The node's local state, or None if it is not tracked."""
        ...

    def suspicion(self, node_id: str, now: float) -> float:
        """The detector's suspicion level of the node at ``now``.

        Raises:
            KeyError: the node is not tracked.
        """
        ...

    def last_heard(self, node_id: str) -> float | None:
        """When the node's last heartbeat arrived (seconds), or None if untracked."""
        ...

    def remove(self, node_id: str) -> None:
        """Stops tracking the node; does nothing if it is not tracked.

        Idempotent like ``set.discard``: the caller restarts a node's history
        (a new incarnation) with ``remove`` then ``heartbeat`` without having
        to ask first whether it was tracked.
        """
        ...

    def hold(self, node_id: str, until: float) -> None:
        """Promises that the node does not turn SUSPECT before ``until`` (seconds).

        Raises:
            KeyError: the node is not tracked.
            ValueError: the node is SUSPECT.
        """
        ...

    def held_until(self, node_id: str) -> float:
        """Until when :meth:`hold` promised the node is not suspected (seconds; -inf
        without a hold; +inf for an untracked node: nothing may be concluded of it)."""
        ...

    def inter_arrival(self, node_id: str) -> InterArrival | None:
        """The node's inter-arrival statistics (rule 7), or None if it is not tracked."""
        ...


@dataclass(slots=True, kw_only=True)
class _Track:
    """Mutable per-node bookkeeping (private; never handed out)."""

    last_heard: float
    interval: float
    hold_until: float = -math.inf
    state: DetectorState = DetectorState.HEALTHY
    # Rule 7: samples since the statistics (re)started, smoothed mean and jitter.
    gaps: int = 0
    gap_mean: float = 0.0
    jitter: float = 0.0


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0 seconds, got {value!r}")


TrackT = TypeVar("TrackT", bound=_Track)


class DeadlineDetector(Generic[TrackT]):
    """What every detector here shares: per-node tracks and a timing wheel of deadlines.

    A subclass says when a node's track is due (:meth:`_deadline`) and how a
    heartbeat updates it, calling :meth:`_arm` after every change to a
    HEALTHY node's track; this class keeps each HEALTHY node's exact deadline
    in a :class:`~arbiter.core.detection.wheel.TimingWheel` (Varghese and Lauck, SOSP
    1987), so a heartbeat costs O(1), :meth:`tick` costs O(suspected + slots
    walked) and :meth:`next_deadline` is exact (rule 6).
    """

    def __init__(
        self, *, resolution: float = DEFAULT_RESOLUTION, slots: int = DEFAULT_SLOTS
    ) -> None:
        """Creates an empty detector.

        Args:
            resolution: seconds per wheel tick (> 0); cost only, never accuracy.
            slots: wheel slots per revolution (a power of two >= 2). See
                ``wheel.py`` for the trade-off; the defaults fit deadlines of
                up to 4 s without the overflow heap.

        Raises:
            ValueError: a wheel parameter out of range.
        """
        self._nodes: dict[str, TrackT] = {}
        # Invariant: node_id has a wheel entry iff it is tracked and HEALTHY,
        # and the entry's deadline is _deadline(track).
        self._wheel: TimingWheel[str] = TimingWheel(resolution=resolution, slots=slots)

    def _due(self, track: TrackT) -> float:
        """When the node is due to turn SUSPECT by the detector's own rule, holds
        aside (monotonic seconds)."""
        raise NotImplementedError

    def _deadline(self, track: TrackT) -> float:
        """When the node is due to turn SUSPECT (monotonic seconds), holds included."""
        return max(self._due(track), track.hold_until)

    def _new_track(self, now: float, interval: float | None) -> TrackT:
        """The track of a node first heard at ``now`` (``interval`` None: the default)."""
        raise NotImplementedError

    def _heard(self, track: TrackT, now: float, interval: float | None) -> None:
        """Updates a known node's track for a heartbeat at ``now`` (>= its last_heard);
        sets ``track.last_heard = now``, and the interval when one is given."""
        raise NotImplementedError

    def heartbeat(self, node_id: str, now: float, interval: float | None = None) -> bool:
        """See :meth:`FailureDetector.heartbeat` (rules 1, 3 and 4).

        The subclass's :meth:`_new_track` and :meth:`_heard` say what a
        heartbeat does to a track; this method validates, revives and re-arms.

        Raises:
            ValueError: ``interval`` is not > 0, or ``now`` is before the
                node's last heartbeat.
        """
        if interval is not None:
            _check_positive("interval", interval)
        track = self._nodes.get(node_id)
        if track is None:
            track = self._new_track(now, interval)
            self._nodes[node_id] = track
            self._arm(node_id, track)
            return True
        if now < track.last_heard:
            raise ValueError(
                f"heartbeat of {node_id!r} at {now!r} is before its last one at "
                f"{track.last_heard!r}: time must not run backwards"
            )
        if (
            track.state is not DetectorState.HEALTHY
            or now >= self._due(track)
            or (interval is not None and interval != track.interval)
        ):
            # Rule 7: a silence, even held, or another cadence is not jitter.
            track.gaps, track.gap_mean, track.jitter = 0, 0.0, 0.0
        else:
            gap = now - track.last_heard
            if track.gaps:
                track.jitter += (abs(gap - track.gap_mean) - track.jitter) * _JITTER_GAIN
                track.gap_mean += (gap - track.gap_mean) * _MEAN_GAIN
            else:
                track.gap_mean, track.jitter = gap, 0.0
            track.gaps += 1
        self._heard(track, now, interval)
        revived = track.state is DetectorState.SUSPECT
        track.state = DetectorState.HEALTHY
        self._arm(node_id, track)
        return revived

    def tick(self, now: float) -> list[str]:
        """See :meth:`FailureDetector.tick` (rules 2 and 6).

        Args:
            now: monotonic seconds; may be earlier than a previous tick's.

        Returns:
            The nodes whose deadline is ``<= now`` and that were HEALTHY, sorted.

        Raises:
            ValueError: ``now`` is NaN.
        """
        suspects = self._wheel.expire(now)
        nodes = self._nodes
        for node_id in suspects:
            track = nodes[node_id]
            assert track.state is DetectorState.HEALTHY, "a SUSPECT node had a wheel entry"
            track.state = DetectorState.SUSPECT
        suspects.sort()
        return suspects

    def next_deadline(self) -> float | None:
        """See :meth:`FailureDetector.next_deadline`.

        Exact, not merely a lower bound: the wheel keeps every deadline as is
        and uses its slots only to find candidates. O(1) while the wheel's
        cached minimum holds; after the earliest node heartbeats, is
        suspected or is removed, one call scans one wheel slot (the nodes
        due within the same ~7.8 ms), see ``wheel.py``.
        """
        return self._wheel.next_deadline()

    def state(self, node_id: str) -> DetectorState | None:
        """See :meth:`FailureDetector.state`."""
        track = self._nodes.get(node_id)
        return None if track is None else track.state

    def last_heard(self, node_id: str) -> float | None:
        """See :meth:`FailureDetector.last_heard`."""
        track = self._nodes.get(node_id)
        return None if track is None else track.last_heard

    def remove(self, node_id: str) -> None:
        """See :meth:`FailureDetector.remove`. Its wheel entry is cancelled (O(1))."""
        if self._nodes.pop(node_id, None) is not None:
            self._wheel.cancel(node_id)

    def hold(self, node_id: str, until: float) -> None:
        """See :meth:`FailureDetector.hold` (rule 5)."""
        track = self._nodes[node_id]
        if track.state is DetectorState.SUSPECT:
            raise ValueError(f"cannot hold {node_id!r}: it is SUSPECT (no lease for a suspect)")
        if until > track.hold_until:
            track.hold_until = until
            self._arm(node_id, track)

    def held_until(self, node_id: str) -> float:
        """See :meth:`FailureDetector.held_until`."""
        track = self._nodes.get(node_id)
        return math.inf if track is None else track.hold_until

    def inter_arrival(self, node_id: str) -> InterArrival | None:
        """See :meth:`FailureDetector.inter_arrival` (rule 7)."""
        track = self._nodes.get(node_id)
        if track is None:
            return None
        return InterArrival(
            samples=track.gaps, mean=track.gap_mean, jitter=track.jitter, interval=track.interval
        )

    def __len__(self) -> int:
        """Number of tracked nodes."""
        return len(self._nodes)

    def _arm(self, node_id: str, track: TrackT) -> None:
        """Moves a HEALTHY node's wheel entry to its current deadline (O(1))."""
        self._wheel.schedule(node_id, self._deadline(track))
