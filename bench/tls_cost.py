"""What mutual TLS costs a replica: CPU per heartbeat, and reconnecting a fleet.

Two measurements, each run with TLS and in plaintext (``--insecure``) in the
same run, so every figure is a ratio against its plaintext baseline on the
same (noisy, shared) machine:

1. **CPU per heartbeat** at ``--nodes`` nodes (300): a local 3-replica
   cluster; a load generator opens one real ``Heartbeat`` stream per node
   to every replica (each on a TCP connection of its own, as the SDK does)
   and sends at ``--interval`` seconds (0.6, the longest interval replicas
   accept, declared in ``interval_seconds``). Over a steady window the
   replicas' CPU (utime + stime from /proc) is divided by the acks they
   sent. The generator reports the rate it achieved against the rate
   asked and how late its own sends were, so a generator that could not
   keep up is never mistaken for the server's result.
2. **Reconnect after a replica restart** at ``--fleet`` nodes (1000): the
   generator holds one stream per node to replica a1 only; a1 is stopped
   (SIGTERM) and started again on its data dir, and the time from its
   port accepting again to each node's first ack on the new process is
   recorded (each a new TCP connection, and with TLS a full handshake).
   Nodes reconnect with the SDK's backoff (full jitter, 0.05 s to 1 s).

Usage: python bench/tls_cost.py [--nodes 300] [--fleet 1000] [--window 20]
Prints a table; ``--json FILE`` also writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from membership.shared.backoff import Backoff
from membership.testing.localcluster import LocalCluster, free_ports, membership_command
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc

_TICKS = os.sysconf("SC_CLK_TCK")
_OWN_CONNECTION = ("grpc.use_local_subchannel_pool", 1)


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` so far, seconds (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


@dataclass
class Credentials:
    """How the generator connects: TLS files, or None for plaintext."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None

    def channel(self, address: str) -> grpc.aio.Channel:
        options = [_OWN_CONNECTION, ("grpc.enable_retries", 0)]
        if self.ca is None:
            return grpc.aio.insecure_channel(address, options=options)
        creds = grpc.ssl_channel_credentials(self.ca, self.key, self.cert)
        return grpc.aio.secure_channel(address, creds, options=options)


@dataclass
class StreamStats:
    """What one generator stream achieved."""

    sent: int = 0
    acked: int = 0
    late: list[float] = field(default_factory=list)  # seconds behind schedule, per send
    first_ack_at: float | None = None  # monotonic seconds of the first ack on the current call
    failures: int = 0


class Generator:
    """Heartbeat streams for ``ids`` to ``targets`` at a fixed interval (seconds).

    One task per (node, replica) stream: write a heartbeat, read its ack,
    sleep to the next tick. A stream that fails reconnects on a new channel
    after a full-jitter backoff (0.05 s to 1 s), as the SDK does.
    """

    def __init__(
        self,
        ids: list[str],
        targets: list[str],
        interval: float,
        creds: Credentials,
        rng: random.Random,
    ) -> None:
        self.ids = ids
        self.targets = targets
        self.interval = interval
        self.creds = creds
        self.rng = rng
        self.stats: dict[tuple[str, str], StreamStats] = {
            (n, t): StreamStats() for n in ids for t in targets
        }
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for i, node in enumerate(self.ids):
            for target in self.targets:
                # Spread the first sends over one interval: no artificial burst.
                offset = (i / max(1, len(self.ids))) * self.interval
                self._tasks.append(loop.create_task(self._stream(node, target, offset)))

    async def stop(self) -> None:
        self._stop.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def reset_first_acks(self) -> None:
        for st in self.stats.values():
            st.first_ack_at = None

    async def _stream(self, node: str, target: str, offset: float) -> None:
        st = self.stats[(node, target)]
        backoff = Backoff(initial=0.05, maximum=1.0, rng=self.rng)
        await asyncio.sleep(offset)
        incarnation = int(time.time() * 1000)
        attempt = 0
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            channel = self.creds.channel(target)
            try:
                call = pb_grpc.MembershipStub(channel).Heartbeat()
                seq = 0
                due = loop.time()
                while True:
                    seq += 1
                    now = loop.time()
                    st.late.append(max(0.0, now - due))
                    await call.write(
                        pb.HeartbeatRequest(
                            node_id=node,
                            incarnation=incarnation,
                            seq=seq,
                            interval_seconds=self.interval,
                        )
                    )
                    st.sent += 1
                    ack = await call.read()
                    if ack is grpc.aio.EOF:
                        raise ConnectionError("stream ended")
                    st.acked += 1
                    attempt = 0
                    if st.first_ack_at is None:
                        st.first_ack_at = loop.time()
                    due += self.interval
                    if due < loop.time() - self.interval:
                        due = loop.time()  # far behind: skip, never burst to catch up (as the SDK)
                    await asyncio.sleep(max(0.0, due - loop.time()))
            except asyncio.CancelledError:
                raise
            except Exception:  # AioRpcError; a write after the server ended the call raises others
                st.failures += 1
            finally:
                await channel.close(grace=None)
            attempt += 1
            await asyncio.sleep(backoff.delay(attempt))


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _port_open(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.2):
            return True
    except OSError:
        return False


async def _wait(pred, timeout: float, what: str, interval: float = 0.05) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)


def make_certs(folder: Path, nodes_pattern: str) -> None:
    """A CA and certificates for a1..a3 and one node certificate ``gen`` for ``nodes_pattern``."""
    import subprocess

    cmd = membership_command(
        "certs", "init", str(folder), "--arbiters", "a1,a2,a3", "--nodes", f"gen={nodes_pattern}"
    )
    subprocess.run(cmd, check=True, capture_output=True)


def _tls_flags(folder: Path, name: str) -> list[str]:
    return [
        "--tls-ca",
        str(folder / "ca.pem"),
        "--tls-cert",
        str(folder / f"{name}.pem"),
        "--tls-key",
        str(folder / f"{name}-key.pem"),
    ]


def _creds(folder: Path | None) -> Credentials:
    if folder is None:
        return Credentials()
    return Credentials(
        ca=(folder / "ca.pem").read_bytes(),
        cert=(folder / "gen.pem").read_bytes(),
        key=(folder / "gen-key.pem").read_bytes(),
    )


async def _wait_listening(cluster: LocalCluster) -> None:
    try:
        await _wait(lambda: all(_port_open(a) for a in cluster.addresses), 60, "replicas")
    except TimeoutError:
        for name, child in cluster.children.items():
            print(f"--- {name} (alive: {child.alive()})\n{child.stderr()[-2000:]}", file=sys.stderr)
        raise


def _start_cluster(tmp: Path, certs: Path | None) -> LocalCluster:
    cluster = LocalCluster(tmp, merge_output=True)
    cluster.arbiters = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(free_ports(3))}
    for rid in cluster.arbiters:
        cluster.start_arbiter(rid, *_arbiter_flags(certs, rid))
    return cluster


def _arbiter_flags(certs: Path | None, rid: str) -> list[str]:
    return _tls_flags(certs, rid) if certs else ["--insecure"]


async def cpu_per_heartbeat(
    tmp: Path, certs: Path | None, nodes: int, interval: float, window: float, rng: random.Random
) -> dict[str, float]:
    """Replica CPU per heartbeat at ``nodes`` nodes streaming to all three replicas."""
    cluster = _start_cluster(tmp, certs)
    gen: Generator | None = None
    try:
        await _wait_listening(cluster)
        gen = Generator(
            [f"n{i}" for i in range(nodes)], cluster.addresses, interval, _creds(certs), rng
        )
        gen.start()
        # Warm-up: every stream connected (with TLS, a handshake each) and acked,
        # then a few seconds for the joins to commit and the streams to settle.
        await _wait(
            lambda: all(s.first_ack_at is not None for s in gen.stats.values()),
            120,
            f"{len(gen.stats)} streams acked",
        )
        await asyncio.sleep(max(5.0, 5 * interval))
        pids = [c.pid for c in cluster.children.values() if c.name.startswith("a")]
        before_cpu = [cpu_seconds(p) for p in pids]
        before_acked = sum(s.acked for s in gen.stats.values())
        before_sent = sum(s.sent for s in gen.stats.values())
        gen_cpu0 = time.process_time()
        t0 = time.monotonic()
        await asyncio.sleep(window)
        elapsed = time.monotonic() - t0
        cpu = sum(cpu_seconds(p) for p in pids) - sum(before_cpu)
        acked = sum(s.acked for s in gen.stats.values()) - before_acked
        sent = sum(s.sent for s in gen.stats.values()) - before_sent
        late = [x for s in gen.stats.values() for x in s.late[-int(window / interval) :]]
        return {
            "cpu_us_per_heartbeat": cpu / max(1, acked) * 1e6,
            "replica_cpu_cores": cpu / elapsed,
            "acks_per_s": acked / elapsed,
            "asked_per_s": nodes * 3 / interval,
            "sent_per_s": sent / elapsed,
            "generator_cpu_cores": (time.process_time() - gen_cpu0) / elapsed,
            "send_late_p99_ms": _percentile(late, 0.99) * 1000,
        }
    finally:
        if gen is not None:
            await gen.stop()
        cluster.stop_all()


async def reconnect_after_restart(
    tmp: Path, certs: Path | None, fleet: int, interval: float, rng: random.Random
) -> dict[str, float]:
    """Seconds from a1 accepting again after a restart to each node's first ack from it."""
    cluster = _start_cluster(tmp, certs)
    gen: Generator | None = None
    try:
        await _wait_listening(cluster)
        a1 = cluster.arbiters["a1"]
        gen = Generator([f"n{i}" for i in range(fleet)], [a1], interval, _creds(certs), rng)
        gen.start()
        await _wait(
            lambda: all(s.first_ack_at is not None for s in gen.stats.values()),
            120,
            f"{fleet} streams acked",
        )
        cluster.children["a1"].signal(15)
        cluster.children["a1"].popen.wait(30)
        await _wait(lambda: not _port_open(a1), 10, "a1 closed")
        gen.reset_first_acks()
        gen_cpu0 = time.process_time()
        cluster.start_arbiter("a1", *_arbiter_flags(certs, "a1"))
        await _wait(lambda: _port_open(a1), 30, "a1 listening again", interval=0.005)
        t_open = asyncio.get_running_loop().time()
        cpu0 = cpu_seconds(cluster.children["a1"].pid)
        await _wait(
            lambda: all(s.first_ack_at is not None for s in gen.stats.values()),
            120,
            f"{fleet} streams acked again",
        )
        delays = [s.first_ack_at - t_open for s in gen.stats.values() if s.first_ack_at]
        return {
            "reconnect_p50_s": statistics.median(delays),
            "reconnect_p99_s": _percentile(delays, 0.99),
            "reconnect_all_s": max(delays),
            "a1_cpu_s_during_reconnect": cpu_seconds(cluster.children["a1"].pid) - cpu0,
            "generator_cpu_s_during_reconnect": time.process_time() - gen_cpu0,
        }
    finally:
        if gen is not None:
            await gen.stop()
        cluster.stop_all()


async def main(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp_s:
        tmp = Path(tmp_s)
        certs = tmp / "certs"
        make_certs(certs, "n*")
        for rnd in range(args.rounds):
            for mode in ("plaintext", "tls"):
                work = tmp / f"cpu-{mode}-{rnd}"
                work.mkdir()
                r = await cpu_per_heartbeat(
                    work,
                    certs if mode == "tls" else None,
                    args.nodes,
                    args.interval,
                    args.window,
                    rng,
                )
                results[f"cpu {mode} {rnd}"] = r
                print(f"cpu/heartbeat {mode} round {rnd}: " + json.dumps(r), flush=True)
        for mode in ("plaintext", "tls"):
            work = tmp / f"reconnect-{mode}"
            work.mkdir()
            r = await reconnect_after_restart(
                work, certs if mode == "tls" else None, args.fleet, args.interval, rng
            )
            results[f"reconnect {mode}"] = r
            print(f"reconnect {mode}: " + json.dumps(r), flush=True)
    _table(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _table(results: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    def med(mode: str, key: str) -> float:
        return statistics.median(
            r[key] for name, r in results.items() if name.startswith(f"cpu {mode}")
        )

    print()
    print(f"{args.nodes} nodes x 3 replicas at {args.interval:g} s, {args.rounds} rounds (median)")
    print(f"{'':28}{'plaintext':>12}{'TLS':>12}{'ratio':>8}")
    for key, label in (
        ("cpu_us_per_heartbeat", "replica CPU us/heartbeat"),
        ("replica_cpu_cores", "replicas' CPU, cores"),
        ("acks_per_s", "acks/s (all replicas)"),
        ("generator_cpu_cores", "generator CPU, cores"),
        ("send_late_p99_ms", "generator send late p99 ms"),
    ):
        p, t = med("plaintext", key), med("tls", key)
        print(f"{label:28}{p:12.1f}{t:12.1f}{t / p if p else float('nan'):8.2f}")
    print(f"{'asked acks/s':28}{args.nodes * 3 / args.interval:12.1f}")
    print()
    print(f"{args.fleet} nodes reconnect to a restarted replica")
    pr, tr = results["reconnect plaintext"], results["reconnect tls"]
    for key, label in (
        ("reconnect_p50_s", "first ack p50, s"),
        ("reconnect_p99_s", "first ack p99, s"),
        ("reconnect_all_s", "all acked, s"),
        ("a1_cpu_s_during_reconnect", "a1 CPU during it, s"),
        ("generator_cpu_s_during_reconnect", "generator CPU, s"),
    ):
        p, t = pr[key], tr[key]
        print(f"{label:28}{p:12.3f}{t:12.3f}{t / p if p else float('nan'):8.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=300)
    ap.add_argument("--fleet", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=0.6)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None)
    sys.exit(asyncio.run(main(ap.parse_args())))
