"""Unit tests of arbiter.core.detection.wheel: time is passed in, nothing sleeps."""

from __future__ import annotations

import math
import random
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbiter.core.detection.wheel import DEFAULT_RESOLUTION, DEFAULT_SLOTS, TimingWheel


def make(resolution: float = 1.0, slots: int = 8) -> TimingWheel[str]:
    # Small wheels (an 8 s revolution by default) so that tests cross revolutions.
    return TimingWheel(resolution=resolution, slots=slots)


def test_wheel_defaults_cover_detection_deadlines() -> None:
    w: TimingWheel[str] = TimingWheel()
    assert (w.resolution, w.slots) == (DEFAULT_RESOLUTION, DEFAULT_SLOTS)
    assert 0.005 <= w.resolution <= 0.02
    assert w.resolution * w.slots >= 3.0  # D at the longest suggested interval
    assert w.next_deadline() is None and len(w) == 0


@pytest.mark.parametrize(
    ("resolution", "slots"),
    [
        (0.0, 8),
        (-1.0, 8),
        (math.nan, 8),
        (math.inf, 8),
        (1e-320, 8),  # 1 / resolution overflows
        (1.0, 0),
        (1.0, 1),
        (1.0, 6),  # not a power of two
        (1.0, 8.0),
        (1.0, True),
    ],
)
def test_wheel_rejects_bad_parameters(resolution: float, slots: int) -> None:
    with pytest.raises(ValueError):
        TimingWheel(resolution=resolution, slots=slots)


def test_wheel_expires_at_deadline_once() -> None:
    w = make()
    w.schedule("a", 3.5)
    assert w.next_deadline() == 3.5
    assert w.expire(3.4999) == []
    assert w.expire(3.5) == ["a"]  # at, not strictly past
    assert w.expire(3.5) == [] and w.expire(100.0) == []
    assert w.next_deadline() is None and "a" not in w and w.deadline("a") is None


@pytest.mark.parametrize(
    ("deadlines", "now", "due", "left"),
    [
        ({"a": 1.0, "b": 2.0, "c": 3.0}, 2.0, ["a", "b"], 3.0),
        ({"a": 1.0, "b": 1.0, "c": 1.0}, 1.0, ["a", "b", "c"], None),
        ({"a": 1.2, "b": 1.7}, 1.5, ["a"], 1.7),  # one slot, split by the comparison
        ({"a": 0.5, "b": 30.0}, 29.9, ["a"], 30.0),  # b several revolutions away
        ({"a": -3.0, "b": -2.5}, -2.75, ["a"], -2.5),  # negative times
        ({"a": 1e6, "b": 1e6 + 0.01}, 1e6, ["a"], 1e6 + 0.01),  # large times
    ],
)
def test_wheel_expiry_table(
    deadlines: dict[str, float], now: float, due: list[str], left: float | None
) -> None:
    w = make()
    for key, deadline in deadlines.items():
        w.schedule(key, deadline)
    assert sorted(w.expire(now)) == due
    assert w.next_deadline() == left


def test_wheel_reschedule_moves_the_deadline_both_ways() -> None:
    w = make()
    w.schedule("a", 2.0)
    w.schedule("a", 6.0)  # later
    assert len(w) == 1 and w.deadline("a") == 6.0
    assert w.next_deadline() == 6.0
    assert w.expire(5.0) == []
    w.schedule("a", 5.5)  # earlier
    assert w.next_deadline() == 5.5
    assert w.expire(5.5) == ["a"]


@pytest.mark.parametrize(
    ("first", "second", "now", "due"),
    [
        (5.2, 4.9, 4.95, True),  # to the previous slot
        (5.2, 5.9, 5.5, False),  # within the slot, later
        (5.7, 5.1, 5.2, True),  # within the slot, earlier
        (5.2, 7.0, 6.0, False),  # to a later slot
        (5.2, 0.2, 0.5, True),  # to the cursor slot
        (5.2, -3.0, -1.0, True),  # before the cursor: into the cursor slot
        (5.2, 40.0, 39.0, False),  # into the overflow heap
        (40.0, 5.1, 5.5, True),  # out of it
    ],
)
def test_wheel_reschedule_table(first: float, second: float, now: float, due: bool) -> None:
    w = make(resolution=1.0, slots=8)
    w.schedule("pin", 0.0)  # holds the cursor at tick 0
    w.schedule("x", first)
    w.schedule("x", second)
    assert w.next_deadline() == min(0.0, second)
    w.cancel("pin")
    assert w.next_deadline() == second
    assert w.expire(now) == (["x"] if due else [])
    assert w.expire(second) == ([] if due else ["x"])
    assert len(w) == 0


def test_wheel_stale_entries_are_never_returned() -> None:
    w = make(slots=4)  # a 4 s revolution
    w.schedule("near", 1.0)
    w.schedule("near", 2.0)  # superseded within the wheel
    w.schedule("far", 50.0)  # in the overflow heap
    w.schedule("far", 3.0)  # its heap item goes stale
    w.schedule("gone", 60.0)
    assert w.cancel("gone") is True
    assert w.cancel("gone") is False
    w.schedule("back", 70.0)
    w.cancel("back")
    w.schedule("back", 80.0)  # the item of the cancelled life must not fire at 70
    assert w.expire(1.5) == []
    assert sorted(w.expire(3.0)) == ["far", "near"]
    assert w.expire(75.0) == []
    assert w.next_deadline() == 80.0
    assert w.expire(1000.0) == ["back"]
    assert len(w) == 0 and w.next_deadline() is None


@pytest.mark.parametrize("revolutions", [1, 2, 5, 1000])
def test_wheel_entries_several_revolutions_away(revolutions: int) -> None:
    w = make(resolution=1.0, slots=8)
    w.schedule("near", 0.0)
    far = 8.0 * revolutions + 0.5
    w.schedule("far", far)
    # Same slot as "far" (tick mod 8), one revolution earlier: must not take "far" along.
    w.schedule("alias", far - 8.0)
    w.expire(0.0)
    assert w.statistics().in_overflow >= 1
    # Walk there in small ticks, as a shell would, and in one jump on a twin wheel.
    t = 0.0
    while t < far - 8.0:
        t = min(t + 0.75, far - 8.0)
        assert w.expire(t) == (["alias"] if t == far - 8.0 else [])
    assert w.next_deadline() == far
    assert w.expire(math.nextafter(far, 0.0)) == []
    assert w.expire(far) == ["far"]
    w2 = make(resolution=1.0, slots=8)
    w2.expire(0.0)
    w2.schedule("far", far)
    w2.schedule("alias", far - 8.0)
    assert sorted(w2.expire(far)) == ["alias", "far"]


@pytest.mark.parametrize("resolution", [2.0**-7, 0.25, 1.0, 0.01])
@pytest.mark.parametrize("k", [0, 1, 7, 8, 9, 100, -3])
def test_wheel_deadlines_exactly_on_slot_boundaries(resolution: float, k: int) -> None:
    w = make(resolution=resolution, slots=8)
    w.expire(0.0)
    boundary = k * resolution
    w.schedule("on", boundary)
    w.schedule("before", math.nextafter(boundary, -math.inf))
    w.schedule("after", math.nextafter(boundary, math.inf))
    assert w.next_deadline() == math.nextafter(boundary, -math.inf)
    assert w.expire(math.nextafter(boundary, -math.inf)) == ["before"]
    assert w.next_deadline() == boundary
    assert w.expire(boundary) == ["on"]
    assert w.next_deadline() == math.nextafter(boundary, math.inf)
    assert w.expire(math.nextafter(boundary, math.inf)) == ["after"]


def test_wheel_power_of_two_resolution_puts_a_boundary_in_the_slot_it_starts() -> None:
    w: TimingWheel[str] = TimingWheel()  # resolution 2**-7: ticks are exact
    w.schedule("pin", 0.0)  # starts the cursor at tick 0
    w.schedule("a", 3 * DEFAULT_RESOLUTION)
    assert w.expire(0.0) == ["pin"]
    # The cursor walks ticks 0..2 (nothing due), stops on tick 3: a is compared there.
    assert w.expire(3 * DEFAULT_RESOLUTION - 1e-12) == []
    assert w.statistics().cursor == 2 * DEFAULT_RESOLUTION
    assert w.expire(3 * DEFAULT_RESOLUTION) == ["a"]
    assert w.statistics().cursor == 3 * DEFAULT_RESOLUTION


def test_wheel_next_deadline_is_exact_and_progress_is_made_there() -> None:
    w = make(resolution=1.0, slots=8)
    deadlines = {"a": 0.3, "b": 0.30000000000000004, "c": 2.9, "d": 2.1, "e": 40.0}
    for key, deadline in deadlines.items():
        w.schedule(key, deadline)
    seen: list[str] = []
    while (due := w.next_deadline()) is not None:
        got = w.expire(due)
        assert got, f"no progress at {due}"
        assert all(deadlines[k] == due for k in got)
        seen += got
    assert seen == sorted(deadlines, key=deadlines.__getitem__)


def test_wheel_next_deadline_after_the_earliest_moves_or_leaves() -> None:
    w = make(resolution=1.0, slots=8)
    for i in range(20):
        w.schedule(f"n{i:02d}", 1.0 + i * 0.1)  # 20 entries over 2 slots
    assert w.next_deadline() == 1.0
    w.schedule("n00", 7.0)  # the earliest moves later
    assert w.next_deadline() == 1.1
    w.cancel("n01")  # the earliest leaves
    assert w.next_deadline() == 1.0 + 2 * 0.1
    w.schedule("n05", 0.5)  # an earlier one arrives
    assert w.next_deadline() == 0.5
    assert sorted(w.expire(1.25)) == ["n02", "n05"]  # the earliest expires
    assert w.next_deadline() == 1.0 + 3 * 0.1


def test_wheel_next_deadline_follows_moves_within_the_earliest_slot() -> None:
    w = make(resolution=1.0, slots=8)
    w.schedule("a", 5.2)
    w.schedule("b", 5.6)
    w.schedule("c", 6.5)
    assert w.next_deadline() == 5.2
    w.schedule("b", 5.5)  # same slot
    w.schedule("a", 5.9)  # same slot: the earliest moved later
    assert w.next_deadline() == 5.5
    w.schedule("b", 6.1)
    assert w.next_deadline() == 5.9
    w.cancel("a")
    assert w.next_deadline() == 6.1


def test_wheel_next_deadline_finds_an_entry_before_the_last_earliest_slot() -> None:
    w = make(resolution=1.0, slots=8)
    w.schedule("pin", 0.0)
    w.schedule("a", 5.5)
    assert w.expire(0.0) == ["pin"]
    assert w.next_deadline() == 5.5  # found in slot 5; slots 0-4 are empty
    w.schedule("b", 2.5)
    w.schedule("c", 3.5)
    w.cancel("b")
    assert w.next_deadline() == 3.5


@pytest.mark.parametrize("jump", [8, 9, 16, 10**6])
@pytest.mark.parametrize("tick", [0, 1, 6, 7])
def test_wheel_jumps_of_a_revolution_or_more_expire_every_slot(jump: int, tick: int) -> None:
    w = make(resolution=1.0, slots=8)
    w.schedule("pin", 0.0)  # holds the cursor at tick 0
    w.schedule("x", tick + 0.5)
    w.schedule("far", jump + 0.5)  # due just after the jump
    assert sorted(w.expire(float(jump))) == ["pin", "x"]
    assert w.next_deadline() == jump + 0.5
    assert w.expire(jump + 0.5) == ["far"]


def test_wheel_next_deadline_finds_entries_put_in_the_cursor_slot() -> None:
    w = make(resolution=1.0, slots=8)
    w.schedule("pin", 0.5)
    w.schedule("a", 5.5)
    assert w.expire(1.0) == ["pin"]  # the cursor is at tick 1
    assert w.next_deadline() == 5.5  # found in slot 5
    w.schedule("b", 0.25)  # before the cursor: into its slot
    w.schedule("c", 0.75)
    w.cancel("b")
    assert w.next_deadline() == 0.75


def test_wheel_next_deadline_after_the_cursor_passed_its_last_find() -> None:
    w = make(resolution=1.0, slots=8)
    w.schedule("a", 2.5)  # starts the cursor at tick 2
    w.schedule("b", 3.5)
    w.schedule("pin", 9.5)  # keeps a slot entry through what follows
    w.cancel("a")
    assert w.next_deadline() == 3.5  # found in slot 3
    assert w.expire(6.0) == ["b"]  # the cursor moves to tick 6
    w.schedule("c", 11.5)  # tick 11, in the physical slot of tick 3
    w.schedule("d", 7.5)
    w.schedule("e", 6.5)
    w.cancel("e")
    assert w.next_deadline() == 7.5


def test_wheel_next_deadline_skips_stale_overflow_items() -> None:
    w = make(resolution=1.0, slots=4)
    w.schedule("pin", 0.5)  # holds the cursor at tick 0
    w.schedule("a", 50.0)
    w.schedule("b", 60.0)
    w.schedule("b", 70.0)  # leaves a stale item at 60
    w.cancel("a")  # leaves a stale item at 50
    w.cancel("pin")  # nothing left in a slot: the overflow heap holds the minimum
    assert w.next_deadline() == 70.0
    assert w.expire(65.0) == []
    assert w.expire(70.0) == ["b"]


def test_wheel_time_running_backwards_is_tolerated_and_exact() -> None:
    # Decision (module docstring rule 4): no error. The cursor never moves back
    # while it holds entries, and an expire() behind it is still exact.
    w = make(resolution=1.0, slots=8)
    w.schedule("a", 10.0)
    w.schedule("b", 20.0)
    assert w.expire(5.0) == []
    cursor = w.statistics().cursor
    w.schedule("late", 2.0)  # before the cursor tick: kept in the cursor slot
    assert w.next_deadline() == 2.0
    assert w.expire(1.0) == []  # backwards, before it: nothing
    assert w.statistics().cursor == cursor
    assert w.expire(3.0) == ["late"]  # still behind the cursor, but due
    assert w.expire(10.0) == ["a"]
    assert w.expire(9.0) == []
    assert w.next_deadline() == 20.0


def test_wheel_empty_wheel_follows_time_in_both_directions() -> None:
    w = make(resolution=1.0, slots=8)
    w.expire(1e6)
    assert w.statistics().cursor == 1e6
    w.expire(-1e3)  # nothing held: the cursor may jump back
    assert w.statistics().cursor == -1e3
    w.schedule("a", 1e6 + 0.5)  # an empty wheel starts its cursor at the deadline
    assert w.statistics().in_slots == 1 and w.statistics().in_overflow == 0
    assert w.expire(1e6 + 0.5) == ["a"]


@pytest.mark.parametrize("bad", ["schedule", "expire"])
def test_wheel_nan_time_raises(bad: str) -> None:
    w = make()
    with pytest.raises(ValueError, match="NaN"):
        if bad == "schedule":
            w.schedule("a", math.nan)
        else:
            w.expire(math.nan)
    assert len(w) == 0


def test_wheel_infinite_times() -> None:
    w = make()
    w.schedule("never", math.inf)
    w.schedule("always", -math.inf)
    w.schedule("a", 5.0)
    assert w.next_deadline() == -math.inf
    assert w.expire(-math.inf) == ["always"]
    assert w.expire(1e300) == ["a"]
    assert w.next_deadline() == math.inf
    assert w.expire(math.inf) == ["never"]
    assert len(w) == 0


def test_wheel_steady_rescheduling_stays_in_slots_and_ticks_touch_only_expired() -> None:
    # The detector's pattern: every key rescheduled 0.75 s ahead every 0.15 s.
    w: TimingWheel[str] = TimingWheel()
    keys = [f"n{i}" for i in range(300)]
    deadline = {}
    expired: list[tuple[float, str]] = []
    for step in range(400):
        t = step * 0.01
        for i in range(step % 15, len(keys), 15):
            if keys[i] != "n7" or t < 1.0:  # n7 dies at 1.0
                deadline[keys[i]] = t + 0.75
                w.schedule(keys[i], t + 0.75)
        expired += [(t, key) for key in w.expire(t)]
        stats = w.statistics()
        assert stats.in_overflow == 0 and stats.overflow_items == 0
        assert w.next_deadline() == min(d for k, d in deadline.items() if k in w)
    # Only n7 expired, at the first tick at or after its deadline.
    [(when, key)] = expired
    assert key == "n7" and 0 <= when - deadline["n7"] < 0.01
    assert len(w) == 299


def test_wheel_overflow_heap_stays_compact_under_churn() -> None:
    w = make(resolution=1.0, slots=4)
    w.schedule("pin", 1.0)  # holds the cursor at tick 1
    for i in range(10_000):
        w.schedule("far", 100.0 + i * 1e-3)  # each leaves a stale heap item
    stats = w.statistics()
    assert stats.in_overflow == 1 and stats.overflow_items <= 2 * 1 + 64 + 1
    assert w.next_deadline() == 1.0
    assert w.expire(200.0) == ["pin", "far"]


# -- model check: the wheel agrees with a dict scanned in full ---------------------------

_KEYS = ["a", "b", "c", "d", "e", "f"]
_SHAPES = [(0.25, 4), (0.25, 16), (1.0, 2), (2.0**-7, 512), (0.01, 8)]


def _ops(resolution: float, slots: int) -> st.SearchStrategy[list[tuple[str, str, float]]]:
    """Operations whose times are relative to the model's clock, in units of the wheel."""
    rev = resolution * slots
    key = st.sampled_from(_KEYS)
    return st.lists(
        st.one_of(
            # Around now, up to three revolutions ahead.
            st.tuples(st.just("schedule"), key, st.floats(-2 * resolution, 3 * rev)),
            # Exactly on the boundary of the slot k ticks after now's.
            st.tuples(st.just("boundary"), key, st.integers(-2, 3 * slots).map(float)),
            st.tuples(st.just("nudge"), key, st.floats(-resolution, resolution)),
            st.tuples(st.just("cancel"), key, st.just(0.0)),
            st.tuples(st.just("advance"), key, st.floats(0.0, 2.5 * rev)),
            st.tuples(st.just("advance"), key, st.floats(0.0, 2 * resolution)),
            st.tuples(st.just("back"), key, st.floats(0.0, rev)),
            st.tuples(st.just("deadline"), key, st.just(0.0)),
        ),
        max_size=100,
    )


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_wheel_matches_naive_model(data: st.DataObject) -> None:
    resolution, slots = data.draw(st.sampled_from(_SHAPES))
    ops = data.draw(_ops(resolution, slots))
    w: TimingWheel[str] = TimingWheel(resolution=resolution, slots=slots)
    model: dict[str, float] = {}
    now = data.draw(st.sampled_from([0.0, -10.0, 1e6]))
    eager = data.draw(st.booleans())  # read next_deadline() after every step, or rarely

    def expire(at: float) -> None:
        due = sorted(k for k, d in model.items() if d <= at)
        for k in due:
            del model[k]
        got = w.expire(at)
        assert len(got) == len(set(got)), "a key returned twice"
        assert sorted(got) == due

    for kind, key, value in ops:
        if kind in ("schedule", "boundary"):
            if kind == "boundary":
                deadline = (math.floor(now / resolution) + int(value)) * resolution
            else:
                deadline = now + value
            model[key] = deadline
            w.schedule(key, deadline)
        elif kind == "nudge":
            if key in model:  # moved a little, usually within its slot
                model[key] += value
                w.schedule(key, model[key])
        elif kind == "cancel":
            assert w.cancel(key) is (model.pop(key, None) is not None)
        elif kind == "advance":
            now += value
            expire(now)
        elif kind == "back":
            expire(now - value)  # time running backwards: tolerated and exact
        else:
            expected = min(model.values()) if model else None
            assert w.next_deadline() == expected
            if expected is not None:
                expire(expected)
                assert expected not in model.values(), "no progress at next_deadline()"
        assert len(w) == len(model)
        assert all(w.deadline(k) == model.get(k) for k in _KEYS)
        stats = w.statistics()
        assert stats.in_slots + stats.in_overflow == len(model)
        if eager:
            assert w.next_deadline() == (min(model.values()) if model else None)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(_SHAPES), st.integers(0, 2**32))
def test_wheel_matches_naive_model_under_heavy_churn(shape: tuple[float, int], seed: int) -> None:
    # Hundreds of keys crowding few slots and draining out of them again, as
    # heartbeats do: slot dicts fill up, empty out and are rebuilt.
    resolution, slots = shape
    rng = random.Random(seed)
    w: TimingWheel[str] = TimingWheel(resolution=resolution, slots=slots)
    keys = [f"k{i}" for i in range(rng.choice([50, 400]))]
    model: dict[str, float] = {}
    now = 0.0
    for _ in range(1500):
        r = rng.random()
        key = rng.choice(keys)
        if r < 0.7:
            deadline = now + rng.choice([resolution, 5 * resolution, resolution * slots * 2])
            deadline += rng.uniform(0.0, resolution)
            model[key] = deadline
            w.schedule(key, deadline)
        elif r < 0.75:
            assert w.cancel(key) is (model.pop(key, None) is not None)
        elif r < 0.95:
            now += rng.uniform(0.0, 2 * resolution)
            due = sorted(k for k, d in model.items() if d <= now)
            for k in due:
                del model[k]
            assert sorted(w.expire(now)) == due
        else:
            assert w.next_deadline() == (min(model.values()) if model else None)
    assert len(w) == len(model)


def test_wheel_drained_slot_is_rebuilt_and_keeps_its_order() -> None:
    w = make(resolution=1.0, slots=8)
    w.schedule("pin", 0.5)  # holds the cursor at tick 0
    keys = [f"k{i:04d}" for i in range(1000)]
    for key in keys:
        w.schedule(key, 5.5)  # all in slot 5
    for key in keys[:-3]:
        w.schedule(key, 6.5)  # drained into slot 6, as heartbeats do
    slot = w._slots[5]
    assert list(slot) == keys[-3:]
    # Rebuilt: no room left for the 997 holes that iterating it would visit.
    assert sys.getsizeof(slot) < 2 * sys.getsizeof(dict(slot)) + 4096
    assert w._filled[5] <= 4 * len(slot) + 32  # so it is not rebuilt at every deletion
    w.cancel("pin")
    assert w.next_deadline() == 5.5
    assert w.expire(5.5) == keys[-3:]
