"""Real processes on loopback for integration tests: arbiters, nodes, watchers, the CLI.

Every process started here is killed when the cluster is closed (the fixture
does it, also when the test fails), and each child gets SIGKILL if the test
process itself dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from membership.demo import _die_with_parent, free_ports

T = TypeVar("T")


def wait_until(pred: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Polls ``pred`` until it returns a truthy value; returns it.

    Raises:
        AssertionError: naming ``what`` after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def wait_async(pred: Callable[[], object], timeout: float, what: str) -> None:
    """Polls ``pred`` on the event loop until truthy; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


@dataclass
class Proc:
    """A child process whose stdout and stderr go to files."""

    name: str
    popen: subprocess.Popen[bytes]
    out: Path
    err: Path

    def lines(self) -> list[str]:
        """Complete lines written to stdout so far."""
        text = self.out.read_text(errors="replace")
        return text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]

    def json_lines(self) -> list[dict[str, Any]]:
        """Stdout lines parsed as JSON objects."""
        return [json.loads(line) for line in self.lines() if line.startswith("{")]

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.alive():
            self.popen.kill()
        self.popen.wait()


@dataclass
class ProcCluster:
    """Arbiters, nodes and watchers as real processes on loopback."""

    workdir: Path
    arbiters: dict[str, str] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)

    def spawn(self, name: str, *argv: str, log_level: str = "info") -> Proc:
        out = self.workdir / f"{name}.out"
        err = self.workdir / f"{name}.err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            popen = subprocess.Popen(
                [sys.executable, "-m", "membership", "--log-level", log_level, *argv],
                stdout=fo,
                stderr=fe,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        proc = Proc(name, popen, out, err)
        self.procs[name] = proc
        return proc

    @property
    def addresses(self) -> list[str]:
        return [self.arbiters[k] for k in sorted(self.arbiters)]

    def arbiter_list(self, first: str | None = None) -> str:
        """Comma-separated arbiter addresses, optionally starting with ``first``'s."""
        ids = sorted(self.arbiters)
        if first is not None:
            ids.remove(first)
            ids.insert(0, first)
        return ",".join(self.arbiters[i] for i in ids)

    def start_arbiters(self, n: int = 3, *extra: str) -> None:
        ports = free_ports(n)
        self.arbiters = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
        peers = ",".join(f"{k}={v}" for k, v in self.arbiters.items())
        for rid, addr in self.arbiters.items():
            self.spawn(
                rid,
                "arbiter",
                "--id",
                rid,
                "--listen",
                addr,
                "--peers",
                peers,
                "--data-dir",
                str(self.workdir / f"{rid}.data"),
                *extra,
            )

    def start_node(self, node_id: str, *extra: str) -> Proc:
        return self.spawn(
            node_id, "node", "--id", node_id, "--arbiters", self.arbiter_list(), *extra
        )

    def start_watch(self, name: str, first: str) -> Proc:
        return self.spawn(
            name, "watch", "--json", "--arbiters", self.arbiter_list(first), log_level="warning"
        )

    def view(self, arbiter: str | None = None, timeout: float = 5.0) -> dict[str, Any] | None:
        """``membership view --json`` against one arbiter (or all); None when it fails."""
        target = self.arbiters[arbiter] if arbiter else self.arbiter_list()
        r = run_cli("view", "--json", "--timeout", str(timeout), "--arbiters", target)
        if r.returncode != 0:
            return None
        return json.loads(r.stdout)

    def leader(self) -> str | None:
        for rid in self.arbiters:
            if self.procs[rid].alive():
                v = self.view(rid)
                if v and v["in_quorum"] and v["leader"]:
                    return str(v["leader"])
        return None

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.alive():
                proc.popen.send_signal(signal.SIGKILL)
        for proc in self.procs.values():
            proc.popen.wait()

    def dump(self) -> str:
        """Every process's stderr tail, for failure messages."""
        parts = []
        for name, proc in sorted(self.procs.items()):
            parts.append(f"--- {name} (rc={proc.popen.poll()})\n{proc.stderr()[-3000:]}")
        return "\n".join(parts)


def run_cli(*argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Runs ``membership ARGV`` to completion and captures its output."""
    return subprocess.run(
        [sys.executable, "-m", "membership", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def changes(proc: Proc, node_id: str | None = None) -> list[dict[str, Any]]:
    """The ``change`` lines a ``watch --json`` process printed (for one node, or all)."""
    return [
        ev
        for ev in proc.json_lines()
        if ev["type"] == "change" and (node_id is None or ev["node_id"] == node_id)
    ]


def alive_set(proc: Proc) -> set[str]:
    """Node ids ALIVE according to everything a watcher printed so far."""
    alive: set[str] = set()
    for ev in proc.json_lines():
        if ev["type"] == "snapshot":
            alive = {m["node_id"] for m in ev["members"] if m["state"] == "ALIVE"}
        elif ev["type"] == "change":
            if ev["state"] == "ALIVE":
                alive.add(ev["node_id"])
            else:
                alive.discard(ev["node_id"])
    return alive
