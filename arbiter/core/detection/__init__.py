"""Failure detection of one replica: per-node detectors, their timing wheel, the interval."""

from arbiter.core.detection.base import DetectorState, FailureDetector
from arbiter.core.detection.interval import suggest_interval
from arbiter.core.detection.missed import MissedHeartbeatDetector
from arbiter.core.detection.phi import PhiAccrualDetector, threshold_sigmas
from arbiter.core.detection.wheel import TimingWheel

__all__ = [
    "DetectorState",
    "FailureDetector",
    "MissedHeartbeatDetector",
    "PhiAccrualDetector",
    "TimingWheel",
    "suggest_interval",
    "threshold_sigmas",
]
