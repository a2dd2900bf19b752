"""Unit tests of arbiter.core.detection (base and missed): time is passed in, nothing sleeps."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbiter.core.detection import DetectorState, FailureDetector, MissedHeartbeatDetector


def make(interval: float = 1.0, missed_limit: float = 3.0) -> MissedHeartbeatDetector:
    return MissedHeartbeatDetector(interval=interval, missed_limit=missed_limit)


def test_detector_implements_protocol() -> None:
    detector: FailureDetector = make()  # checked by mypy
    assert detector.next_deadline() is None


@pytest.mark.parametrize(
    ("interval", "missed_limit"),
    [
        (0.0, 3.0),
        (-1.0, 3.0),
        (math.nan, 3.0),
        (math.inf, 3.0),
        (1.0, 0.99),
        (1.0, 0.0),
        (1.0, math.nan),
        (1.0, math.inf),
    ],
)
def test_detector_rejects_bad_arguments(interval: float, missed_limit: float) -> None:
    with pytest.raises(ValueError):
        MissedHeartbeatDetector(interval=interval, missed_limit=missed_limit)


def test_detector_first_heartbeat_turns_healthy() -> None:
    d = make()
    assert d.state("n") is None and d.last_heard("n") is None
    assert d.heartbeat("n", 10.0) is True
    assert d.state("n") is DetectorState.HEALTHY
    assert d.last_heard("n") == 10.0
    assert d.heartbeat("n", 10.5) is False
    assert len(d) == 1


def test_detector_suspects_at_deadline_once() -> None:
    d = make(interval=1.0, missed_limit=3.0)
    d.heartbeat("n", 0.0)
    assert d.next_deadline() == 3.0
    assert d.tick(2.999) == []
    assert d.state("n") is DetectorState.HEALTHY
    assert d.tick(3.0) == ["n"]
    assert d.state("n") is DetectorState.SUSPECT
    assert d.tick(100.0) == []  # reported once per suspicion
    assert d.next_deadline() is None


def test_detector_heartbeat_revives_and_suspects_again() -> None:
    d = make(interval=1.0, missed_limit=2.0)
    d.heartbeat("n", 0.0)
    assert d.tick(5.0) == ["n"]
    assert d.heartbeat("n", 6.0) is True  # SUSPECT -> HEALTHY
    assert d.state("n") is DetectorState.HEALTHY
    assert d.next_deadline() == 8.0
    assert d.tick(8.0) == ["n"]


def test_detector_heartbeats_postpone_and_next_deadline_is_exact() -> None:
    d = make(interval=1.0, missed_limit=3.0)
    for t in (0.0, 1.0, 2.0):
        d.heartbeat("n", t)
    # The heap entry armed at 3.0 is early; next_deadline re-arms it, not reports 3.0.
    assert d.next_deadline() == 5.0
    assert d.tick(4.9) == []
    assert d.tick(5.0) == ["n"]


def test_detector_early_entry_rearmed_by_tick() -> None:
    d = make(interval=1.0, missed_limit=3.0)
    d.heartbeat("n", 0.0)
    d.heartbeat("n", 2.0)
    assert d.tick(3.5) == []  # the entry at 3.0 fires early and is re-armed at 5.0
    assert d.next_deadline() == 5.0


def test_detector_tick_reports_sorted() -> None:
    d = make(interval=1.0, missed_limit=1.0)
    for node, t in [("c", 0.0), ("a", 0.5), ("b", 0.2), ("z", 5.0)]:
        d.heartbeat(node, t)
    assert d.tick(2.0) == ["a", "b", "c"]
    assert d.next_deadline() == 6.0


@pytest.mark.parametrize(
    ("beats", "deadline"),
    [
        ([(0.0, 0.5)], 1.5),  # override from the first heartbeat
        ([(0.0, 0.5), (1.0, None)], 2.5),  # the override sticks
        ([(0.0, 2.0), (1.0, 0.1)], 1.3),  # a shorter interval moves the deadline earlier
        ([(0.0, 0.1), (0.1, 2.0)], 6.1),  # a longer one later
    ],
)
def test_detector_per_node_interval(
    beats: list[tuple[float, float | None]], deadline: float
) -> None:
    d = make(interval=1.0, missed_limit=3.0)
    for now, interval in beats:
        d.heartbeat("n", now, interval)
    assert d.next_deadline() == pytest.approx(deadline)
    assert d.tick(deadline - 1e-9) == []
    assert d.tick(deadline + 1e-9) == ["n"]


@pytest.mark.parametrize("interval", [0.0, -1.0, math.nan, math.inf])
def test_detector_heartbeat_rejects_bad_interval(interval: float) -> None:
    with pytest.raises(ValueError):
        make().heartbeat("n", 0.0, interval)


def test_detector_heartbeat_rejects_time_running_backwards() -> None:
    d = make()
    d.heartbeat("n", 5.0)
    with pytest.raises(ValueError, match="backwards"):
        d.heartbeat("n", 4.0)
    assert d.heartbeat("n", 5.0) is False  # the same instant is fine


def test_detector_hold_postpones_suspicion() -> None:
    d = make(interval=1.0, missed_limit=3.0)
    d.heartbeat("n", 0.0)
    d.hold("n", 10.0)
    assert d.next_deadline() == 10.0
    d.hold("n", 7.0)  # a promise is never shortened
    assert d.next_deadline() == 10.0
    d.heartbeat("n", 1.0)  # holds survive heartbeats
    assert d.next_deadline() == 10.0
    assert d.tick(9.99) == []
    assert d.tick(10.0) == ["n"]


def test_detector_hold_shorter_than_timeout_changes_nothing() -> None:
    d = make(interval=1.0, missed_limit=3.0)
    d.heartbeat("n", 0.0)
    d.hold("n", 1.0)
    assert d.next_deadline() == 3.0


def test_detector_hold_refuses_suspect_and_untracked() -> None:
    d = make(interval=1.0, missed_limit=1.0)
    with pytest.raises(KeyError):
        d.hold("n", 5.0)
    d.heartbeat("n", 0.0)
    d.tick(1.0)
    with pytest.raises(ValueError, match="SUSPECT"):
        d.hold("n", 5.0)


def test_detector_remove_forgets_and_stale_entries_are_skipped() -> None:
    d = make(interval=1.0, missed_limit=3.0)
    d.heartbeat("n", 0.0)
    d.remove("n")
    d.remove("n")  # idempotent
    assert d.state("n") is None and len(d) == 0
    assert d.next_deadline() is None
    assert d.tick(100.0) == []
    # Tracked again: the old entry (deadline 3.0) must not fire for the new track.
    d.heartbeat("m", 0.0)
    d.remove("m")
    d.heartbeat("m", 2.0)
    assert d.tick(3.0) == []
    assert d.next_deadline() == 5.0
    assert d.tick(5.0) == ["m"]


def test_detector_suspicion_counts_missed_intervals() -> None:
    d = make(interval=2.0, missed_limit=3.0)
    with pytest.raises(KeyError):
        d.suspicion("n", 0.0)
    d.heartbeat("n", 10.0)
    assert d.suspicion("n", 10.0) == 0.0
    assert d.suspicion("n", 15.0) == 2.5
    assert d.suspicion("n", 9.0) == 0.0  # never negative


def test_detector_wheel_stays_small_under_steady_heartbeats() -> None:
    d = make(interval=1.0, missed_limit=3.0)
    for i in range(1000):
        d.heartbeat("n", i * 0.5)
    assert len(d._wheel) == 1  # one entry per node, whatever the heartbeats


# -- model check: the wheel agrees with an O(nodes) scan ------------------------


@dataclass
class _Model:
    last: float
    interval: float
    hold: float = -math.inf
    suspect: bool = False


_NODES = ["a", "b", "c", "d"]
_op = st.one_of(
    st.tuples(st.just("beat"), st.sampled_from(_NODES), st.sampled_from([None, 0.5, 1.0, 2.0])),
    st.tuples(st.just("hold"), st.sampled_from(_NODES), st.floats(0.0, 8.0)),
    st.tuples(st.just("remove"), st.sampled_from(_NODES), st.none()),
    st.tuples(st.just("tick"), st.none(), st.none()),
    st.tuples(st.just("deadline"), st.none(), st.none()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 3.0), _op), max_size=60))
def test_detector_matches_naive_model(
    steps: list[tuple[float, tuple[str, object, object]]],
) -> None:
    limit = 2.5
    d = make(interval=1.0, missed_limit=limit)
    model: dict[str, _Model] = {}

    def deadline(m: _Model) -> float:
        return max(m.last + m.interval * limit, m.hold)

    now = 0.0
    for advance, (kind, node, arg) in steps:
        now += advance
        if kind == "beat":
            assert isinstance(node, str)
            interval = arg if isinstance(arg, float) else None
            m = model.get(node)
            turned = m is None or m.suspect
            if m is None:
                m = model[node] = _Model(last=now, interval=interval or 1.0)
            m.last, m.suspect = now, False
            m.interval = interval or m.interval
            assert d.heartbeat(node, now, interval) is turned
        elif kind == "hold":
            assert isinstance(node, str) and isinstance(arg, float)
            m = model.get(node)
            if m is None or m.suspect:
                with pytest.raises((KeyError, ValueError)):
                    d.hold(node, now + arg)
            else:
                m.hold = max(m.hold, now + arg)
                d.hold(node, now + arg)
        elif kind == "remove":
            assert isinstance(node, str)
            model.pop(node, None)
            d.remove(node)
        elif kind == "tick":
            due = sorted(n for n, m in model.items() if not m.suspect and deadline(m) <= now)
            for n in due:
                model[n].suspect = True
            assert d.tick(now) == due
        else:
            healthy = [deadline(m) for m in model.values() if not m.suspect]
            assert d.next_deadline() == (min(healthy) if healthy else None)
        for n in _NODES:
            m = model.get(n)
            expected = (
                None
                if m is None
                else DetectorState.SUSPECT
                if m.suspect
                else (DetectorState.HEALTHY)
            )
            assert d.state(n) is expected
