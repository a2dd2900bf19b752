"""Commit-to-subscriber latency with 1,000 subscribers, with and without heartbeat load.

    python bench/fanout.py                                # 1,000 subscribers, N = 1,000
    python bench/fanout.py --rounds 3 --before DIR        # against another checkout, same run
    python bench/fanout.py --profile DIR                  # one more run per system, py-spy on a1

Per system and round, a fresh 3-replica cluster (``membership arbiter
--insecure``, JSON logs at INFO so that every applied change is a
``membership_change`` line with its wall-clock time) and ``--subscribers``
Subscribe streams from the Go load generator (``loadgen sub --times``: spread
over the replicas, each receive stamped with the wall clock). Then two
phases, each committing ``--changes`` joins (one node at a time, each waited
for at every subscriber, then ``--gap`` seconds) and ``--kills`` deaths (a
joined node stopped abruptly):

1. quiet: nothing else heartbeats but the few nodes that join (the fan-out's
   own cost);
2. loaded: after ``--nodes`` nodes joined (the Go load generator, each a
   Heartbeat stream to every replica at the interval the replicas suggest,
   started ``--join-batch`` at a time, each batch once the last is ALIVE;
   above ``--full-load-max`` nodes a2 and a3 are light, as in bench/scale.py;
   ``--light a1,a2,a3`` makes all three light, for a machine whose other work
   leaves too little CPU for a fully loaded replica)
   and ``--settle`` seconds.

Measured, per phase, over the epochs those changes committed: for every
subscriber and epoch, its receive time minus the time its replica applied
that epoch (the replica's last ``membership_change`` log line of it:
milliseconds, truncated, so a figure is up to 1 ms high), as p50/p90/p99/max;
the fan-out spread (the last minus the first receive among one replica's
subscribers, per epoch); the replicas' own histogram
``membership_commit_to_subscriber_seconds`` (apply to the write returning,
bucket upper bounds); each replica's CPU and the subscriber process's CPU
over the phase; and in the loaded phase what the load generator sent against
what was required, and its lateness, so that a limit of the load is never
taken for the server's.

``--before DIR`` runs, in every round, a second system: the replicas from
another source tree (``git archive COMMIT arbiter membership | tar -x -C
DIR``) with the same load, for a before/after in one run. ``--profile DIR``
adds one run per system with ``py-spy record`` on a1 during each phase
(``DIR/SYSTEM-PHASE.txt``, collapsed stacks, and the top of it printed); a
profiled run is never a measured one. No test asserts a speed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from detection_common import Procs, say
from fanout_common import ms, receive_latency, start_spy, stop_spy, summary
from loadgen import Fleet, Process
from scale_common import (
    histogram_delta,
    histogram_quantile,
    metric,
    scrape,
    tree_cpu_seconds,
    wait_until,
)

from membership.testing.localcluster import LocalCluster, free_ports

RESULTS = Path(__file__).resolve().parent / "results"
HISTOGRAM = "membership_commit_to_subscriber_seconds"
PHASES = ("quiet", "loaded")


def _start_cluster(args: argparse.Namespace, workdir: Path, before: Path | None) -> Any:
    """The 3 replicas (those of ``args.light`` light) and their metrics addresses."""
    env = {**os.environ, "MEMBERSHIP_LOG_FORMAT": "json"}
    if before is not None:
        env["PYTHONPATH"] = str(before)
    cluster = LocalCluster(workdir, tls=False, log_level="info", merge_output=True, env=env)
    ports, mports = free_ports(3), free_ports(3)
    cluster.arbiters = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    maddr = {rid: f"127.0.0.1:{mports[i]}" for i, rid in enumerate(cluster.arbiters)}
    n = args.nodes + 4 * (args.changes + args.kills)
    limits = [
        *("--max-nodes", str(2 * n + 100), "--max-heartbeat-streams", str(3 * n + 200)),
        *("--max-subscribers", str(args.subscribers + 100)),
    ]
    for rid in cluster.arbiters:
        extra = [*limits, "--metrics-listen", maddr[rid]]
        if rid in args.light:
            iv = str(args.light_interval)
            extra += ["--heartbeat-interval", iv, "--max-heartbeat-interval", iv]
            extra += ["--missed-heartbeats", str(args.light_missed)]
            extra += ["--restart-grace", str(args.light_interval * args.light_missed + 1)]
        cluster.start_arbiter(rid, *extra)

    def ready() -> bool:
        for rid, child in cluster.children.items():
            if not child.alive():
                raise RuntimeError(f"replica {rid} exited: {' / '.join(child.lines()[-3:])}")
        ms = [scrape(maddr[r]) for r in cluster.arbiters]
        return all(metric(m, "membership_in_quorum") == 1 for m in ms) and any(
            metric(m, "membership_raft_role", role="leader") == 1 for m in ms
        )

    if not wait_until(ready, 60):
        raise RuntimeError("the cluster elected no leader within 60 s")
    return cluster, maddr


def _apply_times(cluster: LocalCluster) -> dict[tuple[str, int], float]:
    """(replica, epoch) -> wall-clock seconds of its last ``membership_change`` line."""
    out: dict[tuple[str, int], float] = {}
    for rid, child in cluster.children.items():
        for line in child.lines():
            if not line.startswith("{") or '"membership_change"' not in line:
                continue
            rec = json.loads(line)
            t = datetime.datetime.fromisoformat(rec["ts"]).timestamp()
            key = (rid, int(rec["epoch"]))
            out[key] = max(out.get(key, 0.0), t)
    return out


class Phase:
    """One phase's changes, and the readings around them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.epochs: list[int] = []
        self.late = 0  # changes that committed nothing within --change-timeout
        self.figures: dict[str, Any] = {}


def _changes(
    args: argparse.Namespace, subs: Process, changers: Process, phase: Phase, first: int
) -> None:
    """``--changes`` joins of the next changer nodes, then ``--kills`` of c<first>..,
    each waited for (up to --change-timeout) until every subscriber received an epoch
    after it; the phase's epochs are all those committed meanwhile."""

    def top() -> int:
        return max((e["epoch"] for e in subs.events if e.get("ev") == "epoch"), default=0)

    start = top()

    def commit(command: str) -> None:
        seen = top()
        changers.send(command)
        if not subs.wait_for(lambda: top() > seen, args.change_timeout):
            phase.late += 1  # an overloaded cluster: measured all the same
        time.sleep(args.gap)

    for _ in range(args.changes):
        commit("join 1")
    for i in range(args.kills):
        commit(f"kill c{first + i}")
    phase.epochs = list(range(start + 1, top() + 1))


def _ramp(args: argparse.Namespace, fleet: Fleet, subs: Process) -> None:
    """Starts the fleet's nodes ``--join-batch`` at a time, each batch once the last is
    ALIVE (or after 10 s): a join storm is not what this measures (bench/scale.py and
    bench/join_storm.py time it), and on a loaded machine one collapses the replicas
    (nodes heartbeat at the base interval until their first ack)."""
    per = max(1, args.join_batch // len(fleet.parts))
    base = subs.report.get("alive") or 0
    started = 0
    while started < fleet.count:
        for _, _, p in fleet.parts:
            p.send(f"join {per}")
        started = min(fleet.count, started + per * len(fleet.parts))
        target = base + started
        wait_until(lambda t=target: (subs.report.get("alive") or 0) >= t, 10.0, 0.2)


def _phase(
    args: argparse.Namespace,
    name: str,
    subs: Process,
    changers: Process,
    fleet: Fleet | None,
    first: int,
    cluster: LocalCluster,
    maddr: dict[str, str],
    profile: Path | None,
) -> Phase:
    """One phase's changes (from changer ``first``), with the readings around them."""
    phase = Phase(name)
    pids = {rid: c.pid for rid, c in cluster.children.items()}
    spy = start_spy(pids["a1"], profile, args.native)
    m0 = {r: scrape(maddr[r], 30.0) for r in cluster.arbiters}
    c0 = {r: tree_cpu_seconds(p) for r, p in pids.items()}
    s0, t0 = subs.cpu(), time.monotonic()
    lg0 = fleet.cpu() if fleet is not None else 0.0
    try:
        _changes(args, subs, changers, phase, first)
    except BaseException:
        stop_spy(spy, profile)
        raise
    dt = time.monotonic() - t0
    m1 = {r: scrape(maddr[r], 30.0) for r in cluster.arbiters}
    deltas = [histogram_delta(m1[r], m0[r], HISTOGRAM) for r in cluster.arbiters]
    cpu = sum(tree_cpu_seconds(p) - c0[r] for r, p in pids.items())
    rc = {r: round((tree_cpu_seconds(p) - c0[r]) / dt, 3) for r, p in pids.items()}
    sc = round((subs.cpu() - s0) / dt, 3)
    loadgen = None
    if fleet is not None:
        tot = fleet.totals()
        a1 = tot["arbiters"][0]
        loadgen = {
            "sent_per_s": round(a1["sent_rate"]),
            "required_per_s": round(a1["required_rate"]),
            "late_p99_ms": tot["late_p99_ms"],
            "ack_p99_ms_a1": a1["ack_p99_ms"],
            "cores": round((fleet.cpu() - lg0) / dt, 3),
        }
    top = stop_spy(spy, profile)
    phase.figures = {
        "epochs": len(phase.epochs),
        "late_changes": phase.late,
        "seconds": round(dt, 1),
        "replicas_cores": round(cpu / dt, 3),
        "server_p50_ms": ms(histogram_quantile(deltas, HISTOGRAM, 0.5)),
        "server_p99_ms": ms(histogram_quantile(deltas, HISTOGRAM, 0.99)),
        "replica_cores": rc,
        "subscriber_cores": sc,
    }
    if loadgen is not None:
        phase.figures["loadgen"] = loadgen
    if top is not None:
        phase.figures["profile_top"] = top
    return phase


def run_system(
    args: argparse.Namespace,
    system: str,
    before: Path | None,
    workdir: Path,
    procs: Procs,
    profile: Path | None = None,
) -> dict[str, Any]:
    """Both phases against a fresh cluster of ``system``; returns their figures."""
    workdir.mkdir(parents=True, exist_ok=True)
    cluster, maddr = _start_cluster(args, workdir, before)
    addrs = cluster.addresses
    subs = changers = fleet = None
    res: dict[str, Any] = {"system": system}
    try:
        subs = Process(
            procs, "sub",
            ["sub", "--arbiters", ",".join(addrs), "--count", str(args.subscribers), "--times",
             "--epoch-wait", str(args.change_timeout)],
            workdir / "sub.log",
        )  # fmt: skip
        if not subs.wait_for(lambda: subs.report.get("open", 0) >= args.subscribers, 60):
            raise RuntimeError(f"{args.subscribers} subscriptions not open within 60 s")
        own = ["--interval-rule", "own"] if args.light else []
        changers = Fleet(
            procs, addrs, 4 * (args.changes + args.kills), 1, workdir, "--wait-join", *own,
            name="changers", prefix="c",
        ).parts[0][2]  # fmt: skip
        changers.ready.wait(30)
        time.sleep(1.0)

        def term() -> float:
            return max(metric(scrape(maddr[r], 30.0), "membership_raft_term") for r in maddr)

        term0 = term()
        first = 0
        for name in ("quiet", "loaded"):
            if name == "loaded":
                fleet = Fleet(
                    procs, addrs, args.nodes, args.procs, workdir, "--wait-join",
                    "--start-spread", str(args.join_spread), *own,
                )  # fmt: skip
                fleet.wait_ready()
                want = (subs.report.get("alive") or 0) + args.nodes
                _ramp(args, fleet, subs)
                joined = wait_until(
                    lambda want=want: (subs.report.get("alive") or 0) >= want,
                    args.join_timeout,
                    0.5,
                )
                res["alive_before_loaded"] = subs.report.get("alive")
                if not joined:  # measured all the same, and the table says so
                    say(f"{system}: {subs.report.get('alive')} of {want} ALIVE after "
                        f"{args.join_timeout} s")  # fmt: skip
                time.sleep(args.settle)
            out = None if profile is None else profile / f"{system}-{name}.txt"
            try:
                res[name] = _phase(args, name, subs, changers, fleet, first, cluster, maddr, out)
            except RuntimeError as e:  # a change committed nothing in time
                res["error"] = f"{name}: {e}"
                say(f"{system}: {res['error']}")
                break
            first += args.changes + args.kills
        time.sleep(1.0)  # the last epochs' lines reach the logs
        applied = _apply_times(cluster)
        for name in ("quiet", "loaded"):
            if name in res:
                phase = res[name]
                lat = receive_latency(
                    subs.events, lambda r, e: applied.get((r, e)), set(phase.epochs)
                )
                res[name] = {**phase.figures, **lat}
        res["elections"] = int(term() - term0)
        return res
    finally:
        if fleet is not None:
            fleet.stop()
        if changers is not None:
            changers.stop()
        if subs is not None:
            subs.stop()
        cluster.kill_all()


def _row(r: dict[str, Any], phase: str) -> str:
    p = r[phase]
    rc = p["replica_cores"]
    lg = p.get("loadgen")
    load = (
        f" | lg {lg['sent_per_s']}/{lg['required_per_s']}/s late p99 {lg['late_p99_ms']:.0f} ms"
        if lg
        else ""
    )
    alive = r.get("alive_before_loaded")
    if phase == "loaded" and alive is not None:
        load += f", {alive} ALIVE"
    if p.get("late_changes"):
        load += f" [{p['late_changes']} change(s) not committed within --change-timeout]"
    return (
        f"{r['system']:<7} {r['round']:>2} {phase:<7} {p['epochs']:>3} {p['samples']:>6} "
        f"{_f(p['p50_ms']):>7} {_f(p['p90_ms']):>7} {_f(p['p99_ms']):>7} {_f(p['max_ms']):>7} "
        f"{_f(p['spread_p50_ms']):>7} {_f(p['spread_max_ms']):>7} "
        f"{_f(p['server_p50_ms']):>6}/{_f(p['server_p99_ms']):<6} "
        f"{p['replicas_cores']:>5.2f} "
        f"{rc['a1']:>5.2f} {rc['a2']:>5.2f} {rc['a3']:>5.2f} {p['subscriber_cores']:>5.2f}"
        f"{load}"
    )


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def table(args: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    """Per system, round and phase: the latency percentiles, spread, CPU."""
    head = (
        f"{'system':<7} {'rd':>2} {'phase':<7} {'ep':>3} {'recv':>6} {'p50':>7} {'p90':>7} "
        f"{'p99':>7} {'max':>7} {'spr50':>7} {'sprmax':>7} {'server p50/p99':>13} "
        f"{'cores':>5} "
        f"{'a1':>5} {'a2':>5} {'a3':>5} {'subs':>5}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        for phase in ("quiet", "loaded"):
            if phase in r:
                lines.append(_row(r, phase))
        if "error" in r:
            lines.append(f"{r['system']:<7} {r['round']:>2} {r['error']}")
    lines.append("")
    rows = [{"label": f"{r['system']} {ph}", **r[ph]} for r in results for ph in PHASES if ph in r]
    keys = ("p50_ms", "p99_ms", "max_ms", "replicas_cores")
    lines += summary(rows, lambda x: str(x["label"]), keys)
    light = f" (light at {args.light_interval} s: {','.join(args.light)})" if args.light else ""
    lines.append(
        f"\n{args.subscribers} subscribers spread over 3 replicas; N = {args.nodes} heartbeating "
        f"nodes in the loaded phase{light}; "
        f"{args.changes} joins + {args.kills} kills per phase, {args.gap} s apart.\n"
        "Times in ms. p50..max: a subscriber's receive (wall clock) minus its replica's apply "
        "of that epoch (log line, ms, truncated: up to 1 ms high), over every subscriber and "
        "epoch; spr50/sprmax: the last minus the first receive among one replica's "
        "subscribers, per epoch; server: the replicas' membership_commit_to_subscriber_seconds "
        "(apply to the write returning; bucket upper bounds). cores: the three replicas' "
        "CPU over the phase (bench/fanout_cost.py measures the CPU per delivery alone); "
        "a1..a3, subs: cores used over "
        "the phase (replicas; the Go subscriber process). lg: what the load generator sent "
        "to a1 against the rate required, and its send lateness."
    )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--subscribers", type=int, default=1000)
    p.add_argument("--nodes", type=int, default=1000, help="heartbeating nodes (loaded phase)")
    p.add_argument("--procs", type=int, default=2, help="load generator processes")
    p.add_argument("--changes", type=int, default=20, help="joins per phase")
    p.add_argument("--kills", type=int, default=3, help="deaths per phase")
    p.add_argument("--gap", type=float, default=0.5, help="seconds between changes")
    p.add_argument("--settle", type=float, default=5.0)
    p.add_argument("--join-spread", type=float, default=1.0)
    p.add_argument("--join-batch", type=int, default=100, help="nodes started at a time")
    p.add_argument("--keep-logs", type=Path, default=None, help="copy every process's log here")
    p.add_argument("--join-timeout", type=float, default=120.0)
    p.add_argument("--change-timeout", type=float, default=20.0)
    p.add_argument("--full-load-max", type=int, default=999, help="above it a2, a3 are light")
    p.add_argument("--light", default=None, help="light replicas (default: a2,a3 above it)")
    p.add_argument("--light-interval", type=float, default=3.0)
    p.add_argument("--light-missed", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--before", type=Path, default=None, help="another source tree, same run")
    p.add_argument("--profile", type=Path, default=None, help="py-spy profiles into DIR")
    p.add_argument("--native", action="store_true", help="py-spy --native (C frames too)")
    p.add_argument("--out", type=Path, default=RESULTS / "fanout")
    args = p.parse_args()
    if args.light is None:
        args.light = "a2,a3" if args.nodes > args.full_load_max else ""
    args.light = [x for x in args.light.split(",") if x]
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    systems: list[tuple[str, Path | None]] = [("ours", None)]
    if args.before is not None:
        systems.insert(0, ("before", args.before.resolve()))
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp_s:
        tmp = Path(tmp_s)
        # Children run ``python -m membership``, which puts their working directory first
        # on sys.path: outside any source tree, PYTHONPATH (--before) decides.
        os.chdir(tmp)
        procs = Procs(tmp)
        try:
            for rnd in range(args.rounds):
                for system, before in systems:
                    say(f"round {rnd}: {system} ...")
                    r = run_system(args, system, before, tmp / f"{system}-{rnd}", procs)
                    r["round"] = rnd
                    results.append(r)
                    say(table(args, [r]).split("\n\n")[0])
            tops: dict[str, str] = {}
            if args.profile is not None:
                args.profile.mkdir(parents=True, exist_ok=True)
                for system, before in systems:
                    say(f"profile: {system} ...")
                    r = run_system(
                        args, system, before, tmp / f"{system}-profile", procs, args.profile
                    )
                    for phase in ("quiet", "loaded"):
                        top = r.get(phase, {}).pop("profile_top", None)
                        if top is not None:
                            tops[f"{system}-{phase}"] = top
                            (args.profile / f"{system}-{phase}-top.txt").write_text(top + "\n")
                            print(f"\nprofile of {system}, {phase} (py-spy on a1):\n{top}")
        finally:
            procs.kill_all()
            if args.keep_logs is not None:
                shutil.copytree(tmp, args.keep_logs, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("*.data"))  # fmt: skip
    text = table(args, results)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fanout.txt").write_text(text + "\n")
    meta = {k: str(v) for k, v in vars(args).items()}
    (args.out / "fanout.json").write_text(
        json.dumps({"args": meta, "results": results}, indent=1, default=str)
    )
    say(f"wrote {args.out}/fanout.txt, fanout.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
