"""The virtual clock and its event queue (trio's MockClock autojump, etcd's ``network``).

Rules:

1. Time is virtual seconds, starting at 0. It only moves when the next event
   is taken, straight to that event's time: nothing in the simulator sleeps.
2. Events are kept in one binary heap ordered by ``(time, seq)``; ``seq`` is a
   counter, so events at the same time run in the order they were scheduled
   and a run never depends on how Python compares payloads.
3. Timers are lazy: a component keeps one token per timer; an event whose
   token is no longer current is stale and is dropped when taken.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

__all__ = ["EventQueue"]

Action = Callable[..., None]


class EventQueue:
    """A heap of ``(time, seq, action, args)`` entries and the current virtual time."""

    __slots__ = ("_heap", "_seq", "now", "taken")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Action, tuple[Any, ...]]] = []
        self._seq = 0
        self.now = 0.0
        self.taken = 0

    def at(self, when: float, action: Action, *args: Any) -> None:
        """Schedules ``action(*args)`` at virtual time ``when`` (never before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.now), self._seq, action, args))

    def next_time(self) -> float | None:
        """When the next event is due, or None if there is none."""
        return self._heap[0][0] if self._heap else None

    def run_next(self) -> None:
        """Moves the clock to the next event and runs it."""
        when, _, action, args = heapq.heappop(self._heap)
        self.now = when
        self.taken += 1
        action(*args)

    def __len__(self) -> int:
        return len(self._heap)
