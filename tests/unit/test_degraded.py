"""DEGRADED rules (arbiter/core/degraded.py) and the detectors' inter-arrival jitter
(arbiter/core/detection/base.py rule 7): time is passed in, nothing sleeps."""

from __future__ import annotations

import collections
import random
from collections.abc import Callable

import pytest

from arbiter.config import ArbiterConfig
from arbiter.core.degraded import DegradedPolicy, NodeSignals, StepHistory, judge
from arbiter.core.detection import (
    FailureDetector,
    InterArrival,
    MissedHeartbeatDetector,
    PhiAccrualDetector,
)
from membership.shared.errors import InvalidArgument

POLICY = DegradedPolicy(min_samples=10, step_window=10.0, min_steps=5)
H = 0.15


def _ia(jitter: float, samples: int = 50, interval: float = H) -> InterArrival:
    return InterArrival(samples=samples, mean=interval, jitter=jitter, interval=interval)


# --- detector statistics (rule 7) ------------------------------------------------------


DETECTORS: list[Callable[[], FailureDetector]] = [
    lambda: MissedHeartbeatDetector(interval=H, missed_limit=5.0),
    lambda: PhiAccrualDetector(interval=H, acceptable_heartbeat_pause=0.4),
]


def _feed(d: FailureDetector, gaps: list[float], t: float = 0.0, node: str = "n1") -> float:
    for gap in gaps:
        t += gap
        d.heartbeat(node, t)
    return t


@pytest.mark.parametrize("make", DETECTORS, ids=["missed", "phi"])
def test_inter_arrival_regular_heartbeats_have_no_jitter_and_irregular_ones_do(
    make: Callable[[], FailureDetector],
) -> None:
    d = make()
    assert d.inter_arrival("n1") is None
    _feed(d, [H] * 60)
    regular = d.inter_arrival("n1")
    assert regular is not None and regular.samples == 59  # the first heartbeat is no gap
    assert regular.mean == pytest.approx(H) and regular.jitter == pytest.approx(0.0, abs=1e-9)
    rng = random.Random(7)
    _feed(d, [rng.choice((0.05, 0.35)) for _ in range(100)], t=100.0, node="n2")
    jittery = d.inter_arrival("n2")
    assert jittery is not None and jittery.samples == 99
    # Gaps of 0.05 or 0.35 s at random: mean ~0.2, mean absolute deviation ~0.15.
    assert 0.08 < jittery.jitter < 0.22
    assert jittery.interval == H


@pytest.mark.parametrize("make", DETECTORS, ids=["missed", "phi"])
def test_inter_arrival_restarts_after_a_suspicion_a_held_silence_or_a_new_interval(
    make: Callable[[], FailureDetector],
) -> None:
    d = make()
    t = _feed(d, [H] * 20)
    # A silence past the detector's deadline is a death or a pause, not jitter.
    assert d.tick(t + 2.0) == ["n1"]
    d.heartbeat("n1", t + 2.0)
    stats = d.inter_arrival("n1")
    assert stats is not None and stats.samples == 0
    t = _feed(d, [H] * 20, t=t + 2.0)
    # A silence a hold (a lease, a grace window) covered does not count either.
    d.hold("n1", t + 30.0)
    assert d.tick(t + 10.0) == []
    d.heartbeat("n1", t + 10.0)
    stats = d.inter_arrival("n1")
    assert stats is not None and stats.samples == 0 and stats.jitter == 0.0
    t = _feed(d, [H] * 5, t=t + 10.0)
    d.heartbeat("n1", t + 0.3, interval=0.3)  # another cadence
    stats = d.inter_arrival("n1")
    assert stats is not None and stats.samples == 0 and stats.interval == 0.3


# --- rule 2: jitter ----------------------------------------------------------------------


def test_judge_jitter_far_above_the_others_median_is_degraded() -> None:
    nodes = [NodeSignals(node_id=f"n{i}", inter_arrival=_ia(0.004)) for i in range(4)]
    nodes.append(NodeSignals(node_id="bad", inter_arrival=_ia(0.06)))
    marks = judge(nodes, POLICY)
    assert list(marks) == ["bad"]
    (mark,) = marks["bad"]
    assert mark.cause == "jitter"
    assert "60 ms" in mark.reason and "15.0x" in mark.reason and "4 other" in mark.reason


@pytest.mark.parametrize(
    ("jitter", "samples", "why"),
    [
        (0.02, 50, "under the floor: 0.2 x 150 ms = 30 ms"),
        (0.012, 50, "not 4x the median (4 ms): 3x"),
        (0.5, 9, "cold start: fewer than min_samples"),
    ],
)
def test_judge_jitter_spares_the_floor_the_factor_and_a_cold_start(
    jitter: float, samples: int, why: str
) -> None:
    nodes = [NodeSignals(node_id=f"n{i}", inter_arrival=_ia(0.004)) for i in range(4)]
    nodes.append(NodeSignals(node_id="x", inter_arrival=_ia(jitter, samples=samples)))
    assert judge(nodes, POLICY) == {}, why


def test_judge_jitter_needs_another_node_and_compares_without_the_node_itself() -> None:
    alone = [NodeSignals(node_id="x", inter_arrival=_ia(0.5))]
    assert judge(alone, POLICY) == {}
    # Two nodes: each is compared with the other (its own jitter would drag the median).
    pair = [
        NodeSignals(node_id="x", inter_arrival=_ia(0.5)),
        NodeSignals(node_id="y", inter_arrival=_ia(0.01)),
    ]
    assert list(judge(pair, POLICY)) == ["x"]
    # Peers with too few samples do not count as "the cluster".
    pair[1] = NodeSignals(node_id="y", inter_arrival=_ia(0.01, samples=3))
    assert judge(pair, POLICY) == {}


# --- rule 3: step rate -------------------------------------------------------------------


def test_step_history_rate_needs_a_whole_window_and_falls_when_the_step_stops() -> None:
    h = StepHistory(window=10.0)
    assert h.rate(0.0) is None
    for t in range(0, 10):
        h.observe(t * 10, float(t))  # 10 steps/s
    assert h.rate(9.0) is None  # 9 s of history: a cold start is not judged
    h.observe(100, 10.0)
    rate = h.rate(10.0)
    assert rate is not None and rate[0] == pytest.approx(10.0) and rate[1] == 100
    # Stuck at step 100 from t = 10: the rate over the last window falls to 0.
    later = h.rate(25.0)
    assert later is not None and later[0] < 1.0
    late = h.rate(40.0)
    assert late is not None and late == (0.0, 0)
    # A restart from a checkpoint (the step goes down) starts the history again.
    h.observe(50, 41.0)
    assert h.rate(45.0) is None


def test_step_history_memory_is_bounded_whatever_the_rate() -> None:
    h = StepHistory(window=10.0)
    for i in range(100_000):
        h.observe(i, i * 0.001)  # 1,000 steps/s for 100 s
    assert h._times is not None and len(h._times) <= 18
    rate = h.rate(100.0)
    assert rate is not None and rate[0] == pytest.approx(1000.0, rel=0.01)
    # A node that reports no step holds no anchors at all (one history per node).
    quiet = StepHistory(window=10.0)
    assert quiet.rate(50.0) is None and quiet._times is None


class _DequeStepHistory:
    """StepHistory as it was before its anchors became flat arrays: the reference."""

    def __init__(self, window: float) -> None:
        self._window = window
        self._anchors: collections.deque[tuple[float, int]] = collections.deque()
        self._last: int | None = None

    def observe(self, step: int, now: float) -> None:
        last = self._last
        if last is not None and step < last:
            self._anchors.clear()
        elif step == last:
            return
        self._last = step
        anchors = self._anchors
        if not anchors or now - anchors[-1][0] >= self._window / 16:
            anchors.append((now, step))
        while len(anchors) >= 2 and anchors[1][0] <= now - self._window:
            anchors.popleft()

    def rate(self, now: float) -> tuple[float, int] | None:
        anchors = self._anchors
        while len(anchors) >= 2 and anchors[1][0] <= now - self._window:
            anchors.popleft()
        if not anchors or self._last is None:
            return None
        start, step = anchors[0]
        span = now - start
        if span < self._window:
            return None
        return (self._last - step) / span, self._last - step


@pytest.mark.parametrize("seed", range(5))
def test_step_history_rates_equal_the_deque_reference(seed: int) -> None:
    rng = random.Random(seed)
    h, ref = StepHistory(window=10.0), _DequeStepHistory(window=10.0)
    now, step = 0.0, 0
    for _ in range(3_000):
        now += rng.choice([0.0, 0.05, 0.3, 1.0, 4.0, 12.0])
        r = rng.random()
        if r < 0.45:
            step += rng.choice([0, 1, 5, 2**40])
            h.observe(step, now)
            ref.observe(step, now)
        elif r < 0.47:  # a restart from a checkpoint
            step = rng.randrange(0, step + 1)
            h.observe(step, now)
            ref.observe(step, now)
        else:
            assert h.rate(now) == ref.rate(now)


def _job(rates: dict[str, float], job: str = "j1") -> list[NodeSignals]:
    window = POLICY.step_window
    return [
        NodeSignals(node_id=n, job=job, step_rate=(r, int(r * window))) for n, r in rates.items()
    ]


def test_judge_step_rate_far_below_the_median_of_its_job_is_degraded() -> None:
    marks = judge(_job({"n1": 10.0, "n2": 9.0, "n3": 11.0, "slow": 2.0}), POLICY)
    assert list(marks) == ["slow"]
    (mark,) = marks["slow"]
    assert mark.cause == "step_rate"
    assert "job j1" in mark.reason and "0.20x" in mark.reason and "3 other" in mark.reason
    # Other jobs are not compared with this one.
    other = judge(_job({"n1": 10.0, "n2": 9.0}) + _job({"m1": 1.0, "m2": 1.1}, job="j2"), POLICY)
    assert other == {}


@pytest.mark.parametrize(
    ("rates", "why"),
    [
        ({"n1": 10.0, "n2": 9.0, "x": 6.0}, "0.63x the median: above the fraction 0.5"),
        ({"n1": 0.3, "n2": 0.3, "x": 0.0}, "peers made 3 steps in the window, < min_steps 5"),
        ({"n1": 0.0, "n2": 0.0, "x": 0.0}, "a paused job (all checkpointing) is nobody's fault"),
        ({"x": 0.0}, "alone in its job"),
    ],
)
def test_judge_step_rate_spares_what_is_not_far_below_a_moving_job(
    rates: dict[str, float], why: str
) -> None:
    assert judge(_job(rates), POLICY) == {}, why


def test_judge_step_rate_ignores_nodes_without_a_job_or_a_rate() -> None:
    nodes = [
        *_job({"n1": 10.0, "n2": 10.0}),
        NodeSignals(node_id="nojob", step_rate=(0.0, 0)),
        NodeSignals(node_id="cold", job="j1"),
    ]
    assert judge(nodes, POLICY) == {}


# --- rule 4, 5: the flag, several causes -------------------------------------------------


def test_judge_unhealthy_flag_is_degraded_at_once_with_its_reason() -> None:
    marks = judge(
        [
            NodeSignals(node_id="a", healthy=False, health_reason="ECC errors on GPU 3"),
            NodeSignals(node_id="b", healthy=False),
            NodeSignals(node_id="c", healthy=True),
            NodeSignals(node_id="d"),
        ],
        POLICY,
    )
    assert {n: [(m.cause, m.reason) for m in ms] for n, ms in marks.items()} == {
        "a": [("unhealthy", "ECC errors on GPU 3")],
        "b": [("unhealthy", "the application reports it unhealthy")],
    }


def test_judge_reports_every_cause_of_one_node_in_order() -> None:
    nodes = [
        NodeSignals(node_id=f"n{i}", job="j1", inter_arrival=_ia(0.004), step_rate=(10.0, 100))
        for i in range(3)
    ]
    nodes.append(
        NodeSignals(
            node_id="bad",
            job="j1",
            inter_arrival=_ia(0.2),
            step_rate=(1.0, 10),
            healthy=False,
            health_reason="sick",
        )
    )
    marks = judge(nodes, POLICY)
    assert [m.cause for m in marks["bad"]] == ["jitter", "step_rate", "unhealthy"]
    assert list(marks) == ["bad"]


# --- the thresholds -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("degraded_jitter_factor", 1.0),
        ("degraded_jitter_floor", -0.1),
        ("degraded_min_samples", 1),
        ("degraded_step_fraction", 1.0),
        ("degraded_step_fraction", 0.0),
        ("degraded_step_window", 0.0),
        ("degraded_min_steps", 0),
    ],
)
def test_degraded_thresholds_are_checked_by_the_configuration(field: str, value: float) -> None:
    with pytest.raises(InvalidArgument, match=field):
        ArbiterConfig.local(**{field: value}).validate()


def test_degraded_policy_defaults_are_the_configuration_defaults() -> None:
    assert ArbiterConfig.lan().degraded_policy() == DegradedPolicy()
