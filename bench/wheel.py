"""Failure detector cost per heartbeat and per tick: timing wheel versus the old heap.

Drives :class:`arbiter.core.detection.MissedHeartbeatDetector` (deadlines in
the hashed timing wheel of ``arbiter/core/detection/wheel.py``) and, for comparison, a
copy of the binary-heap detector it replaced (lazy tokens, entries re-armed
when they fire early; kept below as ``HeapDetector``) on simulated time: N
nodes heartbeat every ``--interval`` seconds (random phase, small jitter),
``--deaths`` of them stop at random moments of the measured time (the same
number whatever N, so every N gives the ticks the same suspicions to
report), and the shell ticks every ``--tick`` seconds and then reads
``next_deadline()``, as the driver's loop does. Each call is timed on its own
(perf_counter_ns; the timer's own cost is printed) with the garbage
collector off, as ``timeit`` does; the first ``--warmup`` simulated seconds
are not counted. Both detectors must report the same suspects at every tick.

Prints mean and p99 per call, in microseconds, and "busy": all timed calls
per simulated second. A tick of the wheel costs O(suspected + slots walked),
so its work stays flat from 1k to 100k nodes, while the heap's tick and
next_deadline re-arm every entry that a heartbeat made early, about
N * tick / interval per loop turn at O(log N) each. What a wheel tick still
gains with N is the memory hierarchy: the heartbeats between two ticks evict
the caches, and the calls after them pay for it. The ``control`` row shows
that floor: a 100-node wheel detector ticked amid the same N-node traffic.

Usage: python bench/wheel.py [--nodes 1000,10000,100000] [--seconds 3] [--warmup 1]
       [--interval 0.15] [--missed 5] [--tick 0.01] [--deaths 30] [--seed 1]
"""

from __future__ import annotations

import argparse
import gc
import heapq
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from arbiter.core.detection import DetectorState, MissedHeartbeatDetector

# The detector's per-node record (a private class of arbiter/core/detection/base.py;
# this benchmark subclasses the detector, so it works on the records, not their type).
Track = Any


class Detector(Protocol):
    def heartbeat(self, node_id: str, now: float, interval: float | None = None) -> bool: ...
    def tick(self, now: float) -> list[str]: ...
    def next_deadline(self) -> float | None: ...


class HeapDetector(MissedHeartbeatDetector):
    """MissedHeartbeatDetector with its deadlines in the binary heap the wheel replaced.

    ``tick``, ``next_deadline`` and ``_arm`` are the code of
    ``arbiter/core/detector.py`` before the wheel (git 9699d4c): one live heap
    entry per HEALTHY node recognised by a token; a heartbeat that moves the
    deadline later leaves the heap alone; an entry that fires early is re-armed
    at the real deadline. The token and armed deadline, fields of the track
    then, live in a side dict here (one more dict lookup per heartbeat).
    Heartbeat validation and bookkeeping are the current class's, so the two
    detectors differ only in where deadlines live. remove() and hold() are not
    carried over (the benchmark uses neither).
    """

    def __init__(self, *, interval: float, missed_limit: float) -> None:
        super().__init__(interval=interval, missed_limit=missed_limit)
        self._pq: list[tuple[float, str, int]] = []
        self._armed: dict[str, list[float | int | None]] = {}  # node -> [token, armed]
        self._count = 0

    def tick(self, now: float) -> list[str]:
        suspects: list[str] = []
        heap = self._pq
        while heap and heap[0][0] <= now:
            _, node_id, token = heapq.heappop(heap)
            track = self._live(node_id, token)
            if track is None:
                continue  # stale entry: skipped, never acted upon
            self._armed[node_id][1] = None
            if self._deadline(track) <= now:
                track.state = DetectorState.SUSPECT
                suspects.append(node_id)
            else:
                self._arm(node_id, track)  # fired early: the deadline moved later
        suspects.sort()
        return suspects

    def next_deadline(self) -> float | None:
        heap = self._pq
        while heap:
            deadline, node_id, token = heap[0]
            track = self._live(node_id, token)
            if track is None:
                heapq.heappop(heap)
                continue
            if self._deadline(track) <= deadline:
                return deadline
            heapq.heappop(heap)
            self._armed[node_id][1] = None
            self._arm(node_id, track)
        return None

    def _live(self, node_id: str, token: int) -> Track | None:
        track = self._nodes.get(node_id)
        armed = self._armed.get(node_id)
        if track is None or armed is None or armed[0] != token or armed[1] is None:
            return None
        return track

    def _arm(self, node_id: str, track: Track) -> None:
        deadline = self._deadline(track)
        armed = self._armed.get(node_id)
        if armed is None:
            self._armed[node_id] = armed = [0, None]
        elif armed[1] is not None and armed[1] <= deadline:
            return  # fires early at worst; tick() or next_deadline() re-arms it then
        self._count += 1
        armed[0], armed[1] = self._count, deadline
        heapq.heappush(self._pq, (deadline, node_id, self._count))


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    nodes: int
    seconds: float
    warmup: float
    interval: float
    tick: float
    deaths: int
    seed: int


def windows(load: Load) -> Iterator[tuple[float, list[tuple[float, str]]]]:
    """(tick time, heartbeats since the previous tick) for the whole run; deterministic."""
    rng = random.Random(load.seed)
    per_interval = max(1, round(load.interval / load.tick))
    groups: list[list[tuple[float, str]]] = [[] for _ in range(per_interval)]
    for i in range(load.nodes):
        groups[rng.randrange(per_interval)].append((rng.uniform(0.0, 0.5), f"node-{i:06d}"))
    for group in groups:
        group.sort()
    end = load.warmup + load.seconds
    death = {
        f"node-{i:06d}": rng.uniform(load.warmup, end)
        for i in rng.sample(range(load.nodes), min(load.deaths, load.nodes))
    }
    steps = round(end / load.tick)
    for k in range(1, steps + 1):
        now = k * load.tick
        start = now - load.tick
        beats = []
        for frac, node in groups[k % per_interval]:
            # Within the window (frac < 0.5), plus jitter of up to 40 % of it.
            t = start + load.tick * (frac + rng.uniform(0.0, 0.4))
            if t < death.get(node, end):
                beats.append((t, node))
        yield now, beats


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    heartbeat: list[int]
    tick: list[int]
    next_deadline: list[int]
    empty: list[int]
    suspects: list[tuple[float, list[str]]]


def _empty(now: float) -> float:
    return now


def run(detector: Detector, load: Load) -> Result:
    clock = time.perf_counter_ns
    hb: list[int] = []
    ticks: list[int] = []
    nd: list[int] = []
    empty: list[int] = []
    suspects: list[tuple[float, list[str]]] = []
    for now, beats in windows(load):
        counted = now > load.warmup
        for t, node in beats:
            t0 = clock()
            detector.heartbeat(node, t)
            t1 = clock()
            if counted:
                hb.append(t1 - t0)
        # The first call after a batch of heartbeats pays for the caches they
        # evicted; an empty call timed here shows that floor.
        t0 = clock()
        _empty(now)
        t1 = clock()
        got = detector.tick(now)
        t2 = clock()
        detector.next_deadline()
        t3 = clock()
        if counted:
            empty.append(t1 - t0)
            ticks.append(t2 - t1)
            nd.append(t3 - t2)
        if got:
            suspects.append((now, got))
    return Result(heartbeat=hb, tick=ticks, next_deadline=nd, empty=empty, suspects=suspects)


def control(load: Load, missed: float) -> list[int]:
    """Tick costs of a 100-node wheel detector amid the memory traffic of N nodes.

    Every heartbeat of the N-node stream updates a per-node record in a plain
    dict (what a heartbeat's bookkeeping touches), but only nodes 0-99 reach
    the detector. Its ticks do the same work at every N, so whatever their
    cost gains with N is the caches the traffic evicted, not the wheel.
    """
    clock = time.perf_counter_ns
    detector = MissedHeartbeatDetector(interval=load.interval, missed_limit=missed)
    records = {f"node-{i:06d}": [0.0] for i in range(load.nodes)}
    tracked = set(list(records)[:100])
    ticks: list[int] = []
    for now, beats in windows(load):
        for t, node in beats:
            records[node][0] = t
            if node in tracked:
                detector.heartbeat(node, t)
        _empty(now)
        t1 = clock()
        detector.tick(now)
        t2 = clock()
        detector.next_deadline()
        if now > load.warmup:
            ticks.append(t2 - t1)
    return ticks


def _mean(samples: list[int]) -> float:
    return sum(samples) / len(samples) / 1000


def _us(samples: list[int]) -> str:
    s = sorted(samples)
    p99 = s[min(len(s) - 1, int(len(s) * 0.99))] / 1000
    return f"{_mean(s):8.2f} {p99:8.2f}"


def _timer_cost() -> float:
    clock = time.perf_counter_ns
    n = 100_000
    t0 = clock()
    for _ in range(n):
        clock()
    return (clock() - t0) / n / 1000


def main(loads: list[Load], missed: float) -> None:
    first = loads[0]
    print(
        f"heartbeat every {first.interval} s, suspect after {missed:g} missed "
        f"(D = {first.interval * missed:g} s), tick + next_deadline every {first.tick} s, "
        f"{first.deaths} nodes die; {first.seconds:g} s measured after "
        f"{first.warmup:g} s warm-up, seed {first.seed}, gc off; "
        f"timer ~{_timer_cost():.2f} us per read"
    )
    print("microseconds per call (mean, p99); busy = all timed calls, ms per simulated second")
    print()
    print(
        f"{'nodes':>7}  {'detector':<8} {'heartbeat':>17}  {'tick':>17}  "
        f"{'next_deadline':>17}  {'empty call':>10}  {'busy':>7}  {'suspected':>9}"
    )
    pair = f"{'mean':>8} {'p99':>8}"
    print(f"{'':>7}  {'':<8} {pair}  {pair}  {pair}  {'mean':>10}  {'ms/s':>7}")
    for load in loads:
        results = {}
        for name, make in (("wheel", MissedHeartbeatDetector), ("heap", HeapDetector)):
            detector: Detector = make(interval=load.interval, missed_limit=missed)
            gc.collect()
            gc.disable()  # as timeit does: collector pauses would land on random calls
            try:
                results[name] = r = run(detector, load)
            finally:
                gc.enable()
            busy = (sum(r.heartbeat) + sum(r.tick) + sum(r.next_deadline)) / 1e6 / load.seconds
            print(
                f"{load.nodes:>7}  {name:<8} {_us(r.heartbeat)}  {_us(r.tick)}  "
                f"{_us(r.next_deadline)}  {_mean(r.empty):10.2f}  {busy:7.1f}  "
                f"{sum(len(s) for _, s in r.suspects):>9}"
            )
        assert results["wheel"].suspects == results["heap"].suspects, "the detectors disagree"
        gc.collect()
        gc.disable()
        try:
            ticks = control(load, missed)
        finally:
            gc.enable()
        print(f"{load.nodes:>7}  {'control':<8} {'':>17}  {_us(ticks)}")
    print()
    print(
        "control: a 100-node wheel detector ticked amid the same N-node heartbeat traffic\n"
        "(records updated in a plain dict): its ticks do the same work at every N, so\n"
        "what they gain with N is evicted caches, not the wheel (see control())."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,10000,100000", help="comma-separated counts")
    parser.add_argument("--seconds", type=float, default=3.0, help="simulated seconds measured")
    parser.add_argument("--warmup", type=float, default=1.0, help="simulated seconds not counted")
    parser.add_argument("--interval", type=float, default=0.15, help="heartbeat interval, s")
    parser.add_argument("--missed", type=float, default=5.0, help="missed intervals to suspect")
    parser.add_argument("--tick", type=float, default=0.01, help="simulated s between ticks")
    parser.add_argument("--deaths", type=int, default=30, help="nodes that die while measured")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    main(
        [
            Load(
                nodes=int(n),
                seconds=args.seconds,
                warmup=args.warmup,
                interval=args.interval,
                tick=args.tick,
                deaths=args.deaths,
                seed=args.seed,
            )
            for n in args.nodes.split(",")
        ],
        args.missed,
    )
