"""Helpers of the fan-out benchmarks (bench/fanout.py, bench/fanout_cost.py): receive
latencies from the Go subscribers' times, py-spy around a window, summaries. Not a
program of its own."""

from __future__ import annotations

import shutil
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from heartbeat_path import profile_top
from scale_common import pct

__all__ = ["ms", "receive_latency", "start_spy", "stop_spy", "summary"]


def ms(v: float | None) -> float | None:
    """Seconds as milliseconds, rounded to 10 us (None stays None)."""
    return None if v is None else round(v * 1e3, 2)


def receive_latency(
    events: Iterable[dict[str, Any]],
    origin: Callable[[str, int], float | None],
    epochs: set[int],
) -> dict[str, Any]:
    """Every subscriber's receive time minus ``origin(arbiter, epoch)``, over ``epochs``.

    Args:
        events: the ``loadgen sub --times`` lines (``ev`` "epoch" with ``recv``:
            arbiter id -> wall-clock receive times).
        origin: the wall-clock time the arbiter applied (or published) the epoch;
            None when unknown (those receives are counted as unmatched).
        epochs: the epochs to count.

    Returns:
        samples, unmatched, p50/p90/p99/max (ms), p99 per arbiter (ms), and the
        spread (last minus first receive among one arbiter's subscribers, per
        epoch) p50 and max (ms).
    """
    samples: list[float] = []
    spreads: list[float] = []
    per: dict[str, list[float]] = {}
    missing = 0
    for e in events:
        if e.get("ev") != "epoch" or e["epoch"] not in epochs or not e.get("recv"):
            continue
        for rid, times in e["recv"].items():
            at = origin(rid, int(e["epoch"]))
            if at is None:
                missing += len(times)
                continue
            lat = [t - at for t in times]
            samples += lat
            per.setdefault(rid, []).extend(lat)
            spreads.append(max(times) - min(times))
    return {
        "samples": len(samples),
        "unmatched": missing,
        **{f"p{p}_ms": ms(pct(samples, p)) for p in (50, 90, 99)},
        "max_ms": ms(max(samples, default=None)),
        "per_replica_p99_ms": {r: ms(pct(v, 99)) for r, v in sorted(per.items())},
        "spread_p50_ms": ms(pct(spreads, 50)),
        "spread_max_ms": ms(max(spreads, default=None)),
    }


def start_spy(pid: int, out: Path | None, native: bool = False) -> subprocess.Popen[bytes] | None:
    """``py-spy record`` of ``pid`` into ``out`` (collapsed stacks) until :func:`stop_spy`;
    None when ``out`` is None. ``native`` adds C frames (gRPC's core, the GC) and pauses
    the process to sample."""
    if out is None:
        return None
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--rate", "250", "--format", "raw",
         "--output", str(out), *(["--native"] if native else ["--nonblocking"])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def stop_spy(spy: subprocess.Popen[bytes] | None, out: Path | None) -> str | None:
    """Stops :func:`start_spy`'s recording; returns the top of the profile (or None)."""
    if spy is None or out is None:
        return None
    spy.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
    try:
        spy.wait(30)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait()
        return None
    return profile_top(out) if out.exists() else None


def summary(
    rows: Sequence[dict[str, Any]], label: Callable[[dict[str, Any]], str], keys: Sequence[str]
) -> list[str]:
    """Per ``label(row)`` and key: the median, min and max over the rows (the rounds)."""
    out = []
    for name in dict.fromkeys(label(r) for r in rows):
        for key in keys:
            xs = [r[key] for r in rows if label(r) == name and r.get(key) is not None]
            if xs:
                out.append(
                    f"{name} {key}: median {statistics.median(xs):.3g} "
                    f"(min {min(xs):.3g}, max {max(xs):.3g}, {len(xs)} round(s))"
                )
    return out
