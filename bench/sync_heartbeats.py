"""Heartbeat lateness of the blocking client (membership.sync) while the main thread works.

A node heartbeats through :class:`membership.sync.MembershipClient` (default
settings: an interval of 0.15 s, the lease it counts 0.65 s from the send, the
replicas' detection time D 0.75 s) to three replica processes on loopback,
while this process's main thread, in turn:

* ``idle``: sleeps (``time.sleep`` releases the GIL);
* ``busy``: runs a pure-Python loop (the GIL changes hands every
  ``sys.getswitchinterval()``, 5 ms by default);
* ``numpy``: multiplies matrices with numpy, if installed (BLAS releases the
  GIL: the kind of C call that is harmless), on one BLAS thread
  (``OPENBLAS_NUM_THREADS=1`` unless set: on a small machine that also runs
  the replicas, BLAS threads on every core would measure CPU starvation of
  the replicas, not the GIL);
* ``gil 0.1`` / ``gil 0.5`` / ``gil 2``: a C call that holds the GIL that long
  (``usleep`` through :class:`ctypes.PyDLL`, which keeps the GIL, as a C
  extension without ``Py_BEGIN_ALLOW_THREADS`` does), ``--repeat`` times with
  a recovery between (after a 2 s hold: until the node rejoined and holds its
  leases again).

Three figures, in milliseconds:

* *lag*: how late a task on the client's loop wakes from a 10 ms sleep: how
  long the loop's thread waits for the GIL (and for a CPU) after a timer fires;
* *late*: on the node, how late each heartbeat was handed to its stream
  against that stream's schedule (the previous hand-over + the interval; a
  stream's first heartbeat, after a reconnect or a hedge, has none), from
  ``_Stream.offer``, wrapped here;
* *gap*: at each replica, the time between two heartbeats of the node as it
  received them, on whichever stream (the replicas run this file with
  ``--replica``, which records it in ``Driver.heartbeat`` with the arrival
  time; CLOCK_MONOTONIC is the same clock in every process). This is what the
  failure detector sees: a gap above D (0.75 s) is a suspicion. Its median is
  the interval the replicas suggest (0.15 s, more when they are loaded).

And per phase: how often the node reported itself fenced, and how often it
was declared DEAD (an ``Evicted`` event, then a rejoin at a higher
incarnation). Also printed: the cost of reading a property of the blocking
client (one round trip to the loop's thread), and the machine's load.

Usage: python bench/sync_heartbeats.py [--seconds 5] [--repeat 5] [--holds 0.1,0.5,2]
       [--switch-interval 0.005] [--json FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def replica_main(arrivals: str, argv: list[str]) -> int:
    """``--replica FILE -- ARGS``: ``membership ARGS``, writing to FILE the time since the
    previous heartbeat of the same node (on any stream) at every heartbeat received."""
    from arbiter.server.consensus.driver import Driver

    out = open(arrivals, "a", buffering=1)  # noqa: SIM115 - for the life of the process
    last: dict[str, float] = {}
    original = Driver.heartbeat

    def heartbeat(self: Driver, node_id: str, *args: Any) -> Any:
        now = args[-1]
        if node_id in last:
            out.write(f"{now:.6f} {now - last[node_id]:.6f}\n")
        last[node_id] = now
        return original(self, node_id, *args)

    Driver.heartbeat = heartbeat  # type: ignore[method-assign]
    from membership.cli import main

    return main(argv)


# --- the node side ----------------------------------------------------------------


def hold_gil(seconds: float) -> None:
    """Sleeps in C while holding the GIL (PyDLL keeps it during the call)."""
    libc = ctypes.PyDLL(ctypes.util.find_library("c"))
    libc.usleep(ctypes.c_uint(int(seconds * 1e6)))


def busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        for i in range(1000):
            x += i * i


def numpy_work(seconds: float) -> bool:
    try:
        import numpy as np
    except ImportError:
        return False
    a = np.random.default_rng(1).random((400, 400))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = a @ a
        a /= a.max()
    return True


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Recorder:
    """Heartbeat hand-overs per stream, the loop's ticks and the session events."""

    def __init__(self) -> None:
        self.late: list[tuple[float, float]] = []  # (time, seconds late) per hand-over
        self.events: list[tuple[float, Any]] = []
        self.lag: list[tuple[float, float]] = []  # (time, seconds late) of the loop's ticks

    def wrap(self, agent: Any) -> None:
        """Records every heartbeat handed to a stream against that stream's schedule.

        Per stream, so that a stream opened anew (after a failure, a hedge) is
        not taken for a late heartbeat: its first hand-over has no schedule.
        """
        from membership._node import heartbeats

        late = self.late
        original = heartbeats._Stream.offer

        def offer(stream: Any, seq: int, request: Any, now: float) -> None:
            prev = getattr(stream, "_bench_prev", None)
            stream._bench_prev = (now, agent.interval)
            if prev is not None:
                late.append((now, max(0.0, now - (prev[0] + prev[1]))))
            original(stream, seq, request, now)

        heartbeats._Stream.offer = offer  # type: ignore[method-assign]

    async def tick(self, every: float = 0.01) -> None:
        """Wakes every ``every`` seconds on the client's loop and records how late."""
        import asyncio

        while True:
            due = time.monotonic() + every
            await asyncio.sleep(every)
            now = time.monotonic()
            self.lag.append((now, now - due))

    def loop_lag(self, t0: float, t1: float) -> list[float]:
        return [lag for t, lag in self.lag if t0 <= t <= t1]

    def on_event(self, ev: Any) -> None:
        self.events.append((time.monotonic(), ev))

    def lateness(self, t0: float, t1: float) -> list[float]:
        return [late for t, late in self.late if t0 <= t <= t1]

    def count(self, kind: str, t0: float, t1: float, **match: Any) -> int:
        return sum(
            1
            for t, ev in self.events
            if t0 <= t <= t1
            and type(ev).__name__ == kind
            and all(getattr(ev, k) == v for k, v in match.items())
        )


def gaps(files: list[Path], t0: float, t1: float) -> list[float]:
    out = []
    for f in files:
        for line in f.read_text().splitlines():
            at, gap = map(float, line.split())
            if t0 <= at <= t1:
                out.append(gap)
    return out


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from membership import ClientConfig
    from membership.sync import MembershipClient
    from membership.testing.localcluster import LocalCluster, arbiter_args, free_ports

    sys.setswitchinterval(args.switch_interval)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cluster = LocalCluster(work, log_level="warning", tls=False)
        cluster.arbiters = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(free_ports(3))}
        files = [work / f"{rid}.arrivals" for rid in cluster.arbiters]
        try:
            for rid in cluster.arbiters:
                argv = arbiter_args(rid, cluster.arbiters, cluster.data_dir(rid), "--insecure")
                arrivals = str(work / f"{rid}.arrivals")
                command = [sys.executable, __file__, "--replica", arrivals, "--"]
                cluster.spawn_command(rid, [*command, "--log-level", "warning", *argv])
            rec = Recorder()
            config = ClientConfig(insecure=True, follow_view=True)
            with MembershipClient(
                cluster.addresses, node_id="bench-1", config=config, on_event=rec.on_event
            ) as client:
                rec.wrap(client._client._agent)  # bench only: the send schedule
                client._loop.create_task(rec.tick, "bench-loop-lag")
                client.wait_alive(timeout=30)
                client.wait_fenced(False, timeout=30)
                time.sleep(1.0)

                # The cost of a property read: a round trip to the loop's thread.
                reads = []
                for _ in range(500):
                    t = time.perf_counter()
                    client.is_member  # noqa: B018
                    reads.append(time.perf_counter() - t)
                print(
                    f"property read (client.is_member): p50 {pct(reads, 0.5) * 1e6:.0f} us, "
                    f"p99 {pct(reads, 0.99) * 1e6:.0f} us"
                )

                def phase(name: str, work: Callable[[], Any], settle: float = 1.0) -> None:
                    t0 = time.monotonic()
                    work()
                    t1 = time.monotonic()
                    time.sleep(settle)  # the heartbeat that ends a pause arrives after it
                    t2 = time.monotonic()
                    late = rec.lateness(t0, t1 + 0.5)
                    seen = gaps(files, t0, t1 + 0.5)
                    lag = rec.loop_lag(t0, t1)
                    row = {
                        "phase": name,
                        "lag_p50_ms": pct(lag, 0.5) * 1e3,
                        "lag_p99_ms": pct(lag, 0.99) * 1e3,
                        "lag_max_ms": max(lag, default=float("nan")) * 1e3,
                        "seconds": round(t1 - t0, 2),
                        "heartbeats": len(late),
                        "late_p50_ms": pct(late, 0.5) * 1e3,
                        "late_p99_ms": pct(late, 0.99) * 1e3,
                        "late_max_ms": max(late, default=float("nan")) * 1e3,
                        "gap_p50_ms": pct(seen, 0.5) * 1e3,
                        "gap_p99_ms": pct(seen, 0.99) * 1e3,
                        "gap_max_ms": max(seen, default=float("nan")) * 1e3,
                        "fenced": rec.count("Fenced", t0, t2, fenced=True),
                        "dead": rec.count("Evicted", t0, t2),
                    }
                    rows.append(row)
                    print(_line(row), flush=True)

                print(_header(), flush=True)
                phase("idle (sleep)", lambda: time.sleep(args.seconds))
                phase("busy Python loop", lambda: busy(args.seconds))
                if numpy_work(0.01):
                    phase("numpy matmul", lambda: numpy_work(args.seconds))
                for hold in args.holds:

                    def holds(hold: float = hold) -> None:
                        for i in range(args.repeat):
                            hold_gil(hold)
                            if i < args.repeat - 1:
                                recover(hold)

                    def recover(hold: float) -> None:
                        if hold < 0.6:
                            time.sleep(1.0)
                            return
                        client.wait_fenced(False, timeout=30)  # rejoined and leased again
                        time.sleep(1.0)

                    phase(f"GIL held {hold:g} s x{args.repeat}", holds, settle=2.0 + hold)
                    if hold >= 0.6:
                        client.wait_fenced(False, timeout=30)
                        time.sleep(1.0)
        finally:
            cluster.kill_all()
    return rows


def _header() -> str:
    return (
        f"{'main thread':<24} {'s':>5} | {'lag ms p50':>10} {'p99':>7} {'max':>7} | {'beats':>5}"
        f" {'late ms p50':>11} {'p99':>7} {'max':>7} | {'gap ms p50':>10} {'p99':>7} {'max':>7} |"
        f" {'fenced':>6} {'dead':>4}"
    )


def _line(r: dict[str, Any]) -> str:
    return (
        f"{r['phase']:<24} {r['seconds']:>5.1f} | "
        f"{r['lag_p50_ms']:>10.1f} {r['lag_p99_ms']:>7.1f} {r['lag_max_ms']:>7.1f} | "
        f"{r['heartbeats']:>5} "
        f"{r['late_p50_ms']:>11.1f} {r['late_p99_ms']:>7.1f} {r['late_max_ms']:>7.1f} | "
        f"{r['gap_p50_ms']:>10.1f} {r['gap_p99_ms']:>7.1f} {r['gap_max_ms']:>7.1f} | "
        f"{r['fenced']:>6} {r['dead']:>4}"
    )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--replica":
        sep = sys.argv.index("--")
        return replica_main(sys.argv[2], sys.argv[sep + 1 :])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0, help="length of each working phase")
    p.add_argument("--repeat", type=int, default=5, help="GIL holds per duration")
    p.add_argument(
        "--holds",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[0.1, 0.5, 2.0],
        help="GIL hold durations, seconds, comma-separated",
    )
    p.add_argument("--switch-interval", type=float, default=sys.getswitchinterval())
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")  # before numpy is imported (see the docstring)
    print(
        f"python {sys.version.split()[0]}, switch interval {args.switch_interval * 1e3:g} ms, "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    )
    rows = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    print(
        f"load average after: {os.getloadavg()[0]:.2f}; median late overall "
        f"{statistics.median(r['late_p50_ms'] for r in rows):.1f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
