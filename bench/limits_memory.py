"""What one heartbeat stream, one subscriber and one tracked node cost a replica in memory.

The defaults of max_heartbeat_streams, max_subscribers and max_nodes
(arbiter/config.py) rest on these figures. Starts one replica process
(``membership arbiter --preset local --insecure``-free plaintext, a group of
one), then, reading its VmRSS (/proc/<pid>/status) before and after each step:

1. opens ``--streams`` heartbeat streams (100 per connection, the
   max_concurrent_streams default), each with one heartbeat of one known
   node id, and keeps them open;
2. opens ``--subscribers`` subscriptions (one connection each) that read;
3. sends one heartbeat each for ``--nodes`` new node ids (the replica then
   tracks them).

Prints the RSS growth per stream, per subscriber and per node, in KiB.

Usage: python bench/limits_memory.py [--streams 2000] [--subscribers 300] [--nodes 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import tempfile
import time
from pathlib import Path

import grpc

from membership.testing.localcluster import LocalCluster
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def settle(pid: int) -> int:
    """RSS once it stops moving (two readings 0.5 s apart within 64 KiB)."""
    last = rss_kib(pid)
    for _ in range(20):
        await asyncio.sleep(0.5)
        now = rss_kib(pid)
        if abs(now - last) < 64:
            return now
        last = now
    return last


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp), log_level="warning")
        try:
            cluster.start_arbiters(
                1,
                *("--preset", "local", "--max-nodes", "100000"),
                *("--max-heartbeat-streams", "100000", "--max-subscribers", "100000"),
            )
            address = cluster.arbiters["a1"]
            host, port = address.rsplit(":", 1)
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection((host, int(port)), 1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
            pid = cluster.children["a1"].pid
            base = await settle(pid)
            print(f"replica at rest: {base / 1024:.1f} MiB")

            channels = [
                grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range((args.streams + 99) // 100)
            ]
            calls = []
            for i in range(args.streams):
                call = pb_grpc.MembershipStub(channels[i // 100]).Heartbeat()
                await call.write(pb.HeartbeatRequest(node_id="bench", incarnation=1, seq=i + 1))
                calls.append(call)
            for call in calls:
                await call.read()
            after_streams = await settle(pid)
            per = (after_streams - base) / args.streams
            print(
                f"{args.streams} heartbeat streams: +{(after_streams - base) / 1024:.1f} MiB, "
                f"{per:.1f} KiB each"
            )

            sub_channels = [
                grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(args.subscribers)
            ]
            subs = []
            for ch in sub_channels:
                call = pb_grpc.MembershipStub(ch).Subscribe(pb.SubscribeRequest())
                await call.read()
                subs.append(call)
            after_subs = await settle(pid)
            per = (after_subs - after_streams) / args.subscribers
            print(
                f"{args.subscribers} subscribers: +{(after_subs - after_streams) / 1024:.1f} "
                f"MiB, {per:.1f} KiB each"
            )

            # A connection of its own: the others carry as many streams as they may.
            node_channel = grpc.aio.insecure_channel(
                address, options=[("grpc.use_local_subchannel_pool", 1)]
            )
            channels.append(node_channel)
            stub = pb_grpc.MembershipStub(node_channel)
            for i in range(args.nodes):
                beat = stub.Heartbeat()
                await beat.write(
                    pb.HeartbeatRequest(
                        node_id=f"node-{i}", incarnation=1, seq=1, labels={"rack": f"r{i % 40}"}
                    )
                )
                await beat.read()
                beat.cancel()
            after_nodes = await settle(pid)
            per = (after_nodes - after_subs) / args.nodes
            print(
                f"{args.nodes} tracked nodes: +{(after_nodes - after_subs) / 1024:.1f} MiB, "
                f"{per:.1f} KiB each"
            )
            for call in calls + subs:
                call.cancel()
            for ch in channels + sub_channels:
                await ch.close()
        finally:
            cluster.kill_all()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--subscribers", type=int, default=300)
    parser.add_argument("--nodes", type=int, default=3000)
    asyncio.run(main(parser.parse_args()))
