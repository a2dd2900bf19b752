"""The replica's own work per heartbeat, without gRPC: ``MembershipServicer.Heartbeat`` driven
in-process, for two versions of the code in one run.

bench/heartbeat_path.py measures a replica end to end, where gRPC's own work
(HTTP/2, the completion queue, protobuf decoding and encoding) is most of the
cost and the shared machine's noise is large. This isolates what the
replica adds: one replica (a group of one, lan settings, in this process)
and ``--nodes`` (1,000) heartbeat streams, each the servicer's own
``Heartbeat`` async generator fed decoded requests (the SDK's fields: labels,
a status that changes every other heartbeat, the declared interval) and
read for its ack, as grpc.aio does. After a round that makes every node
ALIVE, ``--rounds`` (30) rounds of one heartbeat per node, 0.1 s apart (the
driver's loop runs in between), are timed with this process's CPU clock.
Printed: microseconds of CPU per heartbeat (the servicer, the driver, the
core, the status board, the ack), and the CPU the process spends between
rounds (driver turns, detector ticks, the loop-lag monitor) as microseconds
per heartbeat at 0.6 s per node.

Each version runs in a child process of its own: ``--before DIR`` the code
of another source tree (``git archive COMMIT arbiter membership | tar -x -C
DIR``), and the working tree's; ``--repeat`` (3) alternates them, the
median is printed, and the ratio.

Usage: python bench/heartbeat_shell.py [--before DIR] [--nodes 1000] [--rounds 30]
       [--repeat 3] [--loop asyncio|uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


class _Context:
    """The little of a grpc.aio ServicerContext that Heartbeat uses on a good stream."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    async def abort(self, code: Any, details: str, trailing_metadata: Any = ()) -> None:
        raise RuntimeError(f"aborted: {code} {details}")


async def _child(nodes: int, rounds: int) -> dict[str, float]:
    from arbiter.config import ArbiterConfig
    from arbiter.server.app import ArbiterServer
    from membership.testing.localcluster import free_ports
    from membership.v1 import membership_pb2 as pb

    with tempfile.TemporaryDirectory(prefix="bench-hbshell-") as tmp:
        addr = f"127.0.0.1:{free_ports(1)[0]}"
        server = ArbiterServer(
            replica_id="a1",
            peers={"a1": addr},
            listen=addr,
            # the harness feeds a round of every node at once: a loop late for it is
            # the harness, not load to shed (shedding.py)
            config=ArbiterConfig.lan(shed_utilisation=1.0, shed_lateness=1e9),
            data_dir=Path(tmp),
        )
        await server.start()
        try:
            deadline = time.monotonic() + 30
            while not server.driver.status().in_quorum:
                if time.monotonic() > deadline:
                    raise TimeoutError("no leader")
                await asyncio.sleep(0.05)
            statuses = [
                pb.NodeStatus(load=1.0, cpu_utilization=0.2, memory_utilization=0.4),
                pb.NodeStatus(load=1.0, cpu_utilization=0.3, memory_utilization=0.4),
            ]
            # What gRPC hands the servicer: requests decoded from their bytes.
            pending: list[list[Any]] = [[] for _ in range(nodes)]

            def request(i: int, seq: int) -> Any:
                req = pb.HeartbeatRequest(
                    node_id=f"n{i}",
                    incarnation=1_733_000_000_000 + i,
                    seq=seq,
                    send_time_unix=time.time(),
                    labels={"job": "bench", "rank": str(i)},
                    status=statuses[(seq // 2) % 2],
                    interval_seconds=0.6,
                    cluster=server.api.cluster if seq == 1 else "",
                )
                return pb.HeartbeatRequest.FromString(req.SerializeToString())

            async def requests(i: int) -> Any:
                while True:
                    yield pending[i].pop()

            ctx = _Context()
            streams = [server.api.Heartbeat(requests(i), ctx) for i in range(nodes)]  # type: ignore[arg-type]

            async def one_round(seq: int) -> float:
                for i in range(nodes):
                    pending[i].append(request(i, seq))
                t0 = time.process_time()
                for s in streams:
                    await anext(s)
                return time.process_time() - t0

            await one_round(1)
            seq = 1
            deadline = time.monotonic() + 60
            while (
                sum(1 for i in range(nodes) if server.driver.state.member(f"n{i}") is not None)
                < nodes
            ):
                if time.monotonic() > deadline:
                    raise TimeoutError("nodes not ALIVE")
                await asyncio.sleep(0.1)
                seq += 1
                await one_round(seq)
            import gc

            gc_time = [0.0, 0.0]  # [total, start of the current collection]

            def on_gc(phase: str, info: dict[str, int]) -> None:
                if phase == "start":
                    gc_time[1] = time.process_time()
                else:
                    gc_time[0] += time.process_time() - gc_time[1]

            gc.callbacks.append(on_gc)
            counts0 = [g["collections"] for g in gc.get_stats()]
            spent = idle = 0.0
            for _ in range(rounds):
                t0, w0 = time.process_time(), time.monotonic()
                await asyncio.sleep(0.1)  # the driver's loop (turns, ticks) runs meanwhile
                idle += (time.process_time() - t0) / (time.monotonic() - w0)
                seq += 1
                spent += await one_round(seq)
            for s in streams:
                await s.aclose()
            per = spent / (rounds * nodes)
            # The loop's own work between heartbeats, per heartbeat at 0.6 s per node.
            background = idle / rounds / (nodes / 0.6)
            gc.callbacks.remove(on_gc)
            counts = [g["collections"] - c for g, c in zip(gc.get_stats(), counts0, strict=True)]
            return {
                "us_per_heartbeat": per * 1e6,
                "background_us_per_heartbeat": background * 1e6,
                "gc_us_per_heartbeat": gc_time[0] / (rounds * nodes) * 1e6,
                "gc_collections": counts,  # type: ignore[dict-item]
                "objects": len(gc.get_objects()),
            }
        finally:
            await server.stop(0)


def _run_child(args: argparse.Namespace, before: Path | None, loop: str) -> dict[str, float]:
    env = dict(os.environ)
    if before is not None:
        env["PYTHONPATH"] = str(before)
    argv = [sys.executable, str(HERE), "--child", "--nodes", str(args.nodes)]
    argv += ["--rounds", str(args.rounds), "--loop", loop]
    # Outside any source tree, so that PYTHONPATH (--before) decides what is imported.
    cwd = tempfile.gettempdir()
    out = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--before", type=Path, default=None)
    p.add_argument("--loops", default="asyncio", help="of the working tree: asyncio,uvloop")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--loop", default="asyncio", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        import logging

        logging.basicConfig(level=logging.WARNING)
        factory = None
        if args.loop == "uvloop":
            import uvloop

            factory = uvloop.new_event_loop
        with asyncio.Runner(loop_factory=factory) as runner:
            print(json.dumps(runner.run(_child(args.nodes, args.rounds))))
        return 0
    versions: list[tuple[str, Path | None, str]] = []
    if args.before is not None:
        versions.append(("before/asyncio", args.before, "asyncio"))
    versions += [(f"now/{lp}", None, lp) for lp in args.loops.split(",") if lp]
    results: dict[str, list[float]] = {name: [] for name, _, _ in versions}
    for r in range(args.repeat):
        for name, before, loop in versions:
            res = _run_child(args, before, loop)
            results[name].append(res["us_per_heartbeat"])
            print(
                f"round {r} {name}: {res['us_per_heartbeat']:.1f} us/heartbeat; between rounds "
                f"the loop's own work is {res['background_us_per_heartbeat']:.1f} us per "
                f"heartbeat at 0.6 s; GC {res['gc_us_per_heartbeat']:.1f} us per heartbeat "
                f"(collections by generation {res['gc_collections']}, {res['objects']} objects)",
                flush=True,
            )
    print()
    print(f"replica shell CPU per heartbeat, {args.nodes} nodes, median of {args.repeat}:")
    base = statistics.median(results[versions[0][0]])
    for name, xs in results.items():
        m = statistics.median(xs)
        print(f"  {name:16} {m:8.1f} us   ratio to {versions[0][0]}: {m / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
