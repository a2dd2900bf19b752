"""The read lag (arbiter/server/readlag.py): queueing delay from send times, no clock sync."""

from __future__ import annotations

import math

import pytest

from arbiter.server.load import LocalHealth
from arbiter.server.readlag import BASE_BUCKET, ReadLag, StreamBase


def test_readlag_queueing_delay_cancels_the_clock_offset() -> None:
    base = StreamBase()
    offset = -37.25  # the node's clock runs 37.25 s ahead: every delay is negative
    assert base.queued(offset + 0.002, 0.0) == 0.0  # the first is the base
    assert base.queued(offset + 0.001, 0.1) == 0.0  # a faster one lowers it
    assert base.queued(offset + 0.801, 0.2) == pytest.approx(0.8)  # read 0.8 s late


def test_readlag_a_clock_stepped_back_is_forgotten_after_two_buckets() -> None:
    base = StreamBase()
    base.queued(0.001, 0.0)
    # The node's clock steps 5 s back: its heartbeats look 5 s late until the
    # bucket holding the old base is gone (RFC 6817's base delay history).
    assert base.queued(5.001, 1.0) == pytest.approx(5.0)
    assert base.queued(5.001, BASE_BUCKET + 1.0) == pytest.approx(5.0)
    assert base.queued(5.001, 2 * BASE_BUCKET + 1.0) == 0.0


def test_readlag_is_the_median_so_one_slow_stream_does_not_make_the_replica_late() -> None:
    lag = ReadLag(window=8, stale=1.0)
    assert lag.lateness(0.0) == 0.0  # nothing read yet
    for i in range(8):
        lag.add(3.0 if i % 4 == 0 else 0.01, 10.0)  # two of eight streams slow
    assert lag.lateness(10.0) == pytest.approx(0.01)
    for _ in range(8):
        lag.add(1.5, 10.5)  # everyone read 1.5 s late: the replica is behind
    assert lag.lateness(10.5) == pytest.approx(1.5)
    assert lag.lateness(11.6) == 0.0  # nothing read for `stale` s: the loop lag's to see


@pytest.mark.parametrize(("window", "stale"), [(0, 1.0), (8, 0.0), (8, math.nan)])
def test_readlag_refuses_a_bad_window_or_stale(window: int, stale: float) -> None:
    with pytest.raises(ValueError, match="window > 0 and stale > 0"):
        ReadLag(window=window, stale=stale)


class _Lag:
    latest_late = (0.0, -math.inf)

    def recent_lag(self, now: float, at: float) -> float:
        return 0.0

    def mean_lateness(self, now: float) -> float:
        return 0.0


def test_readlag_counts_as_lateness_not_as_a_backlog_to_shed_on() -> None:
    h = LocalHealth(_Lag(), listen_after=0.15)  # type: ignore[arg-type]
    h.add_source(lambda now: 1.2, backlog=False)
    assert h.lateness(5.0) == pytest.approx(1.2)
    assert h.backlog(5.0) == 0.0
