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
import base64
import contextlib
import json
import math
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from operator import contains
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/detection.py`: sys.path[0] is bench/
    sys.path.insert(0, str(ROOT))

from membership.localcluster import (  # noqa: E402
    arbiter_args,
    die_with_parent,
    free_ports,
    membership_command,
    node_args,
    wait_leader,
)

T0 = time.monotonic()
# The delay/freeze proxy of the test suite, run as a program (see Ours._start_proxy).
NETPROXY = ROOT / "tests" / "support" / "netproxy.py"
SYSTEMS = ("ours", "etcd", "serf")
PACKAGES = {"etcd": {"etcd": "etcd-server", "etcdctl": "etcd-client"}, "serf": {"serf": "serf"}}
BURST_ON = (5.0, 20.0)
BURST_OFF = (2.0, 8.0)
PAUSE_GAP = (0.2, 1.0)
MAX_CONCURRENT_PAUSES = 2
# A process runs at least this long between two of its pauses: two pauses a few
# milliseconds apart are, to a failure detector, one pause longer than the lease.
PAUSE_SPACING = 1.0
SOAK_GRACE = 3.0  # DEATHs this long after the soak still count as the soak's


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def percentile(sorted_samples: list[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    k = max(0, math.ceil(p / 100 * len(sorted_samples)) - 1)
    return sorted_samples[k]


@dataclass
class Row:
    """One line of the final table."""

    key: str
    label: str
    samples: list[float] = field(default_factory=list)  # seconds
    false_positives: int = 0
    fp_note: str = ""
    missed: int = 0
    details: dict[str, Any] = field(default_factory=dict)


# --- processes ----------------------------------------------------------------------------------


class Procs:
    """Every child process of the benchmark; all are SIGKILLed and reaped by :meth:`kill_all`."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.all: list[subprocess.Popen[bytes]] = []

    def spawn(
        self, name: str, argv: list[str], *, pipe: bool = False, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Starts ``argv`` in its own session, stdout+stderr to ``<name>.log`` (or a pipe)."""
        logf = None if pipe else open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE if pipe else logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches this script only; it kills the children
                preexec_fn=die_with_parent,
                env=env,
            )
        finally:
            if logf is not None:
                logf.close()
        self.all.append(proc)
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL (works on a stopped process too) and reap."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)

    def kill_all(self) -> None:
        for p in self.all:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
        for p in self.all:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
            if p.stdout is not None:
                p.stdout.close()
        self.all = [p for p in self.all if p.returncode is None]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_lines(
    proc: subprocess.Popen[bytes],
    loop: asyncio.AbstractEventLoop,
    handler: Callable[[float, str], None],
    log_path: Path,
) -> threading.Thread:
    """Reads a child's stdout on a thread; each line is timestamped on arrival, then handled
    on the loop (and copied to ``log_path``)."""

    def run() -> None:
        assert proc.stdout is not None
        with open(log_path, "a") as log:
            for raw in iter(proc.stdout.readline, b""):
                t = time.monotonic()
                line = raw.decode(errors="replace").rstrip("\n")
                log.write(line + "\n")
                with contextlib.suppress(RuntimeError):  # loop closed at the end
                    loop.call_soon_threadsafe(handler, t, line)

    th = threading.Thread(target=run, name=f"read-{proc.pid}", daemon=True)
    th.start()
    return th


def ensure_installed(system: str) -> bool:
    """Installs the Debian packages ``system`` needs with apt-get when a binary is missing."""
    binaries = PACKAGES[system]
    missing = [b for b in binaries if shutil.which(b) is None]
    if not missing:
        return True
    pkgs = sorted({binaries[b] for b in missing})
    apt = shutil.which("apt-get")
    if apt is None:
        say(f"{system}: {', '.join(missing)} missing and no apt-get here: skipping {system}")
        return False
    cmd = [apt, "install", "-y", "-q", "--no-install-recommends", *pkgs]
    if os.geteuid() != 0:
        sudo = shutil.which("sudo")
        if sudo is None:
            say(f"{system}: {', '.join(missing)} missing; run as root or install {pkgs}: skipping")
            return False
        cmd = [sudo, "-n", *cmd]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    say(f"{system}: installing {' '.join(pkgs)} with apt-get (Debian packages) ...")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:  # perhaps no package lists yet
        subprocess.run([*cmd[: cmd.index(apt) + 1], "update", "-q"], env=env, capture_output=True)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    still = [b for b in binaries if shutil.which(b) is None]
    if still:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        say(f"{system}: could not install {pkgs}: {' / '.join(tail)}: skipping {system}")
        return False
    say(
        f"{system}: installed {' '.join(pkgs)} (a system service the package may enable is not "
        "used: this benchmark starts its own on free loopback ports)"
    )
    return True


def package_version(pkg: str) -> str:
    """The installed Debian package's version ("?" if unknown)."""
    with contextlib.suppress(OSError):
        r = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True
        )
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    return "?"


# --- ours ----------------------------------------------------------------------------------------


class Subscriber:
    """Follows the view with the SDK; times ALIVE and DEAD events on this process's clock.

    A DEAD event for a node in :attr:`expected` (SIGKILLed, not yet seen DEAD)
    is a detection; any other DEAD of a node's newest incarnation is a false
    DEATH and goes to ``on_false_death``.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.alive: dict[str, tuple[int, float]] = {}  # node -> (incarnation, since)
        self.incarnation: dict[str, int] = {}
        self.expected: set[str] = set()
        self.detected: dict[str, float] = {}
        self.changed = asyncio.Event()
        self.on_false_death: Callable[[float, Any], None] = lambda t, change: None
        self.retired = 0
        self.quorum_changes: list[str] = []

    async def run(self) -> None:
        from membership.view import MemberState, QuorumChanged, ViewChanged, ViewSnapshot

        async for ev in self.client.watch():
            now = time.monotonic()
            if isinstance(ev, ViewSnapshot):
                alive = {m.node_id: m for m in ev.view.members if m.state is MemberState.ALIVE}
                for m in ev.view.members:
                    self.incarnation[m.node_id] = max(
                        m.incarnation, self.incarnation.get(m.node_id, 0)
                    )
                    if m.node_id in self.expected and m.state is not MemberState.ALIVE:
                        self.expected.discard(m.node_id)
                        self.detected[m.node_id] = now
                self.alive = {
                    n: (m.incarnation, self.alive.get(n, (0, now))[1]) for n, m in alive.items()
                }
            elif isinstance(ev, ViewChanged):
                for c in ev.changes:
                    newest = max(c.incarnation, self.incarnation.get(c.node_id, 0))
                    self.incarnation[c.node_id] = newest
                    if c.state is MemberState.ALIVE:
                        self.alive[c.node_id] = (c.incarnation, now)
                        continue
                    if c.incarnation < newest:  # an old life retired by a newer one
                        self.retired += 1
                        continue
                    self.alive.pop(c.node_id, None)
                    if c.state is not MemberState.DEAD:
                        continue
                    if c.node_id in self.expected:
                        self.expected.discard(c.node_id)
                        self.detected[c.node_id] = now
                    else:
                        self.on_false_death(now, c)
            elif isinstance(ev, QuorumChanged):
                self.quorum_changes.append(f"{ev.arbiter_id} in_quorum={ev.in_quorum}")
            self.changed.set()

    def up_for(self, node: str, now: float) -> float:
        """Seconds the node has been ALIVE (-1 when it is not)."""
        a = self.alive.get(node)
        return -1.0 if a is None else now - a[1]

    async def wait_for(self, pred: Callable[[], bool], timeout: float) -> bool:
        return await wait_event(self.changed, pred, timeout)


async def longest_up(
    names: list[str], up_since: dict[str, float], min_up: float, poll: float
) -> str:
    """The name up the longest (``up_since``: monotonic seconds), once one has been
    up for ``min_up`` seconds; polls every ``poll`` seconds until then."""
    while True:
        now = time.monotonic()
        ready = [n for n in names if now - up_since.get(n, now + 1) >= min_up]
        if ready:
            return min(ready, key=lambda n: up_since[n])
        await asyncio.sleep(poll)


async def wait_event(changed: asyncio.Event, pred: Callable[[], bool], timeout: float) -> bool:
    """Waits until ``pred()`` holds, re-checking whenever ``changed`` is set (and every
    0.1 s); False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        changed.clear()
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(left, 0.1)):
                await changed.wait()
    return True


class Ours:
    """3 replicas, victims as node processes, background nodes in host processes; kills, soak."""

    def __init__(self, args: argparse.Namespace, procs: Procs, workdir: Path) -> None:
        self.args = args
        self.procs = procs
        self.workdir = workdir
        self.rng = random.Random(args.seed)
        self.arbiters: dict[str, str] = {}
        self.proc: dict[str, subprocess.Popen[bytes]] = {}  # process name -> process
        self.nodes_of: dict[str, list[str]] = {}  # process name -> its node ids
        self.victims: list[str] = []
        self.proxies: list[str] = []  # the proxies' addresses
        self.proxied_host: str | None = None
        self.sub: Subscriber | None = None
        self.paused: dict[str, float] = {}  # process name -> SIGSTOP time
        self.last_pause: dict[str, tuple[float, float]] = {}  # process -> (start, end)
        self.pauses: list[dict[str, Any]] = []
        self.busy: set[str] = set()  # victims being killed or restarted
        self.burners_on = 0
        self.burst_since: dict[int, float] = {}
        self.phase = "start"
        self.false_deaths: list[dict[str, Any]] = []
        self.soak_t0 = 0.0
        self.cpu: dict[str, Any] = {}

    # --- processes

    def _spawn_member(self, name: str, argv: list[str]) -> None:
        self.proc[name] = self.procs.spawn(name, membership_command(*argv, log_level="info"))

    def start_arbiters(self) -> None:
        ports = free_ports(3)
        self.arbiters = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
        for rid in self.arbiters:
            data = self.workdir / f"{rid}.data"
            self._spawn_member(rid, arbiter_args(rid, self.arbiters, data))

    def start_victim(self, node: str) -> None:
        self._spawn_member(node, node_args(node, self.arbiters.values()))
        self.nodes_of[node] = [node]

    def start_host(self, name: str, ids: list[str], addresses: list[str]) -> None:
        if len(ids) == 1:  # --nodes-per-process 1: a plain node process
            self._spawn_member(name, node_args(ids[0], addresses))
        else:
            self.proc[name] = self.procs.spawn(
                name,
                [
                    sys.executable,
                    str(ROOT / "bench" / "node_host.py"),
                    *("--arbiters", ",".join(addresses), "--ids", ",".join(ids)),
                ],
            )
        self.nodes_of[name] = ids

    def _start_proxy(self, name: str, target: str) -> str:
        """A jitter proxy process in front of ``target`` (``tests/support/netproxy.py`` run
        by path, as a program: the benchmark imports nothing from the tests); returns
        the address it listens on (its first line of output)."""
        jmin, jmax = self.args.jitter_ms
        proc = self.procs.spawn(
            name,
            [
                sys.executable,
                str(NETPROXY),
                *("--target", target, "--delay", str(jmin / 1000)),
                *("--jitter", str((jmax - jmin) / 1000), "--seed", str(self.rng.randrange(2**31))),
            ],
            pipe=True,
        )
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline().decode().strip() if ready else ""
        if not line:
            raise RuntimeError(f"ours: {name} did not start (rc={proc.poll()})")
        return line

    # --- phases

    async def run(self) -> list[Row]:
        from membership.client import MembershipClient, reap
        from membership.config import ClientConfig

        args = self.args
        client = None
        task = None
        rows: list[Row] = []
        try:
            say("ours: starting 3 arbiter replicas (default settings) ...")
            self.start_arbiters()
            client = MembershipClient(
                list(self.arbiters.values()), config=ClientConfig(follow_view=False)
            )
            try:
                info = await wait_leader(client, 60)
            except TimeoutError:
                raise RuntimeError("ours: no leader elected within 60 s") from None
            say(f"ours: leader {info.leader_id}")
            self.sub = sub = Subscriber(client)
            sub.on_false_death = self._false_death
            task = asyncio.get_running_loop().create_task(sub.run())
            await self._start_nodes()
            await self._measure_cpu()
            self.phase = "kills"
            quiet = Row("ours", f"ours: 3 replicas, {args.nodes} nodes, defaults")
            await self._kill_series(quiet, args.kills, label="ours")
            quiet.false_positives = sum(1 for d in self.false_deaths if d["phase"] == "kills")
            quiet.fp_note = "during the kills"
            rows.append(quiet)
            if args.soak > 0:
                rows.append(await self._soak())
            return rows
        finally:
            if task is not None:
                await reap(task)
            if client is not None:
                await client.close()
            for p in self.proc.values():
                Procs.kill(p)

    async def _start_nodes(self) -> None:
        args = self.args
        assert self.sub is not None
        names = [f"n{i:02d}" for i in range(args.nodes)]
        n_victims = max(1, min(args.victims, args.nodes))
        self.victims = names[:n_victims]
        background = names[n_victims:]
        per = max(1, args.nodes_per_process)
        groups = [background[i : i + per] for i in range(0, len(background), per)]
        proxied: list[str] = []
        if groups and args.jitter_ms[1] > 0 and args.soak > 0:
            if not NETPROXY.exists():
                say(f"ours: no jitter: {NETPROXY} is missing")
            else:
                for i, addr in enumerate(self.arbiters.values()):
                    proxied.append(self._start_proxy(f"proxy{i}", addr))
        self.proxies = proxied
        for v in self.victims:
            self.start_victim(v)
        for i, g in enumerate(groups):
            name = f"host{i}"
            via_proxy = i == 0 and bool(proxied)
            if via_proxy:
                self.proxied_host = name
            self.start_host(name, g, proxied if via_proxy else list(self.arbiters.values()))
        hosted = (
            f"{len(background)} background nodes in {len(groups)} process(es) of up to {per} "
            f"(bench/node_host.py)"
            if per > 1
            else f"{len(background)} background nodes as their own `membership node` processes"
        )
        say(
            f"ours: starting {args.nodes} nodes: {n_victims} victims as `membership node` "
            f"processes ({', '.join(self.victims)}), {hosted}"
            + (
                f"; {self.proxied_host}'s {len(groups[0])} nodes reach the replicas through "
                f"a proxy process each ({NETPROXY.relative_to(ROOT)}) adding {args.jitter_ms[0]:g}-"
                f"{args.jitter_ms[1]:g} ms to every chunk, for the whole run"
                if self.proxied_host
                else ""
            )
        )
        t = time.monotonic()
        sub = self.sub
        if not await sub.wait_for(lambda: set(names) <= set(sub.alive), 120):
            missing = sorted(set(names) - set(sub.alive))
            raise RuntimeError(f"ours: nodes not ALIVE after 120 s: {missing}")
        say(f"ours: all {args.nodes} nodes ALIVE after {time.monotonic() - t:.1f} s")

    async def _measure_cpu(self, window: float = 5.0) -> None:
        await asyncio.sleep(2.0)  # past the start-up
        before = {n: cpu_seconds(p.pid) for n, p in self.proc.items()}
        t = time.monotonic()
        await asyncio.sleep(window)
        dt = time.monotonic() - t
        pct = {n: (cpu_seconds(p.pid) - before[n]) / dt * 100 for n, p in self.proc.items()}
        arb = {n: round(v, 1) for n, v in pct.items() if n in self.arbiters}
        node_proc = [pct[v] for v in self.victims]
        hosts = [(pct[n], len(self.nodes_of[n])) for n in pct if n.startswith("host")]
        per_node_proc = sum(node_proc) / len(node_proc)
        self.cpu = {"window_s": round(dt, 1), "arbiters_pct": arb}
        self.cpu["node_process_pct"] = round(per_node_proc, 2)
        line = (
            f"ours: CPU over {dt:.0f} s: replicas "
            + "/".join(f"{v:.1f}" for v in arb.values())
            + f" % of a core; one `membership node` process {per_node_proc:.2f} %"
        )
        if hosts and max(k for _, k in hosts) > 1:
            host_pct = sum(p for p, _ in hosts) / len(hosts)
            per_hosted = sum(p for p, _ in hosts) / sum(k for _, k in hosts)
            self.cpu["host_process_pct"] = round(host_pct, 2)
            self.cpu["hosted_node_pct"] = round(per_hosted, 2)
            line += (
                f"; one host process {host_pct:.1f} % ({per_hosted:.2f} % per hosted node): "
                f"{self.args.nodes} node processes would take "
                f"~{per_node_proc * self.args.nodes:.0f} % of a core, as run they take "
                f"{sum(node_proc) + sum(p for p, _ in hosts):.0f} %"
            )
        say(line)

    def _pick_victim(self, now: float) -> str | None:
        assert self.sub is not None
        ready = [
            v
            for v in self.victims
            if v not in self.busy
            and v not in self.paused
            and self.sub.up_for(v, now) >= self.args.min_up
            and now - self.last_pause.get(v, (0.0, -1e9))[1] > 1.0
        ]
        if not ready:
            return None
        # the one that has waited longest since it came up: rotation
        return min(ready, key=lambda v: self.sub.alive[v][1])  # type: ignore[union-attr]

    async def _kill_one(self, row: Row) -> None:
        sub = self.sub
        assert sub is not None
        while True:
            victim = self._pick_victim(time.monotonic())
            if victim is not None:
                break
            await asyncio.sleep(0.05)
        self.busy.add(victim)
        try:
            # a random phase against the 0.15 s heartbeat interval
            await asyncio.sleep(self.rng.uniform(0, 0.15))
            sub.expected.add(victim)
            sub.detected.pop(victim, None)
            proc = self.proc[victim]
            t0 = time.monotonic()
            proc.kill()
            proc.wait()
            if await sub.wait_for(lambda: victim in sub.detected, 30):
                row.samples.append(sub.detected.pop(victim) - t0)
            else:
                row.missed += 1
                sub.expected.discard(victim)
                say(f"{row.key}: {victim} not DEAD 30 s after SIGKILL (counted as missed)")
            self.start_victim(victim)
        finally:
            self.busy.discard(victim)

    async def _kill_series(self, row: Row, kills: int, label: str) -> None:
        say(
            f"{label}: {kills} SIGKILLs of a victim (rotating among {len(self.victims)}), "
            "timing kill -> DEAD at the subscriber ..."
        )
        for i in range(kills):
            await self._kill_one(row)
            if (i + 1) % 10 == 0 or i + 1 == kills:
                last = sorted(row.samples[-10:])
                if last:
                    say(
                        f"{label}: {i + 1}/{kills} kills; last {len(last)}: "
                        f"{last[0] * 1000:.0f} .. {last[-1] * 1000:.0f} ms"
                    )

    # --- soak

    def _false_death(self, t: float, change: Any) -> None:
        proc = next((p for p, ids in self.nodes_of.items() if change.node_id in ids), "?")
        last = self.last_pause.get(proc)
        paused_now = proc in self.paused
        ev = [
            f"{e.arbiter_id}:{e.silence:.2f}s" if e.silence is not None else e.arbiter_id
            for e in getattr(change, "evidence", ())
        ]
        rec = {
            "phase": self.phase,
            "t_soak": round(t - self.soak_t0, 3) if self.phase == "soak" else None,
            "node": change.node_id,
            "incarnation": change.incarnation,
            "process": proc,
            "paused_now_for": round(t - self.paused[proc], 3) if paused_now else None,
            "last_pause": (
                {"ended_s_before": round(t - last[1], 3), "length_s": round(last[1] - last[0], 3)}
                if last
                else None
            ),
            "burners_on": self.burners_on,
            "via_proxy": proc == self.proxied_host,
            "evidence_silence": ev,
        }
        self.false_deaths.append(rec)
        say(f"ours: FALSE DEATH {json.dumps(rec)}")

    async def _pause(self, name: str, length: float) -> None:
        proc = self.proc[name]
        start = time.monotonic()
        try:
            os.kill(proc.pid, signal.SIGSTOP)
            self.paused[name] = start
            await asyncio.sleep(length)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            end = time.monotonic()
            self.paused.pop(name, None)
            self.last_pause[name] = (start, end)
            self.pauses.append(
                {
                    "process": name,
                    "t_soak": round(start - self.soak_t0, 3),
                    "s": round(end - start, 4),
                }
            )

    async def _pauser(self) -> None:
        args = self.args
        sub = self.sub
        assert sub is not None
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                await asyncio.sleep(self.rng.uniform(*PAUSE_GAP))
                now = time.monotonic()
                if len(self.paused) >= MAX_CONCURRENT_PAUSES:
                    continue
                candidates = [
                    p
                    for p in self.nodes_of
                    if p not in self.paused
                    and now - self.last_pause.get(p, (0.0, -1e9))[1] >= PAUSE_SPACING
                    and p not in self.busy
                    and all(sub.up_for(n, now) >= 0 for n in self.nodes_of[p])
                ]
                if not candidates:
                    continue
                name = self.rng.choice(candidates)
                t = asyncio.get_running_loop().create_task(
                    self._pause(name, self.rng.uniform(args.pause_min, args.pause_max))
                )
                tasks.add(t)
                t.add_done_callback(tasks.discard)
        finally:
            for t in list(tasks):
                await t  # each resumes its process (SIGCONT) within pause_max

    async def _burner(self, proc: subprocess.Popen[bytes], on_time: list[float]) -> None:
        on = True
        try:
            while True:
                start = time.monotonic()
                if on:
                    os.kill(proc.pid, signal.SIGCONT)
                    self.burners_on += 1
                    self.burst_since[proc.pid] = start
                    try:
                        await asyncio.sleep(self.rng.uniform(*BURST_ON))
                    finally:
                        os.kill(proc.pid, signal.SIGSTOP)
                        self.burners_on -= 1
                        del self.burst_since[proc.pid]
                        on_time[0] += time.monotonic() - start
                else:
                    await asyncio.sleep(self.rng.uniform(*BURST_OFF))
                on = not on
        finally:
            Procs.kill(proc)

    async def _soak_killer(self, row: Row) -> None:
        every = self.args.soak_kill_every
        while True:
            await asyncio.sleep(self.rng.uniform(0.5 * every, 1.5 * every))
            await self._kill_one(row)

    async def _soak(self) -> Row:
        from membership.client import reap

        args = self.args
        row = Row("ours-soak", "ours, during the soak (pauses, CPU bursts, jitter)")
        jmin, jmax = args.jitter_ms
        n_burners = args.burners
        say(
            f"ours: soak for {args.soak:g} s: SIGSTOP of a random node process for "
            f"{args.pause_min:g}-{args.pause_max:g} s every {PAUSE_GAP[0]:g}-{PAUSE_GAP[1]:g} s "
            f"(at most {MAX_CONCURRENT_PAUSES} at once, a process runs >= {PAUSE_SPACING:g} s "
            f"between two of its pauses); {n_burners} busy-loop burner(s) in bursts "
            f"({BURST_ON[0]:g}-{BURST_ON[1]:g} s on, {BURST_OFF[0]:g}-{BURST_OFF[1]:g} s off); "
            + (
                f"{jmin:g}-{jmax:g} ms delay on {self.proxied_host}'s links"
                if self.proxies
                else "no jitter (no proxy)"
            )
            + (
                f"; a victim SIGKILLed every ~{args.soak_kill_every:g} s"
                if args.soak_kill_every
                else ""
            )
        )
        logs = [self.procs.logdir / f"{n}.log" for n in self.nodes_of]
        offsets = {p: p.stat().st_size if p.exists() else 0 for p in logs}
        loop = asyncio.get_running_loop()
        self.phase = "soak"
        self.soak_t0 = t0 = time.monotonic()
        on_time = [0.0]
        burners = [
            self.procs.spawn(f"burner{i}", [sys.executable, "-c", "while True: pass"])
            for i in range(n_burners)
        ]
        tasks = [loop.create_task(self._burner(b, on_time)) for b in burners]
        tasks.append(loop.create_task(self._pauser()))
        if args.soak_kill_every > 0:
            tasks.append(loop.create_task(self._soak_killer(row)))
        end = t0 + args.soak

        def burning(done: float) -> float:  # burner-seconds so far, bursts under way included
            now = time.monotonic()
            return done + sum(now - since for since in self.burst_since.values())

        try:
            while (left := end - time.monotonic()) > 0:
                await asyncio.sleep(min(30.0, left))
                el = time.monotonic() - t0
                say(
                    f"ours: soak {el:.0f}/{args.soak:g} s: {len(self.pauses)} pauses "
                    f"(longest {max((p['s'] for p in self.pauses), default=0):.2f} s), "
                    f"burners on {burning(on_time[0]) / max(el, 1e-9) / max(n_burners, 1):.0%}"
                    f" of the time so far, {len(row.samples)} kills, "
                    f"{sum(1 for d in self.false_deaths if d['phase'] == 'soak')} false DEATHs, "
                    f"load {os.getloadavg()[0]:.1f}"
                )
        finally:
            for t in tasks:
                await reap(t)
            for name in list(self.paused):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc[name].pid, signal.SIGCONT)
        soak_len = time.monotonic() - t0
        await asyncio.sleep(SOAK_GRACE)  # DEATHs caused by the soak's last moments
        self.phase = "after"
        fenced = 0
        for p in logs:
            if p.exists():
                with open(p, "rb") as f:
                    f.seek(offsets[p])
                    fenced += f.read().count(b": fenced (")
        lengths = sorted(p["s"] for p in self.pauses)
        soak_fd = [d for d in self.false_deaths if d["phase"] == "soak"]
        row.false_positives = len(soak_fd)
        row.fp_note = f"in the {soak_len:.0f} s soak"
        row.details = {
            "soak_s": round(soak_len, 1),
            "pauses": len(self.pauses),
            "pause_s_p50": round(percentile(lengths, 50), 3) if lengths else None,
            "pause_s_max": round(lengths[-1], 3) if lengths else None,
            "pauses_over_lease_0.75s": sum(1 for x in lengths if x >= 0.75),
            "pause_spacing_s": PAUSE_SPACING,
            "burner_duty": round(on_time[0] / soak_len / max(n_burners, 1), 3),
            "burners": n_burners,
            "jitter_ms": [jmin, jmax] if self.proxies else None,
            "proxied_nodes": len(self.nodes_of.get(self.proxied_host or "", [])),
            "fenced_episodes": fenced,
            "false_deaths": soak_fd,
            "pause_log": self.pauses,
        }
        say(
            f"ours: soak done: {soak_len:.0f} s, {len(self.pauses)} pauses (median "
            f"{row.details['pause_s_p50']} s, longest {row.details['pause_s_max']} s), burners on "
            f"{row.details['burner_duty'] * 100:.0f} % of the time, {fenced} fencing episode(s) "
            f"reported by nodes, {len(row.samples)} kills, {len(soak_fd)} false DEATH(s)"
        )
        return row


# --- etcd ----------------------------------------------------------------------------------------


class Etcd:
    """One etcd member, lease keep-alive processes as nodes, an etcdctl watcher."""

    def __init__(self, args: argparse.Namespace, procs: Procs, workdir: Path) -> None:
        self.args = args
        self.procs = procs
        self.workdir = workdir
        self.rng = random.Random(None if args.seed is None else args.seed + 1)
        self.url = ""
        self.env = {**os.environ, "ETCDCTL_API": "3"}
        self.keepalive: dict[str, subprocess.Popen[bytes]] = {}
        self.up_since: dict[str, float] = {}
        self.expected: set[str] = set()
        self.deleted: dict[str, float] = {}
        self.false: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self.ttl = 0

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            result: dict[str, Any] = json.loads(r.read())
            return result

    def _grant(self, ttl: int) -> tuple[int, int]:
        r = self._post("/v3/lease/grant", {"TTL": ttl})
        return int(r["ID"]), int(r["TTL"])

    def _start_node(self, node: str) -> None:
        lease, _ = self._grant(self.ttl)
        key = base64.b64encode(f"/bench/{node}".encode()).decode()
        self._post(
            "/v3/kv/put", {"key": key, "value": base64.b64encode(b"x").decode(), "lease": lease}
        )
        self.keepalive[node] = self.procs.spawn(
            f"etcd-{node}",
            ["etcdctl", "--endpoints", self.url, "lease", "keep-alive", format(lease, "x")],
            env=self.env,
        )

    def _on_watch(self, t: float, line: str) -> None:
        try:
            resp = json.loads(line)
        except ValueError:
            return
        for ev in resp.get("Events") or ():
            key = base64.b64decode(ev["kv"]["key"]).decode()
            node = key.rsplit("/", 1)[-1]
            if ev.get("type", 0) == 1:  # DELETE
                self.up_since.pop(node, None)
                if node in self.expected:
                    self.expected.discard(node)
                    self.deleted[node] = t
                else:
                    self.false.append({"node": node, "t": round(t - T0, 3)})
                    say(f"etcd: unexpected DELETE of {key}")
            else:
                self.up_since[node] = t
        self.changed.set()

    async def _wait(self, pred: Callable[[], bool], timeout: float) -> bool:
        return await wait_event(self.changed, pred, timeout)

    async def run(self) -> list[Row]:
        args = self.args
        cport, pport = free_ports(2)
        self.url = f"http://127.0.0.1:{cport}"
        purl = f"http://127.0.0.1:{pport}"
        say(
            f"etcd: starting one member (--heartbeat-interval {args.etcd_heartbeat_ms} "
            f"--election-timeout {args.etcd_election_ms}) on {self.url} ..."
        )
        etcd = self.procs.spawn(
            "etcd",
            [
                "etcd",
                *("--name", "bench", "--data-dir", str(self.workdir / "etcd.data")),
                *("--listen-client-urls", self.url, "--advertise-client-urls", self.url),
                *("--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl),
                *("--initial-cluster", f"bench={purl}"),
                *("--heartbeat-interval", str(args.etcd_heartbeat_ms)),
                *("--election-timeout", str(args.etcd_election_ms)),
            ],
        )
        watcher = None
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                        if json.loads(r.read()).get("health") == "true":
                            break
                except (OSError, ValueError):
                    pass
                if etcd.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("etcd did not become healthy (see its log with --keep-logs)")
                await asyncio.sleep(0.2)
            lease, self.ttl = self._grant(1)
            self._post("/v3/lease/revoke", {"ID": lease})
            say(f"etcd: asked for a 1 s lease, granted TTL {self.ttl} s (etcd's minimum here)")
            watcher = self.procs.spawn(
                "etcd-watch",
                ["etcdctl", "--endpoints", self.url, "-w", "json", "watch", "--prefix", "/bench/"],
                pipe=True,
                env=self.env,
            )
            read_lines(
                watcher, asyncio.get_running_loop(), self._on_watch, self.workdir / "etcd-watch.log"
            )
            await asyncio.sleep(0.5)  # the watch is open before the first key is written
            names = [f"n{i:02d}" for i in range(args.nodes)]
            for n in names:
                self._start_node(n)
            if not await self._wait(lambda: set(names) <= set(self.up_since), 30):
                raise RuntimeError("etcd: the watcher did not see every node's key")
            victims = names[: max(1, min(args.victims, args.nodes))]
            say(
                f"etcd: {args.nodes} nodes (lease TTL {self.ttl} s, a key each, an `etcdctl lease "
                f"keep-alive` process each); {args.kills} SIGKILLs of a victim (rotating among "
                f"{len(victims)}), timing kill -> DELETE at the watcher ..."
            )
            row = Row("etcd", f"etcd {self._version()}: lease TTL {self.ttl} s, watcher")
            for i in range(args.kills):
                victim = await longest_up(victims, self.up_since, args.min_up, poll=0.05)
                await asyncio.sleep(self.rng.uniform(0, 0.5))  # phase against the 0.5 s renewals
                self.expected.add(victim)
                proc = self.keepalive[victim]
                t0 = time.monotonic()
                proc.kill()
                proc.wait()
                if await self._wait(partial(contains, self.deleted, victim), 30):
                    row.samples.append(self.deleted.pop(victim) - t0)
                else:
                    row.missed += 1
                    self.expected.discard(victim)
                    say(f"etcd: {victim}'s key not deleted 30 s after SIGKILL (missed)")
                self._start_node(victim)
                if (i + 1) % 10 == 0 or i + 1 == args.kills:
                    last = sorted(row.samples[-10:])
                    say(
                        f"etcd: {i + 1}/{args.kills} kills; last {len(last)}: "
                        f"{last[0] * 1000:.0f} .. {last[-1] * 1000:.0f} ms"
                    )
            row.false_positives = len(self.false)
            row.fp_note = "during the kills"
            row.details = {"ttl_s": self.ttl, "unexpected_deletes": self.false}
            return [row]
        finally:
            for p in [*self.keepalive.values(), *([watcher] if watcher else []), etcd]:
                Procs.kill(p)

    @staticmethod
    def _version() -> str:
        return package_version("etcd-server")


# --- serf ----------------------------------------------------------------------------------------

_SERF_EVENT = re.compile(r"serf: EventMember(Join|Failed|Leave|Reap|Update): (\S+)")


class Serf:
    """Serf agents and an observer agent on loopback."""

    def __init__(self, args: argparse.Namespace, procs: Procs, workdir: Path) -> None:
        self.args = args
        self.procs = procs
        self.workdir = workdir
        self.rng = random.Random(None if args.seed is None else args.seed + 2)
        self.up_since: dict[str, float] = {}
        self.expected: set[str] = set()
        self.failed: dict[str, float] = {}
        self.false: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, tuple[int, int]] = {}
        self.observer_addr = ""

    def _on_line(self, t: float, line: str) -> None:
        m = _SERF_EVENT.search(line)
        if not m:
            return
        kind, name = m.groups()
        if kind == "Join":
            self.up_since[name] = t
        elif kind == "Failed":
            self.up_since.pop(name, None)
            if name in self.expected:
                self.expected.discard(name)
                self.failed[name] = t
            else:
                self.false.append({"node": name, "t": round(t - T0, 3)})
                say(f"serf: unexpected member-failed for {name}")
        elif kind in ("Leave", "Reap"):
            self.up_since.pop(name, None)
        self.changed.set()

    def _agent_argv(self, name: str) -> list[str]:
        bind, rpc = self.ports[name]
        argv = [
            "serf",
            "agent",
            *("-node", name, "-bind", f"127.0.0.1:{bind}", "-rpc-addr", f"127.0.0.1:{rpc}"),
            *("-profile", self.args.serf_profile, "-log-level", "info"),
        ]
        if name != "observer":
            argv += ["-join", self.observer_addr]
        return argv

    def _start(self, name: str) -> None:
        self.agents[name] = self.procs.spawn(f"serf-{name}", self._agent_argv(name))

    async def _wait(self, pred: Callable[[], bool], timeout: float) -> bool:
        return await wait_event(self.changed, pred, timeout)

    async def run(self) -> list[Row]:
        args = self.args
        names = [f"s{i + 1}" for i in range(args.serf_agents)]
        ports = free_ports(2 * (len(names) + 1))
        for i, n in enumerate(["observer", *names]):
            self.ports[n] = (ports[2 * i], ports[2 * i + 1])
        self.observer_addr = f"127.0.0.1:{self.ports['observer'][0]}"
        say(f"serf: starting an observer and {len(names)} agents (profile {args.serf_profile}) ...")
        observer = self.procs.spawn("serf-observer", self._agent_argv("observer"), pipe=True)
        try:
            read_lines(
                observer,
                asyncio.get_running_loop(),
                self._on_line,
                self.workdir / "serf-observer.log",
            )
            if not await self._wait(lambda: "observer" in self.up_since, 20):
                raise RuntimeError("serf: the observer agent did not start")
            for n in names:
                self._start(n)
            if not await self._wait(lambda: set(names) <= set(self.up_since), 60):
                raise RuntimeError("serf: agents did not join")
            kills = args.serf_kills
            say(
                f"serf: {kills} SIGKILLs of an agent (rotating), timing kill -> EventMemberFailed "
                "at the observer, then a restart and a rejoin ..."
            )
            row = Row(
                "serf",
                f"serf {self._version()}: {len(names)} agents + observer, "
                f"profile {args.serf_profile}",
            )
            for i in range(kills):
                victim = await longest_up(names, self.up_since, 2.0, poll=0.1)
                await asyncio.sleep(self.rng.uniform(0, 1.0))  # phase against the 1 s probes
                self.expected.add(victim)
                proc = self.agents[victim]
                t0 = time.monotonic()
                proc.kill()
                proc.wait()
                if await self._wait(partial(contains, self.failed, victim), 120):
                    dt = self.failed.pop(victim) - t0
                    row.samples.append(dt)
                    say(f"serf: {i + 1}/{kills}: {victim} failed {dt * 1000:.0f} ms after SIGKILL")
                else:
                    row.missed += 1
                    self.expected.discard(victim)
                    say(f"serf: {victim} not failed 120 s after SIGKILL (missed)")
                self._start(victim)
                if not await self._wait(partial(contains, self.up_since, victim), 60):
                    raise RuntimeError(f"serf: {victim} did not rejoin")
            row.false_positives = len(self.false)
            row.fp_note = "during the kills"
            row.details = {"unexpected_failures": self.false, "profile": args.serf_profile}
            return [row]
        finally:
            for p in [*self.agents.values(), observer]:
                Procs.kill(p)

    @staticmethod
    def _version() -> str:
        return package_version("serf")


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
