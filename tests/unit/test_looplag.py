"""The loop-lag monitor: stalls measured, logged with where the time went, rate-limited."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest

from arbiter.server.load.looplag import MEAN_WINDOW, LoopLagMonitor


async def _until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def _stall_blocked(seconds: float) -> None:
    time.sleep(seconds)  # the loop thread blocked in the kernel, as in an fsync


def _stall_on_cpu(seconds: float) -> None:
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:  # CPU time, however busy the machine is
        pass


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "arbiter.looplag" and r.levelno == logging.WARNING
    ]


async def test_looplag_blocked_stall_is_logged_with_its_size_and_stack(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "arbiter.looplag")
    m = LoopLagMonitor(name="a1", warn_after=0.2, warn_every=0)
    m.start()
    try:
        await _until(lambda: m.statistics().samples >= 2)
        _stall_blocked(0.5)
        await _until(lambda: m.statistics().stalls >= 1)
        st = m.statistics()
    finally:
        await m.stop()
    assert st.max >= 0.45
    # The stack was taken mid-stall; the warning says where the time went.
    mine = [w for w in _warnings(caplog) if "_stall_blocked" in w]
    assert mine, caplog.text
    assert mine[0].startswith("a1: event loop stalled: woke"), mine[0]
    assert "blocked or asleep" in mine[0], mine[0]


async def test_looplag_cpu_stall_is_accounted_as_cpu(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "arbiter.looplag")
    m = LoopLagMonitor(name="a1", warn_after=0.2, warn_every=0)
    m.start()
    try:
        await _until(lambda: m.statistics().samples >= 2)
        _stall_on_cpu(0.4)
        await _until(lambda: m.statistics().stalls >= 1)
    finally:
        await m.stop()
    mine = [w for w in _warnings(caplog) if "_stall_on_cpu" in w]
    assert mine, caplog.text
    cpu = float(mine[0].split("loop thread on CPU ")[1].split("s")[0])
    assert cpu >= 0.4, mine[0]


async def test_looplag_warnings_are_rate_limited_and_count_what_they_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "arbiter.looplag")
    m = LoopLagMonitor(name="a1", warn_after=0.2, warn_every=0.6)
    m.start()
    try:
        await _until(lambda: m.statistics().samples >= 2)
        _stall_blocked(0.3)
        await _until(lambda: len(_warnings(caplog)) >= 1)
        warned, stalls = len(_warnings(caplog)), m.statistics().stalls
        _stall_blocked(0.3)  # within warn_every of that warning: counted, not logged
        await _until(lambda: m.statistics().stalls > stalls)
        assert len(_warnings(caplog)) == warned, _warnings(caplog)
        seen = m.statistics().samples
        await _until(lambda: m.statistics().samples > seen + 12)  # 12 x 0.05 s: past warn_every
        _stall_blocked(0.3)
        await _until(lambda: len(_warnings(caplog)) > warned)
    finally:
        await m.stop()
    assert "more stall(s) since the last warning" in _warnings(caplog)[-1], _warnings(caplog)


async def test_looplag_recent_lag_reports_a_stall_in_progress_and_just_ended() -> None:
    m = LoopLagMonitor(name="a1", interval=0.05)
    assert m.recent_lag(time.monotonic(), since=0.0) == 0.0  # not started
    m.start()
    try:
        await _until(lambda: m.statistics().samples >= 2)
        _stall_blocked(0.4)
        # The loop is back but the monitor has not run yet: a stall in progress.
        assert m.recent_lag(time.monotonic(), since=time.monotonic()) >= 0.3
        await _until(lambda: m.statistics().stalls >= 1)
        # The monitor ran: the stall it measured counts if it came after `since`.
        assert m.recent_lag(time.monotonic(), since=time.monotonic() - 10.0) >= 0.3
        assert m.recent_lag(time.monotonic(), since=time.monotonic()) < 0.3
    finally:
        await m.stop()
    assert m.recent_lag(time.monotonic(), since=0.0) == 0.0  # stopped


async def test_looplag_mean_lateness_counts_a_loop_late_in_bursts_not_one_short_stall() -> None:
    m = LoopLagMonitor(name="a1", interval=0.05, warn_after=10.0)
    assert m.mean_lateness(time.monotonic()) == 0.0  # not started
    m.start()
    stop = asyncio.Event()

    async def starve() -> None:
        # A loop starved in bursts (as by CPU-bound neighbours): 0.5 s without a turn,
        # then 0.1 s in which it wakes on time.
        while not stop.is_set():
            _stall_blocked(0.5)
            await asyncio.sleep(0.1)

    hog: asyncio.Task[None] | None = None
    try:
        await _until(lambda: m.statistics().samples >= 5)
        _stall_blocked(0.4)  # one short stall...
        await _until(lambda: m.statistics().max >= 0.3)
        assert m.mean_lateness(time.monotonic()) < 0.1  # ...counts little (0.04 s)
        hog = asyncio.get_running_loop().create_task(starve())
        await _until(lambda: m.mean_lateness(time.monotonic()) >= 0.12)
        stop.set()
        await hog
        # On time again: it fades within the window.
        await _until(lambda: m.mean_lateness(time.monotonic()) < 0.01, timeout=MEAN_WINDOW + 3)
    finally:
        stop.set()
        if hog is not None:
            await hog
        await m.stop()
    assert m.mean_lateness(time.monotonic()) == 0.0  # stopped


def test_looplag_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        LoopLagMonitor(name="a1", interval=0)
    with pytest.raises(ValueError):
        LoopLagMonitor(name="a1", warn_after=-1)
