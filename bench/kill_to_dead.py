"""Kill-to-DEAD latency: SIGKILL a node, time until a subscriber sees it DEAD.

Starts 3 arbiter replicas and N node processes on loopback (default settings),
follows the view with the SDK, then repeatedly SIGKILLs a node and restarts a
replacement, recording the time from the kill to the DEAD event. Prints each
sample and the median, p90 and max.

Plaintext (``--insecure``) by default; ``--tls`` runs every process with
mutual TLS, certificates made in the temporary folder.

Usage: python bench/kill_to_dead.py [--nodes 5] [--runs 10] [--tls]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from membership.testing.localcluster import LocalCluster, ViewFollower, wait_leader


async def main(nodes: int, runs: int, tls: bool = False) -> int:
    from membership._client import MembershipClient

    samples: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-kill-") as tmp:
        cluster = LocalCluster(Path(tmp), merge_output=True, tls=tls)
        client = None
        task = None
        try:
            cluster.start_arbiters(3)
            client = MembershipClient(
                cluster.addresses, config=cluster.client_config(follow_view=False)
            )
            await wait_leader(client, timeout=20)
            watcher = ViewFollower(client)
            task = asyncio.get_running_loop().create_task(watcher.run())
            names = [f"n{i}" for i in range(nodes)]
            for n in names:
                cluster.start_node(n)
            await watcher.wait_for(lambda: set(names) <= watcher.alive, 30, "every node ALIVE")
            for run in range(runs):
                victim = names[run % len(names)]
                t0 = time.monotonic()
                cluster.kill(victim)
                await watcher.wait_for(lambda v=victim: v in watcher.deaths, 30, f"{victim} DEAD")
                dt = watcher.deaths.pop(victim) - t0
                samples.append(dt)
                print(f"run {run + 1}: {victim} DEAD {dt * 1000:.0f} ms after SIGKILL", flush=True)
                cluster.start_node(victim)
                await watcher.wait_for(lambda v=victim: v in watcher.alive, 30, f"{victim} back")
        finally:
            if task is not None:
                task.cancel()
            if client is not None:
                await client.close()
            cluster.stop_all()
    samples.sort()
    p90 = samples[min(len(samples) - 1, int(0.9 * len(samples)))]
    print(
        f"kill-to-DEAD over {len(samples)} runs ({nodes} nodes, 3 replicas, defaults): "
        f"median {statistics.median(samples) * 1000:.0f} ms, p90 {p90 * 1000:.0f} ms, "
        f"max {samples[-1] * 1000:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--tls", action="store_true", help="mutual TLS (default plaintext)")
    args = parser.parse_args()
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    sys.exit(asyncio.run(main(args.nodes, args.runs, args.tls)))
