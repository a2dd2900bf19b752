"""The per-heartbeat path of a replica against a bare grpc.aio server, in the same run.

A quick tool to guide work on the heartbeat path (arbiter/server/api/heartbeat_path.py);
bench/scale.py gives the big figures. Every figure is a ratio against the bare
server measured in the same run, on the same (noisy, shared) machine.

Per system, one after the other (never two at once):

* ``bare``: bench/heartbeat_load.py ``--bare``, a grpc.aio server that decodes
  every HeartbeatRequest and answers a replica-shaped HeartbeatAck copied
  from a template: the least any server does per heartbeat with these
  messages. ``bare-settings``: the same with the replica's gRPC options
  (keepalive, limits) and request interceptor.
* ``before`` (with ``--before DIR``): the same replica run from another source
  tree (``git archive COMMIT arbiter membership | tar -x -C DIR``), to compare
  two versions of the path in one run.
* ``ours``: ``--mode single`` (default) one replica in a group of one;
  ``--mode cluster`` a 3-replica LocalCluster, every node streaming to all
  three (CPU summed over the replicas, divided by the acks of all three).
  Both plaintext.

The load: ``--nodes`` (1,000) nodes split over ``--procs`` (2) load processes
(bench/heartbeat_load.py ``--load``), one stream per node and server on its
own TCP connection, each heartbeat at ``--interval`` (0.6 s) declared in
``interval_seconds``. After every stream has an ack and ``--warmup`` seconds
(joins committed), the servers' CPU (utime + stime, /proc) over ``--window``
seconds is divided by the acks received in it. The load processes report the
rate they achieved against the rate asked and how late their own sends were:
a load that could not keep up is flagged, never mistaken for the server's
result. ``--loops asyncio,uvloop`` measures each system once per event loop
(``membership arbiter --event-loop``). ``--rounds`` repeats the whole
sequence; the table gives the median of the rounds.

``--profile DIR``: one more run of each of ``--profile-systems`` (ours; or
ours,before) on asyncio with ``py-spy record`` attached to the (first)
replica during the window: ``DIR/SYSTEM/profile.txt`` (collapsed stacks:
``flamegraph.pl`` or speedscope draw them) and the top of the profile
(inclusive and own share of samples per function) printed and written to
``DIR/SYSTEM/profile-top.txt``. A profile run is never a measured one.

Usage: python bench/heartbeat_path.py [--nodes 1000] [--window 15] [--mode single|cluster]
       [--loops asyncio,uvloop] [--rounds 1] [--profile DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from membership.testing.localcluster import LocalCluster, free_ports

HERE = Path(__file__).resolve().parent
LOAD = HERE / "heartbeat_load.py"
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` so far, seconds (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _port_open(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.2):
            return True
    except OSError:
        return False


def _wait(pred: Any, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


class Loads:
    """The load processes: started, marked (counters since the last mark), stopped."""

    def __init__(self, args: argparse.Namespace, targets: list[str], logdir: Path) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        per = -(-args.nodes // args.procs)
        for k in range(args.procs):
            first, count = k * per, min(per, args.nodes - k * per)
            if count <= 0:
                break
            argv = [sys.executable, str(LOAD), "--load", "--targets", ",".join(targets)]
            argv += ["--first", str(first), "--count", str(count)]
            argv += ["--interval", str(args.interval), "--loop", args.load_loop]
            err = open(logdir / f"load{k}.err", "ab")  # noqa: SIM115
            self.procs.append(
                subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                    start_new_session=True,
                )
            )
            err.close()

    def mark(self) -> list[dict[str, Any]]:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write("mark\n")
            p.stdin.flush()
        out = []
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"load process {p.pid} ended (exit {p.poll()})")
            out.append(json.loads(line))
        return out

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(OSError):
                assert p.stdin is not None
                p.stdin.write("stop\n")
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _start_bare(
    tmp: Path, loop: str, like_ours: bool = False
) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    port = free_ports(1)[0]
    argv = [sys.executable, str(LOAD), "--bare", "--port", str(port), "--loop", loop]
    with open(tmp / "bare.log", "ab") as log:
        proc = subprocess.Popen(
            argv + (["--like-ours"] if like_ours else []),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return [proc], [f"127.0.0.1:{port}"]


def _start_ours(tmp: Path, mode: str, loop: str, before: Path | None = None) -> LocalCluster:
    """The replica(s); ``before``: the code of another checkout (PYTHONPATH), asyncio's loop."""
    env = None if before is None else {**os.environ, "PYTHONPATH": str(before)}
    cluster = LocalCluster(tmp, merge_output=True, log_level="warning", env=env)
    n = 3 if mode == "cluster" else 1
    cluster.arbiters = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(free_ports(n))}
    flags = ["--insecure"] if before is not None else ["--insecure", "--event-loop", loop]
    for rid in cluster.arbiters:
        cluster.start_arbiter(rid, *flags)
    return cluster


def measure(
    args: argparse.Namespace, system: str, loop: str, tmp: Path, profile: Path | None = None
) -> dict[str, Any]:
    """One system under the load: CPU per heartbeat over the window, and the load's figures."""
    tmp.mkdir(parents=True)
    cluster: LocalCluster | None = None
    bare: list[subprocess.Popen[bytes]] = []
    loads: Loads | None = None
    spy: subprocess.Popen[bytes] | None = None
    try:
        if system in ("bare", "bare-settings"):
            bare, targets = _start_bare(tmp, loop, like_ours=system == "bare-settings")
            pids = [p.pid for p in bare]
        else:
            before = args.before if system == "before" else None
            cluster = _start_ours(tmp, args.mode, loop, before)
            targets = cluster.addresses
            pids = [c.pid for c in cluster.children.values()]
        _wait(lambda: all(_port_open(t) for t in targets), 60, f"{system} listening")
        rest = sum(rss_kib(p) for p in pids)
        loads = Loads(args, targets, tmp)
        streams = args.nodes * len(targets)
        _wait(
            lambda: sum(m["streams_acked"] for m in loads.mark()) >= streams,
            180,
            f"{streams} streams acked",
            interval=1.0,
        )
        time.sleep(args.warmup)
        loads.mark()
        if profile is not None:
            exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            spy = subprocess.Popen(
                [exe, "record", "--pid", str(pids[0]),
                 "--duration", str(int(args.window)), "--rate", "200", "--format", "raw",
                 "--output", str(profile / "profile.txt"), "--nonblocking"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
        cpu0 = [cpu_seconds(p) for p in pids]
        t0 = time.monotonic()
        time.sleep(args.window)
        marks = loads.mark()
        elapsed = time.monotonic() - t0
        cpu = sum(cpu_seconds(p) for p in pids) - sum(cpu0)
        rss = sum(rss_kib(p) for p in pids)
        acked = sum(m["acked"] for m in marks)
        asked = streams / args.interval
        result = {
            "system": system,
            "loop": loop,
            "cpu_us_per_heartbeat": cpu / max(1, acked) * 1e6,
            "server_cores": cpu / elapsed,
            "acks_per_s": acked / elapsed,
            "asked_per_s": asked,
            "achieved": acked / elapsed / asked,
            "failures": sum(m["failures"] for m in marks),
            "send_late_p99_ms": max(m["late_ms"][1] for m in marks),
            "rtt_p50_ms": statistics.median(m["rtt_ms"][0] for m in marks),
            "rtt_p99_ms": max(m["rtt_ms"][1] for m in marks),
            "load_cores": sum(m["cpu_s"] for m in marks) / elapsed,
            "kib_per_node": (rss - rest) / args.nodes / len(pids),
        }
        if spy is not None:
            spy.wait(args.window + 30)
        return result
    finally:
        if loads is not None:
            loads.stop()
        if spy is not None and spy.poll() is None:
            spy.kill()
        for p in bare:
            p.kill()
            p.wait()
        if cluster is not None:
            cluster.kill_all()


def profile_top(path: Path, n: int = 25) -> str:
    """The top of a py-spy raw (collapsed) profile: inclusive and own share per function."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_s)
        total += count
        frames = [_short(f) for f in stack.split(";")]
        for f in set(frames):
            inclusive[f] += count
        own[frames[-1]] += count
    out = [
        f"{total} samples; inclusive % (own %) per function, top {n} by inclusive "
        "(the event loop's and threads' own frames left out):"
    ]
    shown = [(f, c) for f, c in inclusive.most_common() if not f.endswith(_CONTAINERS)]
    for f, c in shown[:n]:
        out.append(f"  {100 * c / total:5.1f} ({100 * own[f] / total:4.1f})  {f}")
    out.append(f"top {n} by own samples:")
    for f, c in own.most_common(n):
        out.append(f"  {100 * c / total:5.1f}  {f}")
    return "\n".join(out)


# Frames that only contain the work (the loop, runpy, thread bootstraps, the CLI).
_CONTAINERS = (
    "(asyncio/base_events.py)",
    "(asyncio/runners.py)",
    "(<frozen runpy>)",
    "(membership/cli.py)",
    "(membership/__main__.py)",
    "(threading.py)",
    "(membership/cli/commands.py)",
)


def _short(frame: str) -> str:
    # "function (path/to/file.py:123)" -> "function (file.py)"
    name, _, where = frame.partition(" (")
    file = where.rsplit(":", 1)[0]
    parts = Path(file).parts
    tail = "/".join(parts[-2:]) if parts else file
    return f"{name} ({tail})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--procs", type=int, default=2, help="load processes")
    p.add_argument("--interval", type=float, default=0.6)
    p.add_argument("--window", type=float, default=15.0)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--mode", choices=("single", "cluster"), default="single")
    p.add_argument("--loops", default="asyncio", help="asyncio, uvloop or asyncio,uvloop")
    p.add_argument("--load-loop", choices=("asyncio", "uvloop"), default="asyncio")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--systems",
        default="bare,ours",
        help="of bare, bare-settings, ours, before; NAME:LOOP for one loop",
    )
    p.add_argument(
        "--before",
        type=Path,
        default=None,
        help="system 'before': the replica from this source tree (a checkout of another "
        "commit, its arbiter/ and membership/), to compare two versions in one run",
    )
    p.add_argument("--profile", type=Path, default=None)
    p.add_argument("--profile-systems", default="ours", help="systems profiled: ours,before,bare")
    p.add_argument("--native", action="store_true", help="py-spy --native: C frames too")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    # SIGTERM ends the run as Ctrl-C does: every child process is removed on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    loops = [x for x in args.loops.split(",") if x]
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-hbpath-") as tmp_s:
        tmp = Path(tmp_s)
        # Children run ``python -m membership``, which puts their working directory
        # first on sys.path: outside any source tree, PYTHONPATH (--before) decides.
        os.chdir(tmp)
        for rnd in range(args.rounds):
            for system, loop in _columns(args, loops):
                r = measure(args, system, loop, tmp / f"{system}-{loop}-{rnd}")
                r["round"] = rnd
                results.append(r)
                say(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                for k, v in r.items()}))  # fmt: skip
        tops: dict[str, str] = {}
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            for system in args.profile_systems.split(","):
                out = args.profile / system
                out.mkdir(exist_ok=True)
                measure(args, system, "asyncio", tmp / f"profile-{system}", profile=out)
                tops[system] = profile_top(out / "profile.txt")
                (out / "profile-top.txt").write_text(tops[system] + "\n")
    _table(args, loops, results)
    for system, top in tops.items():
        print(f"\nprofile of {system} (py-spy, the replica process, during the window):")
        print(top)
    if args.json is not None:
        payload = {"args": vars(args), "results": results}
        args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return 0


def _columns(args: argparse.Namespace, loops: list[str]) -> list[tuple[str, str]]:
    """(system, loop) pairs in run order: ``--systems`` entries ``name`` (every loop of
    ``--loops``) or ``name:loop``; ``before`` runs on asyncio only (its code has no choice)."""
    out: list[tuple[str, str]] = []
    for lp in loops:
        for entry in args.systems.split(","):
            system, _, only = entry.partition(":")
            if (only and only != lp) or (system == "before" and lp != loops[0]):
                continue
            out.append((system, lp))
    return out


def _table(args: argparse.Namespace, loops: list[str], results: list[dict[str, Any]]) -> None:
    def med(system: str, loop: str, key: str) -> float:
        xs = [r[key] for r in results if r["system"] == system and r["loop"] == loop]
        return statistics.median(xs) if xs else float("nan")

    print()
    print(
        f"{args.nodes} nodes at {args.interval:g} s, mode {args.mode}, {args.procs} load "
        f"processes, window {args.window:g} s, median of {args.rounds} round(s)"
    )
    cols = _columns(args, loops)
    print(f"{'':30}" + "".join(f"{s + '/' + lp:>22}" for s, lp in cols))
    for key, label in (
        ("cpu_us_per_heartbeat", "server CPU us/heartbeat"),
        ("server_cores", "server CPU, cores"),
        ("acks_per_s", "acks/s"),
        ("achieved", "achieved / asked rate"),
        ("send_late_p99_ms", "load send late p99 ms"),
        ("rtt_p50_ms", "ack round trip p50 ms"),
        ("rtt_p99_ms", "ack round trip p99 ms"),
        ("load_cores", "load CPU, cores"),
        ("kib_per_node", "server KiB per node"),
        ("failures", "stream failures"),
    ):
        print(f"{label:30}" + "".join(f"{med(s, lp, key):22.2f}" for s, lp in cols))
    base = med("bare", "asyncio", "cpu_us_per_heartbeat")
    for s, lp in cols:
        if s == "bare" and lp == "asyncio":
            continue
        print(f"ratio {s}/{lp} to bare/asyncio: {med(s, lp, 'cpu_us_per_heartbeat') / base:.2f}")
    for r in results:
        if r["achieved"] < 0.95:
            print(
                f"WARNING: the load reached only {100 * r['achieved']:.0f}% of the asked rate "
                f"against {r['system']}/{r['loop']} (round {r['round']}): its figure is the "
                "load's limit as much as the server's"
            )


if __name__ == "__main__":
    sys.exit(main())
