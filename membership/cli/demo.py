"""``membership demo``: a real cluster on loopback, shown failing and deciding.

Starts 3 arbiter replicas and 5 nodes as separate processes on free loopback
ports (:class:`membership.testing.localcluster.LocalCluster`, in a temporary folder),
watches the view, SIGKILLs a node, then the leader replica and another node,
and prints each death with the time from kill to the DEAD event.

Rules:

1. Cleanup always runs, whether the scenario ends, fails, times out or is
   interrupted (the CLI sets ``stop`` on SIGINT or SIGTERM): nodes get SIGTERM
   first (they leave), then the replicas; whatever still runs after 5 s gets
   SIGKILL; the temporary folder is removed (``keep_logs`` copies every log
   first). :meth:`Demo.abort` is the same at once (SIGKILL, remove), for a
   second signal. Children also get SIGKILL if the demo itself is killed
   (PR_SET_PDEATHSIG, Linux).
2. Times are honest: ``[  t s]`` stamps and the final total count from the
   start of the command (the process's start, interpreter start-up included),
   and the total is printed after the cleanup, so it covers everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from membership.shared.view import ViewChanged, ViewEvent, ViewSnapshot
from membership.testing.localcluster import LocalCluster, ViewFollower, wait_leader

__all__ = ["Demo", "DemoError", "command_started"]

# Seconds the cluster gets for each step (a leader, every node ALIVE, a DEAD).
_STEP_TIMEOUT = 20.0


class DemoError(Exception):
    """The demo could not go on (a step did not happen in time, a child failed)."""


def command_started() -> float:
    """The monotonic time at which this process started (so interpreter start-up counts).

    On Linux from ``/proc/self/stat`` (clock ticks since boot, 10 ms) against
    CLOCK_BOOTTIME; elsewhere from psutil (whose boot time is whole seconds).
    """
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        import psutil  # type: ignore[import-untyped]

        age = time.time() - psutil.Process().create_time()
    return time.monotonic() - max(0.0, age)


class Demo:
    """One run of the demo (module rules).

    Args:
        nodes: how many nodes (at least 4: two are killed).
        keep_logs: folder to copy every process's log to at the end, or None.
        origin: monotonic time the printed times count from (default: the
            process's start).
        out: prints one line (default: print to stdout, flushed).
        tls: mutual TLS with certificates made in the temporary folder
            (default); False runs plaintext (``--insecure``).

    Raises:
        DemoError: from :meth:`run`, when a step does not happen in time.
    """

    def __init__(
        self,
        nodes: int = 5,
        keep_logs: Path | None = None,
        origin: float | None = None,
        out: Callable[[str], None] | None = None,
        tls: bool = True,
    ) -> None:
        self.tls = tls
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        self.keep_logs = keep_logs
        self.origin = command_started() if origin is None else origin
        self.out = out or (lambda line: print(line, flush=True))
        self.results: list[tuple[str, str, float]] = []
        self.tmp: Path | None = None
        self.cluster: LocalCluster | None = None
        self.survivors: list[str] | None = None  # ALIVE at the end of the scenario
        self.final_epoch = 0

    def _elapsed(self) -> float:
        return time.monotonic() - self.origin

    def _stamp(self) -> str:
        return f"[{self._elapsed():6.2f}s]"

    async def run(self, stop: asyncio.Event, timeout: float) -> bool:
        """Runs the scenario, then cleans up (rule 1); returns False when ``stop`` cut it short.

        Args:
            stop: set to interrupt the scenario (the cleanup still runs).
            timeout: seconds the scenario may take (the cleanup comes on top).

        Raises:
            DemoError: a step did not happen in time, or the scenario took
                longer than ``timeout``.
        """
        self.tmp = Path(tempfile.mkdtemp(prefix="membership-demo-"))
        # One ingest worker a replica: the layout of a real one (auto: a worker per
        # core) at the demo's size (arbiter/server/ingest).
        self.cluster = LocalCluster(
            self.tmp, merge_output=True, tls=self.tls, arbiter_args=("--ingest-workers", "1")
        )
        scenario = asyncio.ensure_future(self._scenario(self.cluster))
        stopper = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait(
                {scenario, stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if scenario in done:
                scenario.result()  # raises its error
                return True
            if stopper in done:
                self.out(f"\n{self._stamp()} interrupted")
                return False
            raise DemoError(f"the demo did not finish within {timeout:g}s")
        finally:
            for task in (scenario, stopper):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            await self._cleanup()

    async def _scenario(self, cluster: LocalCluster) -> None:
        from membership._client import MembershipClient, reap

        out = self.out
        if self.tls:
            out(f"mutual TLS: a CA and one certificate per process in {cluster.certs.folder}")
        out("starting 3 arbiter replicas (a1, a2, a3) on loopback ...")
        cluster.start_arbiters(3)
        client = MembershipClient(
            cluster.addresses, config=cluster.client_config(follow_view=False)
        )
        follower = ViewFollower(client, show=self._show)
        task: asyncio.Task[None] | None = None
        try:
            info = await self._step(wait_leader(client, _STEP_TIMEOUT))
            out(f"{self._stamp()} leader elected: {info.leader_id}")
            task = asyncio.get_running_loop().create_task(follower.run())
            out(f"starting {len(self.nodes)} nodes ...")
            for i, n in enumerate(self.nodes):
                labels = {"rack": f"r{i % 2 + 1}", "gpu": "a100" if i % 2 else "h100"}
                cluster.start_node(n, labels=labels)
            await self._step(
                follower.wait_for(
                    lambda: set(self.nodes) <= follower.alive, _STEP_TIMEOUT, "every node ALIVE"
                )
            )
            out(f"{self._stamp()} all {len(self.nodes)} nodes ALIVE at epoch {follower.epoch}")

            async def kill_node(name: str, note: str) -> None:
                out(f"\n{self._stamp()} >>> SIGKILL {name}{note}")
                t0 = time.monotonic()
                cluster.kill(name)
                await self._step(
                    follower.wait_for(
                        lambda: name in follower.deaths, _STEP_TIMEOUT, f"{name} DEAD"
                    )
                )
                dt = follower.deaths[name] - t0
                self.results.append((name, note.strip(" ()"), dt))
                out(f"    {name} declared DEAD by a quorum of replicas {dt:.2f}s after the kill")

            await kill_node(self.nodes[1], "")
            info = await client.get_view()
            leader = info.leader_id
            if leader is None or leader not in cluster.children:
                raise DemoError(f"no leader to kill (the view names {leader!r})")
            out(f"\n{self._stamp()} >>> SIGKILL leader replica {leader}")
            cluster.kill(leader)
            await kill_node(self.nodes[3], f" (leader {leader} is down: 2 of 3 replicas decide)")
            info = await self._step(wait_leader(client, _STEP_TIMEOUT))
            out(f"{self._stamp()} new leader: {info.leader_id}")
            self.survivors = sorted(follower.alive)
            self.final_epoch = follower.epoch
        finally:
            if task is not None:
                await reap(task)
            await client.close()

    @staticmethod
    async def _step(aw: Any) -> Any:
        try:
            return await aw
        except TimeoutError as e:
            raise DemoError(str(e) or "a step did not happen in time") from None

    def _show(self, ev: ViewEvent) -> None:
        if isinstance(ev, ViewSnapshot):
            alive = len(ev.view.alive())
            self.out(f"{self._stamp()} view at epoch {ev.view.epoch}: {alive} alive")
        elif isinstance(ev, ViewChanged):
            for c in ev.changes:
                labels = " ".join(f"{k}={v}" for k, v in c.labels.items())
                state = c.state.value
                line = f"{self._stamp()} epoch {ev.epoch:>3}  {c.node_id} -> {state:<5} {labels}"
                self.out(line.rstrip())

    async def _cleanup(self) -> None:
        """Rule 1: nodes, then replicas, stopped; logs copied; the folder removed."""
        if self.cluster is not None and self.cluster.children:
            self.out(f"{self._stamp()} stopping the cluster (nodes leave, then replicas stop) ...")
            await self.cluster.wait_stopped_all(timeout=5.0)
        self._copy_logs()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def _copy_logs(self) -> None:
        if self.keep_logs is None or self.tmp is None:
            return
        self.keep_logs.mkdir(parents=True, exist_ok=True)
        for f in self.tmp.glob("*.log"):
            shutil.copy(f, self.keep_logs / f.name)

    def abort(self) -> None:
        """Rule 1 at once, for a second signal: SIGKILL every child, remove the folder."""
        if self.cluster is not None:
            self.cluster.kill_all(reap=False)  # the demo exits now: init reaps them
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                self._copy_logs()
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def summary(self) -> list[str]:
        """The closing lines: each death, who is alive, and the total time (rule 2)."""
        lines = ["", "summary"]
        for name, note, dt in self.results:
            lines.append(f"  {name}: DEAD {dt:.2f}s after SIGKILL  {note}".rstrip())
        if self.survivors is not None:
            lines.append(f"  alive at epoch {self.final_epoch}: {', '.join(self.survivors)}")
        lines.append(
            f"  total {self._elapsed():.1f}s, from the start of the command to the end of the "
            "cleanup"
        )
        return lines
