"""What a replica's own code keeps per node, without gRPC: tracemalloc over the servicer
driven in-process (bench/heartbeat_shell.py's harness), by line and by type.

bench/memory.py measures a replica's resident memory per node end to end,
where gRPC's own per-stream state is most of it and tracing slows the
replica past what a loaded machine lets it serve. This isolates what the
replica adds: one replica (a group of one, lan settings, in this process),
``--nodes`` (1,000) heartbeat streams, each the servicer's own ``Heartbeat``
async generator fed decoded requests and read for its ack. ``--like sdk``
(default) sends the SDK's fields: two labels, one of them the same for
every node, a status without a step that changes every other heartbeat,
the declared interval; ``--like loadgen`` what ``bench/loadgen`` sends,
which ``bench/memory.py`` and ``bench/scale.py`` measure: two labels every
node has alike, a status whose step and load move every heartbeat. tracemalloc starts after the
server is up; every node then heartbeats until it is ALIVE, then
``--rounds`` (20) more rounds, 0.1 s apart, so that the driver, Raft and the
status board settle. Printed per node: the bytes traced (what Python code
allocated and still holds: the servicer's generator frames and everything
below them: the checks, the driver, the core's records, the status board),
by the innermost line of ours that allocated them and by file, and gc-tracked
objects by type. The requests the harness keeps (one per node, as gRPC's
reader does) are counted too, as the replica's generator holds the last one.

``--before DIR`` runs the same in a child process on the code of another
source tree (``git archive COMMIT arbiter membership | tar -x -C DIR``) and
prints both.

Usage: python bench/memory_shell.py [--nodes 1000] [--rounds 20] [--top 30] [--like sdk|loadgen]
       [--replicas 1|3] [--before DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
INTERVAL = 2.0  # seconds between heartbeats, declared
# Frames charged to their caller (the owner is the innermost frame outside them).
_MACHINERY = ("/asyncio/", "/google/protobuf/", "<frozen", "<string>", "/dataclasses.py")


class _Context:
    """The little of a grpc.aio ServicerContext that Heartbeat uses on a good stream."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    async def abort(self, code: Any, details: str, trailing_metadata: Any = ()) -> None:
        raise RuntimeError(f"aborted: {code} {details}")


def _where(tb: tracemalloc.Traceback) -> tuple[str, str]:
    """(innermost frame of ours, the allocating frame), each ``path:line``."""
    frames = list(tb)[::-1]  # most recent first
    own = next((f for f in frames if not any(m in f.filename for m in _MACHINERY)), frames[0])
    return _short(own), _short(frames[0])


def _short(frame: tracemalloc.Frame) -> str:
    parts = Path(frame.filename).parts
    for anchor in ("arbiter", "membership", "bench"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) :]) + f":{frame.lineno}"
    return "/".join(parts[-2:]) + f":{frame.lineno}"


async def _child(
    nodes: int, rounds: int, top: int, replicas: int, like: str = "sdk"
) -> dict[str, Any]:
    from arbiter.config import ArbiterConfig
    from arbiter.server.app import ArbiterServer
    from membership.testing.localcluster import free_ports
    from membership.v1 import membership_pb2 as pb

    with tempfile.TemporaryDirectory(prefix="bench-memshell-") as tmp:
        ids = [f"a{k + 1}" for k in range(replicas)]
        peers = {
            rid: f"127.0.0.1:{port}" for rid, port in zip(ids, free_ports(replicas), strict=True)
        }
        # The servicer in this process; a long D (20 s), so that a round made slow by
        # tracing on a loaded machine is never a silence (memory does not depend on it).
        config = ArbiterConfig.lan(
            ingest_workers=0,
            heartbeat_interval=INTERVAL,
            max_heartbeat_interval=INTERVAL,
            missed_heartbeats=10.0,
            # the harness feeds a round of every node at once: a loop that is
            # late for it is the harness, not load to shed (shedding.py)
            shed_utilisation=1.0,
            shed_lateness=1e9,
            # three replicas share this loop with the harness and tracing: a round
            # stalls it for about a second, which must not be an election
            election_timeout=5.0,
        )
        servers = [
            ArbiterServer(
                replica_id=rid,
                peers=peers,
                listen=peers[rid],
                config=config,
                data_dir=Path(tmp) / rid,
            )
            for rid in ids
        ]
        await asyncio.gather(*(s.start() for s in servers))
        server = servers[0]
        try:
            deadline = time.monotonic() + 60
            while not all(s.driver.status().in_quorum for s in servers):
                if time.monotonic() > deadline:
                    raise TimeoutError("no leader")
                await asyncio.sleep(0.05)
            statuses = [
                pb.NodeStatus(load=1.0, cpu_utilization=0.2, memory_utilization=0.4),
                pb.NodeStatus(load=1.5, cpu_utilization=0.3, memory_utilization=0.4),
            ]
            pending: list[list[Any]] = []

            def loadgen_status(seq: int) -> Any:
                # bench/loadgen/hb.go's: a step a heartbeat, a load that moves with it
                return pb.NodeStatus(
                    load=3.5 + (seq % 7) * 0.1, gpu_utilization=0.9, phase="allreduce", step=seq
                )

            def labels(i: int) -> dict[str, str]:
                if like == "sdk":  # a job's label, and one of the node's own
                    return {"job": "bench", "rank": str(i)}
                return {"role": "worker", "pool": "bench"}  # bench/loadgen: every node's

            incarnation = 1_733_000_000_000

            def request(i: int, seq: int) -> Any:
                req = pb.HeartbeatRequest(
                    node_id=f"n{i}",
                    incarnation=incarnation + i,
                    seq=seq,
                    send_time_unix=time.time(),
                    labels=labels(i),
                    status=statuses[(seq // 2) % 2] if like == "sdk" else loadgen_status(seq),
                    interval_seconds=INTERVAL,
                    cluster=server.api.cluster if seq == 1 else "",
                )
                # What gRPC hands the servicer: a request decoded from its bytes.
                return pb.HeartbeatRequest.FromString(req.SerializeToString())

            async def requests(i: int) -> Any:
                while True:
                    yield pending[i].pop()

            pending = [[] for _ in range(nodes * replicas)]  # a stream per node and replica

            gc.collect()
            objects0: Counter[str] = Counter(type(o).__name__ for o in gc.get_objects())
            tracemalloc.start(8)
            t0 = time.monotonic()
            ctx = _Context()
            streams = [
                srv.api.Heartbeat(requests(k * nodes + i), ctx)  # type: ignore[arg-type]
                for k, srv in enumerate(servers)
                for i in range(nodes)
            ]
            seq = 0

            async def one_round() -> None:
                nonlocal seq
                seq += 1
                for k in range(replicas):
                    for i in range(nodes):
                        pending[k * nodes + i].append(request(i, seq))
                for k, s in enumerate(streams):
                    await anext(s)
                    if k % 50 == 49:
                        # the replicas' Raft runs in this loop too: a round of 3,000
                        # streams without a pause would starve it into elections
                        await asyncio.sleep(0)

            await one_round()
            print(f"first round done in {time.monotonic() - t0:.1f} s", file=sys.stderr)
            deadline = time.monotonic() + 300
            while not all(
                sum(1 for i in range(nodes) if srv.driver.state.member(f"n{i}")) == nodes
                for srv in servers
            ):
                if time.monotonic() > deadline:
                    raise TimeoutError("nodes not ALIVE")
                await asyncio.sleep(0.1)
                await one_round()
            for _ in range(rounds):
                await asyncio.sleep(0.1)
                await one_round()
            print(f"{seq} rounds done in {time.monotonic() - t0:.1f} s", file=sys.stderr)
            gc.collect()
            snap = tracemalloc.take_snapshot()
            traced = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            objects1: Counter[str] = Counter(type(o).__name__ for o in gc.get_objects())
            by_line: Counter[str] = Counter()
            by_file: Counter[str] = Counter()
            by_alloc: Counter[str] = Counter()
            blocks: Counter[str] = Counter()
            for stat in snap.statistics("traceback"):
                own, alloc = _where(stat.traceback)
                by_line[own] += stat.size
                blocks[own] += stat.count
                by_file[own.rsplit(":", 1)[0]] += stat.size
                by_alloc[alloc] += stat.size
            per = nodes * replicas  # figures per node and replica
            types = {t: (objects1[t] - objects0[t]) / per for t in objects1 | objects0}
            for s in streams:
                await s.aclose()
            return {
                "nodes": nodes,
                "replicas": replicas,
                "traced_per_node": traced / per,
                "by_line": [(w, b / per, blocks[w] / per) for w, b in by_line.most_common(top)],
                "by_file": [(w, b / per) for w, b in by_file.most_common(top)],
                "by_alloc": [(w, b / per) for w, b in by_alloc.most_common(top)],
                "types": sorted(
                    ((t, c) for t, c in types.items() if abs(c) >= 0.05), key=lambda x: -abs(x[1])
                )[:top],
            }
        finally:
            await asyncio.gather(*(s.stop(0) for s in servers))


def _run_child(args: argparse.Namespace, before: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    if before is not None:
        env["PYTHONPATH"] = str(before)
    argv = [sys.executable, str(HERE), "--child", "--nodes", str(args.nodes)]
    argv += ["--rounds", str(args.rounds), "--top", str(args.top)]
    argv += ["--replicas", str(args.replicas), "--like", args.like]
    # Outside any source tree, so that PYTHONPATH (--before) decides what is imported.
    out = subprocess.run(
        argv, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=900
    )
    if out.returncode != 0:
        raise RuntimeError(f"child failed:\n{out.stderr[-3000:]}")
    sys.stderr.write(out.stderr[-2000:])
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _print(name: str, r: dict[str, Any]) -> None:
    print(
        f"\n== {name}: {r['nodes']} nodes, {r['replicas']} replica(s), "
        f"{r['traced_per_node']:.0f} bytes traced per node and replica"
    )
    print("  by the innermost line of ours that allocated (bytes, blocks per node):")
    for w, b, c in r["by_line"]:
        print(f"  {b:9.1f} {c:6.2f}  {w}")
    print("  by file:")
    for w, b in r["by_file"]:
        print(f"  {b:9.1f}  {w}")
    print("  gc-tracked objects per node, by type:")
    for t, c in r["types"]:
        print(f"  {c:9.2f}  {t}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--top", type=int, default=30)
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="a group of 1 or 3 in this process (figures per replica)",
    )
    p.add_argument(
        "--like",
        choices=("sdk", "loadgen"),
        default="sdk",
        help="sdk: labels job=bench and rank=i, a status without a step; loadgen: "
        "bench/loadgen's heartbeats (two labels every node has alike, a step each)",
    )
    p.add_argument("--before", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        import logging

        logging.basicConfig(level=logging.WARNING)
        out = _child(args.nodes, args.rounds, args.top, args.replicas, args.like)
        print(json.dumps(asyncio.run(out)))
        return 0
    results = {}
    if args.before is not None:
        results["before"] = _run_child(args, args.before)
        _print("before", results["before"])
    results["now"] = _run_child(args, None)
    _print("now", results["now"])
    if "before" in results:
        b, n = results["before"]["traced_per_node"], results["now"]["traced_per_node"]
        print(f"\ntraced per node: before {b:.0f} B, now {n:.0f} B ({n - b:+.0f} B, x{n / b:.2f})")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
