"""Resident memory per node of a replica against a bare grpc.aio server, in the same run.

    python bench/memory.py                                 # N = 1000, 3000, one replica
    python bench/memory.py --nodes 1000 --rounds 3 --before DIR
    python bench/memory.py --nodes 1000 --trace 1 --systems ours,bare   # attribution

A quick, repeatable tool for issue 12's "at most 32 KiB per node"
(``bench/scale.py`` gives the same figure inside its bigger run). Per N and
round, one system after the other (never two at once), on loopback:

* ``ours``: ``--mode single`` (default) one replica in a group of one;
  ``--mode cluster`` a 3-replica group with a1 loaded fully and a2, a3
  lightly (3 s interval, as ``bench/scale.py`` above its ``--full-load-max``),
  a1 measured. Plaintext, ``--ingest-workers 0``, limits raised to N.
* ``before`` (with ``--before DIR``): the same replica run from another source
  tree (``git archive COMMIT arbiter membership | tar -x -C DIR``).
* ``bare``: ``bench/scale_bare.py``, a grpc.aio server that decodes every
  HeartbeatRequest and acks it, nothing else, at the interval ours suggested.

The load is the Go load generator (``bench/loadgen.py``; the streams of about
90 nodes share a connection, docs/scale.md), nodes joining ``--ramp`` a
second (not a storm: this measures a member's memory, not a join's peak).
Once every node has an ALIVE ack from every server and ``--settle`` seconds
passed (heartbeats going on), KiB/node = (RSS now - RSS before the first
join) / N, RSS from /proc. Every server runs under ``bench/memory_probe.py``,
which on SIGUSR2 writes what its allocators hold (glibc malloc: what C code
holds, gRPC's core and protobuf's upb arenas; pymalloc: Python's small
objects), gc-tracked objects per type and, with ``--trace K``, a tracemalloc
snapshot of K frames. The table gives each part's growth per node; with
``--trace`` the lines of code whose allocations grew most, per node (a traced
run is slower: its figures are for attribution, the untraced ones are the
result). The load generator's figures (sent against required, its lateness)
are printed so a load that fell short is seen.

Usage: python bench/memory.py [--nodes 1000,3000] [--rounds 1] [--mode single|cluster]
       [--systems ours,bare] [--before DIR] [--trace K] [--settle 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from detection_common import Procs, say
from loadgen import Fleet, Process, binary
from memory_report import breakdown, print_breakdown, table
from scale_common import metric, rss_bytes, scrape, wait_until

from membership.testing.localcluster import (
    LocalCluster,
    arbiter_args,
    free_ports,
    membership_command,
)

BENCH = Path(__file__).resolve().parent
PROBE = BENCH / "memory_probe.py"


def _probe_argv(out: Path, trace: int) -> list[str]:
    return [sys.executable, str(PROBE), "--out", str(out), "--trace-frames", str(trace), "--"]


def take_probe(pid: int, out: Path, k: int, timeout: float = 600.0) -> dict[str, Any]:
    """Sends SIGUSR2 to ``pid`` and waits for ``out/probe-<k>.json``; returns it.

    Raises:
        TimeoutError: the probe did not appear within ``timeout`` seconds.
    """
    os.kill(pid, signal.SIGUSR2)
    path = out / f"probe-{k}.json"
    if not wait_until(path.exists, timeout, 0.1):
        raise TimeoutError(f"no {path} within {timeout:g} s")
    data: dict[str, Any] = json.loads(path.read_text())
    trace = out / f"probe-{k}.tracemalloc"
    data["tracemalloc"] = str(trace) if trace.exists() else None
    return data


def start_ours(
    args: argparse.Namespace, n: int, workdir: Path, before: Path | None
) -> tuple[LocalCluster, list[str], dict[str, str]]:
    """The replica(s) under the probe; returns the cluster, their addresses, metrics addresses."""
    env = {**os.environ}
    if before is not None:
        env["PYTHONPATH"] = str(before)
    cluster = LocalCluster(workdir, tls=False, log_level="warning", merge_output=True, env=env)
    count = 3 if args.mode == "cluster" else 1
    cluster.arbiters = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(free_ports(count))}
    maddr = {
        rid: f"127.0.0.1:{p}" for rid, p in zip(cluster.arbiters, free_ports(count), strict=True)
    }
    for rid in cluster.arbiters:
        extra = [
            "--insecure",
            *("--metrics-listen", maddr[rid], "--max-nodes", str(2 * n + 100)),
            *("--max-heartbeat-streams", str(3 * n + 200)),
            *("--max-subscribers", str(args.subscribers + 100)),
            # the interval N >= 1,000 gets anyway, from the start: a join on a busy
            # machine is then not judged at the 0.15 s base interval's D (0.75 s)
            *("--heartbeat-interval", str(args.interval)),
            *("--max-heartbeat-interval", str(max(0.6, args.interval))),
            # a long D: a replica starved by a busy machine must not declare nodes
            # DEAD (they would rejoin: records, floors and history that are no
            # member's memory); what a member costs does not depend on D
            *("--missed-heartbeats", str(args.missed)),
            *("--restart-grace", str(args.missed * max(0.6, args.interval) + 1)),
            *args.replica_flag,
        ]
        if args.mode == "cluster" and rid != "a1":
            iv = str(args.light_interval)
            extra += ["--heartbeat-interval", iv, "--max-heartbeat-interval", iv]
            extra += [
                "--missed-heartbeats",
                "2",
                "--restart-grace",
                str(2 * args.light_interval + 1),
            ]
        argv = membership_command(
            *arbiter_args(rid, cluster.arbiters, cluster.data_dir(rid), *extra),
            log_level=args.log_level,
        )
        # python -m membership ... -> python memory_probe.py --out D -m membership ...
        probe = _probe_argv(workdir / f"probe-{rid}", args.trace)
        cluster.spawn_command(rid, [*probe, *argv[1:]])

    def ready() -> bool:
        for rid, child in cluster.children.items():
            if not child.alive():
                raise RuntimeError(f"replica {rid} exited: {' / '.join(child.lines()[-3:])}")
        ms = [scrape(maddr[r]) for r in cluster.arbiters]
        return all(metric(m, "membership_in_quorum") == 1 for m in ms)

    if not wait_until(ready, 60):
        raise RuntimeError("the replica(s) not in quorum within 60 s")
    return cluster, cluster.addresses, maddr


def measure(
    args: argparse.Namespace, system: str, n: int, interval: float, procs: Procs, workdir: Path
) -> dict[str, Any]:
    """One system at N nodes: RSS and probes before the first join and once settled."""
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = None
    bare = None
    fleet = None
    subs = None
    try:
        if system == "bare":
            (port,) = free_ports(1)
            addrs = [f"127.0.0.1:{port}"]
            bare = procs.spawn(
                "bare",
                [*_probe_argv(workdir / "probe-bare", args.trace), str(BENCH / "scale_bare.py"),
                 "--listen", addrs[0], "--interval", f"{interval:.4f}",
                 *(f"--option={o}" for o in args.bare_option)],
            )  # fmt: skip
            pid, out = bare.pid, workdir / "probe-bare"
            if not wait_until(lambda: (out / ".").exists() and bare.poll() is None, 30):
                raise RuntimeError("the bare server did not start")
            time.sleep(1.5)
            if bare.poll() is not None:
                raise RuntimeError("the bare server exited (see its log)")
        else:
            before = args.before if system == "before" else None
            cluster, addrs, _ = start_ours(args, n, workdir, before)
            pid, out = cluster.children["a1"].pid, workdir / "probe-a1"
        if system != "bare" and args.subscribers > 0:
            argv = ["sub", "--arbiters", ",".join(addrs), "--count", str(args.subscribers)]
            subs = Process(procs, "sub", argv, workdir / "sub.log")
            if not subs.wait_for(lambda: subs.report.get("open", 0) >= args.subscribers, 60):
                raise RuntimeError(f"{args.subscribers} subscriptions not open within 60 s")
        extra = ["--wait-join", "--start-spread", "0.5", "--default-interval", str(args.interval)]
        if args.mode == "cluster" and system != "bare":
            extra += ["--interval-rule", "own"]
        fleet = Fleet(procs, addrs, n, args.procs, workdir, *extra)
        fleet.wait_ready()
        time.sleep(1.0)  # at rest, every connection dialled
        rss0 = rss_bytes(pid)  # before the probe, which allocates (its list of objects)
        p0 = take_probe(pid, out, 0)
        others = (
            {}
            if cluster is None
            else {rid: c.pid for rid, c in cluster.children.items() if rid != "a1"}
        )
        others0 = {rid: rss_bytes(q) for rid, q in others.items()}
        t_join = time.monotonic()
        started = 0
        while started < n:  # --ramp nodes a second, spread over the load processes
            step = min(args.ramp, n - started)
            for i, (_, _, p) in enumerate(fleet.parts):
                share = step // len(fleet.parts) + (1 if i < step % len(fleet.parts) else 0)
                p.send(f"join {share}")
            started += step
            time.sleep(1.0)

        def all_alive() -> bool:
            arbs = fleet.totals()["arbiters"] if fleet else []
            return len(arbs) == len(addrs) and all(a["states"].get("ALIVE", 0) >= n for a in arbs)

        if not wait_until(all_alive, args.join_timeout, 0.5):
            states = [(a["states"], a["errors"]) for a in fleet.totals()["arbiters"]]
            raise RuntimeError(
                f"{system}: not every node ALIVE within {args.join_timeout:g} s: {states}"
            )
        joined_s = time.monotonic() - t_join
        time.sleep(args.settle)
        samples = []
        for _ in range(int(args.window)):
            samples.append(rss_bytes(pid))
            time.sleep(1.0)
        tot = fleet.totals()
        rss1 = rss_bytes(pid)
        p1 = take_probe(pid, out, 1)
        trimmed = None
        if args.trim:  # what malloc_trim(0) gives back (memory_probe.py), after the probe
            os.kill(pid, signal.SIGUSR1)
            path = out / "trim-0.json"
            if wait_until(path.exists, 60, 0.1):
                trimmed = json.loads(path.read_text())
        a = tot["arbiters"][0]
        res = {
            "system": system,
            "n": n,
            "interval_s": n / a["required_rate"] if a["required_rate"] else None,
            "joined_s": joined_s,
            "rss0_mib": rss0 / 2**20,
            "rss1_mib": rss1 / 2**20,
            "kib_per_node": (rss1 - rss0) / n / 1024,
            "rss_drift_kib_per_node": (samples[-1] - samples[0]) / n / 1024 if samples else 0.0,
            "sent_rate": a["sent_rate"],
            "required_rate": a["required_rate"],
            "late_p99_ms": tot["late_p99_ms"],
            "probes": [p0, p1],
            "trim": trimmed,
        }
        # a2, a3 in cluster mode (light: their heartbeats come every --light-interval)
        res["others_kib_per_node"] = {
            rid: (rss_bytes(q) - others0[rid]) / n / 1024 for rid, q in others.items()
        }
        if trimmed is not None:
            say(
                f"{system} N={n}: malloc_trim(0) took {trimmed['s'] * 1000:.1f} ms, RSS "
                f"{trimmed['rss_before_kib'] / 1024:.1f} -> {trimmed['rss_after_kib'] / 1024:.1f} "
                f"MiB: {(trimmed['rss_after_kib'] * 1024 - rss0) / n / 1024:.1f} KiB/node after it"
            )
        say(
            f"{system} N={n}: {res['kib_per_node']:.1f} KiB/node (RSS {res['rss0_mib']:.1f} -> "
            f"{res['rss1_mib']:.1f} MiB, drift over the last {args.window:g} s "
            f"{res['rss_drift_kib_per_node']:+.2f} KiB/node), interval "
            f"{res['interval_s'] or 0:.3f} s, sent {a['sent_rate']:.0f}/"
            f"{a['required_rate']:.0f}/s, late p99 {tot['late_p99_ms']:.0f} ms"
        )
        return res
    finally:
        if fleet is not None:
            fleet.stop()
        if subs is not None:
            subs.stop()
        if bare is not None:
            Procs.kill(bare)
        if cluster is not None:
            cluster.kill_all()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", default="1000,3000", help="comma list of N")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--mode", choices=("single", "cluster"), default="single")
    p.add_argument("--systems", default="ours,bare", help="of ours, before, bare (run order)")
    p.add_argument("--before", type=Path, default=None, help="source tree of system 'before'")
    p.add_argument("--procs", type=int, default=2, help="load generator processes")
    p.add_argument("--ramp", type=int, default=500, help="nodes joining per second (N: a storm)")
    p.add_argument(
        "--subscribers", type=int, default=0, help="Subscribe streams open throughout (ours)"
    )
    p.add_argument("--settle", type=float, default=20.0, help="seconds after every node is ALIVE")
    p.add_argument("--window", type=float, default=5.0, help="seconds of RSS samples after it")
    p.add_argument("--join-timeout", type=float, default=120.0)
    p.add_argument("--light-interval", type=float, default=3.0, help="a2, a3 in cluster mode")
    p.add_argument(
        "--missed",
        type=float,
        default=20.0,
        help="--missed-heartbeats of the replicas (D / interval)",
    )
    p.add_argument(
        "--interval", type=float, default=0.6, help="the replicas' base heartbeat interval, s"
    )
    p.add_argument("--trace", type=int, default=0, help="tracemalloc frames (0: not traced)")
    p.add_argument("--top", type=int, default=25, help="lines of the tracemalloc breakdown")
    p.add_argument(
        "--trim",
        action="store_true",
        help="then call malloc_trim(0) in the server and print what RSS it gave back",
    )
    p.add_argument(
        "--replica-flag", action="append", default=[], help="one more flag of the replica (repeat)"
    )
    p.add_argument(
        "--bare-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a gRPC server option of the bare server (scale_bare.py --option; repeat)",
    )
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--keep-logs", type=Path, default=None, help="work in DIR and keep it")
    p.add_argument("--log-level", default="warning", help="of the replicas")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sizes = [int(x) for x in args.nodes.split(",") if x]
    systems = [s for s in args.systems.split(",") if s]
    if "before" in systems and args.before is None:
        p.error("system 'before' needs --before DIR")
    binary()
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        if args.keep_logs is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-memory-")))
        else:
            tmp = args.keep_logs.resolve()
            tmp.mkdir(parents=True, exist_ok=True)
        os.chdir(tmp)  # children's `python -m` puts their cwd first on sys.path: --before decides
        procs = Procs(tmp)
        try:
            for rnd in range(args.rounds):
                for n in sizes:
                    interval = args.interval
                    for system in systems:
                        r = measure(args, system, n, interval, procs, tmp / f"{system}-{n}-{rnd}")
                        r["round"] = rnd
                        if system != "bare" and r["interval_s"]:
                            interval = r["interval_s"]
                        r["breakdown"] = breakdown(r, args.top)
                        results.append(r)
        finally:
            procs.kill_all()
        print(table(args, sizes, systems, results))
        for r in results:
            if r["round"] == args.rounds - 1:
                print_breakdown(r)
    if args.json is not None:
        for r in results:
            r.pop("probes", None)
        args.json.write_text(json.dumps({"args": vars(args), "results": results}, indent=2,
                                        default=str) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
