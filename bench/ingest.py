"""Heartbeat ingest in worker processes: one replica at ``--ingest-workers`` K = 0, 1, 2.

One replica (a group of one, plaintext, its own data dir) takes ``--nodes``
simulated nodes, each one real ``Heartbeat`` stream declaring
``--interval`` seconds (0.6) and sending at it, from ``--procs`` generator
processes (this script with ``--generate``; streams spread over connections
of their own, at most 50 streams each, so SO_REUSEPORT spreads them over the
workers). For each K in turn, in the same run:

1. the replica's processes' CPU (utime + stime from /proc) over ``--idle``
   seconds with no load: the cost of standing still (empty batches, Raft
   and driver ticks), subtracted below;
2. the load connects and warms up for ``--warmup`` seconds, then over a
   ``--window`` (s) the acks the generators received, the rate they
   achieved against the rate they were asked for and the lateness of their
   own sends (a result is never the generators' limit mistaken for the
   replica's), and every process's CPU.

Printed per K: acks/s, the consensus process's and the workers' marginal CPU
per heartbeat (µs; idle cost subtracted), their sum, each as a ratio to
K = 0's total, and the heartbeats per second one core of each would carry
(1e6 / µs). The projection for C cores gives the workers C - 1 cores and
the consensus process one: min(1e6 / consensus µs, (C - 1) x 1e6 / worker µs).
On this 2-core machine the generators share the cores with the replica, so
achieved throughput is bounded by the machine, not by the replica: the CPU
per heartbeat is the figure; the throughput column says what was offered
and served.

Usage: python bench/ingest.py [--nodes 1200] [--interval 0.6] [--procs 1]
       [--window 10] [--workers 0,1,2] [--rounds 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STREAMS_PER_CONNECTION = 50
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (seconds), 0.0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


# --- the generator (--generate) ----------------------------------------------------------


async def generate(args: argparse.Namespace) -> None:
    import grpc

    from membership.v1 import membership_pb2 as pb

    t0, t1 = args.measure_from, args.measure_from + args.window
    acks = sent = failures = 0
    late: list[float] = []
    channels = []
    codes: dict[str, int] = {}
    examples: list[str] = []

    async def stream(i: int, channel: Any) -> None:
        nonlocal acks, sent, failures
        call = channel.stream_stream(
            "/membership.v1.Membership/Heartbeat",
            request_serializer=pb.HeartbeatRequest.SerializeToString,
            response_deserializer=pb.HeartbeatAck.FromString,
        )()
        req = pb.HeartbeatRequest(
            node_id=f"{args.prefix}{i}", incarnation=1, interval_seconds=args.interval
        )
        await asyncio.sleep(args.interval * (i % 97) / 97)  # spread over one interval
        due = time.monotonic()
        seq = 0
        try:
            while time.monotonic() < t1:
                seq += 1
                req.seq = seq
                now = time.monotonic()
                await call.write(req)
                await call.read()
                if t0 <= now < t1:
                    sent += 1
                    acks += 1
                    late.append(now - due)
                due += args.interval
                wait = due - time.monotonic()
                if wait < 0:  # more than behind: skip ahead, never burst
                    due = time.monotonic()
                else:
                    await asyncio.sleep(wait)
        except grpc.aio.AioRpcError as e:
            failures += 1
            codes[e.code().name] = codes.get(e.code().name, 0) + 1
            if len(examples) < 3:
                examples.append(f"{e.code().name}: {e.details()}")
        except asyncio.InvalidStateError:  # the stream ended between two writes
            failures += 1
            status = await call.code()
            codes[status.name] = codes.get(status.name, 0) + 1
            if len(examples) < 3:
                examples.append(f"{status.name}: {await call.details()}")
        finally:
            call.cancel()

    tasks = []
    for i in range(args.first, args.first + args.count):
        if (i - args.first) % STREAMS_PER_CONNECTION == 0:
            channels.append(
                grpc.aio.insecure_channel(
                    args.target, options=[("grpc.use_local_subchannel_pool", 1)]
                )
            )
        tasks.append(asyncio.create_task(stream(i, channels[-1])))
    cpu0 = time.process_time()
    await asyncio.gather(*tasks)
    for ch in channels:
        await ch.close()
    print(
        json.dumps(
            {
                "acks": acks,
                "failures": failures,
                "codes": codes,
                "examples": examples,
                "late_p50_ms": _pct(late, 0.5) * 1000,
                "late_p99_ms": _pct(late, 0.99) * 1000,
                "cpu": time.process_time() - cpu0,
            }
        ),
        flush=True,
    )


# --- the benchmark -----------------------------------------------------------------------


def _start_replica(tmp: Path, k: int, port: int) -> subprocess.Popen[bytes]:
    addr = f"127.0.0.1:{port}"
    tmp.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable, "-m", "membership", "--log-level", "warning", "arbiter",
        "--id", "a1", "--listen", addr, "--peers", f"a1={addr}", "--insecure",
        "--data-dir", str(tmp / f"k{k}.data"), "--ingest-workers", str(k),
        "--max-nodes", "100000", "--max-heartbeat-streams", "100000",
    ]  # fmt: skip
    err = open(tmp / f"k{k}.err", "wb")  # noqa: SIM115 - lives as long as the child
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)


def _wait_serving(addr: str, timeout: float = 30.0) -> None:
    import grpc

    from membership.v1 import membership_pb2 as pb
    from membership.v1 import membership_pb2_grpc as pb_grpc

    deadline = time.monotonic() + timeout
    while True:
        try:
            with grpc.insecure_channel(addr) as ch:
                r = pb_grpc.MembershipStub(ch).GetView(pb.GetViewRequest(summary=True), timeout=1)
                if r.in_quorum:
                    return
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"replica at {addr} not serving in a quorum within {timeout}s")
        time.sleep(0.2)


def _pids(replica: subprocess.Popen[bytes]) -> list[int]:
    return [replica.pid, *children(replica.pid)]


def measure(args: argparse.Namespace, k: int, tmp: Path) -> dict[str, Any]:
    from membership.testing.localcluster import free_ports

    (port,) = free_ports(1)
    replica = _start_replica(tmp, k, port)
    gens: list[subprocess.Popen[str]] = []
    try:
        _wait_serving(f"127.0.0.1:{port}")
        pids = _pids(replica)
        c0 = {p: cpu_seconds(p) for p in pids}
        time.sleep(args.idle)
        idle = {p: (cpu_seconds(p) - c0[p]) / args.idle for p in pids}  # cores, at rest
        measure_from = time.monotonic() + args.warmup + args.interval
        per = args.nodes // args.procs
        for g in range(args.procs):
            gens.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--generate",
                        "--target",
                        f"127.0.0.1:{port}",
                        "--first",
                        str(g * per),
                        "--count",
                        str(per),
                        "--prefix",
                        f"k{k}n",
                        "--interval",
                        str(args.interval),
                        "--window",
                        str(args.window),
                        "--measure-from",
                        str(measure_from),
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        time.sleep(max(0.0, measure_from - time.monotonic()))
        pids = _pids(replica)  # a worker restarted meanwhile would show here
        c1 = {p: cpu_seconds(p) for p in pids}
        time.sleep(args.window)
        c2 = {p: cpu_seconds(p) for p in pids}
        results = [json.loads(g.communicate(timeout=60)[0].strip().splitlines()[-1]) for g in gens]
    finally:
        for g in gens:
            if g.poll() is None:
                g.kill()
        replica.send_signal(signal.SIGTERM)
        try:
            replica.wait(15)
        except subprocess.TimeoutExpired:
            replica.kill()
    acks = sum(r["acks"] for r in results)
    busy = {p: c2[p] - c1[p] - idle.get(p, 0.0) * args.window for p in pids}
    main_us = busy[replica.pid] / acks * 1e6
    worker_us = sum(v for p, v in busy.items() if p != replica.pid) / acks * 1e6
    return {
        "workers": k,
        "offered_per_s": args.nodes / args.interval,
        "acks_per_s": acks / args.window,
        "failures": sum(r["failures"] for r in results),
        "failure_examples": [x for r in results for x in r["examples"]][:3],
        "gen_late_p99_ms": max(r["late_p99_ms"] for r in results),
        "consensus_us": main_us,
        "workers_us": worker_us,
        "total_us": main_us + worker_us,
        "idle_cores": sum(idle.values()),
    }


def channel_cost(nodes: int, batch: int, seconds: float = 2.0) -> dict[str, float]:
    """In this process: µs per heartbeat of ``Driver.on_heartbeat`` alone, and of a
    worker's BATCH answered by :class:`arbiter.server.ingest.pool.IngestPool` (frame
    decode, the same on_heartbeat, status board, VERDICTS encode), batches of ``batch``."""
    from arbiter.config import ArbiterConfig
    from arbiter.server.consensus.arbiterset import ArbiterSet
    from arbiter.server.consensus.driver import Driver
    from arbiter.server.consensus.storage import Storage
    from arbiter.server.fanout.statusboard import StatusBoard
    from arbiter.server.ingest import frames
    from arbiter.server.ingest.pool import IngestPool
    from membership.v1 import membership_pb2 as pb

    async def run() -> dict[str, float]:
        ids = {"a1": "127.0.0.1:1"}
        storage = Storage.open(None, replica_id="a1", cluster="default", arbiters=ids)
        cfg = ArbiterConfig.local(max_nodes=10 * nodes + 1000)
        driver = Driver(
            replica_id="a1", replica_ids=ids, config=cfg, send=lambda m: None,
            on_change=lambda c: None, on_quorum=lambda s: None, storage=storage,
        )  # fmt: skip

        class Api:
            board = StatusBoard()
            heartbeat_streams = 0

            @staticmethod
            def arbiters() -> ArbiterSet:
                return ArbiterSet(voters=ids)

        class Server:
            pass

        server: Any = Server()
        server.driver, server.api, server.config = driver, Api(), cfg
        pool = IngestPool(server, 1)

        class Sink:
            def write(self, data: bytes) -> None:
                pass

        slot = pool._slots[0]
        slot.writer = Sink()  # type: ignore[assignment]
        status = pb.NodeStatus(load=1.0).SerializeToString()

        names = [f"n{i}" for i in range(nodes)]
        no_labels: dict[str, str] = {}

        def direct(n: int) -> float:
            t = time.perf_counter()
            for i in range(n):
                driver.on_heartbeat(names[i % nodes], 1, no_labels, 0.6)
            return time.perf_counter() - t

        def batched(n: int, seq: list[int]) -> float:
            took = 0.0
            for start in range(0, n, batch):
                entries = tuple(
                    (
                        i % nodes,
                        f"n{i % nodes}",
                        1,
                        None,
                        0.6,
                        False,
                        status if i % 20 == 0 else None,
                    )
                    for i in range(start, min(n, start + batch))
                )
                seq[0] += 1
                now = time.monotonic()
                data = frames.encode(
                    frames.BATCH, seq[0], now, entries, (), (0, 0, 0), (0.0, 0.0), None, 0.0
                )
                t = time.perf_counter()
                (msg,) = frames.FrameDecoder().feed(data)
                pool._answer(slot, msg)
                took += time.perf_counter() - t
            return took

        direct(nodes)  # every node known (first heartbeats are joins)
        n = nodes * 5
        seq = [0]
        d_runs, b_runs = [], []
        for _ in range(5):  # interleaved: the machine's load changes under both alike
            d_runs.append(direct(n))
            b_runs.append(batched(n, seq))
        best_d, best_b = min(d_runs) / n * 1e6, min(b_runs) / n * 1e6
        storage.close()
        return {"on_heartbeat_us": best_d, "batched_us": best_b, "added_us": best_b - best_d}

    return asyncio.run(run())


def report(rows: list[dict[str, Any]]) -> str:
    base = next((r["total_us"] for r in rows if r["workers"] == 0), rows[0]["total_us"])
    lines = [
        "K  offered/s  acks/s  failed streams  gen p99 late  consensus us/hb  workers us/hb  "
        "total us/hb  total/K0  consensus hb/s/core  worker hb/s/core"
    ]
    for r in rows:
        w = r["workers_us"]
        lines.append(
            f"{r['workers']}  {r['offered_per_s']:9.0f}  {r['acks_per_s']:6.0f}  "
            f"{r['failures']:14d}  "
            f"{r['gen_late_p99_ms']:9.1f} ms  {r['consensus_us']:15.1f}  {w:13.1f}  "
            f"{r['total_us']:11.1f}  {r['total_us'] / base:7.2f}x  "
            f"{1e6 / r['consensus_us']:19.0f}  {1e6 / w if w > 0 else float('nan'):16.0f}"
        )
    for r in rows:
        if r["workers"] >= 1 and r["workers_us"] > 0:
            c_main, c_work = 1e6 / r["consensus_us"], 1e6 / r["workers_us"]
            proj = {c: min(c_main, (c - 1) * c_work) for c in (2, 8, 16)}
            lines.append(
                f"projection from K={r['workers']}: heartbeats/s per replica with C cores "
                "(1 consensus, C-1 workers): "
                + ", ".join(f"C={c}: {v:,.0f}" for c, v in proj.items())
                + f"; bound by the consensus process past C = {1 + c_main / c_work:.1f}"
            )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=1200)
    p.add_argument("--interval", type=float, default=0.6)
    p.add_argument("--procs", type=int, default=1, help="generator processes")
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=4.0)
    p.add_argument("--idle", type=float, default=3.0)
    p.add_argument("--workers", default="0,1,2", help="values of K, comma-separated")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--keep-logs", type=Path, default=None, help="the replicas' logs go here")
    p.add_argument("--rounds", type=int, default=1, help="rounds (order alternates); medians")
    p.add_argument(
        "--channel-only", action="store_true", help="only the in-process channel cost (no replica)"
    )
    # --generate (one generator process; started by the benchmark)
    p.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--target", default="", help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--prefix", default="n", help=argparse.SUPPRESS)
    p.add_argument("--measure-from", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.generate:
        asyncio.run(generate(args))
        return 0
    costs = {b: channel_cost(args.nodes, b) for b in (1, 16, 256)}
    print(
        f"consensus process, in this process, {args.nodes} nodes: Driver.on_heartbeat "
        f"{costs[1]['on_heartbeat_us']:.1f} us; a heartbeat answered from a worker's batch "
        + ", ".join(
            f"{c['batched_us']:.1f} us at {b}/batch (+{c['added_us']:.1f})"
            for b, c in costs.items()
        )
    )
    if args.channel_only:
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as d:
        logs = args.keep_logs or Path(d)
        logs.mkdir(parents=True, exist_ok=True)
        ks = [int(x) for x in args.workers.split(",")]
        runs: dict[int, list[dict[str, Any]]] = {k: [] for k in ks}
        for r in range(args.rounds):  # alternate the order: a drift of the machine hits all K
            for k in ks if r % 2 == 0 else reversed(ks):
                runs[k].append(measure(args, k, logs / f"r{r}"))
                print(json.dumps(runs[k][-1]), file=sys.stderr, flush=True)
        for k in ks:  # the median round of each K, by its total CPU per heartbeat
            ordered = sorted(runs[k], key=lambda row: row["total_us"])
            rows.append(ordered[len(ordered) // 2])
    print(
        f"one replica, {args.nodes} nodes at {args.interval}s ({args.nodes / args.interval:.0f} "
        f"heartbeats/s offered), {args.procs} generator process(es), {args.window:g}s window, "
        f"{os.cpu_count()} cores, median of {args.rounds} round(s), load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(report(rows))
    if args.json is not None:
        args.json.write_text(json.dumps({"channel": costs, "replica": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
