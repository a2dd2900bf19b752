"""A join storm against a real 3-replica group: entries, epochs and time to all ALIVE.

Issue 12, item 5 (arbiter/core/batching.py). For each ``--intervals`` value
(default ``0,0.2``: without batching, then the lan preset's), in one run:

1. starts a fresh 3-replica LocalCluster (plaintext) with
   ``--observation-batch-interval`` set to it, waits for a leader, and
   follows the view through the SDK's watch on one replica;
2. starts a load process (this script with ``load``): ``--nodes`` simulated
   nodes in one asyncio process, each with its own node id, incarnation 1 and
   one real ``Heartbeat`` stream per replica (50 streams per connection),
   first heartbeats at times drawn uniformly within ``--spread`` seconds
   (seeded), later ones at the ``next_interval_seconds`` of the acks, as the
   SDK does; a stream refused with a retry hint (a replica shedding new
   nodes) is opened again after the hint, as the SDK does, and counted; it
   reports how late its own first sends were (the write returned, on a
   stream that gRPC had to open first), so that a slow load generator is
   never mistaken for a slow replica;
3. measures, from the first scheduled send: the time until the watcher's
   view holds every node ALIVE (and, as ``last join+``, from the load's last
   first heartbeat written: the replicas' share when the load ran late), the
   epochs it moved through, and, read from
   a1's log (SQLite, read-only), the ObserveBatch entries committed during
   the storm, per proposing replica.

The replicas run with ``--heartbeat-interval 2`` (D = 10 s) so that one
Python load process can keep 3,000 streams heartbeating on a shared 2-core
machine: batching does not depend on the interval (a SUSPECT is never held),
and the storm is over long before anyone could be suspected. Figures are
from one run each; compare the rows of one run, not runs.

Usage: python bench/join_storm.py [--nodes 1000] [--spread 1.0] [--intervals 0,0.2]
       [--json bench/results/join_storm.json] [--sim]

``--sim`` adds the same storm in the deterministic simulator (virtual time,
tests/sim/storm.py) for each interval.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # no fork() notices from the children's starts

from arbiter.core.commands import ObserveBatch, ObserveBatches, decode  # noqa: E402
from arbiter.server.consensus.storage import DB_NAME  # noqa: E402
from membership.testing.localcluster import LocalCluster, ViewFollower, wait_leader  # noqa: E402

HEARTBEAT_INTERVAL = 2.0
STREAMS_PER_CONNECTION = 50


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _percentile(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


# --- the load process -------------------------------------------------------------------


async def _load(arbiters: list[str], nodes: int, spread: float, seed: int, t0: float) -> None:
    import grpc

    from membership.shared.backoff import retry_pushback
    from membership.v1 import membership_pb2 as pb
    from membership.v1 import membership_pb2_grpc as pb_grpc

    opts = [("grpc.use_local_subchannel_pool", 1)]
    groups = (nodes + STREAMS_PER_CONNECTION - 1) // STREAMS_PER_CONNECTION
    stubs = [
        [pb_grpc.MembershipStub(grpc.aio.insecure_channel(a, options=opts)) for _ in range(groups)]
        for a in arbiters
    ]
    rng = random.Random(f"{seed}/storm")
    starts = sorted(rng.uniform(0, spread) for _ in range(nodes))
    late: list[float] = []
    written: list[float] = []  # monotonic time of each stream's first write
    first_ack: dict[int, float] = {}  # replica -> latest first ack of its streams
    sent = [0]
    shed = [0]  # streams refused with a retry hint
    stop = asyncio.Event()

    async def stream(i: int, r: int) -> None:
        due, attempt = t0 + starts[i], 0
        while not stop.is_set():
            attempt += 1
            try:
                return await one_stream(i, r, due, attempt == 1)
            except grpc.aio.AioRpcError as e:
                # A replica that sheds new nodes says when to come back (gRFC A6); the
                # SDK waits that long (membership/_node/heartbeats.py rule 5), and so does this.
                hint = retry_pushback(e.trailing_metadata())
                if hint is None:
                    return
                shed[0] += 1
                due = time.monotonic() + hint

    async def one_stream(i: int, r: int, due: float, first_try: bool) -> None:
        node_id = f"s{i:05d}"
        call = stubs[r][i // STREAMS_PER_CONNECTION].Heartbeat()
        interval = 0.0
        seq = 0
        with contextlib.suppress(asyncio.CancelledError):
            while not stop.is_set():
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                seq += 1
                await call.write(
                    pb.HeartbeatRequest(
                        node_id=node_id,
                        incarnation=1,
                        seq=seq,
                        send_time_unix=time.time(),
                        interval_seconds=interval,
                    )
                )
                sent[0] += 1
                if seq == 1 and first_try:  # written: the stream is open, the heartbeat sent
                    written.append(time.monotonic())
                    late.append(written[-1] - due)
                ack = await call.read()
                if ack is grpc.aio.EOF:
                    return
                if seq == 1:
                    first_ack[r] = max(first_ack.get(r, 0.0), time.monotonic() - t0)
                interval = ack.next_interval_seconds or HEARTBEAT_INTERVAL
                due += interval

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(stream(i, r)) for i in range(nodes) for r in range(len(arbiters))]
    while len(late) < len(tasks) and not stop.is_set():
        await asyncio.sleep(0.05)
    first_sends = time.monotonic() - t0
    print(
        json.dumps(
            {
                "first_sends": len(late),
                "first_sends_done_after": round(first_sends, 3),
                "last_first_send": round(max(written, default=t0) - t0, 3),
                "first_send_late_p50": round(_percentile(late, 50), 4),
                "first_send_late_p99": round(_percentile(late, 99), 4),
                "first_send_late_max": round(max(late, default=0.0), 4),
            }
        ),
        flush=True,
    )
    mark, t_mark = sent[0], time.monotonic()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(3.0):
            await stop.wait()
    rate = (sent[0] - mark) / (time.monotonic() - t_mark)
    acks = {arbiters[r]: round(t, 3) for r, t in sorted(first_ack.items())}
    line = {"steady_heartbeats_per_s": round(rate, 1), "last_first_ack": acks, "shed": shed[0]}
    print(json.dumps(line), flush=True)
    await stop.wait()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# --- one cluster ------------------------------------------------------------------------


def _observe_batches(db: Path, after: int) -> list[tuple[int, str, int]]:
    """(index, proposing replica, observations) of a1's ObserveBatch and ObserveBatches
    entries past ``after`` (a gathered cut's replicas joined by "+")."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT idx, data FROM entries WHERE idx > ? ORDER BY idx", (after,))
        out = []
        for idx, data in rows:
            try:
                command = decode(bytes(data))
            except Exception:  # a configuration entry or a no-op
                continue
            if isinstance(command, ObserveBatch):
                out.append((idx, command.replica_id, len(command.observations)))
            elif isinstance(command, ObserveBatches):  # the leader's gathered cut
                who = "+".join(sorted({b.replica_id for b in command.batches}))
                out.append((idx, who, sum(len(b.observations) for b in command.batches)))
        return out
    finally:
        conn.close()


def _last_index(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT COALESCE(MAX(idx), 0) FROM entries").fetchone()[0])
    finally:
        conn.close()


async def _storm(args: argparse.Namespace, interval: float) -> dict[str, Any]:
    from membership._client import MembershipClient

    with tempfile.TemporaryDirectory(prefix="join-storm-") as tmp:
        workdir = Path(tmp)
        if args.keep_logs:
            workdir = Path(args.keep_logs) / f"interval-{interval:g}-{time.time_ns()}"
            workdir.mkdir(parents=True)
        cluster = LocalCluster(
            workdir,
            merge_output=True,
            log_level="info" if args.keep_logs else "warning",
            tls=False,
            arbiter_args=(
                "--observation-batch-interval",
                str(interval),
                "--heartbeat-interval",
                str(HEARTBEAT_INTERVAL),
                "--max-heartbeat-interval",
                str(HEARTBEAT_INTERVAL),
                "--restart-grace",
                str(5 * HEARTBEAT_INTERVAL),
                "--snapshot-every",
                "1000000",
            ),
        )
        load: subprocess.Popen[str] | None = None
        try:
            cluster.start_arbiters(3)
            client = MembershipClient(
                cluster.addresses, node_id=None, config=cluster.client_config()
            )
            async with client:
                await wait_leader(client, 20.0)
                timeline: list[tuple[float, int, int]] = []
                follower = ViewFollower(
                    client,
                    show=lambda _ev: timeline.append(
                        (time.monotonic(), follower.epoch, len(follower.alive))
                    ),
                )
                watch = asyncio.create_task(follower.run())
                await asyncio.sleep(0.5)  # the snapshot, and the Bootstrap entry committed
                db = cluster.data_dir("a1") / DB_NAME
                before = _last_index(db)
                epoch0 = follower.epoch
                t0 = time.monotonic() + 1.0
                load = subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "load",
                        "--arbiters",
                        ",".join(cluster.addresses),
                        "--nodes",
                        str(args.nodes),
                        "--spread",
                        str(args.spread),
                        "--seed",
                        str(args.seed),
                        "--t0",
                        repr(t0),
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
                try:
                    await follower.wait_for(
                        lambda: len(follower.alive) >= args.nodes, args.timeout, "all ALIVE"
                    )
                    alive_after = time.monotonic() - t0
                except TimeoutError:  # a row that says so, not a crash
                    alive_after = float("nan")
                    n = len(follower.alive)
                    say(f"interval {interval:g}: {n} ALIVE after {args.timeout:g}s")
                epochs = follower.epoch - epoch0
                half = next((t for t, _, n in timeline if n >= args.nodes / 2), math.nan) - t0
                await asyncio.sleep(1.0)  # the last replica's batches commit
                batches = _observe_batches(db, before)
                load.send_signal(signal.SIGTERM)
                out, _ = load.communicate(timeout=30)
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
        finally:
            if load is not None and load.poll() is None:
                load.kill()
                load.wait()
            cluster.kill_all()
    stats: dict[str, Any] = {}
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            stats.update(json.loads(line))
    per = Counter(r for _, r, _ in batches)
    return {
        "where": "processes",
        "interval": interval,
        "nodes": args.nodes,
        "spread": args.spread,
        "alive_after": round(alive_after, 3),
        "alive_after_last_join": round(alive_after - stats.get("last_first_send", 0.0), 3),
        "half_alive_after": round(half, 3),
        "epochs": epochs,
        "timeline": [(round(t - t0, 3), e, n) for t, e, n in timeline if e > epoch0],
        "entries": len(batches),
        "entries_per_replica": dict(sorted(per.items())),
        "largest_entry": max((k for *_, k in batches), default=0),
        "load": stats,
    }


def _sim(args: argparse.Namespace, interval: float) -> dict[str, Any]:
    from tests.sim.storm import join_storm

    r = join_storm(args.nodes, spread=args.spread, interval=interval, seed=args.seed)
    return {
        "where": "simulator",
        "interval": interval,
        "nodes": args.nodes,
        "spread": args.spread,
        "alive_after": round(r.alive_after, 3),
        "alive_after_last_join": None,
        "epochs": r.epochs,
        "entries": r.total_entries,
        "entries_per_replica": r.entries,
        "largest_entry": max((k for _, _, k, _ in r.sizes), default=0),
        "load": {},
    }


def _table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'where':<10} {'interval':>8} {'nodes':>6} {'ALIVE after':>11} {'last join+':>10} "
        f"{'epochs':>6} {'entries':>7}  per replica            load: first sends late p50/p99/max"
        ", streams shed"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        per = " ".join(f"{k}={v}" for k, v in r["entries_per_replica"].items())
        ld = r["load"]
        late = (
            f"{ld['first_send_late_p50']:.3f}/{ld['first_send_late_p99']:.3f}/"
            f"{ld['first_send_late_max']:.3f} s, {ld.get('shed', 0)}"
            if ld
            else "(virtual time)"
        )
        after_last = r["alive_after_last_join"]
        last = "-" if after_last is None else f"{after_last:.3f}s"
        alive = "timeout" if math.isnan(r["alive_after"]) else f"{r['alive_after']:.3f}s"
        if last == "nans":
            last = "timeout"
        lines.append(
            f"{r['where']:<10} {r['interval']:>8g} {r['nodes']:>6} {alive:>11} "
            f"{last:>10} {r['epochs']:>6} {r['entries']:>7}  {per:<22} {late}"
        )
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> None:
    intervals = [float(x) for x in args.intervals.split(",")]
    rows = []
    for iv in intervals:
        rows.append(await _storm(args, iv))
        print(_table(rows[-1:]).splitlines()[-1], flush=True)
    if args.sim:
        for iv in intervals:
            rows.append(_sim(args, iv))
    print()
    print(
        f"join storm: {args.nodes} nodes starting within {args.spread:g} s, 3 replicas "
        f"(heartbeat interval {HEARTBEAT_INTERVAL:g} s); entries = ObserveBatch(es) entries "
        "committed until 1 s after all ALIVE"
    )
    print(_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "load":
        p = argparse.ArgumentParser(prog="join_storm.py load")
        p.add_argument("--arbiters", required=True)
        p.add_argument("--nodes", type=int, required=True)
        p.add_argument("--spread", type=float, required=True)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--t0", type=float, required=True)
        a = p.parse_args(sys.argv[2:])
        asyncio.run(_load(a.arbiters.split(","), a.nodes, a.spread, a.seed, a.t0))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--spread", type=float, default=1.0, help="seconds the joins spread over")
    p.add_argument("--intervals", default="0,0.2", help="observation_batch_interval values")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sim", action="store_true", help="also run the storm in the simulator")
    p.add_argument("--json", help="write the rows as JSON here")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for all ALIVE")
    p.add_argument("--keep-logs", metavar="DIR", help="keep each cluster's logs and data in DIR")
    asyncio.run(_main(p.parse_args()))


if __name__ == "__main__":
    main()
