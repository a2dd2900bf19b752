"""The adaptive heartbeat interval: load per replica within the budget, a cap that grows
with N, the measured load moving it with hysteresis, the grace covering the longest lease."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arbiter.config import ArbiterConfig
from arbiter.core.detection.interval import (
    STEP,
    IntervalGovernor,
    LoadPolicy,
    interval_cap,
    load_cap,
    suggest_interval,
)
from membership.shared.errors import InvalidArgument

BASE, BUDGET, MAX = 0.15, 5000.0, 0.6


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        (0, 0.15),
        (1, 0.15),
        (750, 0.15),  # exactly budget x base: still the base interval
        (751, 0.15 * 1.25),
        (1000, 0.15 * 1.25**2),  # 0.2 s needed -> 0.234 s
        (2000, 0.15 * 1.25**5),  # 0.4 s needed -> 0.458 s
        (3000, 0.6),  # 0.6 s needed: the cap, exactly at budget
        (10_000, 0.6),  # over budget: the cap holds
    ],
)
def test_interval_table(nodes: int, expected: float) -> None:
    assert suggest_interval(nodes, base=BASE, budget=BUDGET, maximum=MAX) == pytest.approx(expected)


@given(st.integers(0, 10**6), st.floats(0.01, 2.0), st.floats(1.0, 1e5), st.floats(1.0, 50.0))
def test_interval_keeps_load_within_budget_below_the_cap(
    nodes: int, base: float, budget: float, cap_factor: float
) -> None:
    maximum = base * cap_factor
    h = suggest_interval(nodes, base=base, budget=budget, maximum=maximum)
    assert base <= h <= maximum
    if h < maximum:
        assert nodes / h <= budget * (1 + 1e-9)  # within budget
        if h > base:  # and the smallest step that is
            assert nodes / (h / STEP) > budget * (1 - 1e-9)


@given(st.integers(0, 10**5), st.integers(0, 10**5))
def test_interval_is_monotonic_in_the_node_count(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    f = lambda n: suggest_interval(n, base=BASE, budget=BUDGET, maximum=MAX)  # noqa: E731
    assert f(lo) <= f(hi)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"nodes": -1, "base": 0.1, "budget": 10.0, "maximum": 1.0},
        {"nodes": 1, "base": 0.0, "budget": 10.0, "maximum": 1.0},
        {"nodes": 1, "base": 0.1, "budget": 0.0, "maximum": 1.0},
        {"nodes": 1, "base": 0.1, "budget": 10.0, "maximum": 0.05},
    ],
)
def test_interval_bad_arguments_raise(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        suggest_interval(**kwargs)  # type: ignore[arg-type]


def test_interval_infinite_budget_always_suggests_the_base() -> None:
    assert suggest_interval(10**9, base=BASE, budget=math.inf, maximum=MAX) == BASE


def test_interval_config_lease_scales_and_the_grace_covers_the_longest_lease() -> None:
    cfg = ArbiterConfig.lan().validate()
    s = cfg.replica_settings()
    assert s.lease_for(cfg.heartbeat_interval) == pytest.approx(cfg.lease)
    assert s.lease_for(cfg.interval_ceiling) == pytest.approx(cfg.max_lease)
    assert cfg.interval_ceiling == pytest.approx(load_cap(10_000, budget=BUDGET, maximum=MAX))
    assert cfg.max_lease <= cfg.grace  # interval rule 6, observer rule 5
    assert cfg.grace == pytest.approx(5 * cfg.interval_ceiling)  # 17.9 s at 10,000 nodes
    # A longer H_max raises the grace with it (derived) instead of being refused.
    big = ArbiterConfig.lan(max_heartbeat_interval=2.0, max_nodes=100).validate()
    assert big.grace == pytest.approx(10.0) and big.restart_grace == 3.0


def test_interval_local_preset_keeps_the_small_cluster_timings() -> None:
    cfg = ArbiterConfig.local().validate()
    assert cfg.interval_ceiling == pytest.approx(0.6)
    assert cfg.grace == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"max_heartbeat_interval": 0.1}, "max_heartbeat_interval"),
        ({"missed_heartbeats": 2.0, "lease_fraction": 0.5}, "2 x heartbeat_interval"),
        ({"heartbeat_budget": 0.0}, "heartbeat_budget"),
        ({"status_interval": -1.0}, "status_interval"),
        ({"load_target": 1.0}, "load_target"),
        ({"shed_utilisation": 0.5}, "shed_utilisation"),
        ({"shed_lateness": 0.0}, "shed_lateness"),
        ({"restart_grace": -1.0}, "restart_grace"),
    ],
)
def test_interval_config_relations_are_checked(overrides: dict[str, float], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        ArbiterConfig.lan(**overrides).validate()


@pytest.mark.parametrize("preset", [ArbiterConfig.lan, ArbiterConfig.local])
def test_interval_presets_validate(preset: object) -> None:
    preset().validate()  # type: ignore[operator]


# --- the cap that grows with N (rule 3) ------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "cap", "limit"),
    [
        (0, 0.6, 0.6),
        (1_920, 0.6, 0.6),  # the load cap leaves H_max up to B x H_max / 1.5625 nodes
        (3_000, 0.6, 0.6 * 1.25**2),  # the cap is H_max up to B x H_max nodes
        (3_001, 0.75, 0.6 * 1.25**3),
        (10_000, 0.6 * 1.25**6, 0.6 * 1.25**8),
        (100_000, 0.6 * 1.25**16, 0.6 * 1.25**18),
    ],
)
def test_interval_cap_grows_with_the_node_count(nodes: int, cap: float, limit: float) -> None:
    assert interval_cap(nodes, budget=BUDGET, maximum=MAX) == pytest.approx(cap)
    assert load_cap(nodes, budget=BUDGET, maximum=MAX) == pytest.approx(limit)


@given(st.integers(0, 10**6))
def test_interval_budget_holds_at_the_cap_at_every_n(nodes: int) -> None:
    g = IntervalGovernor(base=BASE, budget=BUDGET, maximum=MAX, ceiling=math.inf)
    cap = interval_cap(nodes, budget=BUDGET, maximum=MAX)
    assert nodes / cap <= BUDGET * (1 + 1e-9)
    assert nodes / g.nominal(nodes) <= BUDGET * (1 + 1e-9)  # the count rule, uncapped above
    assert g.nominal(nodes) <= cap <= g.limit(nodes)


def test_interval_nominal_is_the_old_table_up_to_3000_nodes() -> None:
    g = IntervalGovernor(base=BASE, budget=BUDGET, maximum=MAX, ceiling=10.0)
    for n in (0, 750, 751, 1000, 2000, 3000):
        assert g.nominal(n) == pytest.approx(
            suggest_interval(n, base=BASE, budget=BUDGET, maximum=MAX)
        )
    assert g.nominal(10_000) == pytest.approx(0.15 * 1.25**12)  # 2.18 s, within budget
    assert g.nominal(10**6) == 10.0  # the ceiling bounds everything


# --- the load rule (rule 4) ------------------------------------------------------


def _governor(**policy: float) -> IntervalGovernor:
    return IntervalGovernor(
        base=BASE, budget=BUDGET, maximum=MAX, ceiling=100.0, policy=LoadPolicy(**policy)
    )


def test_interval_load_up_raises_the_interval_at_once_by_enough_steps() -> None:
    g = _governor()
    n = 1000  # nominal 0.234 s, load cap 0.6 s
    assert g.suggest(n) == pytest.approx(0.15 * 1.25**2)
    assert g.observe(0.95, n, now=0.0)  # 0.95 / 0.6 -> 3 steps (1.95x)
    assert g.steps == 3 and g.suggest(n) == pytest.approx(0.15 * 1.25**5)
    # Within up_after, even more load does not move it again (nodes adopt it first).
    assert not g.observe(1.0, n, now=1.0)
    assert g.observe(1.0, n, now=2.5)
    assert g.suggest(n) == pytest.approx(0.6)  # the load cap at 1,000 nodes
    assert not g.observe(1.0, n, now=10.0)  # capped: nothing more to give
    assert g.steps == 5  # the first step that reaches the cap: no wind-up past it


def test_interval_load_down_one_step_per_settle_time_and_below_the_budget_prior() -> None:
    g = _governor(down_after=10.0, down_steps=3)
    n = 3000  # nominal 0.6
    g.observe(0.9, n, now=0.0)
    high = g.suggest(n)
    assert high > 0.6
    for t in range(1, 10):
        assert not g.observe(0.1, n, now=float(t))  # low, but not for 10 s yet
    assert g.observe(0.1, n, now=11.0) and g.suggest(n) == pytest.approx(high / STEP)
    assert not g.observe(0.1, n, now=15.0)
    t = 15.0
    while g.observe(0.1, n, now=t + 11.0) or t < 200:
        t += 11.0
    # At most down_steps below the count rule: the measurement decides, within bounds.
    assert g.suggest(n) == pytest.approx(0.6 / STEP**3)


def test_interval_hysteresis_band_does_not_move_it() -> None:
    g = _governor()
    n = 1000
    g.observe(0.9, n, now=0.0)
    h = g.suggest(n)
    # Anywhere between low and high, for as long as it lasts: no change.
    for t in range(1, 300):
        assert not g.observe(0.4 + (t % 7) * 0.05, n, now=float(t))
    assert g.suggest(n) == h


def test_interval_load_does_not_oscillate_with_load_proportional_to_the_rate() -> None:
    # A replica whose busy fraction is rate x cost: the suggestion settles, then stays.
    g = _governor()
    n, cost = 3000, 0.00015  # 150 us per heartbeat: 0.75 busy at 5,000/s
    seen = []
    for t in range(600):
        g.observe(n / g.suggest(n) * cost, n, now=float(t))
        seen.append(g.suggest(n))
    assert len(set(seen[100:])) == 1  # settled
    assert n / seen[-1] * cost <= LoadPolicy().high


def test_interval_a_load_spike_after_going_faster_returns_to_the_count_rule_first() -> None:
    g = _governor(down_after=1.0)
    n = 3000
    for t in range(40):
        g.observe(0.05, n, now=float(t))
    assert g.steps < 0
    g.observe(0.8, n, now=50.0)  # never below the count rule once over high
    assert g.suggest(n) >= g.nominal(n) * STEP


@pytest.mark.parametrize(
    "policy",
    [
        {"low": 0.7, "target": 0.6, "high": 0.75},
        {"low": 0.65, "target": 0.7, "high": 0.8},  # 0.65 x 1.25 > 0.8: no band
        {"high": 1.5},
        {"up_after": 0.0},
    ],
)
def test_interval_bad_load_policy_raises(policy: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LoadPolicy(**policy).validate()  # type: ignore[arg-type]


def test_interval_observe_refuses_nan_and_negative_load() -> None:
    g = _governor()
    for bad in (math.nan, -0.1):
        with pytest.raises(ValueError):
            g.observe(bad, 10, now=0.0)


def test_interval_infinite_budget_ignores_load() -> None:
    g = IntervalGovernor(base=BASE, budget=math.inf, maximum=MAX, ceiling=MAX)
    g.observe(1.0, 10**6, now=0.0)
    assert g.suggest(10**6) == BASE
