"""The detection benchmark's run of this cluster (bench/detection.py): kills, then the soak."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from detection_common import (
    BURST_OFF,
    BURST_ON,
    MAX_CONCURRENT_PAUSES,
    NETPROXY,
    PAUSE_GAP,
    PAUSE_SPACING,
    ROOT,
    SOAK_GRACE,
    Procs,
    Row,
    Subscriber,
    cpu_seconds,
    percentile,
    say,
)

from membership.testing.localcluster import (
    LocalCluster,
    node_args,
    wait_leader,
)


class Ours:
    """3 replicas, victims as node processes, background nodes in host processes; kills, soak."""

    def __init__(self, args: argparse.Namespace, procs: Procs, workdir: Path) -> None:
        self.args = args
        self.procs = procs
        self.workdir = workdir
        self.rng = random.Random(args.seed)
        self.arbiters: dict[str, str] = {}
        # Replicas, victims and node hosts: the shared local-cluster helper (logs as
        # <name>.log, data dirs as <id>.data in workdir); everything else is in procs.
        # Plaintext (--insecure) unless --tls: then certificates are made in workdir/tls.
        self.tls = bool(getattr(args, "tls", False))
        self.cluster = LocalCluster(workdir, merge_output=True, log_level="info", tls=self.tls)
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
        self.proc[name] = self.cluster.spawn(name, *argv).popen

    def start_arbiters(self) -> None:
        self.arbiters = self.cluster.start_arbiters(3)
        for rid in self.arbiters:
            self.proc[rid] = self.cluster.children[rid].popen

    def start_victim(self, node: str) -> None:
        self._spawn_member(node, node_args(node, self.arbiters.values()))
        self.nodes_of[node] = [node]

    def start_host(self, name: str, ids: list[str], addresses: list[str]) -> None:
        if len(ids) == 1:  # --nodes-per-process 1: a plain node process
            self._spawn_member(name, node_args(ids[0], addresses))
        else:
            if self.tls:
                for node_id in ids:
                    self.cluster.certs.files(node_id)  # each node its own certificate
                security = ["--tls-dir", str(self.cluster.certs.folder)]
            else:
                security = ["--insecure"]
            self.proc[name] = self.cluster.spawn_command(
                name,
                [
                    sys.executable,
                    str(ROOT / "bench" / "node_host.py"),
                    *("--arbiters", ",".join(addresses), "--ids", ",".join(ids)),
                    *security,
                ],
            ).popen
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
        from membership._client import MembershipClient, reap

        args = self.args
        client = None
        task = None
        rows: list[Row] = []
        try:
            say("ours: starting 3 arbiter replicas (default settings) ...")
            self.start_arbiters()
            client = MembershipClient(
                list(self.arbiters.values()),
                config=self.cluster.client_config(follow_view=False),
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
            self.cluster.kill_all()

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
        from membership._client import reap

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
        logs = [self.cluster.workdir / f"{n}.log" for n in self.nodes_of]
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
