"""The failure detector an :class:`arbiter.config.ArbiterConfig` asks for, tuned to its D.

Split from :mod:`arbiter.config` (which calls :func:`make_detector` from
``ArbiterConfig.detector``), so that the configuration stays within the
module size the layering test sets.
"""

from __future__ import annotations

from arbiter.core.detection import (
    FailureDetector,
    MissedHeartbeatDetector,
    PhiAccrualDetector,
    threshold_sigmas,
)

__all__ = ["make_detector"]

# Phi accrual parameters, fixed (not tunables): Akka's threshold and window,
# and a deviation floor of a quarter interval (the cold-start deviation).
_PHI_THRESHOLD = 8.0
_PHI_MAX_SAMPLES = 200
_PHI_MIN_STD_FRACTION = 0.25


def make_detector(kind: str, interval: float, missed: float) -> FailureDetector:
    """A new failure detector of ``kind`` for heartbeats every ``interval`` seconds,
    suspecting after ``missed`` intervals (D = interval x missed).

    ``"missed"``: :class:`MissedHeartbeatDetector` suspecting after
    ``missed_heartbeats`` intervals, i.e. at D.

    ``"phi"``: :class:`PhiAccrualDetector` with threshold 8, a window of
    200 samples, ``min_std_deviation = H / 4`` and a first-heartbeat
    estimate of H (H = heartbeat_interval). Its acceptable pause is chosen
    so that a clean silence after perfectly regular heartbeats (fitted
    deviation below the floor) is suspected at D, like the missed-count
    detector: the phi deadline is ``H + pause + y8 * H / 4`` where
    ``y8 ~ 5.23`` is the number of deviations at which phi reaches 8, so
    ``pause = D - H - y8 * H / 4`` (about 2.69 H, 0.40 s, by default).
    Jittery heartbeats raise the deviation and so delay suspicion beyond
    D; a node killed after its first heartbeat (window seeded with
    deviation H / 4) is suspected at D too. If D < H * (1 + y8 / 4)
    (missed_heartbeats below ~2.31) the pause is 0 and suspicion comes at
    ``H * (1 + y8 / 4)``, a little after D; a hold (lease) is honoured
    either way.
    """
    suspect_after = interval * missed
    if kind == "phi":
        h = interval
        min_std = h * _PHI_MIN_STD_FRACTION
        y = threshold_sigmas(_PHI_THRESHOLD)
        return PhiAccrualDetector(
            interval=h,
            threshold=_PHI_THRESHOLD,
            max_sample_size=_PHI_MAX_SAMPLES,
            min_std_deviation=min_std,
            acceptable_heartbeat_pause=max(0.0, suspect_after - h - y * min_std),
            first_heartbeat_estimate=h,
        )
    return MissedHeartbeatDetector(interval=interval, missed_limit=missed)
