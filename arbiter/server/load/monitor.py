"""A replica's own load and lateness: what the adaptive interval, shedding and local health read.

The shell side of ``arbiter/core/detection/interval.py`` (rule 4) and of
observer rule 6; the decisions stay in the cores, this module only measures.

Rules:

1. Utilisation. Every ``period`` seconds (1 s) :class:`LoadMonitor` reads
   the loop thread's scheduler accounting (Linux
   ``/proc/thread-self/schedstat``: seconds on a CPU, and seconds runnable
   but waiting for one) and divides its growth by the wall time: the
   fraction of the time the event loop was busy or wanted to be. Why this
   measure: it is cheap (one read of a 30-byte file per second, from the
   loop thread itself), it reaches 1.0 exactly when the loop cannot keep up,
   and it is robust on a shared machine: it counts the time a neighbour takes
   from the replica while the replica has work (which is what makes it late)
   and nothing while the replica idles. Process CPU misses the first (a
   replica starved by a CPU hog shows little CPU while it falls behind); the
   loop lag is a symptom after the fact, and noisy. Without ``/proc`` it falls
   back to ``time.thread_time()`` (CPU only). The value used is the mean of
   the last ``window`` periods, and the maximum with every load source
   (:meth:`LoadMonitor.add_source`: the ingest workers reporting their own,
   each measured by a LoadMonitor on its loop; the maximum over them, with
   their time on a CPU kept apart for shedding).
2. Interval. Each sample goes to ``on_sample`` (the driver passes it to
   ``Replica.observe_load``: interval rule 4).
3. Lateness (:class:`LocalHealth`, for observer rule 6: Lifeguard's local
   health, Dadgar et al., DSN Workshops 2018, arXiv:1707.00788). How many
   seconds of the recent past this replica could not hear: the maximum of a
   loop stall in progress, a stall of ``L`` seconds that ended less than
   ``max(listen_after, L)`` ago (the heartbeats it left queued take up to
   that long to be read), the driver's own wake-up lag, and the backlog.
   The core bounds it.
4. Backlog (:meth:`LocalHealth.backlog`): lateness that lasts, as opposed to
   a stall that is over by the time it is measured: the loop's lateness
   averaged over the last 2 s (``LoopLagMonitor.mean_lateness``: how long a
   heartbeat arriving then waited, on average, for the loop to read it,
   whether the loop had more work than it got through or waited for a CPU),
   and every lateness source (``fn(now) -> seconds``: an ingest backlog).
   Shedding reads it, with the utilisation: :mod:`arbiter.server.api.shedding`.
   A source added with ``backlog=False`` (the read lag of
   :mod:`arbiter.server.load.readlag`) counts for rule 3 only: a join storm puts
   every heartbeat a fraction of a second behind for a moment, and shedding
   the storm's joins for that would only move them later; shedding acts on
   the replica's time on a CPU and on the loop's lasting lateness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable

from arbiter.server.load.looplag import LoopLagMonitor

__all__ = [
    "LoadMonitor",
    "LocalHealth",
    "busy_seconds",
]

log = logging.getLogger("arbiter.load")


def busy_seconds() -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable waiting for one) of the calling thread (rule 1).

    Reads ``/proc/thread-self/schedstat``; without it, ``(time.thread_time(), 0.0)``.
    """
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            on_cpu, waiting, _ = f.read().split()
    except (OSError, ValueError):
        return time.thread_time(), 0.0
    return int(on_cpu) / 1e9, int(waiting) / 1e9


class LoadMonitor:
    """The replica's utilisation, sampled on its event loop (rules 1 and 2).

    Args:
        name: who is measured (the replica id), for log lines.
        period: seconds between samples (> 0).
        window: samples averaged (>= 1).
        on_sample: called with (utilisation, monotonic now) after each sample.
        reader: (seconds on a CPU, seconds waiting for one) so far of the loop
            thread (default :func:`busy_seconds`; called on the loop thread).
        clock: monotonic seconds.

    Attributes:
        utilisation: the latest value (0 before the first sample).
        cpu: the same on a CPU only, the wait for one left out (shedding's, rule 4).
        cost: seconds spent sampling so far (the measurement's own price).
        shed: new nodes' streams refused so far (rule 4).
        shed_since: when the shedding episode under way started (None: none),
            monotonic seconds (arbiter/server/api/shedding.py's hint grows with it).
        last_shed: the latest refusal, monotonic seconds.
    """

    def __init__(
        self,
        *,
        name: str,
        period: float = 1.0,
        window: int = 2,
        on_sample: Callable[[float, float], object] = lambda u, now: None,
        reader: Callable[[], tuple[float, float]] = busy_seconds,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not period > 0 or window < 1:
            raise ValueError(f"need period > 0 and window >= 1, got {period}, {window}")
        self.name, self.period = name, period
        self._on_sample, self._reader, self._clock = on_sample, reader, clock
        self._sources: list[tuple[Callable[[float], float], Callable[[float], float]]] = []
        self._recent: deque[tuple[float, float]] = deque(maxlen=window)  # (busy, cpu)
        self._last: tuple[float, float, float] | None = None  # (wall, cpu, wait) at the last
        self._task: asyncio.Task[None] | None = None
        self.utilisation = 0.0
        self.cpu = 0.0
        self.cost = 0.0
        self.samples = 0
        self.shed = 0  # new streams refused (rule 4)
        # The shedding episode under way (arbiter/server/api/shedding.py): when it
        # started (None: none) and the latest refusal, monotonic seconds.
        self.shed_since: float | None = None
        self.last_shed = float("-inf")

    def add_source(
        self, fn: Callable[[float], float], cpu: Callable[[float], float] | None = None
    ) -> None:
        """Adds a load source: ``fn(now)`` -> utilisation (0 to 1) of a part of the
        replica that this loop does not see (a worker process); the maximum counts.
        ``cpu(now)`` is the same part's time on a CPU only (:attr:`cpu`, shedding's);
        without it ``fn`` counts for both."""
        self._sources.append((fn, cpu or fn))

    def start(self) -> None:
        """Starts sampling on the running loop (idempotent)."""
        if self._task is None:
            self._last = (self._clock(), *self._reader())
            self._task = asyncio.get_running_loop().create_task(self._run(), name="load-monitor")

    async def stop(self) -> None:
        """Stops sampling (idempotent)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                self.sample()
            except Exception:  # a bad source must not stop the measuring
                log.exception("%s: load sample failed", self.name)

    def sample(self) -> float:
        """Takes one sample now (on the loop thread) and reports it (rule 2).

        Returns:
            The utilisation used, 0 to 1.
        """
        t0 = time.perf_counter()
        now, (cpu, wait) = self._clock(), self._reader()
        if self._last is not None and now > self._last[0]:
            wall, cpu0, wait0 = self._last
            on = max(0.0, cpu - cpu0) / (now - wall)
            self._recent.append((on + max(0.0, wait - wait0) / (now - wall), on))
        self._last = (now, cpu, wait)
        n = len(self._recent) or 1
        u = sum(b for b, _ in self._recent) / n
        c = sum(c for _, c in self._recent) / n
        for fn, on_cpu in self._sources:
            u, c = max(u, float(fn(now))), max(c, float(on_cpu(now)))
        self.utilisation = min(1.0, max(0.0, u))
        self.cpu = min(1.0, max(0.0, c))
        self.samples += 1
        self.cost += time.perf_counter() - t0
        self._on_sample(self.utilisation, now)
        return self.utilisation


class LocalHealth:
    """How late this replica is (rule 3).

    Args:
        monitor: the loop's lag monitor.
        listen_after: seconds of listening after a short stall before its
            silence counts again (the configured heartbeat interval).
    """

    def __init__(self, monitor: LoopLagMonitor, listen_after: float) -> None:
        self._monitor = monitor
        self._listen_after = listen_after
        self._sources: list[Callable[[float], float]] = []
        self._hearing: list[Callable[[float], float]] = []

    def add_source(self, fn: Callable[[float], float], backlog: bool = True) -> None:
        """Adds a lateness source: ``fn(now)`` -> seconds of the recent past the
        replica could not hear (>= 0; e.g. the age of the oldest heartbeat not yet
        handed to the detector). ``backlog=False``: counted by :meth:`lateness`
        only, not by :meth:`backlog` (shedding does not read it: the read lag of
        ``arbiter/server/load/readlag.py``, which every join storm raises for a moment)."""
        (self._sources if backlog else self._hearing).append(fn)

    def lateness(self, now: float, own_lag: float = 0.0) -> float:
        """Seconds of the recent past this replica could not hear, at ``now`` (rule 3).

        Args:
            now: monotonic seconds.
            own_lag: how late the driver's own last wake-up was (seconds).
        """
        late = max(own_lag, self._monitor.recent_lag(now, now))  # a stall in progress
        lag, at = self._monitor.latest_late
        if now - at < max(self._listen_after, lag):
            late = max(late, lag)
        for fn in self._hearing:
            late = max(late, _safe(fn, now))
        return max(late, self.backlog(now))

    def backlog(self, now: float) -> float:
        """Lateness that lasts, seconds (rule 4): the loop's lasting lag and what the
        sources report (an ingest backlog); 0 without either.

        Unlike a loop stall, which is over by the time it is measured, a backlog
        lasts: it is what shedding reads."""
        late = self._monitor.mean_lateness(now)
        for fn in self._sources:
            late = max(late, _safe(fn, now))
        return late if late >= 0 else 0.0


def _safe(fn: Callable[[float], float], now: float) -> float:
    """``fn(now)``, or 0 when it fails: a broken source must not stop detection."""
    try:
        return float(fn(now))
    except Exception:
        log.exception("lateness source failed")
        return 0.0
