"""``membership demo``: a real cluster on loopback, shown failing and deciding.

Starts 3 arbiter replicas and 5 nodes as separate processes on free loopback
ports, watches the view, SIGKILLs a node, then the leader replica and another
node, and prints each death with the time from kill to the DEAD event. Every
child is stopped on exit, also on Ctrl-C (and, on Linux, if the demo itself
is killed: children get SIGKILL through PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from membership.errors import InvalidArgument
from membership.view import MemberState, ViewChanged, ViewEvent, ViewSnapshot

__all__ = ["Cluster", "add_parser", "free_ports"]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """Returns ``n`` distinct ports that were free on ``host`` a moment ago."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Cluster:
    """Processes of a local cluster: arbiters and nodes, each a child process.

    Args:
        workdir: folder for the children's log files and the arbiters' data
            directories (``<id>.data``).
        arbiter_args: extra flags for every arbiter.
    """

    workdir: Path
    arbiter_args: list[str] = field(default_factory=list)
    arbiters: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def addresses(self) -> list[str]:
        """Every arbiter's address, in id order."""
        return [self.arbiters[k] for k in sorted(self.arbiters)]

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        logf = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            [sys.executable, "-m", "membership", "--log-level", "info", *argv],
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches the demo only; it stops the children
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        logf.close()
        self.procs[name] = proc
        return proc

    def start_arbiters(self, n: int = 3) -> None:
        """Starts ``n`` replicas a1..an on free loopback ports."""
        ports = free_ports(n)
        self.arbiters = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
        peers = ",".join(f"{k}={v}" for k, v in self.arbiters.items())
        for rid, addr in self.arbiters.items():
            data_dir = str(self.workdir / f"{rid}.data")
            self._spawn(
                rid,
                [
                    "arbiter",
                    *("--id", rid, "--listen", addr, "--peers", peers, "--data-dir", data_dir),
                    *self.arbiter_args,
                ],
            )

    def start_node(self, node_id: str, labels: dict[str, str] | None = None) -> None:
        """Starts one node process heartbeating to every arbiter."""
        argv = ["node", "--id", node_id, "--arbiters", ",".join(self.addresses)]
        for k, v in (labels or {}).items():
            argv += ["--label", f"{k}={v}"]
        self._spawn(node_id, argv)

    def kill(self, name: str) -> None:
        """SIGKILLs one child and reaps it."""
        proc = self.procs[name]
        proc.kill()
        proc.wait()

    def stop_all(self, timeout: float = 5.0) -> None:
        """SIGTERMs every child (nodes first, so they leave), then SIGKILLs stragglers."""
        order = sorted(self.procs, key=lambda k: k.startswith("a"))
        for name in order:
            proc = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + timeout
        for name in order:
            proc = self.procs[name]
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class _Watcher:
    """Follows the view in-process, prints it, and records when each death arrived."""

    def __init__(self, client: Any, start: float, out: Callable[[str], None] | None = None) -> None:
        self.client = client
        self.start = start
        self.out = out or (lambda line: print(line, flush=True))
        self.deaths: dict[str, float] = {}
        self.alive: set[str] = set()
        self.epoch = 0
        self.changed = asyncio.Event()

    def _t(self) -> str:
        return f"[{time.monotonic() - self.start:6.2f}s]"

    async def run(self) -> None:
        async for ev in self.client.watch():
            self._show(ev)
            self.changed.set()

    def _show(self, ev: ViewEvent) -> None:
        if isinstance(ev, ViewSnapshot):
            self.epoch = ev.view.epoch
            self.alive = {m.node_id for m in ev.view.alive()}
            self.out(f"{self._t()} view at epoch {ev.view.epoch}: {len(self.alive)} alive")
        elif isinstance(ev, ViewChanged):
            self.epoch = ev.epoch
            for c in ev.changes:
                if c.state is MemberState.ALIVE:
                    self.alive.add(c.node_id)
                else:
                    self.alive.discard(c.node_id)
                if c.state is MemberState.DEAD:
                    self.deaths[c.node_id] = time.monotonic()
                labels = " ".join(f"{k}={v}" for k, v in c.labels.items())
                self.out(
                    f"{self._t()} epoch {ev.epoch:>3}  {c.node_id} -> {c.state.value:<5} {labels}"
                )

    async def wait_for(self, pred: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self.changed.wait()


async def _demo(args: argparse.Namespace) -> int:
    from membership.client import MembershipClient, reap
    from membership.config import ClientConfig

    if args.nodes < 4:
        raise InvalidArgument("--nodes must be at least 4 (the demo kills two of them)")
    keep = Path(args.keep_logs) if args.keep_logs is not None else None
    if keep is not None and keep.exists() and not keep.is_dir():
        raise InvalidArgument(f"--keep-logs {args.keep_logs!r} exists and is not a folder")
    start = time.monotonic()
    results: list[tuple[str, str, float]] = []
    with tempfile.TemporaryDirectory(prefix="membership-demo-") as tmp:
        cluster = Cluster(Path(tmp))
        client = None
        watch_task = None
        try:
            print("starting 3 arbiter replicas (a1, a2, a3) on loopback ...", flush=True)
            cluster.start_arbiters(3)
            client = MembershipClient(cluster.addresses, config=ClientConfig(follow_view=False))
            info = await _wait_leader(client, timeout=20)
            print(f"leader elected: {info.leader_id}", flush=True)
            watcher = _Watcher(client, start)
            watch_task = asyncio.get_running_loop().create_task(watcher.run())
            nodes = [f"n{i}" for i in range(1, args.nodes + 1)]
            print(f"starting {len(nodes)} nodes ...", flush=True)
            for i, n in enumerate(nodes):
                cluster.start_node(n, {"rack": f"r{i % 2 + 1}", "gpu": "a100" if i % 2 else "h100"})
            await watcher.wait_for(lambda: set(nodes) <= watcher.alive, 20)
            print(f"all {len(nodes)} nodes ALIVE at epoch {watcher.epoch}", flush=True)

            async def kill_node(name: str, note: str) -> None:
                print(f"\n>>> SIGKILL {name}{note}", flush=True)
                t0 = time.monotonic()
                cluster.kill(name)
                await watcher.wait_for(lambda: name in watcher.deaths, 20)
                dt = watcher.deaths[name] - t0
                results.append((name, note.strip(" ()") or "-", dt))
                print(
                    f"    {name} declared DEAD by a quorum of replicas {dt:.2f}s after the kill",
                    flush=True,
                )

            await kill_node(nodes[1], "")
            info = await client.get_view()
            leader = info.leader_id
            assert leader is not None
            print(f"\n>>> SIGKILL leader replica {leader}", flush=True)
            cluster.kill(leader)
            await kill_node(nodes[3], f" (leader {leader} is down: 2 of 3 replicas decide)")
            info = await _wait_leader(client, timeout=20)
            print(f"new leader: {info.leader_id}", flush=True)
            survivors = sorted(watcher.alive)
            print("\nsummary", flush=True)
            for name, note, dt in results:
                print(
                    f"  {name}: DEAD {dt:.2f}s after SIGKILL  {note if note != '-' else ''}",
                    flush=True,
                )
            print(f"  alive at epoch {watcher.epoch}: {', '.join(survivors)}", flush=True)
            print(f"  total {time.monotonic() - start:.1f}s", flush=True)
            return 0
        finally:
            if watch_task is not None:
                await reap(watch_task)
            if client is not None:
                await client.close()
            cluster.stop_all()
            if args.keep_logs:
                import shutil

                dest = Path(args.keep_logs)
                dest.mkdir(parents=True, exist_ok=True)
                for f in Path(tmp).glob("*.log"):
                    shutil.copy(f, dest / f.name)


async def _wait_leader(client: Any, timeout: float) -> Any:
    from membership.errors import UnavailableError

    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(UnavailableError):
            info = await client.get_view()
            if info.in_quorum and info.leader_id:
                return info
        if time.monotonic() > deadline:
            raise TimeoutError("no leader elected in time")
        await asyncio.sleep(0.1)


def _run(args: argparse.Namespace) -> int:
    # The demo forks children while its own gRPC client runs; they exec at
    # once, so gRPC's fork handlers (and their warnings) are not needed.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    try:
        return asyncio.run(asyncio.wait_for(_demo(args), args.timeout))
    except TimeoutError:
        print("membership demo: error: the demo did not finish in time", file=sys.stderr)
        return 1


def add_parser(sub: Any) -> None:
    """Adds the ``demo`` sub-command."""
    p = sub.add_parser(
        "demo", help="run a 3-replica, 5-node cluster on loopback and kill parts of it"
    )
    p.add_argument("--nodes", type=int, default=5, help="number of nodes (default 5, at least 4)")
    from membership.cli import _positive

    p.add_argument(
        "--timeout", type=_positive, default=55.0, help="give up after this many seconds"
    )
    p.add_argument(
        "--keep-logs", metavar="DIR", default=None, help="copy every process's log here at the end"
    )
    p.set_defaults(func=_run)
