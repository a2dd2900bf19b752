"""Event-loop lag of one replica: how late its loop runs a timer, and why.

Every heartbeat ack, every Raft message and every detector tick of a replica
runs on one asyncio loop, so a loop that is late is a replica that is deaf:
nodes see no ack and drop their lease (a stall of ``ack_timeout``, 0.6 s by
default, makes a node reconnect), followers see no Raft heartbeat. The
monitor makes such a stall visible in the replica's log, with its size and
what the loop thread was doing meanwhile.

Rules:

1. A task sleeps ``interval`` seconds, over and over; the lag of one wake-up
   is how much later than asked it woke. Every lag is kept in a bounded
   window for :meth:`LoopLagMonitor.statistics` (max and p99).
2. A lag above ``warn_after`` is a *stall*: logged at WARNING with its size,
   at most once per ``warn_every`` seconds (stalls in between are counted,
   and the largest is named in the next warning).
3. The warning says where the time went, from the loop thread's own
   accounting over the stalled wake-up (Linux ``/proc/thread-self/schedstat``):
   CPU time on the loop thread (Python code, GC, serialisation), time
   runnable but waiting for a core (the machine is busy), and the rest
   blocked in the kernel (fsync, a lock, page faults). A watcher thread
   records the loop thread's Python stack once per stall while it lasts,
   and the warning carries it; the watcher only reads, never touches the loop.
4. GC pauses are timed (``gc.callbacks``); a stall names the longest
   collection inside it.
5. :meth:`LoopLagMonitor.recent_lag` tells the driver whether the loop was
   just late (a stall in progress, or one that ended moments ago), so that
   the replica blames itself rather than the nodes.
   :meth:`LoopLagMonitor.mean_lateness` tells whether it stays late: the
   loop's lateness averaged over the last ``MEAN_WINDOW`` seconds (at each
   instant, how long its overdue timer has waited: 0 while on time, rising
   to L over a wake-up L late), which is how long a heartbeat arriving in
   that window waited on average before the loop could read it. A loop with
   more work than it gets through is late at every wake-up; one starved of
   CPU by its neighbours is late for most of every second, in bursts
   between which it wakes on time; both show here, however the lateness is
   cut up. One short stall (a GC pause) counts little: a stall of L adds
   L * L / 2 / MEAN_WINDOW (0.04 s for 0.4 s). Shedding reads it.
6. Every ``summary_every`` seconds the max and p99 lag of that period are
   logged at DEBUG with the longest GC (for measurements: ``--log-level debug``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

__all__ = ["LoopLagMonitor", "LoopLagStatistics"]

log = logging.getLogger("arbiter.looplag")

_WINDOW = 4096  # lags kept for statistics (at 20 Hz: the last 3.4 minutes)
MEAN_WINDOW = 2.0  # seconds over which the lateness is averaged (rule 5)
_ASYNCIO = f"{os.sep}asyncio{os.sep}"
_SELECTORS = f"{os.sep}selectors.py"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopLagStatistics:
    """What the monitor measured since it started.

    Attributes:
        samples: wake-ups measured.
        max: the largest lag (seconds).
        p99: the 99th percentile lag over the last wake-ups (seconds).
        stalls: wake-ups later than ``warn_after``.
        gc_max: the longest garbage collection (seconds).
    """

    samples: int
    max: float
    p99: float
    stalls: int
    gc_max: float

    def describe(self, warn_after: float) -> str:
        """One line for the log: the lags and the stalls over ``warn_after`` seconds."""
        return (
            f"event loop lag over {self.samples} wake-ups: max {self.max:.3f}s, p99 "
            f"{self.p99:.3f}s, {self.stalls} stall(s) over {warn_after:.2f}s; longest GC "
            f"{self.gc_max:.3f}s"
        )


def _schedstat() -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable waiting for one) of the calling thread, if known."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            on_cpu, waiting, _ = f.read().split()
    except (OSError, ValueError):
        return None
    return int(on_cpu) / 1e9, int(waiting) / 1e9


class LoopLagMonitor:
    """Measures and logs the lag of the running event loop (see the module rules).

    Args:
        name: who is measured (the replica id), for the log lines.
        interval: seconds between wake-ups (> 0).
        warn_after: a lag above this many seconds is a stall (rule 2).
        warn_every: seconds between two stall warnings at most.
        summary_every: seconds between two DEBUG summaries (rule 5).
    """

    def __init__(
        self,
        *,
        name: str,
        interval: float = 0.05,
        warn_after: float = 0.2,
        warn_every: float = 5.0,
        summary_every: float = 2.0,
    ) -> None:
        if not interval > 0 or not warn_after > 0 or warn_every < 0:
            raise ValueError("interval and warn_after must be > 0, warn_every >= 0")
        self.name = name
        self.interval = interval
        self.warn_after = warn_after
        self.warn_every = warn_every
        self.summary_every = summary_every
        self._period: list[float] = []
        self._lags: collections.deque[float] = collections.deque(maxlen=_WINDOW)
        # (monotonic time, lag) of the wake-ups late by over 1 ms within about
        # MEAN_WINDOW (rule 5); the rest add nothing that counts.
        self._recent: collections.deque[tuple[float, float]] = collections.deque(maxlen=256)
        self._samples = 0
        self._max = 0.0
        # Called with every measured lag (seconds): the replica's metrics histogram.
        self.observe: Callable[[float], None] = lambda lag: None
        self._stalls = 0
        self._task: asyncio.Task[None] | None = None
        self._last_warning = float("-inf")
        self._suppressed = 0
        self._suppressed_max = 0.0
        # GC timing (rule 4).
        self._gc_started: float | None = None
        self._gc_max = 0.0
        self._gc_window_max = 0.0
        self._gc_period_max = 0.0
        # The watcher (rule 3): the loop's last wake-up, and a stack taken mid-stall.
        self._beat = time.monotonic()
        self._late = (0.0, float("-inf"))  # (lag, when) of the latest late wake-up (rule 5)
        self._loop_thread = threading.get_ident()
        self._stack: str | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Starts the monitor on the running loop (and its watcher thread)."""
        if self._task is not None:
            return
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._stop.clear()
        gc.callbacks.append(self._on_gc)
        self._watcher = threading.Thread(
            target=self._watch, name=f"looplag-{self.name}", daemon=True
        )
        self._watcher.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag-monitor")

    async def stop(self) -> None:
        """Stops the monitor and its watcher thread (idempotent)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=1.0)
            self._watcher = None
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)

    def recent_lag(self, now: float, since: float) -> float:
        """How late the loop is, or just was, at ``now`` (rule 5); 0.0 before :meth:`start`.

        Args:
            now: monotonic seconds.
            since: a late wake-up counts if it came after this (monotonic seconds).

        Returns:
            Seconds: the lateness of a wake-up still awaited (a stall in
            progress), or the lag of the latest late wake-up after ``since``.
        """
        if self._task is None:
            return 0.0
        ongoing = max(0.0, now - self._beat - self.interval)
        lag, at = self._late
        return max(ongoing, lag if at > since else 0.0)

    def mean_lateness(self, now: float) -> float:
        """The loop's lateness averaged over the :data:`MEAN_WINDOW` seconds before
        ``now`` (monotonic), seconds (rule 5); 0.0 before :meth:`start` and after
        :meth:`stop`.

        A wake-up ``L`` late at ``t`` was overdue from ``t - L``, by a lateness that
        grew from 0 to ``L``: its area inside the window is added, as is a stall in
        progress, and the sum is divided by the window.
        """
        if self._task is None:
            return 0.0
        start = now - MEAN_WINDOW
        recent = self._recent
        while recent and recent[0][0] <= start:
            recent.popleft()
        area = 0.0
        for t, lag in recent:
            cut = max(0.0, start - (t - lag))  # the part of the lateness before the window
            area += (lag * lag - cut * cut) / 2
        ongoing = max(0.0, now - self._beat - self.interval)  # a stall in progress
        cut = max(0.0, ongoing - MEAN_WINDOW)
        return (area + (ongoing * ongoing - cut * cut) / 2) / MEAN_WINDOW

    @property
    def latest_late(self) -> tuple[float, float]:
        """(lag, monotonic time) of the latest wake-up later than one interval
        (``(0.0, -inf)`` before any): arbiter/server/load/monitor.py's lateness."""
        return self._late

    def statistics(self) -> LoopLagStatistics:
        """Lags measured so far (see :class:`LoopLagStatistics`)."""
        lags = sorted(self._lags)
        p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))] if lags else 0.0
        return LoopLagStatistics(
            samples=self._samples, max=self._max, p99=p99, stalls=self._stalls, gc_max=self._gc_max
        )

    # --- measuring ---------------------------------------------------------------------

    async def _run(self) -> None:
        sched = _schedstat()
        cpu = time.thread_time()
        summary_due = time.monotonic() + self.summary_every
        while True:
            asked = time.monotonic() + self.interval
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            self._beat = now
            lag = max(0.0, now - asked)
            self.record(lag)
            if lag > 0.001:
                self._recent.append((now, lag))
            if lag > self.interval:
                self._late = (lag, now)
            new_sched, new_cpu = _schedstat(), time.thread_time()
            stack, self._stack = self._stack, None
            if lag > self.warn_after:
                self._stall(lag, now, new_cpu - cpu, sched, new_sched, stack)
            sched, cpu = new_sched, new_cpu
            self._gc_window_max = 0.0
            if now >= summary_due:
                self._summary()
                summary_due = now + self.summary_every

    def _summary(self) -> None:
        lags, self._period = sorted(self._period), []
        gc_max, self._gc_period_max = self._gc_period_max, 0.0
        if lags and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s: event loop lag over %d wake-ups: max %.4fs, p99 %.4fs, median %.4fs; "
                "longest GC %.4fs",
                self.name,
                len(lags),
                lags[-1],
                lags[min(len(lags) - 1, int(len(lags) * 0.99))],
                lags[len(lags) // 2],
                gc_max,
            )

    def record(self, lag: float) -> None:
        """Adds one measured lag (seconds) to the statistics (the task's own bookkeeping)."""
        self._samples += 1
        self._lags.append(lag)
        self._period.append(lag)
        self._max = max(self._max, lag)
        self.observe(lag)

    def _stall(
        self,
        lag: float,
        now: float,
        cpu: float,
        sched: tuple[float, float] | None,
        new_sched: tuple[float, float] | None,
        stack: str | None,
    ) -> None:
        self._stalls += 1
        if now - self._last_warning < self.warn_every:
            self._suppressed += 1
            self._suppressed_max = max(self._suppressed_max, lag)
            return
        wall = lag + self.interval
        if sched is not None and new_sched is not None:
            waited = new_sched[1] - sched[1]
            where = (
                f"loop thread on CPU {cpu:.3f}s, runnable waiting for a CPU {waited:.3f}s, "
                f"blocked or asleep {max(0.0, wall - cpu - waited):.3f}s"
            )
        else:
            where = f"loop thread on CPU {cpu:.3f}s"
        extra = ""
        if self._gc_window_max > 0.01:
            extra += f"; longest GC {self._gc_window_max:.3f}s"
        if self._suppressed:
            extra += (
                f"; {self._suppressed} more stall(s) since the last warning, "
                f"up to {self._suppressed_max:.3f}s"
            )
        log.warning(
            "%s: event loop stalled: woke %.3fs late (%s over %.3fs%s)%s",
            self.name,
            lag,
            where,
            wall,
            extra,
            f"; loop thread was in:\n{stack}" if stack else "",
        )
        self._last_warning = now
        self._suppressed = 0
        self._suppressed_max = 0.0

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            took = time.perf_counter() - self._gc_started
            self._gc_started = None
            self._gc_max = max(self._gc_max, took)
            self._gc_window_max = max(self._gc_window_max, took)
            self._gc_period_max = max(self._gc_period_max, took)

    def _watch(self) -> None:
        """Watcher thread: takes the loop thread's stack once per stall (rule 3)."""
        period = self.interval
        taken_for = None
        while not self._stop.wait(period):
            beat = self._beat
            if time.monotonic() - beat < self.interval + self.warn_after or taken_for == beat:
                continue
            frame = sys._current_frames().get(self._loop_thread)
            if frame is None:
                continue
            self._stack = _format_stack(frame)
            taken_for = beat


def _format_stack(frame: FrameType) -> str:
    """The innermost frames below the event loop's own: the callback that held the loop."""
    frames = traceback.extract_stack(frame, limit=40)
    last_loop = max((i for i, f in enumerate(frames) if _ASYNCIO in f.filename), default=-1)
    below = frames[last_loop + 1 :]
    if last_loop >= 0 and all(f.filename.endswith(_SELECTORS) for f in below):
        return "  (idle in select: the loop held nothing; the process itself did not run)"
    return "".join(traceback.format_list(below[-12:])).rstrip()
