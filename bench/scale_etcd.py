"""The scale benchmark's etcd run (bench/scale.py): a 3-member etcd on loopback with N
leases kept alive at its minimum TTL by the Go load generator. Not a program of its own.

The peer users would pick instead of us for liveness: each node holds a lease
with a key under it and renews it every TTL/3 over a LeaseKeepAlive stream
(as etcd's clientv3 does); a watcher on the prefix sees the DELETE when a
lease whose keepalives stopped expires. etcd runs with ``--heartbeat-interval
50 --election-timeout 500`` as in bench/detection_others.py (which lowers the
minimum TTL etcd grants to 1 s); the TTL actually granted is read back.
Debian's etcd-server is installed when missing (``ensure_installed`` of the
detection benchmark).
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from detection_common import Procs, ensure_installed, package_version, say
from loadgen import Process
from scale_common import cpu_seconds, pct, rss_bytes, victims, wait_until

from membership.localcluster import free_ports


def _healthy(url: str) -> bool:
    with urllib.request.urlopen(url + "/health", timeout=2) as r:
        return bool(json.loads(r.read()).get("health") == "true")


def run_etcd(
    args: argparse.Namespace, n: int, procs: Procs, workdir: Path
) -> dict[str, Any] | None:
    """N leases on a fresh 3-member etcd; None when etcd cannot be installed."""
    if not ensure_installed("etcd"):
        return None
    workdir.mkdir(parents=True, exist_ok=True)
    ports = free_ports(6)
    names = ["e1", "e2", "e3"]
    client = {m: f"127.0.0.1:{ports[i]}" for i, m in enumerate(names)}
    peer = {m: f"http://127.0.0.1:{ports[3 + i]}" for i, m in enumerate(names)}
    initial = ",".join(f"{m}={peer[m]}" for m in names)
    members = []
    parts: list[Process] = []
    ranges: list[tuple[int, int, Process]] = []
    try:
        for m in names:
            url = f"http://{client[m]}"
            members.append(
                procs.spawn(
                    f"etcd-{n}-{m}",
                    [
                        "etcd",
                        *("--name", m, "--data-dir", str(workdir / f"{m}.data")),
                        *("--listen-client-urls", url, "--advertise-client-urls", url),
                        *("--listen-peer-urls", peer[m], "--initial-advertise-peer-urls", peer[m]),
                        *("--initial-cluster", initial, "--initial-cluster-state", "new"),
                        *("--heartbeat-interval", "50", "--election-timeout", "500"),
                        *("--quota-backend-bytes", str(2**31), "--log-level", "warn"),
                    ],
                )
            )
        if not wait_until(lambda: all(_healthy(f"http://{client[m]}") for m in names), 30):
            raise RuntimeError("etcd did not become healthy within 30 s")
        endpoints = ",".join(client[m] for m in names)
        k = max(1, min(args.procs, n))
        base, rest = divmod(n, k)
        first = 0
        for i in range(k):
            cnt = base + (1 if i < rest else 0)
            argv = ["etcd", "--endpoints", endpoints, "--first", str(first), "--count", str(cnt)]
            argv += ["--ttl", "1", f"--watch={'true' if i == 0 else 'false'}"]
            parts.append(
                Process(procs, f"etcd-loadgen-{i}", argv, workdir / f"etcd-loadgen-{i}.log")
            )
            ranges.append((first, cnt, parts[-1]))
            first += cnt
        for p in parts:
            if not p.ready.wait(120):
                raise RuntimeError(f"{p.name}: leases not granted within 120 s")
        ttl = next(e["ttl"] for e in parts[0].events if e.get("ev") == "ready")
        say(f"etcd N={n}: {n} leases granted at TTL {ttl} s (asked 1 s), keepalive every TTL/3")
        time.sleep(args.settle)
        pids = [p.pid for p in members]
        c0 = sum(cpu_seconds(pid) for pid in pids)
        s0 = sum(p.report.get("sent", 0) for p in parts)
        lg0, t0 = sum(p.cpu() for p in parts), time.monotonic()
        time.sleep(args.window)
        dt = time.monotonic() - t0
        cpu = sum(cpu_seconds(pid) for pid in pids) - c0
        sent = sum(p.report.get("sent", 0) for p in parts) - s0
        req = sum(p.report.get("required_rate", 0) for p in parts)
        res: dict[str, Any] = {
            "n": n,
            "version": package_version("etcd-server"),
            "ttl_s": ttl,
            "keepalives_per_s": sent / dt,
            "required_rate": req,
            "cores": cpu / dt,
            "cpu_us_per_keepalive": cpu / sent * 1e6 if sent else None,
            "cpu_ms_per_lease_per_s": cpu / dt / n * 1e3,
            "rss_mib": sum(rss_bytes(pid) for pid in pids) / 2**20,
            "late_p99_ms": max(p.report.get("late_ms", {}).get("p99", 0) for p in parts),
            "loadgen": {"cores": (sum(p.cpu() for p in parts) - lg0) / dt},
        }
        watcher = parts[0]
        samples = []
        gone = {e["node"] for e in watcher.events if e.get("ev") == "deleted"}
        for v in victims(n, args.kills, gone):
            num = int(v[1:])
            owner = next(p for f, c, p in ranges if f <= num < f + c)
            owner.send(f"kill {v}")
            killed = owner.event("killed", v, 5)
            deleted = (
                watcher.event("deleted", v, args.kill_timeout, since=killed["t"])
                if killed
                else None
            )
            if killed and deleted:
                samples.append(deleted["t"] - killed["t"])
        res["kill_to_watcher_s"] = samples
        res["kill_p50_s"], res["kill_p99_s"] = pct(samples, 50), pct(samples, 99)
        # a DELETE of a lease whose keepalives were never stopped (or before they were)
        kill_t = {e["node"]: e["t"] for p in parts for e in p.events if e.get("ev") == "killed"}
        res["false_deaths"] = sorted(
            {
                e["node"]
                for e in watcher.events
                if e.get("ev") == "deleted" and e["t"] < kill_t.get(e["node"], float("inf"))
            }
        )
        say(
            f"etcd N={n}: {res['keepalives_per_s']:.0f} keepalives/s, "
            f"{res['cpu_us_per_keepalive'] or 0:.0f} us each (3 members), kill-to-watcher "
            f"{[round(x, 2) for x in samples]}"
        )
        return res
    finally:
        for p in parts:
            p.stop()
        for member in members:
            Procs.kill(member)
