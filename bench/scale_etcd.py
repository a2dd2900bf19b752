"""The scale benchmark's etcd run (bench/scale.py): a 3-member etcd on loopback with N
leases kept alive at its minimum TTL by the Go load generator. Not a program of its own.

The peer users would pick instead of us for liveness: each node holds a lease
with a key under it and keeps it alive as etcd's own client (clientv3 v3.4)
does; a watcher on the prefix sees the DELETE when a lease whose keepalives
stopped expires. How the load generator maps a node to etcd (one clientv3
client, i.e. one LeaseKeepAlive stream, per node by default) and clientv3's
cadence: ``bench/loadgen/etcd.go``; what the figures mean: docs/scale.md.

etcd runs with ``--heartbeat-interval 50 --election-timeout 500``
(``--etcd-timing``, as bench/detection_others.py), which makes its minimum
TTL 1 s (etcd grants at least ceil(1.5 x election timeout)); etcd's defaults
(100, 1000) make it 2 s. The TTL actually granted is read back. Debian's
etcd-server is installed when missing (``ensure_installed`` of the detection
benchmark).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from detection_common import Procs, ensure_installed, package_version, say
from loadgen import Process
from scale_common import (
    cpu_seconds,
    histogram_delta,
    histogram_quantile,
    metric,
    pct,
    rss_bytes,
    scrape,
    victims,
    wait_until,
)

from membership.testing.localcluster import free_ports

WAL_FSYNC = "etcd_disk_wal_fsync_duration_seconds"
LEADER_CHANGES = "etcd_server_leader_changes_seen_total"


def _healthy(url: str) -> bool:
    with urllib.request.urlopen(url + "/health", timeout=2) as r:
        return bool(json.loads(r.read()).get("health") == "true")


def machine_cpu_seconds() -> tuple[float, float]:
    """CPU seconds the machine's processes have used (user+nice+system+irq+softirq in
    /proc/stat) and steal (taken by the hypervisor), to tell how much of the machine
    other work took during a window."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / tick, (v[7] if len(v) > 7 else 0) / tick


def _scrapes(clients: list[str]) -> list[dict[str, Any]]:
    out = []
    for c in clients:
        try:
            out.append(scrape(c))
        except OSError:
            out.append({})
    return out


def _leader_changes(scrapes: list[dict[str, Any]]) -> float:
    """Leader changes seen, the most any member counted (each member counts every change)."""
    return max((metric(m, LEADER_CHANGES) for m in scrapes), default=0.0)


def _fsync_p99_ms(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> float | None:
    deltas = [histogram_delta(a, b, WAL_FSYNC) for a, b in zip(after, before, strict=True)]
    q = histogram_quantile(deltas, WAL_FSYNC, 0.99)
    return None if q is None else q * 1e3


def _kill(owner: Process, node: str) -> dict[str, Any] | None:
    """Sends ``kill node``; the "killed" event (with the lease), or None when the load
    generator had no live lease for it (being granted again) or did not answer."""
    owner.send(f"kill {node}")
    e = owner.find(lambda e: e.get("node") == node and e.get("ev") in ("killed", "error"), 5)
    return e if e and e["ev"] == "killed" else None


def _deleted(watcher: Process, lease: int, timeout: float) -> dict[str, Any] | None:
    """The watcher's DELETE of the key that was under ``lease``, waiting up to ``timeout``."""
    return watcher.find(lambda e: e.get("ev") == "deleted" and e.get("lease") == lease, timeout)


def _start_members(
    args: argparse.Namespace, n: int, procs: Procs, workdir: Path, data: Path
) -> tuple[list[Any], list[str]]:
    """Three members with their data dirs in ``data``, healthy; their client addresses."""
    ports = free_ports(6)
    names = ["e1", "e2", "e3"]
    client = {m: f"127.0.0.1:{ports[i]}" for i, m in enumerate(names)}
    peer = {m: f"http://127.0.0.1:{ports[3 + i]}" for i, m in enumerate(names)}
    initial = ",".join(f"{m}={peer[m]}" for m in names)
    hb_ms, election_ms = args.etcd_timing
    members = []
    for m in names:
        url = f"http://{client[m]}"
        members.append(
            procs.spawn(
                f"etcd-{n}-{m}",
                [
                    "etcd",
                    *("--name", m, "--data-dir", str(data / f"{m}.data")),
                    *("--listen-client-urls", url, "--advertise-client-urls", url),
                    *("--listen-peer-urls", peer[m], "--initial-advertise-peer-urls", peer[m]),
                    *("--initial-cluster", initial, "--initial-cluster-state", "new"),
                    *("--heartbeat-interval", str(hb_ms), "--election-timeout", str(election_ms)),
                    *("--quota-backend-bytes", str(2**31), "--log-level", "warn"),
                ],
            )
        )
    addrs = [client[m] for m in names]
    if not wait_until(lambda: all(_healthy(f"http://{a}") for a in addrs), 30):
        raise RuntimeError("etcd did not become healthy within 30 s")
    return members, addrs


def run_etcd(
    args: argparse.Namespace, n: int, procs: Procs, workdir: Path
) -> dict[str, Any] | None:
    """N leases on a fresh 3-member etcd; None when etcd cannot be installed.

    Raises:
        RuntimeError: etcd did not start, or the leases were not all granted in
            ``--etcd-grant-timeout`` (the message says how many were).
    """
    if not ensure_installed("etcd"):
        return None
    workdir.mkdir(parents=True, exist_ok=True)
    members: list[Any] = []
    # --etcd-tmpfs: the members' WAL and database in memory (no disk: a diagnosis)
    data = Path(tempfile.mkdtemp(prefix="etcd-", dir="/dev/shm")) if args.etcd_tmpfs else workdir
    parts: list[Process] = []
    ranges: list[tuple[int, int, Process]] = []
    try:
        members, addrs = _start_members(args, n, procs, workdir, data)
        m_start = _scrapes(addrs)
        k = max(1, min(args.procs, n))
        base, rest = divmod(n, k)
        first = 0
        for i in range(k):
            cnt = base + (1 if i < rest else 0)
            argv = ["etcd", "--endpoints", ",".join(addrs), "--first", str(first)]
            argv += ["--count", str(cnt), "--ttl", "1", f"--watch={'true' if i == 0 else 'false'}"]
            per_client = args.etcd_leases_per_client or cnt  # 0: one client per process
            argv += ["--leases-per-client", str(per_client)]
            argv += ["--grant-concurrency", str(args.etcd_grant_concurrency)]
            argv += [
                "--member-offset",
                str(i),
                "--cadence",
                args.etcd_cadence,
            ]  # a process's first connection to member i
            parts.append(
                Process(procs, f"etcd-loadgen-{i}", argv, workdir / f"etcd-loadgen-{i}.log")
            )
            ranges.append((first, cnt, parts[-1]))
            first += cnt
        deadline = time.monotonic() + args.etcd_grant_timeout
        for p in parts:
            if not p.ready.wait(max(0.0, deadline - time.monotonic())):
                granted = sum(q.report.get("granted", 0) for q in parts)
                expired = sum(q.report.get("expired", 0) for q in parts)
                raise RuntimeError(
                    f"{granted} of {n} leases granted within {args.etcd_grant_timeout:.0f} s "
                    f"({expired} expired meanwhile; {p.name} exit {p.proc.poll()})"
                )
        readies = [next(e for e in p.events if e.get("ev") == "ready") for p in parts]
        ttl = readies[0]["ttl"]
        watcher = parts[0]
        m_ready = _scrapes(addrs)
        say(
            f"etcd N={n}: {n} leases granted at TTL {ttl} s (asked 1 s) in "
            f"{max(e['grant_s'] for e in readies):.1f} s"
        )
        time.sleep(args.settle)
        pids = [p.pid for p in members]

        keys = ("sent", "renewed", "not_found", "expired", "deadline_missed", "regrants")

        def reports() -> list[dict[str, Any]]:
            return [dict(p.report) for p in parts]

        s0, m0 = reports(), _scrapes(addrs)
        each0, lg0 = [cpu_seconds(pid) for pid in pids], sum(p.cpu() for p in parts)
        (busy0, steal0), t0 = machine_cpu_seconds(), time.monotonic()
        late: list[float] = []
        acks: list[dict[str, float]] = []
        while time.monotonic() - t0 < args.window:
            time.sleep(1.0)
            late += [p.report.get("late_ms", {}).get("p99", 0.0) for p in parts]
            acks += [p.report["ack_ms"] for p in parts if p.report.get("ack_ms", {}).get("n")]
        (busy1, steal1), dt = machine_cpu_seconds(), time.monotonic() - t0
        each = [cpu_seconds(pid) - c for pid, c in zip(pids, each0, strict=True)]
        cpu = sum(each)
        lg = sum(p.cpu() for p in parts) - lg0
        s1, m1, t1 = reports(), _scrapes(addrs), time.monotonic()
        # per process, over the span of its own reports (not the driver's clock: a report
        # is up to a second old when read)
        d = {x: sum(b.get(x, 0) - a.get(x, 0) for a, b in zip(s0, s1, strict=True)) for x in keys}
        rate = {
            x: sum(
                (b.get(x, 0) - a.get(x, 0)) / (b["t"] - a["t"])
                for a, b in zip(s0, s1, strict=True)
                if b.get("t", 0) > a.get("t", 0)
            )
            for x in ("sent", "renewed", "not_found")
        }
        req = sum(p.report.get("required_rate", 0) for p in parts)
        res: dict[str, Any] = {
            "n": n,
            "version": package_version("etcd-server"),
            "timing_ms": list(args.etcd_timing),
            "tmpfs": bool(args.etcd_tmpfs),
            "leases_per_client": args.etcd_leases_per_client or math.ceil(n / k),
            "ttl_s": ttl,
            # clientv3's renewal period: the first 500 ms pass after TTL/3 (etcd.go's period)
            "period_s": ttl / 3
            if args.etcd_cadence == "fixed"
            else 0.5 * (math.floor(ttl / 3 / 0.5) + 1),
            "cadence": args.etcd_cadence,
            "grant_s": max(e["grant_s"] for e in readies),
            "leader_changes_grant": _leader_changes(m_ready) - _leader_changes(m_start),
            "leader_changes_window": _leader_changes(m1) - _leader_changes(m0),
            "fsync_p99_ms_window": _fsync_p99_ms(m0, m1),
            "keepalives_per_s": rate["sent"],
            "renewed_per_s": rate["renewed"],
            "required_rate": req,
            "not_found_per_s": rate["not_found"],
            "expired_window": d["expired"],
            "deadline_missed_window": d["deadline_missed"],
            "cores": cpu / dt,
            # per member, and which one led at the end of the window
            "member_cores": [c / dt for c in each],
            "leader": [bool(metric(m, "etcd_server_is_leader")) for m in m1],
            "cpu_us_per_keepalive": cpu / dt / rate["renewed"] * 1e6 if rate["renewed"] else None,
            "rss_mib": sum(rss_bytes(pid) for pid in pids) / 2**20,
            "late_p99_ms": max(late, default=None),
            # keepalive -> response, the median of the per-second p50s and the largest p99
            "ack_p50_ms": statistics.median(a["p50"] for a in acks) if acks else None,
            "ack_p99_ms": max((a["p99"] for a in acks), default=None),
            "loadgen": {"cores": lg / dt},
            "other_cores": max(0.0, busy1 - busy0 - cpu - lg) / dt,
            "steal_cores": (steal1 - steal0) / dt,
        }
        samples, void = [], []
        gone = {e["node"] for e in watcher.events if e.get("ev") == "deleted"}
        tried = 0
        for v in victims(n, 4 * args.kills, gone):
            if len(samples) + len(void) == args.kills:
                break
            tried += 1
            num = int(v[1:])
            owner = next(p for f, c, p in ranges if f <= num < f + c)
            killed = _kill(owner, v)
            if killed is None:
                continue
            deleted = _deleted(watcher, killed["lease"], args.kill_timeout)
            if deleted and deleted["t"] >= killed["t"]:
                samples.append(deleted["t"] - killed["t"])
            else:  # expired before the kill (a false expiry) or not within the timeout
                void.append(v)
        m_end = _scrapes(addrs)
        res["kill_to_watcher_s"] = samples
        res["kills_void"] = void
        res["kill_p50_s"], res["kill_p99_s"] = pct(samples, 50), pct(samples, 99)
        killed_leases = {e["lease"] for p in parts for e in p.events if e.get("ev") == "killed"}
        deletes = [e for e in watcher.events if e.get("ev") == "deleted"]
        # a DELETE of a lease whose keepalives were never stopped
        false = [e for e in deletes if e["lease"] not in killed_leases]
        # the grants and the settle time; the steady window; the kills
        res["false_expiries_grant"] = sum(1 for e in false if e["t"] < t0)
        res["false_expiries_window"] = sum(1 for e in false if t0 <= e["t"] < t1)
        res["false_expiries_kills"] = sum(1 for e in false if e["t"] >= t1)
        res["false_deaths"] = sorted({e["node"] for e in false if e["t"] >= t0})
        res["leader_changes_kills"] = _leader_changes(m_end) - _leader_changes(m1)
        res["errors"] = {
            k: sum(p.report.get("errors", {}).get(k, 0) for p in parts)
            for k in {k for p in parts for k in p.report.get("errors", {})}
        }
        say(
            f"etcd N={n}: {res['renewed_per_s']:.0f} renewals/s of {req:.0f} required, "
            f"{res['cpu_us_per_keepalive'] or 0:.0f} us each (3 members), kill-to-watcher "
            f"{[round(x, 2) for x in samples]}, false expiries {len(false)}, leader changes "
            f"{res['leader_changes_grant']:.0f}+{res['leader_changes_window']:.0f}"
        )
        return res
    finally:
        for p in parts:
            p.stop()
        for member in members:
            Procs.kill(member)
        if args.etcd_tmpfs:
            shutil.rmtree(data, ignore_errors=True)


def _f(v: Any, fmt: str = ".0f") -> str:
    if v is None or (isinstance(v, float) and math.isinf(v)):
        return "-"
    return format(v, fmt)


def etcd_table(args: argparse.Namespace, rows: list[dict[str, Any]]) -> list[str]:
    """The etcd detail lines of bench/scale.py's table (empty without etcd results)."""
    runs = [(r["n"], r["etcd"]) for r in rows if r.get("etcd") and "cores" in r["etcd"]]
    if not runs:
        return []
    head = (
        f"{'N':>6} {'TTL':>3} {'per s':>5} {'sent/s':>7} {'renew/s':>7} {'req/s':>7} "
        f"{'cores':>5} {'us/renew':>8} {'rtt p50/p99 ms':>14} {'grant s':>7} {'exp@start':>9} "
        f"{'kill->DELETE p50/p99 s':>22} {'falseExp':>8} {'missed':>6} {'leader chg':>10} "
        f"{'fsync p99 ms':>12} | {'lg late p99 ms':>14} {'lg cores':>8} {'others':>6} {'steal':>5}"
    )
    lines = ["", "etcd x3 in detail:", head, "-" * len(head)]
    for n, e in runs:
        lc = "/".join(
            f"{e[k]:.0f}"
            for k in ("leader_changes_grant", "leader_changes_window", "leader_changes_kills")
        )
        lines.append(
            f"{n:>6} {e['ttl_s']:>3} {_f(e['period_s'], '.2f'):>5} {e['keepalives_per_s']:>7.0f} "
            f"{e['renewed_per_s']:>7.0f} {e['required_rate']:>7.0f} {e['cores']:>5.2f} "
            f"{_f(e['cpu_us_per_keepalive']):>8} "
            f"{_f(e['ack_p50_ms'], '.0f') + '/' + _f(e['ack_p99_ms'], '.0f'):>14} "
            f"{e['grant_s']:>7.1f} "
            f"{e['false_expiries_grant']:>9} "
            f"{_f(e['kill_p50_s'], '.2f') + '/' + _f(e['kill_p99_s'], '.2f'):>22} "
            f"{e['false_expiries_window']:>8} {e['deadline_missed_window']:>6.0f} "
            f"{lc:>10} "
            f"{_f(e['fsync_p99_ms_window'], '.0f'):>12} | {_f(e['late_p99_ms'], '.1f'):>14} "
            f"{e['loadgen']['cores']:>8.2f} {e['other_cores']:>6.2f} {e['steal_cores']:>5.2f}"
        )
    e0 = runs[0][1]
    lines += [
        f"etcd --heartbeat-interval {e0['timing_ms'][0]} --election-timeout {e0['timing_ms'][1]}, "
        f"data dir {'on tmpfs' if e0.get('tmpfs') else 'on disk'},",
        f"{e0['leases_per_client']} lease(s) per client (one LeaseKeepAlive stream each); "
        f"cadence {e0.get('cadence', 'clientv3')}:",
        "clientv3's: a pass every 0.5 s sends the leases whose TTL/3 since their last response",
        "has passed (fixed: every lease every TTL/3); per s: the renewal period that gives.",
        "sent/s: keepalives sent;",
        "renew/s: answered with TTL > 0; req/s: live leases / period. us/renew: the 3 members'",
        "CPU / renewals. rtt: keepalive to its response at the load generator (median of the",
        "per-second p50s / largest p99). grant s: until every lease was granted once; exp@start:",
        f"leases expired from the start to the window (the grants, {args.settle:g} s). falseExp:",
        "DELETEs of leases not killed in the window (the load generator grants them again);",
        "missed: clientv3 deadlines (TTL without a response) passed in the window. leader chg:",
        "during the grants / the window / the kills. fsync p99: etcd_disk_wal_fsync_duration_",
        "seconds in the window (bucket bound). others: cores used by other processes of the",
        "machine (not etcd, not the load generator) in the window; steal: cores the hypervisor",
        "took (/proc/stat).",
    ]
    return lines
