"""Real processes on loopback for integration tests: arbiters, nodes, watchers, the CLI.

:class:`ProcCluster` is :class:`membership.testing.localcluster.LocalCluster` (the
demo's and the benchmarks' too) with what tests add: watchers, views through
the CLI, failure dumps. Every process started here is killed when the
cluster is closed (the fixture does it, also when the test fails), and each
child gets SIGKILL if the test process itself dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from membership.testing.localcluster import Child, LocalCluster, die_with_parent, free_ports

__all__ = [
    "Proc",
    "ProcCluster",
    "alive_set",
    "changes",
    "free_ports",
    "run_cli",
    "wait_async",
    "wait_until",
]

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


# A child process of a ProcCluster (stdout and stderr in files; lines(), json_lines()...).
Proc = Child


class ProcCluster(LocalCluster):
    """Arbiters, nodes and watchers as real processes on loopback (``<name>.out``/``.err``
    in ``workdir``); :meth:`close` kills them all."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, log_level="info")
        self._runners: dict[bool, CliRunner] = {}

    @property
    def procs(self) -> dict[str, Child]:
        """Every child by name (replicas a1.., nodes, watchers)."""
        return self.children

    def start_watch(self, name: str, first: str) -> Proc:
        return self.spawn(
            name, "watch", "--json", "--arbiters", self.arbiter_list(first), log_level="warning"
        )

    def view(self, arbiter: str | None = None, timeout: float = 5.0) -> dict[str, Any] | None:
        """``membership view --json`` against one arbiter (or all); None when it fails."""
        target = self.arbiters[arbiter] if arbiter else self.arbiter_list()
        r = self.query("view", "--json", "--timeout", str(timeout), "--arbiters", target)
        if r.returncode != 0:
            return None
        return dict(json.loads(r.stdout))

    def query(
        self, *argv: str, timeout: float = 30.0, secure: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """``membership ARGV`` to read the cluster's state (a view, the arbiter list),
        as :func:`run_cli` runs it (``secure``: with :func:`secure_env` instead of
        this process's environment) but in one long-lived process
        (:mod:`tests.integration.clirunner`), so that a poll costs no Python start
        (0.5 to 1 s each on a loaded machine). Tests of the CLI's own behaviour
        (exit codes, messages, signals) use :func:`run_cli`."""
        runner = self._runners.get(secure)
        if runner is None:
            runner = self._runners[secure] = CliRunner(secure_env() if secure else None)
        try:
            return runner.run(*argv, timeout=timeout)
        except BaseException:
            self._runners.pop(secure).close()  # the next call starts another
            raise

    def leader(self) -> str | None:
        for rid in self.arbiters:
            if self.procs[rid].alive():
                v = self.view(rid)
                if v and v["in_quorum"] and v["leader"]:
                    return str(v["leader"])
        return None

    def close(self) -> None:
        """SIGKILLs every child and reaps it (the fixture calls it, also on failure)."""
        for runner in self._runners.values():
            runner.close()
        self._runners.clear()
        self.kill_all()

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


class CliRunner:
    """``membership`` commands run to completion in one long-lived process
    (:mod:`tests.integration.clirunner`), with this process's environment, as
    :func:`run_cli` runs them; for reading state, not for testing the CLI."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.clirunner"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
            env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
        )

    def run(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Like :func:`run_cli`: ``subprocess.TimeoutExpired`` after ``timeout`` s (the
        runner is then killed; the next call starts another)."""
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(json.dumps(list(argv)) + "\n")
        self.popen.stdin.flush()
        ready, _, _ = select.select([self.popen.stdout], [], [], timeout)
        line = self.popen.stdout.readline() if ready else ""
        if not line:
            self.close()
            if ready:
                raise RuntimeError(f"the CLI runner ended running membership {argv}")
            raise subprocess.TimeoutExpired(["membership", *argv], timeout)
        reply = json.loads(line)
        return subprocess.CompletedProcess(
            ["membership", *argv], reply["rc"], reply["stdout"], reply["stderr"]
        )

    def close(self) -> None:
        self.popen.kill()
        self.popen.wait()
        for f in (self.popen.stdin, self.popen.stdout):
            if f is not None:
                f.close()


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


def secure_env() -> dict[str, str]:
    """This process's environment without any MEMBERSHIP_ setting: secure by default
    (tests/conftest.py sets MEMBERSHIP_INSECURE=1 for the rest of the suite)."""
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("MEMBERSHIP_")}
