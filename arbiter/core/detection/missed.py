"""Missed-heartbeat failure detector: suspect after a fixed number of silent intervals.

The default detector (docs/architecture.md, "Failure detection"). The rules
are those of every deadline detector
(``base.py``); this detector's deadline (rule 2) is

    max(last_heard + interval * missed_limit, hold_until)

with the node's own interval (rule 4: a heartbeat may carry a new one, which
sticks). Sans-I/O: time is the argument ``now``; nothing here reads a clock
or logs.
"""

from __future__ import annotations

import math

from arbiter.core.detection.base import DeadlineDetector, _check_positive, _Track

__all__ = ["MissedHeartbeatDetector"]


class MissedHeartbeatDetector(DeadlineDetector[_Track]):
    """Suspects a node after ``missed_limit`` heartbeat intervals without one.

    The classic fixed-timeout detector (the "missed heartbeats" count of
    Chandra and Toueg style detectors; memberlist's probe timeout works the
    same way): suspect when ``now - last_heard >= interval * missed_limit``,
    unless a lease :meth:`hold` is still running.
    """

    kind = "missed"

    def __init__(self, *, interval: float, missed_limit: float) -> None:
        """Creates an empty detector.

        Args:
            interval: default expected heartbeat interval, seconds (> 0).
            missed_limit: how many intervals may pass without a heartbeat
                before the node is suspected (>= 1; fractions allowed).

        Raises:
            ValueError: interval <= 0 or missed_limit < 1 (or not finite).
        """
        _check_positive("interval", interval)
        if not (math.isfinite(missed_limit) and missed_limit >= 1):
            raise ValueError(f"missed_limit must be a finite number >= 1, got {missed_limit!r}")
        self._interval = interval
        self._missed_limit = missed_limit
        super().__init__()

    @property
    def interval(self) -> float:
        """The default heartbeat interval, seconds."""
        return self._interval

    @property
    def missed_limit(self) -> float:
        """Intervals without a heartbeat before a node is suspected."""
        return self._missed_limit

    def _new_track(self, now: float, interval: float | None) -> _Track:
        return _Track(last_heard=now, interval=self._interval if interval is None else interval)

    def _heard(self, track: _Track, now: float, interval: float | None) -> None:
        track.last_heard = now
        if interval is not None:
            track.interval = interval

    def suspicion(self, node_id: str, now: float) -> float:
        """Missed intervals: ``(now - last_heard) / interval``, never below 0.

        The node is suspected once this reaches ``missed_limit`` (and no hold
        runs).

        Raises:
            KeyError: the node is not tracked.
        """
        track = self._nodes[node_id]
        return max(0.0, (now - track.last_heard) / track.interval)

    # -- internals ---------------------------------------------------------

    def _due(self, track: _Track) -> float:
        return track.last_heard + track.interval * self._missed_limit
