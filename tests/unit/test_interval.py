"""The adaptive heartbeat interval: load per replica within the budget, detection scaled."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arbiter.config import ArbiterConfig
from arbiter.core.detection.interval import STEP, suggest_interval
from membership.errors import InvalidArgument

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


def test_interval_config_lease_scales_and_fits_the_restart_grace() -> None:
    cfg = ArbiterConfig.lan().validate()
    s = cfg.replica_settings()
    assert s.lease_for(cfg.heartbeat_interval) == pytest.approx(cfg.lease)
    assert s.lease_for(cfg.max_heartbeat_interval) == pytest.approx(cfg.max_lease)
    assert cfg.max_lease <= cfg.restart_grace


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"max_heartbeat_interval": 0.1}, "max_heartbeat_interval"),
        ({"max_heartbeat_interval": 2.0}, "restart_grace"),  # lease 10 s > grace 3 s
        ({"missed_heartbeats": 2.0, "lease_fraction": 0.5}, "2 x heartbeat_interval"),
        ({"heartbeat_budget": 0.0}, "heartbeat_budget"),
        ({"status_interval": -1.0}, "status_interval"),
    ],
)
def test_interval_config_relations_are_checked(overrides: dict[str, float], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        ArbiterConfig.lan(**overrides).validate()


@pytest.mark.parametrize("preset", [ArbiterConfig.lan, ArbiterConfig.local])
def test_interval_presets_validate(preset: object) -> None:
    preset().validate()  # type: ignore[operator]
