"""Where the adaptive interval settles, and what measuring the load costs.

Part 1, real runs (loopback): for each ``--nodes`` N, one replica (a group of
one) runs in this process and a load generator in a child process opens one
real heartbeat stream per node and follows ``next_interval_seconds`` as the
SDK does (and declares it in ``interval_seconds``). Every second the
replica's utilisation (arbiter/server/load/monitor.py rule 1), suggested interval and
received heartbeats/s are read; the table gives the last third of the run.
``--budget`` lowers the heartbeat budget so that the count rule and the load
rule both act at node counts a Python load generator can drive on 2 cores.

Part 2, the measurement's own price, in the same run: microseconds per
``LoadMonitor.sample()`` (one a second) and per ``Driver.lateness()`` (twice
per driver turn), each as a fraction of one core-second.

Part 3, a model for the sizes the load generator cannot drive here: the
replica's busy fraction taken as rate x (cost per heartbeat measured in part
1, same run), the governor stepped once a second; where it settles for 1,000
to 100,000 nodes, and with the cost doubled (a contended machine).

``--hogs K`` runs K busy-loop processes beside each real run (a contended
machine: the busy fraction counts the wait for a CPU, rule 1 of monitor.py).

Usage: python bench/budget.py [--nodes 100,300] [--seconds 24] [--budget 1000] [--hogs 0]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

import grpc

from arbiter.config import ArbiterConfig
from arbiter.core.detection.interval import IntervalGovernor
from arbiter.server.app import ArbiterServer
from arbiter.server.load.monitor import busy_seconds
from membership.shared.backoff import retry_pushback
from membership.testing.localcluster import free_ports
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc


async def _loadgen(addr: str, nodes: int, per_channel: int = 90) -> None:
    """The child: ``nodes`` heartbeat streams following the suggested interval."""
    own = [("grpc.use_local_subchannel_pool", 1)]  # one TCP connection per channel
    channels = [grpc.aio.insecure_channel(addr, options=own) for _ in range(0, nodes, per_channel)]

    async def node(i: int) -> None:
        stub = pb_grpc.MembershipStub(channels[i // per_channel])
        interval, seq = 0.0, 0
        await asyncio.sleep(i * 0.001)
        while True:  # one stream, then another after a refusal (its hint, as the SDK)
            call = stub.Heartbeat()
            try:
                while True:
                    seq += 1
                    await call.write(
                        pb.HeartbeatRequest(
                            node_id=f"n{i}", incarnation=1, seq=seq, interval_seconds=interval
                        )
                    )
                    ack = await call.read()
                    interval = ack.next_interval_seconds or 0.15
                    await asyncio.sleep(interval)
            except grpc.aio.AioRpcError as e:
                await asyncio.sleep(retry_pushback(e.trailing_metadata()) or 1.0)

    await asyncio.gather(*(node(i) for i in range(nodes)))


async def _run(nodes: int, seconds: float, budget: float, hogs: int) -> dict[str, float]:
    addr = f"127.0.0.1:{free_ports(1)[0]}"
    cfg = ArbiterConfig.local(heartbeat_budget=budget, max_nodes=max(1500, nodes))
    server = ArbiterServer(replica_id="a1", peers={"a1": addr}, listen=addr, config=cfg)
    await server.start()
    child = subprocess.Popen(
        [sys.executable, __file__, "--loadgen", addr, str(nodes)], stdout=subprocess.DEVNULL
    )
    rows: list[tuple[float, float, float]] = []
    hog = [sys.executable, "-c", "while True: pass"]
    hogging = [subprocess.Popen(hog) for _ in range(hogs)]
    try:
        d = server.driver
        last = (time.monotonic(), d.counters.heartbeats)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await asyncio.sleep(1.0)
            now, beats = time.monotonic(), d.counters.heartbeats
            rate = (beats - last[1]) / (now - last[0])
            last = (now, beats)
            rows.append((d.load.utilisation, d.suggested_interval(), rate))
        tail = rows[len(rows) * 2 // 3 :]
        return {
            "nodes": nodes,
            "tracked": d.observer.tracked(),
            "nominal": d.replica.interval.nominal(d.observer.tracked()),
            "interval": statistics.mode(r[1] for r in tail),
            "utilisation": statistics.mean(r[0] for r in tail),
            "rate": statistics.mean(r[2] for r in tail),
            "sample_us": d.load.cost / max(1, d.load.samples) * 1e6,
            "lateness_us": _time_lateness(d),
            "shed": d.load.shed,
        }
    finally:
        for proc in (child, *hogging):
            proc.kill()
            proc.wait()
        await server.stop(grace=0)


def _time_lateness(driver: object) -> float:
    n, t0 = 20_000, time.perf_counter()
    for _ in range(n):
        driver.lateness(time.monotonic())  # type: ignore[attr-defined]
    return (time.perf_counter() - t0) / n * 1e6


def _model(cost: float, budget: float) -> None:
    print(f"\nmodel: busy = rate x {cost * 1e6:.0f} us, budget {budget:g}/s, stepped once a second")
    print("| nodes | count rule | settles at | D | utilisation | x2 cost: settles at | D |")
    print("|---|---|---|---|---|---|---|")
    for n in (1_000, 3_000, 10_000, 30_000, 100_000):
        out = []
        for c in (cost, 2 * cost):
            g = IntervalGovernor(base=0.15, budget=budget, maximum=0.6, ceiling=1e9)
            for t in range(600):
                g.observe(n / g.suggest(n) * c, n, now=float(t))
            h = g.suggest(n)
            out.append((h, n / h * c))
        (h1, u1), (h2, _) = out
        print(
            f"| {n:,} | {g.nominal(n):.3f} s | {h1:.3f} s | {5 * h1:.2f} s | {min(u1, 1):.2f} "
            f"| {h2:.3f} s | {5 * h2:.2f} s |"
        )


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="100,300")
    p.add_argument("--seconds", type=float, default=24.0)
    p.add_argument("--budget", type=float, default=1000.0)
    p.add_argument("--hogs", type=int, default=0)
    a = p.parse_args()
    t0 = time.perf_counter()
    for _ in range(20_000):
        busy_seconds()
    read_us = (time.perf_counter() - t0) / 20_000 * 1e6
    print(f"busy_seconds() (one schedstat read): {read_us:.1f} us", flush=True)
    print(
        f"\nreal runs, budget {a.budget:g}/s, H0 0.15 s, {a.seconds:g} s each (last third), "
        f"{a.hogs} CPU hog(s):"
    )
    print(
        "| nodes (tracked) | count rule | settled interval | D | utilisation | heartbeats/s "
        "| busy per heartbeat | new nodes shed | sample() | lateness() |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    costs = []
    for n in (int(x) for x in a.nodes.split(",")):
        r = await _run(n, a.seconds, a.budget, a.hogs)
        cost = r["utilisation"] / r["rate"] if r["rate"] else 0.0
        costs.append(cost)
        print(
            f"| {n} ({r['tracked']:.0f}) | {r['nominal']:.3f} s | {r['interval']:.3f} s "
            f"| {5 * r['interval']:.2f} s "
            f"| {r['utilisation']:.2f} | {r['rate']:.0f} | {cost * 1e6:.0f} us | {r['shed']:.0f} "
            f"| {r['sample_us']:.1f} us ({r['sample_us'] / 1e6:.1e} of a core-second) "
            f"| {r['lateness_us']:.2f} us |"
        )
    _model(min(costs), 5000.0)  # as measured (contention included)
    _model(100e-6, 5000.0)  # a replica at ~100 us a heartbeat (the bare grpc.aio figure)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--loadgen":
        asyncio.run(_loadgen(sys.argv[2], int(sys.argv[3])))
    else:
        asyncio.run(main())
