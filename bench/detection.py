"""Detection benchmark: kill-to-detection of ours, etcd and Serf; a soak counting false DEATHs.

One run, one machine, everything on loopback, the systems one after the other
(never two at once, so none loads the machine while another is measured):

1. ours. 3 arbiter replicas and ``--nodes`` nodes (default 50) at default
   settings, and a subscriber (the SDK's ``MembershipClient.watch``) in this
   process. ``--victims`` of the nodes (default 5) are each one ``membership
   node`` process; they are SIGKILLed in turn (``--kills`` times) and started
   again, and the time from the kill to the DEAD event at the subscriber is
   recorded (monotonic clock of this process, which also sends the kill).

   How the other nodes run: a ``membership node`` process costs about 1.3 % of
   a core at the default heartbeat interval, mostly interpreter and gRPC
   overhead paid once per process; 50 of them take two thirds of a core of
   this 2-core machine (and a load spike of ~9 while they start) before the
   arbiters do anything. So the background nodes (all but the victims) are
   hosted ``--nodes-per-process`` (default 9) per process by
   ``bench/node_host.py``: one MembershipClient per node, default config, each
   with its own gRPC connections to every replica, exactly as the node command
   runs it. The run measures and prints both costs; ``--nodes-per-process 1``
   runs every node as its own ``membership node`` process.

2. ours, soak (``--soak`` seconds, default 300). Meanwhile:
   - pauses: every 0.2-1.0 s a random node process (a victim, or a host of
     several nodes, which pauses all of them at once) gets SIGSTOP and, after
     ``--pause-min``..``--pause-max`` seconds (default 0.1-0.5, shorter than
     the 0.75 s lease), SIGCONT; at most two pauses at a time, and a process
     runs at least 1 s between two of its pauses (without that spacing, two
     pauses a few ms apart make one silence longer than the lease: the first
     full run had 85 such pairs and one DEAD from a 0.48 s + 0.29 s pair
     65 ms apart);
   - CPU saturation: ``--burners`` busy-loop processes (default one per core),
     in bursts: each runs 5-20 s, rests 2-8 s (about 75 % of the time on), at
     the same priority as everything else;
   - jitter: the first host process (``--nodes-per-process`` nodes) reaches
     the replicas only through proxy processes (``tests/support/netproxy.py``
     run as a program, one per replica), which delay every chunk by
     ``--jitter-ms`` (default 5-50 ms, uniform); for the whole run, the kill
     series included, since the proxy program takes its delay at start (the
     victims, whose kills are timed, never go through a proxy);
   - a victim is SIGKILLed every ``--soak-kill-every`` seconds (default 10),
     giving a second row: kill-to-DEAD under this stress.
   A false DEATH is a DEAD event for a node that was not SIGKILLed (counted
   from the soak start until 3 s after its end); each one is printed with
   its circumstances (the node's last pause, burners, proxy, the replicas'
   evidence).

3. etcd (Debian's etcd-server and etcd-client, installed with apt-get when
   missing): one member on loopback ports in a temporary folder, run with
   ``--heartbeat-interval 50 --election-timeout 500``, which lowers the
   minimum lease TTL etcd accepts from its default 2 s (ceil of 1.5 election
   timeouts) to 1 s, the least the API can express (TTLs are whole seconds).
   The TTL actually granted is read back and printed. A node is an
   ``etcdctl lease keep-alive`` process (it renews every 0.5 s) for a lease
   with a key ``/bench/<node>`` attached; ``--nodes`` of them. A watcher
   (``etcdctl watch --prefix``) reports the DELETE; the time from SIGKILL of
   a keep-alive process to that DELETE line is recorded. The leader checks
   expiry every 0.5 s, so detection is TTL - (time since the last renewal)
   + up to 0.5 s.

4. Serf (Debian's serf, installed when missing): ``--serf-agents`` agents
   (default 5) and an observer agent, each with its own ports, profile
   ``--serf-profile`` (default lan, Serf's default, as ours runs at its
   defaults; ``local`` is faster). An agent is SIGKILLed, the time until the
   observer logs ``EventMemberFailed`` for it is recorded, and it is started
   again and waited for (``EventMemberJoin``) before its next turn;
   ``--serf-kills`` times (default 8: each takes 5-25 s). The observer's
   event handlers would see the event later still (Serf coalesces member
   events for handlers); the log line is when the observer's membership
   changes.

Prints progress lines, then one table: samples, p50, p99, max in ms and the
false positives per system (for etcd and Serf: unexpected DELETEs or member
failures during their kill runs; they are not soaked). p99 is the
nearest-rank percentile: with fewer than 100 samples it is the maximum.
Writes ``detection.png`` (histogram of kill-to-detection per system, log
scale) and ``detection.json`` (raw samples, pauses, settings) to ``--out``.

Every process started (arbiters, nodes, hosts, etcd, etcdctl, serf agents,
burners) is SIGKILLed and reaped at the end, also on error, Ctrl-C or
SIGTERM; on Linux the children also get SIGKILL if this script is killed
(PR_SET_PDEATHSIG). Temporary folders are removed (``--keep-logs DIR``
copies every child's log first).

Usage (from the repo root):
    python bench/detection.py [--nodes 50] [--kills 100] [--soak 300]
        [--systems ours,etcd,serf] [--out bench/results] [--seed N]
About 10 minutes at the defaults on 2 cores (apt installs aside).
"""

from __future__ import annotations

import os

# The children are exec'd at once: gRPC's fork handlers are not needed (and warn).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import argparse
import asyncio
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/detection.py`: sys.path[0] is bench/
    sys.path.insert(0, str(ROOT))

from detection_common import (  # noqa: E402  (bench/ is sys.path[0])
    PACKAGES,
    ROOT,
    SYSTEMS,
    T0,
    Procs,
    Row,
    ensure_installed,
    percentile,
    say,
)
from detection_others import Etcd, Serf  # noqa: E402
from detection_ours import Ours  # noqa: E402

# --- output --------------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    head = (
        f"{'system':<62} {'samples':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}  false positives"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        s = sorted(r.samples)
        if s:
            p50, p99, mx = (
                f"{percentile(s, 50) * 1000:.0f}",
                f"{percentile(s, 99) * 1000:.0f}",
                f"{s[-1] * 1000:.0f}",
            )
        else:
            p50 = p99 = mx = "-"
        n = f"{len(s)}" + (f"+{r.missed}m" if r.missed else "")
        lines.append(
            f"{r.label:<62} {n:>7} {p50:>7} {p99:>7} {mx:>7}  {r.false_positives} {r.fp_note}"
        )
    return "\n".join(lines)


def write_png(rows: list[Row], path: Path, title: str) -> bool:
    try:
        import matplotlib
        import matplotlib.ticker

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("no matplotlib (pip install -e '.[bench]'): no PNG written")
        return False
    series = [r for r in rows if r.samples]
    if not series:
        return False
    lo = min(min(r.samples) for r in series) * 1000 * 0.8
    hi = max(max(r.samples) for r in series) * 1000 * 1.25
    bins = [lo * (hi / lo) ** (i / 60) for i in range(61)]
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for i, r in enumerate(series):
        ms = [x * 1000 for x in r.samples]
        s = sorted(ms)
        color = f"C{i}"
        ax.hist(
            ms,
            bins=bins,
            histtype="stepfilled",
            alpha=0.35,
            color=color,
            label=f"{r.label} (n={len(ms)}, p50 {percentile(s, 50):.0f}, "
            f"p99 {percentile(s, 99):.0f} ms)",
        )
        ax.hist(ms, bins=bins, histtype="step", color=color)
        ax.axvline(percentile(s, 99), color=color, linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ticks = [
        t
        for t in (250, 500, 750, 1000, 1500, 2000, 3000, 5000, 10000, 20000, 50000)
        if lo <= t <= hi
    ]
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:.0f}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("kill to detection at a subscriber [ms] (log scale; dashed: p99)")
    ax.set_ylabel("kills")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# --- main ----------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> int:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    systems = args.systems
    say(
        f"detection benchmark: systems {','.join(systems)}, seed {args.seed}, "
        f"{os.cpu_count()} CPU(s), load {'/'.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    for s in [s for s in systems if s in PACKAGES]:
        if not ensure_installed(s):
            systems = [x for x in systems if x != s]
    rows: list[Row] = []
    failed: list[str] = []
    extra: dict[str, Any] = {}
    loads: list[float] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-detection-"))
    procs = Procs(tmp)

    async def sample_load() -> None:
        while True:
            loads.append(os.getloadavg()[0])
            await asyncio.sleep(10)

    load_task = loop.create_task(sample_load())
    try:
        for s in systems:
            workdir = tmp / s
            workdir.mkdir()
            procs.logdir = workdir  # the children's logs, per system
            t = time.monotonic()
            try:
                if s == "ours":
                    ours = Ours(args, procs, workdir)
                    try:
                        rows += await ours.run()
                    finally:
                        extra["ours"] = {
                            "cpu": ours.cpu,
                            "false_deaths": ours.false_deaths,
                            "retired": ours.sub.retired if ours.sub else 0,
                        }
                elif s == "etcd":
                    rows += await Etcd(args, procs, workdir).run()
                elif s == "serf":
                    rows += await Serf(args, procs, workdir).run()
            except (RuntimeError, OSError) as e:
                failed.append(s)
                say(f"{s}: FAILED: {e} (going on with the other systems)")
                continue
            say(f"{s}: done in {time.monotonic() - t:.0f} s")
    finally:
        load_task.cancel()
        procs.kill_all()
        if args.keep_logs:
            dest = Path(args.keep_logs)
            dest.mkdir(parents=True, exist_ok=True)
            for f in tmp.rglob("*.log"):
                shutil.copy(f, dest / f"{f.parent.name}-{f.name}")
            say(f"logs copied to {dest}")
        shutil.rmtree(tmp, ignore_errors=True)
    total = time.monotonic() - T0
    load_note = (
        f"1-min load average during the run: {min(loads):.2f} .. {max(loads):.2f} "
        f"(mean {sum(loads) / len(loads):.2f})"
        if loads
        else ""
    )
    print(flush=True)
    print(table(rows), flush=True)
    print(
        "p99 is the nearest-rank percentile (with fewer than 100 samples: the maximum); "
        "+Nm: N kills never detected within the timeout",
        flush=True,
    )
    print(f"{load_note}; total {total:.0f} s; seed {args.seed}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "command": " ".join(["python", *sys.argv]),
        "settings": {k: v for k, v in vars(args).items()},
        "cpus": os.cpu_count(),
        "load_samples": loads,
        "total_s": round(total, 1),
        "rows": [
            {
                "key": r.key,
                "label": r.label,
                "samples_ms": [round(x * 1000, 2) for x in r.samples],
                "missed": r.missed,
                "false_positives": r.false_positives,
                "false_positives_note": r.fp_note,
                "details": r.details,
            }
            for r in rows
        ],
        **extra,
    }
    (out / "detection.json").write_text(json.dumps(data, indent=1) + "\n")
    title = (
        f"kill to detection, {args.nodes} nodes, loopback, {os.cpu_count()} CPUs, seed {args.seed}"
    )
    written = write_png(rows, out / "detection.png", title)
    say(f"wrote {out / 'detection.json'}" + (f" and {out / 'detection.png'}" if written else ""))
    if failed:
        say(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


def _range(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition("-")
    a, b = float(lo), float(hi or lo)
    if not 0 <= a <= b:
        raise argparse.ArgumentTypeError(f"{text!r}: want MIN-MAX with 0 <= MIN <= MAX")
    return a, b


def _systems(text: str) -> list[str]:
    out = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in out if s not in SYSTEMS]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"systems are {','.join(SYSTEMS)}; got {text!r}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=50, help="nodes per system (ours, etcd)")
    p.add_argument("--kills", type=int, default=100, help="SIGKILLs for ours and for etcd")
    p.add_argument("--soak", type=float, default=300.0, help="soak seconds for ours (0: none)")
    p.add_argument("--systems", type=_systems, default=list(SYSTEMS), help="comma-separated")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="PNG and JSON folder")
    p.add_argument("--seed", type=int, default=None, help="seed of every random choice")
    p.add_argument("--victims", type=int, default=5, help="nodes that get SIGKILLed, in turn")
    p.add_argument(
        "--nodes-per-process",
        type=int,
        default=9,
        help="ours: background nodes per host process (1: a process per node)",
    )
    p.add_argument(
        "--min-up",
        type=float,
        default=1.0,
        help="a victim is killed only after this many seconds ALIVE",
    )
    p.add_argument("--pause-min", type=float, default=0.1, help="soak: shortest SIGSTOP, s")
    p.add_argument("--pause-max", type=float, default=0.5, help="soak: longest SIGSTOP, s")
    p.add_argument(
        "--burners",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="soak: busy-loop processes (at most one per CPU)",
    )
    p.add_argument(
        "--jitter-ms",
        type=_range,
        default=(5.0, 50.0),
        help="soak: MIN-MAX delay per chunk on the proxied nodes' links",
    )
    p.add_argument(
        "--soak-kill-every",
        type=float,
        default=10.0,
        help="soak: seconds between SIGKILLs of a victim (0: none)",
    )
    p.add_argument("--etcd-heartbeat-ms", type=int, default=50)
    p.add_argument(
        "--etcd-election-ms",
        type=int,
        default=500,
        help="etcd's minimum lease TTL is ceil(1.5 x this)",
    )
    p.add_argument("--serf-agents", type=int, default=5)
    p.add_argument("--serf-kills", type=int, default=8)
    p.add_argument("--serf-profile", choices=["lan", "local", "wan"], default="lan")
    p.add_argument("--keep-logs", metavar="DIR", default=None, help="copy every child's log here")
    p.add_argument(
        "--tls",
        action="store_true",
        help="ours with mutual TLS (certificates made in the work folder; default plaintext, "
        "--insecure, as the figures above were measured)",
    )
    args = p.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1_000_000)
    cpus = len(os.sched_getaffinity(0))
    if not 0 <= args.burners <= cpus:
        p.error(f"--burners must be 0..{cpus} (one per CPU at most)")
    if args.nodes < 1 or args.kills < 0 or args.soak < 0:
        p.error("--nodes must be >= 1, --kills and --soak >= 0")
    if not 0 < args.pause_min <= args.pause_max:
        p.error("want 0 < --pause-min <= --pause-max")
    try:
        return asyncio.run(run(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted: every child process was killed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
