"""Helpers of the detection benchmark (bench/detection.py): processes, timing, the
SDK subscriber that times detections. Not a program of its own."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from membership.testing.localcluster import die_with_parent

ROOT = Path(__file__).resolve().parent.parent
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
        from membership.shared.view import MemberState, QuorumChanged, ViewChanged, ViewSnapshot

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
