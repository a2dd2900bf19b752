"""A hashed timing wheel of per-key deadlines: what makes a heartbeat O(1) and a tick O(expired).

Varghese and Lauck, "Hashed and Hierarchical Timing Wheels: Data Structures
for the Efficient Implementation of a Timer Facility" (SOSP 1987), scheme 6:
time is cut into ticks of ``resolution`` seconds and a deadline is hashed to
slot ``tick mod slots``, so scheduling, rescheduling and cancelling cost O(1)
and advancing time visits only the slots it walks over. Two departures from
the paper, both for the failure detectors of ``base.py``:

* The wheel keeps each entry's exact deadline (a float) and uses slots only
  to find candidates, so expiry and :meth:`TimingWheel.next_deadline` are
  exact, not rounded to a tick.
* Instead of a round count in every entry (which a tick would visit once per
  revolution), an entry beyond one revolution waits in an overflow heap and
  moves into its slot when the cursor comes within a revolution of it (the
  overflow list of Linux's and Kafka's wheels, kept as a heap).

Sans-I/O: time is an argument (monotonic seconds, any float but NaN:
negative, large or infinite); nothing here reads a clock, sleeps, logs or
draws random numbers.

Rules:

Rule 1. A key has at most one deadline. :meth:`TimingWheel.schedule` sets it
    (replacing any previous one), :meth:`TimingWheel.cancel` forgets it.
Rule 2. :meth:`TimingWheel.expire` returns every key whose deadline is
    ``<= now``, each exactly once, and forgets it. Nothing else is returned:
    a rescheduled or cancelled entry leaves its slot at once, and the item it
    leaves behind in the overflow heap (which cannot drop items in O(1)) is
    stale, recognised by its token and never acted upon.
Rule 3. :meth:`TimingWheel.next_deadline` is the earliest deadline held,
    exactly (None when empty): ``expire(next_deadline())`` returns at least
    one key, so a simulator that jumps its clock there makes progress.
Rule 4. Time need not be monotonic. The cursor (the tick the wheel has
    walked to) only moves forward while the wheel holds slot entries; an
    :meth:`~TimingWheel.expire` with ``now`` behind it is still exact (it
    looks at the cursor slot only, which holds everything due before the
    cursor). A deadline before the cursor goes into the cursor slot. A NaN
    time raises ValueError; infinite times are allowed (an infinite deadline
    never expires but at ``now = inf``).
Rule 5. The tick of a time ``x`` is ``floor(x * (1 / resolution))``. The
    same rounded function is used for deadlines and for ``now``, and it is
    monotonic in ``x``, so an entry in a slot whose tick is before ``now``'s
    is due and one whose tick is after it is not: only the slot of ``now``'s
    own tick needs deadline comparisons. The default resolution is a power of
    two, so ticks are exact and a deadline on a slot boundary is in the slot
    it starts.
Rule 6. A slot is an insertion-ordered dict from key to deadline (rebuilt,
    order kept, once mostly holes), and :meth:`expire` returns keys in slot
    order, then insertion order: deterministic for a given sequence of calls,
    but callers that need an order sort.

Costs (n keys held, S slots, s entries in one slot):

=============================  ==============================================
``schedule`` / ``cancel``      O(1) amortised (a slot's dict is rebuilt
                               when deleted keys outnumber live ones 4 to 1);
                               O(log n) for a deadline beyond one revolution
                               (overflow heap)
``expire(now)``                O(expired + slots walked), slots walked <= S
                               (at most the ticks elapsed since the last
                               call), + O(keys due within ``now``'s own tick,
                               which are compared), + O(log n) per overflow
                               entry that comes within one revolution
``next_deadline()``            O(1) while the cached minimum holds. After the
                               earliest entry was rescheduled, cancelled or
                               expired, one call walks to the first non-empty
                               slot (<= S slots; amortised, as the walk
                               resumes where the last one stopped unless an
                               entry was scheduled before that) and takes
                               ``min`` over that slot's deadlines: O(s), a
                               loop in C (~13 ns per entry where the
                               benchmark ran).
=============================  ==============================================

So a shell that reads ``next_deadline()`` once per loop turn pays at most one
slot scan per turn: with 100,000 nodes heartbeating every 0.15 s, a slot
(7.8 ms of heartbeats) holds ~5,200 entries, ~65 us. A caller that reads it
after every heartbeat (the simulator, with a handful of nodes) pays a scan
each time the earliest node heartbeats, so with many nodes read it per turn.
(A heap index per slot would make that O(log s) amortised, but building one
costs ~7 times the scan, which a once-per-turn reader pays every turn.)

Trade-off of the parameters. A finer ``resolution`` spreads the entries over
more slots (smaller scans in ``next_deadline`` and ``expire``) but makes
every tick walk more slots per second of time and, for a given slot count,
shortens the revolution (more entries in the overflow heap). More ``slots`` lengthen the
revolution at a memory cost of one small dict each, and bound the walks of
``expire`` and ``next_deadline``. The defaults (2**-7 s ~ 7.8 ms, 512 slots:
a 4 s revolution) match a shell that ticks every 10-50 ms and suspicion
deadlines of 0.75 s to 3 s (``interval.py``), which then never
need the overflow heap; the resolution does not affect accuracy, only cost.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["DEFAULT_RESOLUTION", "DEFAULT_SLOTS", "TimingWheel", "WheelStatistics"]

K = TypeVar("K", bound=Hashable)

DEFAULT_RESOLUTION = 2.0**-7
"""Seconds per tick (~7.8 ms; a power of two, so ticks are computed exactly)."""

DEFAULT_SLOTS = 512
"""Slots per revolution (a revolution of 4 s at the default resolution)."""

# Heap items (deadline, token, key): the token is unique, so ties never compare keys.
_Item = tuple[float, int, K]


@dataclass(slots=True)
class _Entry(Generic[K]):
    """One key's deadline (private; never handed out)."""

    key: K
    deadline: float
    # Unique per schedule() call: overflow heap items carrying another token are stale.
    token: int
    # Absolute tick of the slot holding the key; None while in the overflow heap.
    tick: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class WheelStatistics:
    """A snapshot of a wheel's occupancy (for tests, benchmarks and debugging)."""

    entries: int
    """Keys with a deadline."""
    in_slots: int
    """Entries in a slot (within one revolution of the cursor)."""
    in_overflow: int
    """Entries in the overflow heap (more than one revolution ahead)."""
    overflow_items: int
    """Items in the overflow heap, stale ones included."""
    cursor: float
    """Start of the cursor tick, seconds."""


class TimingWheel(Generic[K]):
    """Deadlines of hashable keys in a hashed timing wheel (see the module docstring)."""

    def __init__(
        self, *, resolution: float = DEFAULT_RESOLUTION, slots: int = DEFAULT_SLOTS
    ) -> None:
        """Creates an empty wheel.

        Args:
            resolution: seconds per tick (finite, > 0). Affects cost, never
                accuracy: deadlines are kept exactly.
            slots: slots per revolution, a power of two >= 2. A revolution
                (``resolution * slots`` seconds) should cover the usual
                deadlines; later ones wait in the overflow heap.

        Raises:
            ValueError: a parameter out of range.
        """
        per_tick = 1.0 / resolution if resolution > 0 else math.inf
        if not (math.isfinite(resolution) and math.isfinite(per_tick) and per_tick > 0):
            raise ValueError(f"resolution must be a finite number > 0 seconds, got {resolution!r}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 2:
            raise ValueError(f"slots must be an int >= 2, got {slots!r}")
        if slots & (slots - 1):
            raise ValueError(f"slots must be a power of two, got {slots!r}")
        self._resolution = resolution
        self._per_tick = per_tick
        self._size = slots
        self._mask = slots - 1
        # Slot tick & mask: key -> deadline (the entry's, duplicated for a C-speed min()).
        self._slots: list[dict[K, float]] = [{} for _ in range(slots)]
        # Keys added to each slot's dict since it was last built. A deleted key
        # leaves a hole that iteration still visits, so a dict is rebuilt once
        # holes dominate (_tidy): iterating a slot then costs O(its keys).
        self._filled: list[int] = [0] * slots
        self._entries: dict[K, _Entry[K]] = {}
        # Every slot entry has cursor <= tick < cursor + slots, so each slot
        # holds the entries of exactly one tick; slots of earlier ticks are empty.
        self._cursor = 0
        self._in_slots = 0
        # Every slot of a tick in [cursor, _front) is empty: where next_deadline()
        # starts looking (only links lower it, so its walks are amortised).
        self._front = 0
        # Entries at ticks >= cursor + slots, as heap items by deadline.
        self._overflow: list[_Item[K]] = []
        self._in_overflow = 0
        self._tokens = 0
        # Cached earliest deadline; valid while _min_known (None: empty wheel).
        self._min: float | None = None
        self._min_known = True

    @property
    def resolution(self) -> float:
        """Seconds per tick."""
        return self._resolution

    @property
    def slots(self) -> int:
        """Slots per revolution."""
        return self._size

    def __len__(self) -> int:
        """Number of keys with a deadline."""
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` has a deadline."""
        return key in self._entries

    def deadline(self, key: K) -> float | None:
        """The key's deadline (seconds), or None if it has none."""
        entry = self._entries.get(key)
        return None if entry is None else entry.deadline

    def schedule(self, key: K, deadline: float) -> None:
        """Sets the key's deadline, replacing any previous one (rule 1). O(1).

        Args:
            key: any hashable key.
            deadline: monotonic seconds; may be in the past (the key is then
                returned by the next :meth:`expire`) or infinite.

        Raises:
            ValueError: ``deadline`` is NaN.
        """
        if deadline != deadline:
            raise ValueError(f"deadline of {key!r} is NaN")
        # The hot path of every heartbeat: _unlink and _link are inlined for
        # the common case of a slot entry moving to another slot.
        self._tokens = token = self._tokens + 1
        entry = self._entries.get(key)
        if self._min_known:
            low = self._min
            if low is None or deadline <= low:
                self._min = deadline
            elif entry is not None and entry.deadline <= low:
                self._min_known = False  # the earliest entry moved later
        y = deadline * self._per_tick
        cursor = self._cursor
        if entry is None:
            entry = _Entry(key, deadline, token, None)
            self._entries[key] = entry
        else:
            old = entry.tick
            entry.deadline = deadline
            entry.token = token
            if old is None:
                self._in_overflow -= 1  # its heap item is stale from here on
            elif (old + 1 > y >= old) or (old == cursor and y < old + 1):
                self._slots[old & self._mask][key] = deadline  # same slot
                return
            else:
                index = old & self._mask
                slot = self._slots[index]
                del slot[key]
                self._in_slots -= 1
                if self._filled[index] > 4 * len(slot) + 32:
                    self._tidy(index)
        if self._in_slots == 0:
            # No slot entry pins the cursor: start it at this deadline's tick
            # so that the wheel, not the overflow heap, holds what follows.
            if -math.inf < y < math.inf:
                self._rebase(math.floor(y))
            self._link(entry)
        elif cursor + 1 <= y < cursor + self._size:
            tick = math.floor(y)
            entry.tick = tick
            index = tick & self._mask
            self._slots[index][key] = deadline
            self._filled[index] += 1
            self._in_slots += 1
            if tick < self._front:
                self._front = tick
        else:
            self._link(entry)  # the cursor slot or the overflow heap

    def cancel(self, key: K) -> bool:
        """Forgets the key's deadline. O(1).

        Returns:
            True if the key had one.
        """
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        if entry.tick is None:
            self._in_overflow -= 1
        else:
            self._unlink(entry)
        if self._min_known and self._min is not None and entry.deadline <= self._min:
            self._min_known = False
        return True

    def expire(self, now: float) -> list[K]:
        """Forgets and returns the keys whose deadline is ``<= now`` (rules 2, 4 and 6).

        Args:
            now: monotonic seconds; may be earlier than in a previous call.

        Returns:
            The due keys, each once, in slot then insertion order.

        Raises:
            ValueError: ``now`` is NaN.
        """
        if now != now:
            raise ValueError("now is NaN")
        out: list[K] = []
        y = now * self._per_tick
        if y == math.inf:
            # Beyond any tick: every slot entry is due, overflow ones by comparison.
            self._walk(self._cursor, self._size, out)
            self._drain_overflow(now, out)
        elif y >= self._cursor + 1:
            self._advance(math.floor(y), out)
        elif self._in_slots == 0 and y > -math.inf:
            self._rebase(math.floor(y))
        index = self._cursor & self._mask
        slot = self._slots[index]
        if slot:
            due = [key for key, deadline in slot.items() if deadline <= now]
            if due:
                entries = self._entries
                for key in due:
                    del slot[key]
                    del entries[key]
                out += due
                self._in_slots -= len(due)
                if self._filled[index] > 4 * len(slot) + 32:
                    self._tidy(index)
        if out:
            # Whatever was earliest was due too: the minimum left with it.
            self._min_known = False
        return out

    def next_deadline(self) -> float | None:
        """The earliest deadline held, exactly; None if the wheel is empty (rule 3).

        O(1) while the cached minimum holds; otherwise see the module docstring.
        """
        if self._min_known:
            return self._min
        low: float | None
        if self._in_slots:
            slots, mask = self._slots, self._mask
            tick = self._front
            while not slots[tick & mask]:
                tick += 1
            self._front = tick
            # Every deadline in this slot is below every deadline of a later
            # slot or of the overflow heap (rule 5).
            low = min(slots[tick & mask].values())
        else:
            low = self._overflow_top()
        self._min, self._min_known = low, True
        return low

    def statistics(self) -> WheelStatistics:
        """Occupancy of the wheel (O(1))."""
        return WheelStatistics(
            entries=len(self._entries),
            in_slots=self._in_slots,
            in_overflow=self._in_overflow,
            overflow_items=len(self._overflow),
            cursor=self._cursor * self._resolution,
        )

    # -- internals ---------------------------------------------------------

    def _link(self, entry: _Entry[K]) -> None:
        """Puts an entry that is in neither a slot nor the overflow heap into one."""
        y = entry.deadline * self._per_tick
        cursor = self._cursor
        if y < cursor + 1:
            tick = cursor  # due at or before the cursor tick
        elif y < cursor + self._size:
            tick = math.floor(y)
        else:
            entry.tick = None
            self._in_overflow += 1
            heap = self._overflow
            heapq.heappush(heap, (entry.deadline, entry.token, entry.key))
            if len(heap) > 2 * self._in_overflow + 64:
                self._compact_overflow()
            return
        entry.tick = tick
        index = tick & self._mask
        self._slots[index][entry.key] = entry.deadline
        self._filled[index] += 1
        self._in_slots += 1
        if tick < self._front:
            self._front = tick

    def _unlink(self, entry: _Entry[K]) -> None:
        """Takes a slot entry out of its slot."""
        assert entry.tick is not None
        index = entry.tick & self._mask
        slot = self._slots[index]
        del slot[entry.key]
        self._in_slots -= 1
        if self._filled[index] > 4 * len(slot) + 32:
            self._tidy(index)

    def _tidy(self, index: int) -> None:
        """Rebuilds a slot's dict without its holes (amortised O(1) per deletion).

        CPython's dict leaves a hole per deleted key until it next grows; a
        slot that filled up and was then drained by heartbeats would make
        every later iteration (expire, next_deadline) pay for its peak size.
        Insertion order, hence determinism, is kept.
        """
        slot = dict(self._slots[index])
        self._slots[index] = slot
        self._filled[index] = len(slot)

    def _walk(self, first: int, count: int, out: list[K]) -> None:
        """Expires every entry of the ``count`` slots from tick ``first`` on (all due)."""
        slots, mask, entries = self._slots, self._mask, self._entries
        for tick in range(first, first + count):
            slot = slots[tick & mask]
            if slot:
                for key in slot:
                    del entries[key]
                out.extend(slot)
                self._in_slots -= len(slot)
                slot.clear()
                self._filled[tick & mask] = 0

    def _advance(self, tick: int, out: list[K]) -> None:
        """Moves the cursor forward to ``tick``, expiring the slots it passes."""
        cursor = self._cursor
        if self._in_slots:
            self._walk(cursor, min(tick - cursor, self._size), out)
        self._cursor = tick
        self._front = max(self._front, tick)
        self._migrate()

    def _rebase(self, tick: int) -> None:
        """Moves the cursor of a wheel with no slot entry (either direction)."""
        assert self._in_slots == 0
        forward = tick > self._cursor
        self._cursor = self._front = tick
        if forward:
            self._migrate()

    def _migrate(self) -> None:
        """Moves overflow entries that came within one revolution into their slots."""
        heap, entries = self._overflow, self._entries
        limit = self._cursor + self._size
        while heap:
            deadline, token, key = heap[0]
            if deadline * self._per_tick >= limit:
                break
            heapq.heappop(heap)
            entry = entries.get(key)
            if entry is None or entry.token != token:
                continue  # stale
            self._in_overflow -= 1
            self._link(entry)

    def _drain_overflow(self, now: float, out: list[K]) -> None:
        """Expires the overflow entries due at ``now`` (only for an infinite tick)."""
        heap, entries = self._overflow, self._entries
        while heap and heap[0][0] <= now:
            _, token, key = heapq.heappop(heap)
            entry = entries.get(key)
            if entry is None or entry.token != token:
                continue
            del entries[key]
            self._in_overflow -= 1
            out.append(key)

    def _overflow_top(self) -> float | None:
        """Earliest live deadline of the overflow heap, dropping stale items on top."""
        heap, entries = self._overflow, self._entries
        while heap:
            deadline, token, key = heap[0]
            entry = entries.get(key)
            if entry is not None and entry.token == token:
                return deadline
            heapq.heappop(heap)
        return None

    def _compact_overflow(self) -> None:
        """Drops stale overflow items (amortised O(1) per stale item)."""
        entries = self._entries
        live = []
        for item in self._overflow:
            entry = entries.get(item[2])
            if entry is not None and entry.token == item[1]:
                live.append(item)
        heapq.heapify(live)
        self._overflow = live
