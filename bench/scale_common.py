"""Helpers of the scale benchmark (bench/scale.py): /proc readings, /metrics scrapes,
percentiles, CPU hogs, waiting. Not a program of its own."""

from __future__ import annotations

import math
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from detection_common import Procs, cpu_seconds

__all__ = [
    "cpu_seconds",
    "histogram_quantile",
    "niced",
    "pct",
    "process_tree",
    "rss_bytes",
    "scrape",
    "start_hogs",
    "tree_cpu_seconds",
    "tree_rss_bytes",
    "victims",
    "wait_until",
]


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a replica and its ingest workers), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants (:func:`process_tree`)."""
    return sum(cpu_seconds(p) for p in process_tree(pid))


def tree_rss_bytes(pid: int) -> int:
    """Resident bytes of ``pid`` and its live descendants (:func:`process_tree`)."""
    return sum(rss_bytes(p) for p in process_tree(pid))


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, bytes (VmRSS in /proc; 0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def join_spread(args: Any, n: int) -> float:
    """Seconds within which a join storm's ``n`` nodes start: ``--join-spread`` when
    given, else ``n / --join-rate``, at least 1 s."""
    if args.join_spread is not None:
        return float(args.join_spread)
    return max(1.0, n / args.join_rate)


def spread_words(args: Any) -> str:
    """How :func:`join_spread` chose, in words for a table's notes."""
    if args.join_spread is not None:
        return f"{args.join_spread:g} s"
    return f"N / {args.join_rate:g} s (at least 1 s)"


def pct(samples: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile ``p`` (0..100) of ``samples``; None when there are none."""
    if not samples:
        return None
    s = sorted(samples)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def scrape(address: str, timeout: float = 3.0) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A replica's ``/metrics`` (``--metrics-listen``): sample name -> [(labels, value)].

    Raises:
        OSError: the endpoint does not answer.
    """
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as r:
        text = r.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def metric(m: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
    return sum(v for lab, v in m.get(name, ()) if all(lab.get(k) == x for k, x in labels.items()))


def histogram_quantile(
    scrapes: Sequence[dict[str, list[tuple[dict[str, str], float]]]], name: str, q: float
) -> float | None:
    """The upper bound of the bucket holding quantile ``q`` of histogram ``name``,
    summed over ``scrapes`` (seconds; None when it holds no sample; inf past the last bound)."""
    buckets: dict[float, float] = {}
    for m in scrapes:
        for lab, v in m.get(name + "_bucket", ()):
            le = float(lab["le"])
            buckets[le] = buckets.get(le, 0.0) + v
    if not buckets or buckets.get(math.inf, 0.0) == 0:
        return None
    total = buckets[math.inf]
    for le in sorted(buckets):
        if buckets[le] >= q * total:
            return le
    return math.inf


def histogram_delta(
    after: dict[str, list[tuple[dict[str, str], float]]],
    before: dict[str, list[tuple[dict[str, str], float]]],
    name: str,
) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The buckets of histogram ``name`` observed between two scrapes (after - before)."""
    key = name + "_bucket"
    old = {lab["le"]: v for lab, v in before.get(key, ())}
    return {key: [(lab, v - old.get(lab["le"], 0.0)) for lab, v in after.get(key, ())]}


def start_hogs(procs: Procs, k: int, nice: int = 0) -> list[Any]:
    """``k`` busy-loop processes (one Python ``while True: pass`` each) at ``nice``,
    killed with ``procs``."""
    argv = [*niced(nice), sys.executable, "-c", "while True: pass"]
    return [procs.spawn(f"hog-{i}", argv) for i in range(k)]


def niced(nice: int) -> list[str]:
    """The argv prefix that runs a command at ``nice`` (coreutils ``nice``; none for 0)."""
    return ["nice", "-n", str(nice)] if nice else []


def victims(n: int, k: int, gone: set[str]) -> list[str]:
    """``k`` node ids ``n<i>`` spread over 0..n-1 (a stride prime to n), skipping ``gone``
    (already DEAD or expired: a kill of those could not be timed)."""
    out: list[str] = []
    for i in range(1, 4 * n + 1):
        v = f"n{(i * 7919) % n}"
        if len(out) == k:
            break
        if v not in gone and v not in out:
            out.append(v)
    return out


def wait_until(pred: Callable[[], object], timeout: float, interval: float = 0.2) -> bool:
    """Polls ``pred`` until it is true or ``timeout`` seconds passed; returns whether it was."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if pred():
                return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
