"""The detection benchmark's runs of etcd and Serf (bench/detection.py), for comparison."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import re
import subprocess
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from operator import contains
from pathlib import Path
from typing import Any

from detection_common import (
    T0,
    Procs,
    Row,
    longest_up,
    package_version,
    read_lines,
    say,
    wait_event,
)

from membership.testing.localcluster import free_ports

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
