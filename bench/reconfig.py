"""Changing the arbiter group: time to add a replica, and leader election with 5 replicas.

1. Add a replica to a group whose view holds ``--members`` members (1,000 by
   default, each with ~1 KiB of labels; they join by one heartbeat each and,
   silent after it, become DEAD records: the snapshot a new replica receives
   holds them all). Timed from ``membership admin arbiters add``: the new
   replica started with ``--join`` on an empty data dir restores the leader's
   snapshot (``snapshot``), then is promoted to voter (``promoted``; the
   shell waits ``restart_grace`` after catch-up before promoting, on purpose:
   arbiter/server/ops/reconfig.py rule 4). The baseline, in the same run, is the
   same addition to a group with an empty view.
2. Leader election: SIGKILL the leader, time until a survivor answers in a
   quorum with a new leader (GetView polled every 20 ms), with 5 replicas and
   with 3 (the baseline), ``--runs`` times each.

Every process runs plaintext on loopback with the ``lan`` defaults. Prints
the samples, the medians and the ratios against the baselines.

Usage: python bench/reconfig.py [--members 1000] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from membership.testing.localcluster import LocalCluster, free_ports, membership_command
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc

LABELS = {f"k{i}": "v" * 100 for i in range(10)}


def _admin(cluster: LocalCluster, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        membership_command(
            "admin", "arbiters", *argv, "--arbiters", cluster.arbiter_list(), "--insecure"
        ),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


async def _summary(address: str) -> pb.GetViewResponse | None:
    async with grpc.aio.insecure_channel(address) as ch:
        try:
            resp: pb.GetViewResponse = await pb_grpc.MembershipStub(ch).GetView(
                pb.GetViewRequest(summary=True), timeout=0.5
            )
            return resp
        except grpc.aio.AioRpcError:
            return None


async def _leader(addresses: list[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for resp in await asyncio.gather(*(_summary(a) for a in addresses)):
            if resp is not None and resp.in_quorum and resp.leader_id:
                return resp.leader_id
        await asyncio.sleep(0.02)
    raise TimeoutError("no leader")


async def _fill(addresses: list[str], members: int) -> None:
    """``members`` nodes heard once by every replica at about the same time (a quorum
    hears them ALIVE: they join), then silent (they become DEAD records)."""
    channels = [grpc.aio.insecure_channel(a) for a in addresses]
    try:
        stubs = [pb_grpc.MembershipStub(ch) for ch in channels]

        async def one(stub: pb_grpc.MembershipStub, i: int) -> None:
            call = stub.Heartbeat()
            await call.write(
                pb.HeartbeatRequest(node_id=f"m{i}", incarnation=1, seq=1, labels=LABELS)
            )
            await call.read()
            await call.done_writing()
            await call.code()

        for start in range(0, members, 50):
            batch = range(start, min(members, start + 50))
            await asyncio.gather(*(one(stub, i) for i in batch for stub in stubs))
    finally:
        for ch in channels:
            await ch.close()


def _log_time(path: Path, pattern: str) -> float | None:
    """Seconds since the epoch of the first log line matching ``pattern`` (None: none)."""
    for line in path.read_text(errors="replace").splitlines():
        if re.search(pattern, line):
            stamp = time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")
            return time.mktime(stamp) + int(line[20:23]) / 1000
    return None


async def add_replica(members: int) -> tuple[float, float, int]:
    """(seconds to the restored snapshot, seconds to promotion, view size) of one addition."""
    with tempfile.TemporaryDirectory(prefix="bench-reconfig-") as tmp:
        cluster = LocalCluster(Path(tmp), tls=False)
        try:
            cluster.start_arbiters(3)
            await _leader(cluster.addresses, 30)
            await _fill(cluster.addresses, members)
            deadline = time.monotonic() + 120
            while True:
                resp = await _summary(cluster.addresses[0])
                async with grpc.aio.insecure_channel(cluster.addresses[0]) as ch:
                    view = await pb_grpc.MembershipStub(ch).GetView(pb.GetViewRequest(), timeout=10)
                if len(view.view.members) >= members and resp is not None:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("members did not join")
                await asyncio.sleep(0.5)
            (port,) = free_ports(1)
            address = f"127.0.0.1:{port}"
            t_wall, t0 = time.time(), time.monotonic()
            r = _admin(cluster, "add", f"a4={address}")
            assert r.returncode == 0, r.stderr
            join = ",".join(cluster.addresses)
            cluster.arbiters["a4"] = address
            child = cluster.spawn(
                "a4",
                "arbiter",
                "--id",
                "a4",
                "--listen",
                address,
                "--join",
                join,
                "--data-dir",
                str(cluster.data_dir("a4")),
                "--insecure",
                *("--ingest-workers", "0"),  # as the LocalCluster's replicas (arbiter_args)
            )
            while True:
                r = _admin(cluster, "list", "--json")
                roles = {row["id"]: row["role"] for row in map(json.loads, r.stdout.splitlines())}
                if roles.get("a4") == "voter":
                    promoted = time.monotonic() - t0
                    break
                if time.monotonic() - t0 > 120:
                    raise TimeoutError("a4 not promoted")
                await asyncio.sleep(0.05)
            log = child.err or child.out
            restored = _log_time(log, "restored from the leader's snapshot")
            listening = _log_time(log, "a4 listening on")
            snapshot = (restored - t_wall) if restored is not None else float("nan")
            if restored is not None and listening is not None:
                print(
                    f"  {members} members: a4 served {listening - t_wall:.2f} s after 'add' "
                    f"(process start, asking the group); snapshot restored "
                    f"{restored - listening:.2f} s after that",
                    flush=True,
                )
            return snapshot, promoted, len(view.view.members)
        finally:
            cluster.stop_all()


async def election(replicas: int) -> float:
    """Seconds from SIGKILL of the leader to a new leader in quorum."""
    with tempfile.TemporaryDirectory(prefix="bench-election-") as tmp:
        cluster = LocalCluster(Path(tmp), tls=False)
        try:
            cluster.start_arbiters(replicas)
            leader = await _leader(cluster.addresses, 30)
            await asyncio.sleep(1.0)  # settled: followers have heard the leader
            survivors = [a for rid, a in cluster.arbiters.items() if rid != leader]
            t0 = time.monotonic()
            cluster.kill(leader)
            while True:
                resps = await asyncio.gather(*(_summary(a) for a in survivors))
                if any(
                    r is not None and r.in_quorum and r.leader_id and r.leader_id != leader
                    for r in resps
                ):
                    return time.monotonic() - t0
                await asyncio.sleep(0.02)
        finally:
            cluster.stop_all()


async def main(members: int, runs: int) -> int:
    base = await add_replica(0)
    print(
        f"add a replica, empty view: snapshot restored {base[0]:.2f} s, promoted "
        f"{base[1]:.2f} s after 'admin arbiters add'",
        flush=True,
    )
    full = await add_replica(members)
    print(
        f"add a replica, {full[2]} members: snapshot restored {full[0]:.2f} s, promoted "
        f"{full[1]:.2f} s after 'admin arbiters add'",
        flush=True,
    )
    print(
        f"ratio to the empty view: snapshot x{full[0] / base[0]:.2f}, promoted "
        f"x{full[1] / base[1]:.2f}",
        flush=True,
    )
    medians = {}
    for n in (3, 5):
        samples = []
        for run in range(runs):
            dt = await election(n)
            samples.append(dt)
            print(
                f"{n} replicas, run {run + 1}: new leader {dt * 1000:.0f} ms after SIGKILL",
                flush=True,
            )
        medians[n] = statistics.median(samples)
        print(
            f"{n} replicas: median {medians[n] * 1000:.0f} ms, max {max(samples) * 1000:.0f} ms",
            flush=True,
        )
    print(f"election with 5 replicas / with 3: x{medians[5] / medians[3]:.2f}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.members, args.runs)))
