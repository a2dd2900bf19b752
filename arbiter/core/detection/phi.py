"""Phi accrual failure detector (docs/architecture.md, "Failure detection").

Hayashibara, Défago, Yared and Katayama, "The φ Accrual Failure Detector"
(SRDS 2004): instead of a binary verdict after a fixed timeout, the detector
keeps a bounded window of heartbeat inter-arrival times per node, fits a
normal distribution to it and outputs

    phi(t) = -log10(1 - F(t))

where ``t`` is the time since the node's last heartbeat and ``F`` the fitted
cumulative distribution: phi = 1 means a 10% chance that a heartbeat this late
is still to come, phi = 8 a 1e-8 chance. A node is suspected once phi reaches
a threshold.

The details follow Akka's ``PhiAccrualFailureDetector`` (akka-remote,
``akka.remote.PhiAccrualFailureDetector``):

* ``F`` is the logistic approximation of the normal CDF (Bowling et al.
  2009, "A logistic approximation to the cumulative normal distribution"):
  ``y = (t - mean) / stddev; e = exp(-y * (1.5976 + 0.070566 * y * y))``,
  ``1 - F(t) = e / (1 + e)`` (Akka evaluates it as ``1 - 1 / (1 + e)`` when
  ``t <= mean``; the two are equal, see :func:`phi`).
* ``mean`` is the window's mean plus ``acceptable_heartbeat_pause`` (a pause
  the application promises to tolerate, e.g. a GC or a GIL hold), and
  ``stddev`` is never below ``min_std_deviation``: with perfectly regular
  heartbeats the fitted deviation is ~0, and one late heartbeat would
  otherwise give an enormous phi (failure class "phi accrual edge cases" in
  docs/architecture.md).
* Cold start: the first heartbeat seeds the window with two samples,
  ``estimate +/- estimate / 4`` (mean ``estimate``, deviation
  ``estimate / 4``), as Akka's ``firstHeartbeat`` does, so phi is finite and
  a node killed after one heartbeat is suspected after a bounded time.
* An inter-arrival time is recorded only if phi was below the threshold when
  the heartbeat arrived (Akka's ``isAvailable`` check): the silence of a node
  that was suspected (or only protected by a hold) does not inflate the
  window.

Rules of :class:`PhiAccrualDetector` (rules 1, 3, 5 and 6 are those of every
deadline detector, ``base.py``):

Rule 1. A node is tracked from its first heartbeat until :meth:`remove`; the
    first heartbeat makes it HEALTHY.
Rule 2. phi is monotonic in the elapsed time, so the time at which it reaches
    ``threshold`` is computed once per heartbeat, in closed form:
    ``last_heard + mean + pause + y_threshold * stddev``, where
    ``y_threshold`` (the number of standard deviations at which the
    approximation gives ``threshold``) is found once by bisection. The node's
    deadline is ``max(that, hold_until)``; it turns SUSPECT at the first
    :meth:`tick` whose ``now`` is at or past it, reported exactly once.
Rule 3. A heartbeat turns a SUSPECT node HEALTHY; ``heartbeat`` returns True
    exactly when the node turns HEALTHY. ``now`` below the node's last
    heartbeat raises ValueError.
Rule 4. A heartbeat may carry a new interval (the replica's suggestion). A
    changed interval re-seeds the node's window as a cold start with that
    interval (the old samples describe the old rate), and the pause and
    minimum deviation scale with ``node interval / detector interval``, so a
    node that was told to slow down is judged on its new rate.
Rule 5. :meth:`hold` promises no suspicion before ``until``; holds only
    extend, survive heartbeats, and a SUSPECT node cannot be held.
Rule 6. Deadlines live in the hashed timing wheel of ``wheel.py``, as in
    ``base.py``: a heartbeat costs O(1), a tick O(suspected + slots
    walked), :meth:`next_deadline` is exact.
Rule 7. A node's window is a ring of C doubles (``array('d')``: 8 bytes a
    sample, where a deque of floats costs a 24-byte float object and an
    8-byte slot each), grown by appending until it holds
    ``max_sample_size`` samples, then overwritten oldest first. The sums are
    updated in the same order as with a queue (the oldest sample out, the
    new one in), so the window, its sums and every deadline are the same
    floats bit for bit.

Guarantee: with ``threshold > log10(2)`` (validated), a silence of at most the
window's mean plus ``acceptable_heartbeat_pause`` is never suspected, whatever
the window holds (phi is then at most ``log10(2)``).

Sans-I/O: time is the argument ``now``; nothing here reads a clock or logs.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

from arbiter.core.detection.base import DeadlineDetector, _check_positive, _Track

__all__ = ["PhiAccrualDetector", "phi", "threshold_sigmas"]

_LN10 = math.log(10.0)
# Coefficients of the logistic approximation of the normal CDF (Akka).
_A = 1.5976
_B = 0.070566
# phi at elapsed == mean is log10(2); a threshold at or below it would suspect
# a node that is merely on time.
_MIN_THRESHOLD = math.log10(2.0)


def phi(elapsed: float, mean: float, std_deviation: float) -> float:
    """Akka's phi for a silence of ``elapsed`` seconds.

    ``-log10(1 - F(elapsed))`` with ``F`` the logistic approximation of the
    normal CDF of mean ``mean`` and deviation ``std_deviation`` (Hayashibara
    et al. 2004; Akka ``PhiAccrualFailureDetector.phi``). Akka computes
    ``e = exp(-y * (1.5976 + 0.070566 * y * y))`` and
    ``-log10(e / (1 + e))`` if ``elapsed > mean`` else
    ``-log10(1 - 1 / (1 + e))``; both are ``-log10(e / (1 + e))``, i.e.
    ``softplus(-z) / ln 10`` with ``z = -y * (...)``, evaluated here without
    overflow (``exp`` of a large argument) or underflow (``log10(0)``), so the
    result is finite for any finite input.

    Args:
        elapsed: seconds since the last heartbeat.
        mean: expected inter-arrival time, seconds (acceptable pause included).
        std_deviation: deviation of the inter-arrival time, seconds (> 0).

    Returns:
        phi >= 0; ``log10(2)`` at ``elapsed == mean``.
    """
    y = (elapsed - mean) / std_deviation
    z = -y * (_A + _B * y * y)
    # p = e / (1 + e) = 1 / (1 + exp(-z)); phi = log(1 + exp(-z)) / ln 10.
    if z >= 0:
        return math.log1p(math.exp(-z)) / _LN10
    return (-z + math.log1p(math.exp(z))) / _LN10


def threshold_sigmas(threshold: float) -> float:
    """The smallest ``y = (elapsed - mean) / std`` at which :func:`phi` reaches ``threshold``.

    Found by bisection on :func:`phi` itself (so that ``phi`` evaluated at the
    resulting deadline is ``threshold`` up to rounding). About 5.23 for
    Akka's default threshold 8.

    Args:
        threshold: phi threshold, finite and > log10(2).

    Raises:
        ValueError: threshold not finite or <= log10(2).
    """
    if not (math.isfinite(threshold) and threshold > _MIN_THRESHOLD):
        raise ValueError(f"threshold must be a finite number > log10(2) ~ 0.301, got {threshold!r}")
    lo, hi = 0.0, 1.0
    while phi(hi, 0.0, 1.0) < threshold:
        lo, hi = hi, hi * 2.0
    while True:
        mid = (lo + hi) / 2.0
        if mid in (lo, hi):
            return hi
        if phi(mid, 0.0, 1.0) >= threshold:
            hi = mid
        else:
            lo = mid


@dataclass(slots=True, kw_only=True)
class _PhiTrack(_Track):
    """Mutable per-node bookkeeping (private; never handed out)."""

    # Window of inter-arrival samples (rule 7: a ring once full, samples[head] the
    # oldest; head is 0 until then) and their running sums.
    samples: array[float] = field(default_factory=lambda: array("d"))
    head: int = 0
    total: float = 0.0
    squares: float = 0.0
    # Pushes since the sums were last recomputed exactly (bounds float drift).
    pushes: int = 0
    # When phi reaches the threshold (rule 2), ignoring holds.
    phi_deadline: float = math.inf


class PhiAccrualDetector(DeadlineDetector[_PhiTrack]):
    """Suspects a node once its phi reaches ``threshold`` (Hayashibara et al. 2004, as in Akka).

    Implements :class:`~arbiter.core.detection.base.FailureDetector`; see the module
    docstring for the rules. :meth:`suspicion` returns phi.
    """

    kind = "phi"

    def __init__(
        self,
        *,
        interval: float,
        threshold: float = 8.0,
        max_sample_size: int = 200,
        min_std_deviation: float | None = None,
        acceptable_heartbeat_pause: float | None = None,
        first_heartbeat_estimate: float | None = None,
    ) -> None:
        """Creates an empty detector.

        Args:
            interval: default expected heartbeat interval, seconds (> 0). The
                pause and minimum deviation below apply to nodes at this
                interval and scale with a node's own interval (rule 4).
            threshold: phi at which a node is suspected (Akka's default 8:
                a 1e-8 chance that the heartbeat is merely late).
            max_sample_size: inter-arrival samples kept per node (>= 2).
            min_std_deviation: floor of the fitted deviation, seconds (> 0);
                None means ``interval / 4`` (the cold-start deviation).
            acceptable_heartbeat_pause: seconds added to the mean (>= 0): a
                silence up to mean + pause is never suspected. None means
                ``2 * interval``.
            first_heartbeat_estimate: the mean assumed before any sample
                (seconds, > 0); None means ``interval``. Only used for nodes
                at the default interval; others are seeded with their own.

        Raises:
            ValueError: a value out of range (or not finite).
        """
        _check_positive("interval", interval)
        self._y_threshold = threshold_sigmas(threshold)
        if max_sample_size < 2:
            raise ValueError(f"max_sample_size must be >= 2, got {max_sample_size!r}")
        min_std = interval / 4.0 if min_std_deviation is None else min_std_deviation
        _check_positive("min_std_deviation", min_std)
        pause = 2.0 * interval if acceptable_heartbeat_pause is None else acceptable_heartbeat_pause
        if not (math.isfinite(pause) and pause >= 0):
            raise ValueError(
                f"acceptable_heartbeat_pause must be a finite number >= 0 seconds, got {pause!r}"
            )
        estimate = interval if first_heartbeat_estimate is None else first_heartbeat_estimate
        _check_positive("first_heartbeat_estimate", estimate)
        self._interval = interval
        self._threshold = threshold
        self._max_samples = max_sample_size
        self._min_std = min_std
        self._pause = pause
        self._estimate = estimate
        super().__init__()

    @property
    def interval(self) -> float:
        """The default heartbeat interval, seconds."""
        return self._interval

    @property
    def threshold(self) -> float:
        """phi at which a node is suspected."""
        return self._threshold

    @property
    def max_sample_size(self) -> int:
        """Inter-arrival samples kept per node."""
        return self._max_samples

    @property
    def min_std_deviation(self) -> float:
        """Floor of the fitted deviation at the default interval, seconds."""
        return self._min_std

    @property
    def acceptable_heartbeat_pause(self) -> float:
        """Seconds added to the mean at the default interval."""
        return self._pause

    @property
    def first_heartbeat_estimate(self) -> float:
        """Mean assumed at cold start for nodes at the default interval, seconds."""
        return self._estimate

    def _new_track(self, now: float, interval: float | None) -> _PhiTrack:
        """Rules 1 and 4: a new node starts from the cold-start seeds of its interval."""
        track = _PhiTrack(last_heard=now, interval=self._interval if interval is None else interval)
        self._seed(track)
        self._refresh(track)
        return track

    def _heard(self, track: _PhiTrack, now: float, interval: float | None) -> None:
        """Rules 3 and 4: a new interval re-seeds the window; otherwise the inter-arrival
        time is a sample unless the node had already passed its phi deadline."""
        if interval is not None and interval != track.interval:
            track.interval = interval
            self._seed(track)
        elif now < track.phi_deadline:
            self._push(track, now - track.last_heard)
        track.last_heard = now
        self._refresh(track)

    def suspicion(self, node_id: str, now: float) -> float:
        """phi of the node at ``now`` (finite; ``now`` before the last heartbeat counts as 0 s).

        The node is suspected once this reaches :attr:`threshold` and no hold
        runs: at :meth:`next_deadline` it is >= the threshold (the deadline
        is nudged up by a few ulps when rounding requires it).

        Raises:
            KeyError: the node is not tracked.
        """
        track = self._nodes[node_id]
        mean, std = self._fit(track)
        return phi(max(0.0, now - track.last_heard), mean, std)

    def samples(self, node_id: str) -> tuple[float, ...]:
        """The node's window of inter-arrival samples, oldest first (seeds included).

        Raises:
            KeyError: the node is not tracked.
        """
        track = self._nodes[node_id]
        samples, head = track.samples, track.head
        return tuple(samples[head:]) + tuple(samples[:head])

    # -- internals ---------------------------------------------------------

    def _seed(self, track: _PhiTrack) -> None:
        """Cold start (Akka ``firstHeartbeat``): two samples, estimate +/- estimate / 4."""
        estimate = self._estimate if track.interval == self._interval else track.interval
        track.samples = array("d", (estimate + estimate / 4.0, estimate - estimate / 4.0))
        track.head = 0
        self._resum(track)

    def _push(self, track: _PhiTrack, sample: float) -> None:
        """Rule 7: the oldest sample out (once the window is full), ``sample`` in."""
        samples = track.samples
        if len(samples) >= self._max_samples:
            head = track.head
            old = samples[head]
            track.total -= old
            track.squares -= old * old
            samples[head] = sample
            head += 1
            track.head = head if head < len(samples) else 0
        else:
            samples.append(sample)
        track.total += sample
        track.squares += sample * sample
        track.pushes += 1
        if track.pushes >= self._max_samples:
            self._resum(track)

    @staticmethod
    def _resum(track: _PhiTrack) -> None:
        track.total = math.fsum(track.samples)
        track.squares = math.fsum(s * s for s in track.samples)
        track.pushes = 0

    def _fit(self, track: _PhiTrack) -> tuple[float, float]:
        """(mean + pause, max(deviation, min deviation)), scaled to the node's interval."""
        n = len(track.samples)
        mean = track.total / n
        variance = max(0.0, track.squares / n - mean * mean)
        scale = track.interval / self._interval
        return mean + self._pause * scale, max(math.sqrt(variance), self._min_std * scale)

    def _refresh(self, track: _PhiTrack) -> None:
        """Recomputes when phi reaches the threshold (rule 2)."""
        mean, std = self._fit(track)
        last = track.last_heard
        deadline = last + (mean + self._y_threshold * std)
        # Rounding may leave phi a few ulps short of the threshold at the
        # closed-form deadline; step up to the first float where it is not,
        # so that suspicion(node, next_deadline()) >= threshold holds exactly.
        for _ in range(64):
            if phi(deadline - last, mean, std) >= self._threshold:
                break
            deadline = math.nextafter(deadline, math.inf)
        track.phi_deadline = deadline

    def _due(self, track: _PhiTrack) -> float:
        return track.phi_deadline
