"""Unit tests of arbiter.core.detection.phi: time is passed in, nothing sleeps."""

from __future__ import annotations

import collections
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbiter.config import ArbiterConfig
from arbiter.core.detection import DetectorState, FailureDetector, MissedHeartbeatDetector
from arbiter.core.detection.phi import PhiAccrualDetector, phi, threshold_sigmas
from membership.shared.errors import InvalidArgument

H = 0.15  # production heartbeat interval


def make(**kwargs: float) -> PhiAccrualDetector:
    params: dict[str, float] = {"interval": 1.0}
    params.update(kwargs)
    return PhiAccrualDetector(**params)  # type: ignore[arg-type]


def production() -> PhiAccrualDetector:
    detector = ArbiterConfig(detector_kind="phi").validate().detector()
    assert isinstance(detector, PhiAccrualDetector)
    return detector


def akka_phi(elapsed: float, mean: float, std: float) -> float:
    """Akka's PhiAccrualFailureDetector.phi, transcribed literally."""
    y = (elapsed - mean) / std
    e = math.exp(-y * (1.5976 + 0.070566 * y * y))
    if elapsed > mean:
        return -math.log10(e / (1.0 + e))
    return -math.log10(1.0 - 1.0 / (1.0 + e))


# -- the formula -----------------------------------------------------------------


# Hand computation: y = (t - mean) / std, z = -y * (1.5976 + 0.070566 y^2),
# e = exp(z), phi = -log10(e / (1 + e)).
#   y = 0:  e = 1, p = 1/2, phi = log10 2 = 0.301030
#   y = 1:  z = -1.668166, e = 0.188593, p = 0.158669, phi = 0.799508
#   y = 2:  z = -3.759728, e = 0.023290, p = 0.022760, phi = 1.642828
#   y = 3:  z = -6.698082, e = 0.001233, p = 0.001232, phi = 2.909475
#   y = 4:  z = -10.906624, e = 1.8336e-5, phi = 4.736695
#   y = -1: z = 1.668166, p = 1 - 1/(1 + 5.30243) = 0.841331, phi = 0.075033
#   y = -4: z = 10.906624, p = 1 - 1.8336e-5, phi = 7.963e-6
@pytest.mark.parametrize(
    ("elapsed", "mean", "std", "expected"),
    [
        (1.0, 1.0, 0.25, 0.301030),
        (1.25, 1.0, 0.25, 0.799508),
        (1.5, 1.0, 0.25, 1.642828),
        (1.75, 1.0, 0.25, 2.909475),
        (2.0, 1.0, 0.25, 4.736695),
        (0.75, 1.0, 0.25, 0.075033),
        (0.0, 1.0, 0.25, 0.000008),
        (0.3, 0.15, 0.0375, 4.736695),  # same y = 4 at the production interval
        (3.0, 1.0, 0.5, 4.736695),
    ],
)
def test_phi_matches_hand_computed_values(
    elapsed: float, mean: float, std: float, expected: float
) -> None:
    assert phi(elapsed, mean, std) == pytest.approx(expected, abs=1e-6)
    assert phi(elapsed, mean, std) == pytest.approx(akka_phi(elapsed, mean, std), rel=1e-12)


@pytest.mark.parametrize("y", [-3.0, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0])
def test_phi_approximates_the_normal_tail(y: float) -> None:
    exact = -math.log10(0.5 * math.erfc(y / math.sqrt(2.0)))
    assert phi(y, 0.0, 1.0) == pytest.approx(exact, abs=0.05)


@pytest.mark.parametrize("elapsed", [-1e9, -50.0, 0.0, 50.0, 1e3, 1e9])
def test_phi_is_finite_where_akka_overflows(elapsed: float) -> None:
    value = phi(elapsed, 1.0, 0.01)
    assert math.isfinite(value) and value >= 0


def test_phi_is_monotonic_in_elapsed_time() -> None:
    values = [phi(t / 100, 1.0, 0.25) for t in range(-500, 1000)]
    assert values == sorted(values)


@pytest.mark.parametrize("threshold", [0.5, 1.0, 3.0, 8.0, 12.0, 50.0])
def test_threshold_sigmas_inverts_phi(threshold: float) -> None:
    y = threshold_sigmas(threshold)
    assert phi(y, 0.0, 1.0) >= threshold
    assert phi(math.nextafter(y, 0.0), 0.0, 1.0) < threshold


@pytest.mark.parametrize("threshold", [0.0, 0.3, -1.0, math.nan, math.inf])
def test_threshold_sigmas_rejects_bad_thresholds(threshold: float) -> None:
    with pytest.raises(ValueError):
        threshold_sigmas(threshold)


# -- construction -------------------------------------------------------------


def test_phi_detector_implements_protocol() -> None:
    detector: FailureDetector = make()  # checked by mypy
    assert detector.next_deadline() is None


def test_phi_detector_defaults() -> None:
    d = make(interval=2.0)
    assert d.threshold == 8.0
    assert d.max_sample_size == 200
    assert d.min_std_deviation == 0.5
    assert d.acceptable_heartbeat_pause == 4.0
    assert d.first_heartbeat_estimate == 2.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"interval": 0.0},
        {"interval": math.nan},
        {"threshold": 0.2},
        {"threshold": math.inf},
        {"max_sample_size": 1},
        {"min_std_deviation": 0.0},
        {"acceptable_heartbeat_pause": -0.1},
        {"acceptable_heartbeat_pause": math.inf},
        {"first_heartbeat_estimate": 0.0},
    ],
)
def test_phi_detector_rejects_bad_arguments(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        make(**kwargs)


# -- cold start --------------------------------------------------------------------


def test_cold_start_seeds_history_like_akka() -> None:
    d = make(interval=1.0, acceptable_heartbeat_pause=0.0)
    assert d.heartbeat("n", 10.0) is True
    assert d.samples("n") == (1.25, 0.75)  # mean 1, deviation 1/4
    # phi with no real sample yet: finite, log10(2) one estimate after.
    assert d.suspicion("n", 10.0) == pytest.approx(phi(0.0, 1.0, 0.25))
    assert d.suspicion("n", 11.0) == pytest.approx(math.log10(2.0))
    assert math.isfinite(d.suspicion("n", 1e6))
    deadline = d.next_deadline()
    assert deadline == pytest.approx(10.0 + 1.0 + threshold_sigmas(8.0) * 0.25)


def test_phi_finite_with_zero_and_one_samples() -> None:
    d = make(interval=1.0)
    d.heartbeat("n", 0.0)  # zero real samples
    for now in (0.0, 0.5, 3.0, 100.0):
        assert math.isfinite(d.suspicion("n", now))
    d.heartbeat("n", 1.0)  # one real sample
    assert d.samples("n") == (1.25, 0.75, 1.0)
    for now in (1.0, 2.0, 5.0, 100.0):
        assert math.isfinite(d.suspicion("n", now))


def test_node_killed_after_one_heartbeat_is_suspected_at_d() -> None:
    cfg = ArbiterConfig(detector_kind="phi").validate()
    d = cfg.detector()
    d.heartbeat("n4", 0.0)
    deadline = d.next_deadline()
    assert deadline is not None
    assert deadline == pytest.approx(cfg.suspect_after, rel=1e-9)
    assert d.tick(deadline) == ["n4"]


# -- near-zero variance ---------------------------------------------------------------


def test_regular_heartbeats_then_one_two_interval_delay_is_not_suspected() -> None:
    d = production()
    t = 0.0
    for _ in range(2000):  # 5 minutes of zero-jitter heartbeats
        d.heartbeat("n1", t)
        t += H
    last = t - H
    # Fitted deviation is ~0: the floor keeps phi small for a 2 x H delay.
    delayed = last + H + 2 * H
    assert d.suspicion("n1", delayed) < d.threshold
    assert d.tick(delayed) == []
    assert d.heartbeat("n1", delayed) is False
    assert d.state("n1") is DetectorState.HEALTHY


def test_zero_variance_without_floor_would_suspect() -> None:
    """The same history with a tiny floor and no pause suspects: the floor matters."""
    d = make(interval=H, min_std_deviation=1e-6, acceptable_heartbeat_pause=0.0)
    t = 0.0
    for _ in range(400):
        d.heartbeat("n1", t)
        t += H
    assert d.tick(t - H + 3 * H) == ["n1"]


def test_window_is_bounded() -> None:
    d = make(interval=1.0, max_sample_size=5)
    for i in range(20):
        d.heartbeat("n", float(i))
    assert d.samples("n") == (1.0,) * 5


@settings(max_examples=100, deadline=None)
@given(
    gaps=st.lists(st.floats(min_value=0.01, max_value=2.0), max_size=40),
    size=st.integers(min_value=2, max_value=7),
)
def test_window_keeps_the_latest_samples_oldest_first(gaps: list[float], size: int) -> None:
    """Rule 7: the ring holds what a queue of the last ``max_sample_size`` samples would,
    in order, and phi is fitted to them."""
    d = make(interval=1.0, max_sample_size=size, acceptable_heartbeat_pause=100.0)
    queue: collections.deque[float] = collections.deque((1.25, 0.75), maxlen=size)
    t = 0.0
    d.heartbeat("n", t)
    for gap in gaps:
        now = t + gap
        d.heartbeat("n", now)  # never past its deadline (a pause of 100 s): always a sample
        queue.append(now - t)
        t = now
        assert d.samples("n") == tuple(queue)
    mean = math.fsum(queue) / len(queue)
    std = max(math.sqrt(max(0.0, math.fsum(x * x for x in queue) / len(queue) - mean**2)), 0.25)
    assert d.suspicion("n", t + 1.0) == pytest.approx(phi(1.0, mean + 100.0, std), rel=1e-9)


def test_suspected_silence_is_not_recorded() -> None:
    d = make(interval=1.0, acceptable_heartbeat_pause=0.0)
    d.heartbeat("n", 0.0)
    d.heartbeat("n", 1.0)
    assert d.tick(100.0) == ["n"]
    assert d.heartbeat("n", 100.0) is True
    assert d.samples("n") == (1.25, 0.75, 1.0)  # the 99 s gap is not a sample


def test_changed_interval_reseeds() -> None:
    d = make(interval=1.0)
    d.heartbeat("n", 0.0)
    d.heartbeat("n", 1.0)
    d.heartbeat("n", 2.0, interval=4.0)
    assert d.samples("n") == (5.0, 3.0)
    # pause (2 s at interval 1) and floor scale by 4.
    assert d.next_deadline() == pytest.approx(2.0 + 4.0 + 8.0 + threshold_sigmas(8.0) * 1.0)


# -- safety property ----------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    intervals=st.lists(st.floats(min_value=0.0, max_value=3 * H), min_size=0, max_size=300),
    fraction=st.floats(min_value=0.0, max_value=1.0),
)
def test_no_suspicion_within_mean_plus_acceptable_pause(
    intervals: list[float], fraction: float
) -> None:
    d = production()
    t = 1000.0
    d.heartbeat("n", t)
    for gap in intervals:
        t += gap
        d.heartbeat("n", t)
    window = d.samples("n")
    mean = math.fsum(window) / len(window)
    silence = fraction * d.acceptable_heartbeat_pause
    # A heartbeat delayed by at most the acceptable pause past the mean.
    for elapsed in (silence, mean + silence):
        assert d.suspicion("n", t + elapsed) < d.threshold
        assert d.tick(t + elapsed) == []
    assert d.state("n") is DetectorState.HEALTHY


@settings(max_examples=200, deadline=None)
@given(intervals=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=50))
def test_next_deadline_is_where_phi_reaches_threshold(intervals: list[float]) -> None:
    d = production()
    t = 0.0
    d.heartbeat("n", t)
    for gap in intervals:
        t += gap
        d.heartbeat("n", t)
    deadline = d.next_deadline()
    assert deadline is not None
    assert d.suspicion("n", deadline) >= d.threshold
    assert d.suspicion("n", math.nextafter(deadline, 0.0)) < d.threshold + 1e-9
    before = math.nextafter(deadline, -math.inf)
    assert d.tick(before) == []
    assert d.tick(deadline) == ["n"]


# -- deadlines, holds, removal -------------------------------------------------------------


def test_tick_at_next_deadline_reports_once() -> None:
    d = make(interval=1.0)
    d.heartbeat("a", 0.0)
    d.heartbeat("b", 0.5)
    first = d.next_deadline()
    assert first is not None
    assert d.tick(math.nextafter(first, 0.0)) == []
    assert d.tick(first) == ["a"]
    assert d.state("a") is DetectorState.SUSPECT
    second = d.next_deadline()
    assert second is not None
    assert second == pytest.approx(first + 0.5)
    assert d.tick(second + 100.0) == ["b"]
    assert d.tick(1e9) == []
    assert d.next_deadline() is None


def test_heartbeat_revives_and_rejects_time_running_backwards() -> None:
    d = make(interval=1.0)
    d.heartbeat("n", 5.0)
    assert d.tick(100.0) == ["n"]
    assert d.heartbeat("n", 100.0) is True
    assert d.state("n") is DetectorState.HEALTHY
    with pytest.raises(ValueError):
        d.heartbeat("n", 99.0)
    with pytest.raises(ValueError):
        d.heartbeat("n", 101.0, interval=0.0)


def test_hold_delays_suspicion_and_survives_heartbeats() -> None:
    d = make(interval=1.0)
    d.heartbeat("n", 0.0)
    natural = d.next_deadline()
    assert natural is not None
    d.hold("n", natural + 10.0)
    d.hold("n", 1.0)  # holds never shrink
    assert d.next_deadline() == natural + 10.0
    assert d.tick(natural + 5.0) == []
    assert d.suspicion("n", natural + 5.0) >= d.threshold  # phi is not the verdict
    d.heartbeat("n", natural + 5.0)  # after the phi deadline: not a sample
    assert d.samples("n") == (1.25, 0.75)
    # phi alone would fire at natural + 5 + natural (about natural + 9.3): the hold wins.
    assert natural + 5.0 + natural < natural + 10.0
    assert d.next_deadline() == natural + 10.0
    deadline = d.next_deadline()
    assert deadline is not None
    assert d.tick(deadline) == ["n"]
    with pytest.raises(ValueError):
        d.hold("n", deadline + 100.0)
    with pytest.raises(KeyError):
        d.hold("ghost", 1.0)


def test_remove_makes_entries_stale() -> None:
    d = make(interval=1.0)
    d.heartbeat("n", 0.0)
    d.heartbeat("m", 0.0)
    d.remove("n")
    d.remove("n")  # idempotent
    d.remove("ghost")
    assert d.state("n") is None and d.last_heard("n") is None
    with pytest.raises(KeyError):
        d.suspicion("n", 1.0)
    assert d.tick(1e6) == ["m"]
    # A new incarnation is not confused with the removed track's entry.
    d.heartbeat("n", 1e6)
    assert d.tick(1e6 + 1.0) == []
    assert len(d) == 2


def test_stale_entries_are_skipped_and_heartbeats_move_the_deadline() -> None:
    d = make(interval=1.0, max_sample_size=2)
    d.heartbeat("n", 0.0)
    for i in range(1, 50):
        d.heartbeat("n", i * 1.0)
    deadline = d.next_deadline()
    assert deadline is not None and deadline > 49.0
    assert d.tick(deadline - 1e-9) == []
    assert d.tick(deadline) == ["n"]
    assert d.next_deadline() is None


def test_shorter_intervals_move_the_deadline_earlier() -> None:
    d = make(interval=1.0, max_sample_size=2, acceptable_heartbeat_pause=0.0)
    d.heartbeat("n", 0.0)
    d.heartbeat("n", 0.1)
    d.heartbeat("n", 0.2)  # window (0.1, 0.1): mean 0.1, floor 0.25
    deadline = d.next_deadline()
    assert deadline is not None
    assert deadline == pytest.approx(0.2 + 0.1 + threshold_sigmas(8.0) * 0.25)
    assert d.tick(deadline) == ["n"]


# -- configuration -----------------------------------------------------------------------


def test_config_selects_detector() -> None:
    assert isinstance(ArbiterConfig().validate().detector(), MissedHeartbeatDetector)
    assert isinstance(production(), PhiAccrualDetector)
    with pytest.raises(InvalidArgument):
        ArbiterConfig(detector_kind="timeout").validate()


@pytest.mark.parametrize("missed", [2.0, 3.0, 5.0, 10.0])
def test_config_phi_suspects_clean_silence_at_d(missed: float) -> None:
    # A longer D means longer leases: the restart grace must cover the longest one.
    cfg = ArbiterConfig(
        detector_kind="phi", missed_heartbeats=missed, restart_grace=max(3.0, missed * 0.6)
    ).validate()
    d = cfg.detector()
    t = 0.0
    for _ in range(300):
        d.heartbeat("n", t)
        t += cfg.heartbeat_interval
    last = t - cfg.heartbeat_interval
    deadline = d.next_deadline()
    assert deadline is not None
    floor = cfg.heartbeat_interval * (1 + threshold_sigmas(8.0) / 4)
    assert deadline - last == pytest.approx(max(cfg.suspect_after, floor), rel=1e-6)
