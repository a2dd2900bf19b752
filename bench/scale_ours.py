"""The scale benchmark's runs of our 3-replica cluster and of the bare grpc.aio baseline
(bench/scale.py). Not a program of its own."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from detection_common import Procs, say
from loadgen import Fleet, Process
from scale_common import (
    cpu_seconds,
    histogram_delta,
    histogram_quantile,
    join_spread,
    metric,
    pct,
    rss_bytes,
    scrape,
    tree_cpu_seconds,
    tree_rss_bytes,
    victims,
    wait_until,
)

from membership.testing.localcluster import LocalCluster, free_ports

BENCH = Path(__file__).resolve().parent
# A node is late itself when one of its own send gaps (hb.go's gaps command: between
# two heartbeats it created on a link that had granted a lease) exceeded this many
# intervals; a false DEATH of a node that was not is the replicas' fault.
LATE_RATIO = 1.5


def light(args: argparse.Namespace, n: int) -> bool:
    """Whether a2 and a3 are lightly loaded at this N (two cores cannot carry three full ones)."""
    return bool(n > args.full_load_max)


def light_interval(args: argparse.Namespace, n: int) -> float:
    """The light replicas' heartbeat interval at ``n`` nodes (seconds): ``--light-interval``,
    longer where that would give a light replica more than ``--light-rate`` heartbeats/s."""
    return max(args.light_interval, n / args.light_rate)


def _window(fleet: Fleet, seconds: float) -> list[dict[str, Any]]:
    """The fleet's summed reports, one a second, for ``seconds``."""
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        out.append(fleet.totals())
    return out


def _loadgen_figures(reports: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """What the load generator achieved over a window, for arbiter ``k``."""
    req = [r["arbiters"][k]["required_rate"] for r in reports if r["arbiters"]]
    stale = [r["arbiters"][k]["stale"] for r in reports if r["arbiters"]]
    sent = [r["arbiters"][k]["sent_rate"] for r in reports if r["arbiters"]]
    return {
        "required_rate": statistics.median(req) if req else 0.0,
        "sent_rate": statistics.median(sent) if sent else 0.0,
        # heartbeats dropped unwritten because the stream's writes blocked (flow control:
        # the replica did not read), per second over the window
        "stale_per_s": (stale[-1] - stale[0]) / max(1, len(stale) - 1) if stale else 0.0,
        "late_p50_ms": statistics.median(r["late_p50_ms"] for r in reports) if reports else None,
        "late_p99_ms": max((r["late_p99_ms"] for r in reports), default=None),
        "late_max_ms": max((r["late_max_ms"] for r in reports), default=None),
        "ack_p50_ms": statistics.median(r["arbiters"][k]["ack_p50_ms"] for r in reports)
        if reports
        else None,
        "ack_p99_ms": max((r["arbiters"][k]["ack_p99_ms"] for r in reports), default=None),
    }


def run_ours(args: argparse.Namespace, n: int, procs: Procs, workdir: Path) -> dict[str, Any]:
    """One N against a fresh local 3-replica cluster (``--insecure``); returns its figures."""
    workdir.mkdir(parents=True, exist_ok=True)
    lightly = light(args, n)
    cluster = LocalCluster(workdir, tls=False, log_level="warning", merge_output=True)
    ports, mports = free_ports(3), free_ports(3)
    cluster.arbiters = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    maddr = {rid: f"127.0.0.1:{mports[i]}" for i, rid in enumerate(cluster.arbiters)}
    limits = [
        *("--max-nodes", str(2 * n + 100), "--max-heartbeat-streams", str(3 * n + 200)),
        *("--max-subscribers", str(args.subscribers + 100)),
        *("--ingest-workers", str(args.ingest_workers)),
    ]
    res: dict[str, Any] = {
        "n": n,
        "light": lightly,
        "subscribers": args.subscribers,
        "ingest_workers": args.ingest_workers,
        "join_spread_s": join_spread(args, n),
        "light_interval_s": light_interval(args, n) if lightly else None,
        "budget": args.budget,
        "election_timeout": args.election_timeout,
    }
    fleet = subs = None
    try:
        for rid in cluster.arbiters:
            extra = [*limits, "--metrics-listen", maddr[rid]]
            if args.budget is not None:
                extra += ["--heartbeat-budget", str(args.budget)]
            if args.election_timeout is not None:
                extra += ["--election-timeout", str(args.election_timeout)]
            if lightly and rid != "a1":
                light_s = res["light_interval_s"]
                iv = f"{light_s:g}"
                extra += ["--heartbeat-interval", iv, "--max-heartbeat-interval", iv]
                extra += ["--missed-heartbeats", str(args.light_missed)]
                # a lease granted before a crash is honoured after it (config rule): the
                # grace covers the longest lease, D at this interval
                extra += ["--restart-grace", f"{light_s * args.light_missed + 1:g}"]
            cluster.start_arbiter(rid, *extra)
        pids = {rid: c.pid for rid, c in cluster.children.items()}

        def leader_ready() -> bool:
            for rid, child in cluster.children.items():
                if not child.alive():
                    tail = child.lines()[-3:]
                    raise RuntimeError(f"replica {rid} exited: {' / '.join(tail)}")
            ms = [scrape(maddr[r]) for r in cluster.arbiters]
            return all(metric(m, "membership_in_quorum") == 1 for m in ms) and any(
                metric(m, "membership_raft_role", role="leader") == 1 for m in ms
            )

        if not wait_until(leader_ready, 30):
            raise RuntimeError("the cluster elected no leader within 30 s")
        addrs = cluster.addresses
        subs = Process(
            procs, "sub", ["sub", "--arbiters", ",".join(addrs), "--count", str(args.subscribers)],
            workdir / "sub.log",
        )  # fmt: skip
        if not subs.wait_for(lambda: subs.report.get("open", 0) >= args.subscribers, 60):
            raise RuntimeError(f"{args.subscribers} subscriptions not open within 60 s")
        extra_hb = ["--wait-join", "--start-spread", str(res["join_spread_s"])]
        extra_hb += ["--interval-rule", "own"] if lightly else []
        fleet = Fleet(procs, addrs, n, args.procs, workdir, *extra_hb, nice=args.loadgen_nice)
        fleet.wait_ready()
        time.sleep(1.0)  # the replicas' memory at rest, subscribers open
        rss0 = {r: tree_rss_bytes(p) for r, p in pids.items()}
        m0 = {r: scrape(maddr[r]) for r in cluster.arbiters}
        epoch0 = max(metric(m, "membership_epoch") for m in m0.values())
        term0 = max(metric(m, "membership_raft_term") for m in m0.values())
        say(f"ours N={n}: {args.subscribers} subscribers open; join storm of {n} nodes ...")

        def storm_done() -> bool:
            return any(e.get("ev") == "epoch" and e["alive"] >= n for e in subs.events)

        t_join = fleet.join()
        ok = subs.wait_for(storm_done, args.join_timeout)
        ep = [e for e in subs.events if e.get("ev") == "epoch"]
        if ok:
            done = next(e for e in ep if e["alive"] >= n)
            res["join_s"] = done["first"] - t_join
            res["join_epochs"] = int(done["epoch"] - epoch0)
        else:
            res["join_s"] = None
            res["join_alive"] = max((e["alive"] for e in ep), default=0)
            res["join_epochs"] = int(max((e["epoch"] for e in ep), default=epoch0) - epoch0)
        took = "not done" if res["join_s"] is None else f"{res['join_s']:.2f} s"
        say(f"ours N={n}: join storm {took}, {res['join_epochs']} epochs")
        time.sleep(args.settle)
        # The steady window: CPU from /proc, heartbeats from the replicas' own counters.
        c0 = {r: tree_cpu_seconds(p) for r, p in pids.items()}
        h0 = {r: scrape(maddr[r]) for r in cluster.arbiters}
        lg0, t0 = fleet.cpu(), time.monotonic()
        reports = _window(fleet, args.window)
        dt = time.monotonic() - t0
        c1 = {r: tree_cpu_seconds(p) for r, p in pids.items()}
        h1 = {r: scrape(maddr[r]) for r in cluster.arbiters}
        lg1 = fleet.cpu()
        rss1 = {r: tree_rss_bytes(p) for r, p in pids.items()}
        per: dict[str, Any] = {}
        for k, r in enumerate(sorted(cluster.arbiters)):
            hb = metric(h1[r], "membership_heartbeats_received_total") - metric(
                h0[r], "membership_heartbeats_received_total"
            )
            cpu = c1[r] - c0[r]
            per[r] = {
                "hb_per_s": hb / dt,
                "cores": cpu / dt,
                "cpu_us_per_hb": cpu / hb * 1e6 if hb else None,
                "hb_per_s_per_core": hb / cpu if cpu else None,
                "rss_kib_per_node": (rss1[r] - rss0[r]) / n / 1024,
                "rss_mib": rss1[r] / 2**20,
                **_loadgen_figures(reports, k),
            }
        res["replicas"] = per
        res["loadgen"] = {"cores": (lg1 - lg0) / dt, "processes": len(fleet.parts)}
        a1 = per["a1"]
        res["interval_s"] = n / a1["required_rate"] if a1["required_rate"] else None
        say(
            f"ours N={n}: a1 {a1['hb_per_s']:.0f} hb/s, {a1['cpu_us_per_hb'] or 0:.0f} us/hb, "
            f"{a1['rss_kib_per_node']:.1f} KiB/node; loadgen sent {a1['sent_rate']:.0f}/s of "
            f"{a1['required_rate']:.0f}/s required, late p99 {a1['late_p99_ms']} ms"
        )
        # Kills, one at a time, each timed to the first and the last subscriber's DEAD.
        mk = {r: scrape(maddr[r]) for r in cluster.arbiters}
        gone = {d for e in subs.events if e.get("ev") == "epoch" for d in (e["dead"] or ())}
        chosen = victims(n, args.kills, gone)
        if res["join_s"] is None:  # not every node is a member: a kill could not be timed
            say(f"ours N={n}: no kills (the join storm did not complete)")
            chosen = []
        first_s, last_s = [], []
        for v in chosen:
            killed = fleet.kill(v).event("killed", v, 5)

            def dead(
                v: str = v, t: float = killed["t"] if killed else 0.0
            ) -> dict[str, Any] | None:
                return next(
                    (
                        e
                        for e in subs.events
                        if e.get("ev") == "epoch" and v in (e["dead"] or ()) and e["first"] >= t
                    ),
                    None,
                )

            if killed and subs.wait_for(lambda: dead() is not None, args.kill_timeout):
                e = dead()
                assert e is not None
                first_s.append(e["first"] - killed["t"])
                last_s.append(e["last"] - killed["t"])
        res["kills"] = len(chosen)
        res["kill_to_dead_s"] = first_s
        res["kill_to_dead_last_s"] = last_s
        res["kill_p50_s"], res["kill_p99_s"] = pct(first_s, 50), pct(last_s, 99)
        say(f"ours N={n}: kill-to-DEAD (first subscriber) {[round(x, 2) for x in first_s]}")
        m2 = {r: scrape(maddr[r]) for r in cluster.arbiters}
        name = "membership_commit_to_subscriber_seconds"
        deltas = [histogram_delta(m2[r], m0[r], name) for r in cluster.arbiters]
        res["commit_to_sub_p50_s"] = histogram_quantile(deltas, name, 0.5)
        res["commit_to_sub_p99_s"] = histogram_quantile(deltas, name, 0.99)
        # the same over the kills only (steady state, the join storm's burst excluded)
        deltas = [histogram_delta(m2[r], mk[r], name) for r in cluster.arbiters]
        res["commit_to_sub_kills_p50_s"] = histogram_quantile(deltas, name, 0.5)
        res["commit_to_sub_kills_p99_s"] = histogram_quantile(deltas, name, 0.99)
        spread = [e["last"] - e["first"] for e in subs.events if e.get("ev") == "epoch"]
        res["sub_spread_p99_s"] = pct(spread, 99)
        # subscribers that received every change (the others lag: their epochs came
        # later than --epoch-wait, 5 s, or never)
        res["subs_min"] = min((e["subs"] for e in subs.events if e.get("ev") == "epoch"), default=0)
        res["elections"] = int(max(metric(m, "membership_raft_term") for m in m2.values()) - term0)
        # a DEAD of a node not killed, or before it was
        kill_t = {e["node"]: e["t"] for e in fleet.events("killed")}
        res["false_deaths"] = sorted(
            {
                d
                for e in subs.events
                if e.get("ev") == "epoch"
                for d in (e["dead"] or ())
                if e["first"] < kill_t.get(d, float("inf"))
            }
        )
        # split by the nodes' own send gaps: late when one exceeded LATE_RATIO intervals
        gaps = fleet.gaps(res["false_deaths"])
        res["false_deaths_gaps"] = {v: round(g["max_ratio"], 2) for v, g in gaps.items()}
        res["false_deaths_late"] = sorted(v for v, r in gaps.items() if r["max_ratio"] > LATE_RATIO)
        res["false_deaths_late_count"] = len(res["false_deaths_late"])
        if res["false_deaths"]:
            say(
                f"ours N={n}: {len(res['false_deaths'])} false DEATHs, "
                f"{res['false_deaths_late_count']} of nodes late themselves (gap > "
                f"{LATE_RATIO} intervals); the longest gap / interval of each: "
                f"{res['false_deaths_gaps']}"
            )
        res["rejoins"] = fleet.totals()["rejoins"]
        res["errors"] = {a["addr"]: a["errors"] for a in fleet.totals()["arbiters"]}
        return res
    finally:
        if fleet is not None:
            fleet.stop()
        if subs is not None:
            subs.stop()
        cluster.kill_all()


def run_bare(
    args: argparse.Namespace, n: int, interval: float, procs: Procs, workdir: Path
) -> dict[str, Any]:
    """The same N against one bare grpc.aio server (bench/scale_bare.py) acking at
    ``interval``: the load one replica gets; returns its figures."""
    workdir.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    addr = f"127.0.0.1:{port}"
    bare = procs.spawn(
        f"bare-{n}",
        [
            sys.executable,
            str(BENCH / "scale_bare.py"),
            "--listen",
            addr,
            "--interval",
            f"{interval:.4f}",
        ],
    )
    fleet = None
    try:
        time.sleep(1.5)
        if bare.poll() is not None:
            raise RuntimeError("the bare server exited (see its log)")
        fleet = Fleet(
            procs, [addr], n, args.procs, workdir, "--wait-join",
            "--start-spread", str(join_spread(args, n)), name="bare-loadgen",
        )  # fmt: skip
        fleet.wait_ready()
        time.sleep(0.5)
        rss0 = rss_bytes(bare.pid)
        fleet.join()

        def all_alive() -> bool:
            arbs = fleet.totals()["arbiters"]
            return bool(arbs) and arbs[0]["states"].get("ALIVE", 0) >= n

        wait_until(all_alive, 30)
        time.sleep(args.settle)
        c0, a0, lg0, t0 = (
            cpu_seconds(bare.pid),
            fleet.totals()["arbiters"][0]["acks"],
            fleet.cpu(),
            time.monotonic(),
        )
        reports = _window(fleet, args.window)
        dt = time.monotonic() - t0
        cpu, acks = cpu_seconds(bare.pid) - c0, reports[-1]["arbiters"][0]["acks"] - a0
        res = {
            "n": n,
            "interval_s": interval,
            "hb_per_s": acks / dt,
            "cores": cpu / dt,
            "cpu_us_per_hb": cpu / acks * 1e6 if acks else None,
            "hb_per_s_per_core": acks / cpu if cpu else None,
            "rss_kib_per_node": (rss_bytes(bare.pid) - rss0) / n / 1024,
            "loadgen": {"cores": (fleet.cpu() - lg0) / dt},
            **_loadgen_figures(reports, 0),
        }
        say(
            f"bare N={n}: {res['hb_per_s']:.0f} hb/s, {res['cpu_us_per_hb'] or 0:.0f} us/hb, "
            f"{res['rss_kib_per_node']:.1f} KiB/node"
        )
        return res
    finally:
        if fleet is not None:
            fleet.stop()
        Procs.kill(bare)
