"""Scale benchmark: our replica per heartbeat against bare gRPC and etcd, N = 100 .. 10,000.

    python bench/scale.py                         # N = 100, 1000, 3000, 10000 (~15 min)
    python bench/scale.py --sizes 100,1000 --quick  # ~3 min

For every N, one after the other (never two systems at once), on loopback:

1. ours: a fresh 3-replica cluster (``membership arbiter --insecure``:
   bench/tls_cost.py measures TLS) with ``--metrics-listen``, and limits
   raised to what N needs (``--max-nodes``, ``--max-heartbeat-streams``,
   ``--max-subscribers``). 1,000 subscribers (``--subscribers``) and N
   simulated nodes come from the Go load generator (bench/loadgen/, built
   from Debian's packages on first use): each node a real Heartbeat stream to
   every replica, following the acks' next_interval_seconds as the SDK does.
   Measured: the join storm (N nodes started uniformly within N /
   ``--join-rate`` seconds, at least 1 s: 1,000 joins a second at every N, or
   within ``--join-spread`` seconds), from the first start until the view has
   N ALIVE, and the epochs it took; then a steady window (``--window`` s):
   each replica's CPU from /proc divided by the heartbeats its own counter
   received (CPU per heartbeat), heartbeats/s and per core, RSS growth per
   node (RSS with N joined minus RSS before the join, / N), ack latency
   p50/p99 as the load generator saw it; then ``--kills`` nodes stopped
   abruptly one at a time (streams cancelled, no Leave), kill to DEAD at the
   first and the last subscriber; commit-to-subscriber p50/p99 from the
   replicas' histogram (membership_commit_to_subscriber_seconds: bucket upper
   bounds); elections (Raft term changes) and false DEATHs (a DEAD of a node
   not killed).
   Above ``--full-load-max`` nodes (3,000) two cores cannot carry three fully
   loaded replicas plus the load: a1 is loaded fully, a2 and a3 lightly
   (started with ``--heartbeat-interval/--max-heartbeat-interval
   --light-interval`` (3 s) and ``--missed-heartbeats --light-missed`` (2),
   and heartbeated at their own suggestion: ``--interval-rule own``); the
   table says so, and a DEAD then waits for a light replica's D (6 s).
2. bare: one bare grpc.aio server (bench/scale_bare.py: decodes every
   HeartbeatRequest and answers a HeartbeatAck, nothing else) given the
   same N streams at the interval a1 suggested: the load of one replica.
   CPU per heartbeat, RSS per node, ack latency; ours / bare is the ratio.
3. etcd: a fresh 3-member etcd (Debian's etcd-server), N leases at its
   minimum TTL kept alive as etcd's clientv3 does (a LeaseKeepAlive stream
   per lease), a key each, a watcher on the prefix: renewals/s, the members'
   CPU per renewal, leases expired though renewed, kill to the watcher's
   DELETE (bench/scale_etcd.py; docs/scale.md, "The etcd column").

``--hogs K`` runs K busy-loop processes for the whole run (the issue's
"CPU hogs on both cores"), at ``--hog-nice`` (0: the replicas' priority);
``--loadgen-nice -10`` puts the load generator above them, so that a
starved replica is not taken for a starved client. The load generator
records each node's own send gaps (between two heartbeats it created on a
link that had granted a lease), and a false DEATH is split: ``fD late`` counts
those whose node had a gap longer than ``LATE_RATIO`` (1.5) times its
interval (the node itself was late), the rest are the replicas' fault.
Every figure is of this run; the load generator's
own figures (rate achieved against the rate the intervals in force require,
the lateness of its sends, its CPU) are in the table so that a limit of the
load is never taken for one of the server. Writes bench/results/scale.txt
(the table), scale.json (everything) and scale.png (CPU per heartbeat and
detection time against N). No test asserts a speed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from detection_common import T0, Procs, say
from loadgen import binary
from scale_common import spread_words, start_hogs
from scale_etcd import etcd_table, run_etcd
from scale_ours import light, run_bare, run_ours

RESULTS = Path(__file__).resolve().parent / "results"


def _f(v: Any, fmt: str = ".0f", scale: float = 1.0) -> str:
    if v is None or (isinstance(v, float) and math.isinf(v)):
        return "-" if v is None else "inf"
    return format(v * scale, fmt)


def table(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    """The text table: per N a row for ours (a1, the fully loaded replica), bare and etcd."""
    head = (
        f"{'N':>6} {'system':<15} {'iv s':>5} {'hb/s':>6} {'cores':>5} {'us/hb':>6} {'ratio':>5} "
        f"{'hb/s/core':>9} {'KiB/node':>8} {'ack p50/p99 ms':>14} {'join s/epochs':>13} "
        f"{'commit->sub p50/p99 ms':>22} {'kill->DEAD p50/p99 s':>20} {'elect':>5} {'falseD':>6} "
        f"{'fD late':>7} "
        f"{'subs':>6} "
        f"{'| loadgen sent/required/s':>25} {'late p99 ms':>11} {'stale/s':>7} {'lg cores':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        n = r["n"]
        o, b, e = r.get("ours"), r.get("bare"), r.get("etcd")
        if o and "replicas" in o:
            a1 = o["replicas"]["a1"]
            ratio = (
                a1["cpu_us_per_hb"] / b["cpu_us_per_hb"]
                if b and b.get("cpu_us_per_hb") and a1["cpu_us_per_hb"]
                else None
            )
            js = f"{_f(o['join_s'], '.2f')}/{o['join_epochs']}"
            commit = (
                f"{_f(o['commit_to_sub_kills_p50_s'], '.1f', 1e3)}/"
                f"{_f(o['commit_to_sub_kills_p99_s'], '.1f', 1e3)} "
                f"({_f(o['commit_to_sub_p99_s'], '.0f', 1e3)})"
            )
            if o["join_s"] is None:
                js = f"no:{o.get('join_alive')}/{o['join_epochs']}"
            lines.append(
                f"{n:>6} {'ours a1' + (' (loaded)' if o['light'] else ''):<15} "
                f"{_f(o.get('interval_s'), '.2f'):>5} "
                f"{a1['hb_per_s']:>6.0f} {a1['cores']:>5.2f} {_f(a1['cpu_us_per_hb']):>6} "
                f"{_f(ratio, '.2f'):>5} {_f(a1['hb_per_s_per_core']):>9} "
                f"{a1['rss_kib_per_node']:>8.1f} "
                f"{_f(a1['ack_p50_ms'], '.1f') + '/' + _f(a1['ack_p99_ms'], '.1f'):>14} {js:>13} "
                f"{commit:>22} "
                f"{_f(o['kill_p50_s'], '.2f') + '/' + _f(o['kill_p99_s'], '.2f'):>20} "
                f"{o['elections']:>5} {len(o['false_deaths']):>6} "
                f"{_f(o.get('false_deaths_late_count')):>7} "
                f"{o['subs_min']:>6} "
                f"{'| ' + _f(a1['sent_rate']) + '/' + _f(a1['required_rate']):>25} "
                f"{_f(a1['late_p99_ms'], '.1f'):>11} {_f(a1.get('stale_per_s')):>7} "
                f"{o['loadgen']['cores']:>8.2f}"
            )
            for rid in ("a2", "a3"):
                x = o["replicas"][rid]
                lines.append(
                    f"{'':>6} {'  ' + rid:<15} {'':>5} {x['hb_per_s']:>6.0f} {x['cores']:>5.2f} "
                    f"{_f(x['cpu_us_per_hb']):>6} {'':>5} {_f(x['hb_per_s_per_core']):>9} "
                    f"{x['rss_kib_per_node']:>8.1f} "
                    f"{_f(x['ack_p50_ms'], '.1f') + '/' + _f(x['ack_p99_ms'], '.1f'):>14}"
                )
        elif o:
            lines.append(f"{n:>6} {'ours':<15} failed: {o.get('error')}")
        if b and "hb_per_s" in b:
            lines.append(
                f"{'':>6} {'bare grpc.aio':<15} {b['interval_s']:>5.2f} "
                f"{b['hb_per_s']:>6.0f} {b['cores']:>5.2f} "
                f"{_f(b['cpu_us_per_hb']):>6} {'1':>5} {_f(b['hb_per_s_per_core']):>9} "
                f"{b['rss_kib_per_node']:>8.1f} "
                f"{_f(b['ack_p50_ms'], '.1f') + '/' + _f(b['ack_p99_ms'], '.1f'):>14} "
                f"{'':>13} {'':>22} {'':>20} {'':>5} {'':>6} {'':>6} "
                f"{'| ' + _f(b['sent_rate']) + '/' + _f(b['required_rate']):>25} "
                f"{_f(b['late_p99_ms'], '.1f'):>11} {_f(b.get('stale_per_s')):>7} "
                f"{b['loadgen']['cores']:>8.2f}"
            )
        elif b:
            lines.append(f"{'':>6} {'bare grpc.aio':<15} failed: {b.get('error')}")
        if e and "cores" in e:
            lines.append(
                f"{'':>6} {'etcd x3':<15} {_f(e['period_s'], '.2f'):>5} "
                f"{e['renewed_per_s']:>6.0f} {e['cores']:>5.2f} "
                f"{_f(e['cpu_us_per_keepalive']):>6} {'':>5} {'':>9} {'':>8} {'':>14} {'':>13} "
                f"{'':>22} {_f(e['kill_p50_s'], '.2f') + '/' + _f(e['kill_p99_s'], '.2f'):>20} "
                f"{e['leader_changes_window'] + e['leader_changes_kills']:>5.0f} "
                f"{e['false_expiries_window']:>6} {'':>6} "
                f"{'| ' + _f(e['keepalives_per_s']) + '/' + _f(e['required_rate']):>25} "
                f"{_f(e['late_p99_ms'], '.1f'):>11} {'':>7} {e['loadgen']['cores']:>8.2f}"
            )
        elif e:
            lines.append(f"{'':>6} {'etcd x3':<15} failed: {e.get('error')}")
    notes = [
        "",
        f"ours: 3 replicas --insecure on loopback, --ingest-workers {args.ingest_workers} (CPU and",
        "RSS of a replica include its workers); a1's figures (CPU/hb = replica CPU from /proc /",
        "heartbeats its counter received; ratio = ours / bare in this run). KiB/node = RSS growth",
        "from before the join to after the window, / N. hb/s is per replica. join: N nodes started",
        f"uniformly within {spread_words(args)}, from the first start until the first",
        f"subscriber's view has N ALIVE; {args.subscribers} subscribers.",
        "commit->sub: the replicas' membership_commit_to_subscriber_seconds (bucket upper bounds)",
        "over the kills (steady state); in brackets the p99 over the whole run, join storm",
        "included. subs: the fewest subscribers that received an epoch within 5 s of the first.",
        "kill->DEAD: p50 at the first subscriber, p99 at the last. elect = Raft term changes after",
        "the first election. falseD = DEAD of a node not killed; fD late = of those, nodes",
        "whose own send gaps exceeded 1.5 intervals (the rest: the replicas' fault).",
        "iv s: the heartbeat interval",
        "(ours: N / the rate a1's suggestions require; etcd: the renewal period, see below).",
        f"(loaded): above N = {args.full_load_max} a1 alone is fully loaded; a2 and a3 run "
        "light, at --heartbeat-interval "
        f"max({args.light_interval:g}, N / {args.light_rate:g}) s,",
        f"--missed-heartbeats {args.light_missed} (D = {args.light_missed:g} x that), so a DEAD "
        "waits for that D; a1 is fully loaded.",
        f"--heartbeat-budget: {args.budget or 'the lan preset (5000/s)'} on every replica"
        f"; --election-timeout {args.election_timeout or 'the lan preset (1 s)'}.",
        "bare: one bare grpc.aio server (bench/scale_bare.py) given N streams at a1's interval.",
        "etcd x3: 3 members, N leases at the minimum TTL kept alive as clientv3 does; hb/s and",
        "us/hb = renewals/s and the members' CPU per renewal; kill->DEAD = kill to the watcher's",
        "DELETE; elect = leader changes in the window and the kills; falseD = DELETEs of leases",
        "not killed after the grants (details below the notes).",
        "loadgen: what the Go load generator sent against what the intervals in force require, the",
        "p99 lateness of its sends (send time - schedule), stale/s: heartbeats replaced unwritten",
        "by a newer one because the stream's writes blocked (the server did not read: HTTP/2 flow",
        "control; as the SDK, each stream writes only its newest), and its CPU. The load was not",
        "the limit where sent = required and lateness is small.",
        f"hogs: {args.hogs} busy-loop processes during the run. Machine: "
        f"{__import__('os').cpu_count()} cores, shared.",
    ]
    return "\n".join(lines + notes + etcd_table(args, rows)) + "\n"


def write_png(rows: list[dict[str, Any]], path: Path) -> bool:
    """CPU per heartbeat (ours a1, bare, etcd per keepalive) and detection p50/p99 against N."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("no matplotlib (pip install -e '.[bench]'): no PNG written")
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5))

    def series(key: str, get: Any) -> tuple[list[int], list[float]]:
        xs, ys = [], []
        for r in rows:
            with contextlib.suppress(KeyError, TypeError):
                v = get(r[key])
                if v is not None:
                    xs.append(r["n"])
                    ys.append(v)
        return xs, ys

    for label, key, get in (
        ("ours (a1)", "ours", lambda o: o["replicas"]["a1"]["cpu_us_per_hb"]),
        ("bare grpc.aio", "bare", lambda b: b["cpu_us_per_hb"]),
        ("etcd x3, per keepalive", "etcd", lambda e: e["cpu_us_per_keepalive"]),
    ):
        ax1.plot(*series(key, get), marker="o", label=label)
    ax1.set(
        xscale="log", xlabel="nodes N", ylabel="CPU µs per heartbeat", title="CPU per heartbeat"
    )
    for label, key, get in (
        ("ours p50", "ours", lambda o: o["kill_p50_s"]),
        ("ours p99", "ours", lambda o: o["kill_p99_s"]),
        ("etcd p50", "etcd", lambda e: e["kill_p50_s"]),
        ("etcd p99", "etcd", lambda e: e["kill_p99_s"]),
    ):
        ax2.plot(*series(key, get), marker="o", label=label)
    ax2.set(xscale="log", xlabel="nodes N", ylabel="seconds", title="kill to DEAD at subscriber")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend()
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def bare_interval(n: int, ours: dict[str, Any] | None) -> float:
    """The interval the bare server suggests: a1's in ours' steady window when the join
    completed, otherwise what a replica's lan defaults suggest for N nodes
    (arbiter.core.detection.suggest_interval): not the 0.15 s of nodes still joining."""
    if ours and ours.get("join_s") is not None and ours.get("interval_s"):
        return float(ours["interval_s"])
    from arbiter.config import ArbiterConfig
    from arbiter.core.detection import suggest_interval

    cfg = ArbiterConfig.lan()
    return suggest_interval(
        n,
        base=cfg.heartbeat_interval,
        budget=cfg.heartbeat_budget,
        maximum=cfg.max_heartbeat_interval,
    )


def _one(
    args: argparse.Namespace, key: str, n: int, row: dict[str, Any], procs: Procs, work: Path
) -> dict[str, Any] | None:
    """One system at one N; a failure is recorded (the other systems' figures are kept)."""
    try:
        if key == "ours":
            return run_ours(args, n, procs, work / f"ours-{n}")
        if key == "bare":
            return run_bare(args, n, bare_interval(n, row.get("ours")), procs, work / f"bare-{n}")
        return run_etcd(args, n, procs, work / f"etcd-{n}")
    except Exception as e:
        say(f"{key} N={n} failed: {e!r}")
        return {"error": repr(e)}


def run(args: argparse.Namespace) -> int:
    """Every N, ours then bare then etcd; writes the results. Returns 1 when a system
    failed at some N (its row says why), else 0."""
    binary()  # build (and install Go) before anything is timed
    work = Path(args.keep_logs) if args.keep_logs else Path(tempfile.mkdtemp(prefix="scale-"))
    work.mkdir(parents=True, exist_ok=True)
    procs = Procs(work)
    rows: list[dict[str, Any]] = []
    try:
        if args.hogs:
            start_hogs(procs, args.hogs, args.hog_nice)
            say(f"{args.hogs} CPU hogs running at nice {args.hog_nice}")
        for n in args.sizes:
            row: dict[str, Any] = {"n": n}
            rows.append(row)
            for key in ("ours", "bare", "etcd"):
                if key not in args.skip:
                    row[key] = _one(args, key, n, row, procs, work)
            if "ours" in row and row["ours"] and light(args, n):
                row["ours"]["note"] = "a2, a3 lightly loaded"
    finally:
        procs.kill_all()
        if not args.keep_logs:
            shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = table(args, rows)
    print(text)
    (out / "scale.txt").write_text(text)
    meta = {k: v for k, v in vars(args).items()}
    (out / "scale.json").write_text(json.dumps({"args": meta, "rows": rows}, indent=1, default=str))
    write_png(rows, out / "scale.png")
    say(f"wrote {out}/scale.txt, scale.json, scale.png in {time.monotonic() - T0:.0f} s")
    failed = [f"{k} N={r['n']}" for r in rows for k in ("ours", "bare", "etcd") if _failed(r, k)]
    if failed:
        say(f"failed: {', '.join(failed)} (see the rows)")
        return 1
    return 0


def _failed(row: dict[str, Any], key: str) -> bool:
    """True when system ``key`` ran at this row's N and failed."""
    return key in row and (not row[key] or "error" in row[key])


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuses what cannot make a run (exit 2 through ``p.error``), before anything starts."""
    try:
        args.sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        p.error(f"--sizes must be a comma list of node counts, got {args.sizes!r}")
    if not args.sizes or min(args.sizes) < 1:
        p.error(f"--sizes needs node counts >= 1, got {args.sizes}")
    args.skip = {x.strip() for x in args.skip.split(",") if x.strip()}
    if args.skip - SYSTEMS:
        p.error(
            f"--skip takes {', '.join(sorted(SYSTEMS))}; unknown: {sorted(args.skip - SYSTEMS)}"
        )
    if args.skip == SYSTEMS:
        p.error("--skip leaves no system to run")
    try:
        args.etcd_timing = tuple(int(x) for x in args.etcd_timing.split(","))
    except ValueError:
        p.error(
            f"--etcd-timing must be two integers HEARTBEAT,ELECTION (ms), got {args.etcd_timing!r}"
        )
    if len(args.etcd_timing) != 2 or not 0 < args.etcd_timing[0] < args.etcd_timing[1]:
        p.error(
            f"--etcd-timing needs 0 < heartbeat < election timeout (ms), got {args.etcd_timing}"
        )
    at_least = {
        "procs": 1, "subscribers": 0, "kills": 0, "hogs": 0,
        "full_load_max": 0, "etcd_grant_concurrency": 1, "etcd_leases_per_client": 0,
    }  # fmt: skip
    for name, low in at_least.items():
        if getattr(args, name) < low:
            p.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
    positive = [
        "window", "kill_timeout", "join_timeout", "join_rate", "light_interval", "light_rate",
        "light_missed", "etcd_grant_timeout", "budget", "election_timeout", "join_spread",
    ]  # fmt: skip
    for name in positive:
        value = getattr(args, name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            p.error(f"--{name.replace('_', '-')} must be a finite number > 0, got {value}")
    if not (args.ingest_workers == "auto" or args.ingest_workers.isdigit()):
        p.error(f"--ingest-workers must be 'auto' or a count >= 0, got {args.ingest_workers!r}")
    for name in ("hog_nice", "loadgen_nice"):
        if not -20 <= getattr(args, name) <= 19:
            p.error(f"--{name.replace('_', '-')} must be in -20..19, got {getattr(args, name)}")
    if min(args.hog_nice, args.loadgen_nice) < 0 and os.geteuid() != 0:
        p.error("a negative --hog-nice or --loadgen-nice needs root")
    if not (args.settle >= 0 and math.isfinite(args.settle)):
        p.error(f"--settle must be a finite number >= 0, got {args.settle}")
    for flag, path in (("--out", args.out), ("--keep-logs", args.keep_logs)):
        if path is None:
            continue
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
            probe = Path(path) / f".scale-write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            p.error(f"{flag} {path}: not a writable directory ({e.strerror or e})")


SYSTEMS = frozenset({"ours", "bare", "etcd"})


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--sizes", default="100,1000,3000,10000", help="comma list of N")
    p.add_argument(
        "--quick", action="store_true", help="short windows and 3 kills (~3 min for 100,1000)"
    )
    p.add_argument("--subscribers", type=int, default=1000)
    p.add_argument("--procs", type=int, default=2, help="load generator processes")
    p.add_argument("--window", type=float, help="steady window, seconds (10; --quick: 5)")
    p.add_argument(
        "--settle", type=float, help="seconds after the join before the window (3; --quick: 2)"
    )
    p.add_argument("--kills", type=int, help="nodes killed one at a time (5; --quick: 3)")
    p.add_argument("--kill-timeout", type=float, default=20.0)
    p.add_argument("--join-timeout", type=float, default=60.0)
    p.add_argument(
        "--join-rate",
        type=float,
        default=1000.0,
        help="joins per second of the storm: N nodes start uniformly within N / this many "
        "seconds, at least 1 s (the issue's '1,000 joins arriving within a second', at "
        "every N)",
    )
    p.add_argument(
        "--join-spread",
        type=float,
        default=None,
        help="seconds within which the storm's nodes start (overrides --join-rate)",
    )
    p.add_argument("--hogs", type=int, default=0, help="busy-loop processes for the whole run")
    p.add_argument(
        "--hog-nice", type=int, default=0, help="nice value of the hogs (0: the replicas')"
    )
    p.add_argument(
        "--loadgen-nice",
        type=int,
        default=0,
        help="nice value of the load generator processes (-10: above the hogs; needs root below 0)",
    )
    p.add_argument(
        "--ingest-workers",
        default="0",
        help="--ingest-workers of our replicas (0: one process each; CPU and memory count "
        "a replica's workers too)",
    )
    p.add_argument("--full-load-max", type=int, default=3000, help="above it a2, a3 are light")
    p.add_argument("--light-interval", type=float, default=3.0)
    p.add_argument(
        "--light-rate",
        type=float,
        default=1000.0,
        help="heartbeats/s a light replica is given at most: its interval is N / this when "
        "longer than --light-interval",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="--heartbeat-budget of every replica (heartbeats/s; default the lan preset's "
        "5000): what one replica may take on this machine",
    )
    p.add_argument(
        "--election-timeout",
        type=float,
        default=None,
        help="--election-timeout of every replica (seconds; default the lan preset's 1.0)",
    )
    p.add_argument("--light-missed", type=float, default=2.0)
    p.add_argument(
        "--etcd-timing",
        default="50,500",
        help="etcd's --heartbeat-interval,--election-timeout in ms (50,500: minimum TTL 1 s; "
        "etcd's defaults 100,1000: 2 s)",
    )
    p.add_argument(
        "--etcd-leases-per-client",
        type=int,
        default=1,
        help="leases multiplexed on one clientv3 client's keepalive stream (1: a client per "
        "node; 0: one client per load generator process)",
    )
    p.add_argument(
        "--etcd-tmpfs",
        action="store_true",
        help="etcd's data dirs in /dev/shm: no disk (a diagnosis; ours stays on disk)",
    )
    p.add_argument(
        "--etcd-cadence",
        choices=("clientv3", "fixed"),
        default="clientv3",
        help="renewals as etcd's clientv3 (500 ms passes, TTL/3 after an answer) or every TTL/3",
    )
    p.add_argument("--etcd-grant-concurrency", type=int, default=64, help="per load generator")
    p.add_argument(
        "--etcd-grant-timeout", type=float, default=300.0, help="seconds for all leases' grants"
    )
    p.add_argument("--skip", default="", help="comma list of systems not to run: ours,bare,etcd")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--keep-logs", metavar="DIR", help="keep every process's log in DIR")
    args = p.parse_args()
    if args.quick:  # shorter defaults; a flag given explicitly is kept
        for name, value in (("window", 5.0), ("settle", 2.0), ("kills", 3)):
            if getattr(args, name) is None:
                setattr(args, name, value)
    for name, value in (("window", 10.0), ("settle", 3.0), ("kills", 5)):
        if getattr(args, name) is None:
            setattr(args, name, value)
    _check(p, args)
    # SIGTERM ends the run as Ctrl-C does: processes killed, the work dir removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return run(args)
    except KeyboardInterrupt:
        say("interrupted: every process stopped")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
