"""Runs the example: 3 arbiter replicas, N training workers, one killed, and the timeline.

    python examples/torch_training/run.py --workers 3 --kill-after-steps 50
    python examples/torch_training/run.py --baseline     # then the same job without membership

Membership run: starts 3 arbiter replicas (``membership.testing.localcluster``, the
harness of ``membership demo``, mutual TLS unless ``--insecure``) and
``--workers`` worker processes (worker.py) of job j1; waits for their first
group; once the worker holding rank ``--kill-rank`` reported step
``--kill-after-steps``, SIGKILLs it (``--fault stop``: SIGSTOPs it, a hung
worker or a host that vanished; it is SIGKILLed once the others regrouped);
prints the timeline (kill, the survivors' collective failing or abandoned,
their new epoch, their group re-formed, the state agreed, the end) and checks
the end: every survivor did ``--steps`` steps and holds the same model as a
single process doing the same steps, the checkpointing worker (rank 0, every
``--checkpoint-every`` steps, holding the GIL ``--checkpoint-pause`` seconds
inside a grace window) was never dropped.

``--baseline`` then runs the same job with static ranks and no membership
(worker.py ``--baseline``): the survivors learn of the fault only from gloo,
after ``--baseline-timeout`` seconds at most (torch's default is 30 min).

Everything the runner starts is stopped at the end, on an error and on
Ctrl-C or SIGTERM (workers leave, then the replicas stop; SIGKILL after 5 s),
and its children get SIGKILL if the runner itself is killed (Linux). Exit
status: 0 when every check passed, 1 otherwise, 130/143 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The runner forks workers while its own gRPC client runs; gRPC's fork handlers would
# restart its poller in the child before exec and can abort it (what membership's
# CLI does too). Before grpc is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import torch
from timeline import Tail, kill_figures, median_range, short_error
from train import TrainingConfig, reference_run

from membership import MembershipError, MemberState, ViewChanged
from membership.sync import MembershipClient
from membership.testing import Child, LocalCluster, free_ports

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"
JOB = "j1"


class Failed(Exception):
    """A step of the run did not happen in time."""


class Runner:
    """One invocation: its clusters, its output, its clock (module docstring)."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.t0 = time.monotonic()
        self.clusters: list[LocalCluster] = []
        self.viewers: list[MembershipClient] = []
        self.finished: set[str] = set()
        self.watched: dict[str, Child] = {}  # children whose failure ends the run at once

    def say(self, line: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.2f}s] {line}", flush=True)

    def cleanup(self) -> None:
        for v in self.viewers:
            v.close()
        for c in reversed(self.clusters):
            c.stop_all(timeout=5.0)

    # --- processes ----------------------------------------------------------------

    def _cluster(self, sub: str, tls: bool) -> LocalCluster:
        folder = self.work / sub
        folder.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBERSHIP_")}
        cluster = LocalCluster(folder, tls=tls, env=env)
        self.clusters.append(cluster)
        return cluster

    def _worker_env(self, cluster: LocalCluster, name: str) -> dict[str, str]:
        env = dict(cluster.env or {})
        if cluster.tls:
            files = cluster.certs.files(name, "node")  # its own certificate: it may ask for grace
            env |= {
                "MEMBERSHIP_TLS_CA": str(files.ca),
                "MEMBERSHIP_TLS_CERT": str(files.cert),
                "MEMBERSHIP_TLS_KEY": str(files.key),
            }
        else:
            env["MEMBERSHIP_INSECURE"] = "1"
        return env

    def _worker_argv(self, cluster: LocalCluster, name: str, *extra: str) -> list[str]:
        a = self.args
        return [
            sys.executable,
            str(WORKER),
            *("--id", name, "--job", JOB, "--steps", str(a.steps)),
            *("--step-time", str(a.step_time), "--checkpoint-dir", str(cluster.workdir)),
            *extra,
        ]

    def _poll(self, tails: dict[str, Tail], show: Callable[[dict[str, Any]], None]) -> None:
        for tail in tails.values():
            for e in tail.poll():
                show(e)

    def _wait(self, tails: dict[str, Tail], pred: Callable[[], bool], timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while True:
            done = pred()  # before the poll: what a worker wrote before it ended is read
            self._poll(tails, self._show)
            if done:
                return
            for name, child in self.watched.items():
                code = child.popen.poll()
                if code not in (None, 0):
                    tail = child.stderr()[-1500:]
                    raise Failed(f"{name} exited with status {code} before {what}:\n{tail}")
            if time.monotonic() > deadline:
                raise Failed(f"{what}: not within {timeout:g}s")
            time.sleep(0.02)

    def _show(self, e: dict[str, Any]) -> None:
        w, ev = e["w"], e["ev"]
        if ev == "done":
            self.finished.add(w)
        if w in self.finished and ev == "session":
            return  # its leave
        if ev == "formed":
            self.say(
                f"{w}: group formed at epoch {e['epoch']}: rank {e['rank']} of {e['world_size']}"
            )
        elif ev == "epoch_seen" and e.get("rank") is not None:
            self.say(f"{w}: sees epoch {e['epoch']}: rank {e['rank']} of {e['world_size']}")
        elif ev in ("collective_failed", "collective_abandoned"):
            why = short_error(e["error"]) if "error" in e else "the assignment moved on"
            self.say(f"{w}: {e['op']} {ev.split('_')[1]} at epoch {e['epoch']}: {why}")
        elif ev == "synced":
            self.say(f"{w}: resumes at step {e['step']} (state from rank {e['src']})")
        elif ev == "checkpoint":
            window = (
                "no grace window"
                if e["grace_covered"] is None
                else f"grace window covered {e['grace_covered']}s"
            )
            self.say(
                f"{w}: checkpoint at step {e['step']}, paused {e['paused']:.2f}s holding the GIL"
                f" ({window})"
            )
        elif ev == "checkpoint_skipped":
            self.say(f"{w}: checkpoint at step {e['step']} skipped: {e['reason']}")
        elif ev == "session" and e["what"] != "StateChanged" and "fenced=False" not in e["detail"]:
            self.say(f"{w}: {e['detail']}")  # fenced, evicted, rejoined
        elif ev in ("done", "failed"):
            self.say(f"{w}: {ev} {e.get('step', '')} {e.get('error', '')}".rstrip())

    # --- the membership run ---------------------------------------------------------

    def membership(self) -> dict[str, Any]:
        a = self.args
        cluster = self._cluster("membership", tls=not a.insecure)
        self.say("starting 3 arbiter replicas (a1, a2, a3) ...")
        cluster.start_arbiters(3)
        viewer = MembershipClient(
            cluster.addresses, config=cluster.client_config(follow_view=False)
        )
        self.viewers.append(viewer)
        leader = self._leader(viewer)
        self.say(f"leader elected: {leader}; starting {a.workers} workers of job {JOB} ...")
        changes: list[tuple[float, ViewChanged]] = []
        watch = viewer.watch()

        def follow() -> None:
            with contextlib.suppress(MembershipError):
                for ev in watch:
                    if isinstance(ev, ViewChanged):
                        changes.append((time.monotonic(), ev))

        threading.Thread(target=follow, name="runner-watch", daemon=True).start()
        names = [f"w{i}" for i in range(1, a.workers + 1)]
        extra = [
            *("--arbiters", ",".join(cluster.addresses), "--start-world", str(a.workers)),
            *("--checkpoint-every", str(a.checkpoint_every)),
            *("--checkpoint-pause", str(a.checkpoint_pause), "--timeout", str(a.gloo_timeout)),
            *(("--no-grace",) if a.no_grace else ()),
        ]
        for n in names:
            cluster.spawn_command(
                n, self._worker_argv(cluster, n, *extra), env=self._worker_env(cluster, n)
            )
        tails = {n: Tail(n, cluster.children[n].out) for n in names}
        result = self._kill_and_finish(cluster, tails, names)
        t_kill, victim = result["t_kill"], result["victim"]
        survivors = [n for n in names if n != victim]
        figures = kill_figures(tails, survivors, t_kill)
        dead = [
            (round(t - t_kill, 4), c.node_id, ev.epoch)
            for t, ev in changes
            for c in ev.changes
            if c.state is MemberState.DEAD and not c.forgotten
        ]
        result |= {
            "survivors": figures,
            "dead": dead,
            "dropped": sorted({n for _, n, _ in dead} - {victim}),
            "checkpoints": [
                {k: e.get(k) for k in ("w", "step", "epoch", "paused", "grace_covered", "member")}
                for t in tails.values()
                for e in t.events
                if e["ev"] == "checkpoint"
            ],
            "ranks": [
                {"epoch": ev.epoch, "t": round(t - t_kill, 4), "ranks": dict(j.ranks)}
                for t, ev in changes
                for j in ev.ranks
                if j.job == JOB
            ],
        }
        watch.close()
        return result

    def _leader(self, viewer: MembershipClient) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                info = viewer.get_view()
                if info.in_quorum and info.leader_id:
                    return info.leader_id
            except Exception:
                pass
            time.sleep(0.1)
        raise Failed("no leader within 30s")

    def _kill_and_finish(
        self,
        cluster: LocalCluster,
        tails: dict[str, Tail],
        names: list[str],
        survivors_may_fail: bool = False,
    ) -> dict[str, Any]:
        """Waits for the first group, kills the worker of ``--kill-rank`` once it reported
        ``--kill-after-steps``, waits for the survivors to end; returns what happened."""
        a = self.args
        self.finished.clear()
        self.watched = {n: cluster.children[n] for n in names}

        def formed_all() -> bool:
            return all(
                (f := t.last("formed")) is not None and f["world_size"] == a.workers
                for t in tails.values()
            )

        self._wait(tails, formed_all, a.timeout, f"a group of {a.workers}")
        by_rank = {t.last("formed")["rank"]: n for n, t in tails.items()}  # type: ignore[index]
        victim = by_rank[a.kill_rank]
        self._wait(
            tails, lambda: tails[victim].step >= a.kill_after_steps, a.timeout, f"{victim} at step"
        )
        step = tails[victim].step
        del self.watched[victim]
        if survivors_may_fail:
            self.watched = {}  # the baseline's survivors fail: that is the point
        sig = signal.SIGKILL if a.fault == "kill" else signal.SIGSTOP
        t_kill = time.monotonic()
        os.kill(cluster.children[victim].pid, sig)
        self.say(f">>> {sig.name} {victim} (rank {a.kill_rank}) after its step {step}")
        survivors = [n for n in names if n != victim]
        if a.fault == "stop":
            # A hung worker: killed once the others went on without it (or gave up).
            def regrouped() -> bool:
                return all(
                    tails[n].first_after("synced", t_kill) is not None
                    or not cluster.children[n].alive()
                    for n in survivors
                )

            try:
                self._wait(tails, regrouped, a.timeout, "the survivors regrouped")
            finally:
                cluster.children[victim].kill()
                self.say(f"{victim} SIGKILLed (it was stopped)")
        self._wait(
            tails,
            lambda: not any(cluster.children[n].alive() for n in survivors),
            a.timeout,
            "the survivors finished",
        )
        return {
            "victim": victim,
            "kill_step": step,
            "fault": a.fault,
            "t_kill": t_kill,
            "exit": {n: cluster.children[n].popen.wait() for n in survivors},
        }

    # --- the baseline -------------------------------------------------------------

    def baseline(self) -> dict[str, Any]:
        a = self.args
        cluster = self._cluster("baseline", tls=False)
        master = f"127.0.0.1:{free_ports(1)[0]}"
        names = [f"w{i}" for i in range(1, a.workers + 1)]
        self.say(
            f"baseline: the same job, static ranks, no membership, gloo timeout "
            f"{a.baseline_timeout:g}s ..."
        )
        for r, n in enumerate(names):
            extra = [
                "--baseline",
                *("--rank", str(r), "--world-size", str(a.workers), "--master", master),
                *("--timeout", str(a.baseline_timeout)),
            ]
            cluster.spawn_command(
                n, self._worker_argv(cluster, n, *extra), env=self._worker_env(cluster, n)
            )
        tails = {n: Tail(n, cluster.children[n].out) for n in names}
        saved, self.args.timeout = a.timeout, max(a.timeout, a.baseline_timeout + 60)
        try:
            result = self._kill_and_finish(cluster, tails, names, survivors_may_fail=True)
        finally:
            self.args.timeout = saved
        survivors = [n for n in names if n != result["victim"]]
        result["survivors"] = kill_figures(tails, survivors, result["t_kill"])
        result["timeout"] = a.baseline_timeout
        return result


def check(args: argparse.Namespace, folder: Path, m: dict[str, Any]) -> list[str]:
    """The checks of the membership run; returns what failed."""
    bad = []
    s = m["survivors"]
    epochs = {f["formed_epoch"] for f in s.values()}
    if None in epochs or len(epochs) != 1:
        bad.append(f"survivors re-formed at different epochs: {epochs}")
    if sorted(f["rank"] for f in s.values()) != list(range(len(s))):
        bad.append(f"ranks after the kill are not 0..{len(s) - 1}")
    if any(f["world_size"] != len(s) for f in s.values()):
        bad.append("a survivor's world size is not the number of survivors")
    if any(f["steps"] != args.steps for f in s.values()):
        bad.append(f"steps: {[f['steps'] for f in s.values()]}, not {args.steps}")
    if len({f["checksum"] for f in s.values()}) != 1:
        bad.append("the survivors' models differ")
    if any(code != 0 for code in m["exit"].values()):
        bad.append(f"exit status: {m['exit']}")
    if m["dropped"] and not args.no_grace:
        bad.append(f"dropped without being killed: {m['dropped']}")
    ref = reference_run(TrainingConfig(), args.steps).state_vector()
    diffs = []
    for n in s:
        f = folder / f"final-{n}.pt"
        if f.exists():
            diffs.append(float((torch.load(f, weights_only=True) - ref).abs().max()))
    m["max_diff_vs_one_process"] = max(diffs) if diffs else None
    if not diffs or max(diffs) > 1e-4:
        bad.append(f"the model differs from one process doing the same steps: {diffs}")
    return bad


def report(m: dict[str, Any], b: dict[str, Any] | None) -> None:
    """Prints the timeline after the kill (sorted by time), the summary, the baseline."""
    lines: list[tuple[float, str]] = [
        (0.0, f"{m['fault'].upper()} {m['victim']} after its step {m['kill_step']}")
    ]
    for dt, node, epoch in m["dead"]:
        lines.append((dt, f"cluster: {node} DEAD at epoch {epoch} (the runner's watch)"))
    for n, f in m["survivors"].items():
        c = f["collective"]
        if c:
            why = f" ({short_error(c['error'])})" if c["error"] else ""
            lines.append((c["after"], f"{n}: {c['op']} {c['how']}{why}"))
        if f["epoch_seen"] is not None:
            lines.append((f["epoch_seen"], f"{n}: new epoch {f['epoch']} seen"))
        if f["formed"] is not None:
            lines.append(
                (
                    f["formed"],
                    f"{n}: group re-formed at epoch {f['formed_epoch']}: rank {f['rank']} of "
                    f"{f['world_size']}; resumes at step {f['synced_step']}",
                )
            )
    print("\ntimeline, seconds after the kill")
    for dt, text in sorted(lines):
        print(f"  {dt:7.3f}  {text}")
    print("\nsummary")
    seen = [f["epoch_seen"] for f in m["survivors"].values() if f["epoch_seen"] is not None]
    formed = [f["formed"] for f in m["survivors"].values() if f["formed"] is not None]
    print(f"  kill -> new epoch seen:  {median_range(seen)} over {len(seen)} survivors")
    print(f"  kill -> group re-formed: {median_range(formed)}")
    steps = {n: f["steps"] for n, f in m["survivors"].items()}
    print(f"  steps done: {steps}; max |param - one process| {m['max_diff_vs_one_process']}")
    for c in m["checkpoints"]:
        window = (
            "no grace window"
            if c["grace_covered"] is None
            else f"grace window covering {c['grace_covered']}s"
        )
        print(f"  checkpoint by {c['w']} at step {c['step']}: paused {c['paused']}s, {window}")
    print(f"  dropped without being killed: {', '.join(m['dropped']) or 'nobody'}")
    if b is None:
        return
    print(f"\nbaseline: the same job, static ranks, gloo timeout {b['timeout']:g}s")
    print(f"  0.000  {b['fault'].upper()} {b['victim']} after its step {b['kill_step']}")
    for n, f in b["survivors"].items():
        c = f["collective"]
        if c:
            print(f"  {c['after']:6.3f}  {n}: {c['op']} failed ({short_error(c['error'])})")
        else:
            print(f"          {n}: its collective never failed")
    ended = {n: f["steps"] or f"exit {b['exit'][n]}" for n, f in b["survivors"].items()}
    print(
        f"  the survivors stop there ({ended}): without membership nobody tells them who is "
        "left or their new ranks; a launcher would restart every worker from a checkpoint"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=3, help="worker processes (>= 2)")
    p.add_argument("--steps", type=int, default=200, help="total steps of the job")
    p.add_argument("--step-time", type=float, default=0.05, help="seconds a step takes at least")
    p.add_argument("--kill-after-steps", type=int, default=50, help="kill after this step")
    p.add_argument("--kill-rank", type=int, default=1, help="rank of the worker killed")
    p.add_argument("--fault", choices=("kill", "stop"), default="kill", help="SIGKILL or SIGSTOP")
    p.add_argument("--checkpoint-every", type=int, default=30, help="steps (0: never)")
    p.add_argument("--checkpoint-pause", type=float, default=2.0, help="GIL held, seconds")
    p.add_argument("--no-grace", action="store_true", help="checkpoint without a grace window")
    p.add_argument("--gloo-timeout", type=float, default=60.0, help="membership run, seconds")
    p.add_argument("--baseline", action="store_true", help="also run the job without membership")
    p.add_argument("--baseline-timeout", type=float, default=30.0, help="gloo timeout, seconds")
    p.add_argument("--insecure", action="store_true", help="plaintext instead of mutual TLS")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds each stage may take")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    p.add_argument("--keep-logs", metavar="DIR", help="copy every process's output to DIR")
    args = p.parse_args(argv)
    if args.workers < 2 or not 0 <= args.kill_rank < args.workers:
        p.error("--workers must be >= 2 and --kill-rank in 0..workers-1")
    if args.kill_after_steps >= args.steps:
        p.error("--kill-after-steps must be below --steps")
    above = ("gloo_timeout", "baseline_timeout", "timeout")  # the others: >= 0
    for name in ("step_time", "kill_after_steps", "checkpoint_every", "checkpoint_pause", *above):
        x, sign = getattr(args, name), ">" if name in above else ">="
        if not (math.isfinite(x) and (x > 0 if name in above else x >= 0)):
            p.error(f"--{name.replace('_', '-')} must be a finite number {sign} 0, not {x}")
    return args


def main() -> int:
    args = parse()
    torch.set_num_threads(1)  # the reference run: the cores are the workers'
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in background
    work = Path(tempfile.mkdtemp(prefix="torch-example-"))
    r = Runner(args, work)
    code = 1
    try:
        m = r.membership()
        bad = check(args, work / "membership", m)
        b = r.baseline() if args.baseline else None
        report(m, b)
        for line in bad:
            print(f"CHECK FAILED: {line}")
        if args.json:
            Path(args.json).write_text(json.dumps({"membership": m, "baseline": b}, indent=1))
        code = 1 if bad else 0
    except Failed as e:
        print(f"run.py: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        r.say("stopping everything ...")
        r.cleanup()
        if args.keep_logs:
            dest = Path(args.keep_logs)
            dest.mkdir(parents=True, exist_ok=True)
            for f in work.rglob("*.out"):
                shutil.copy(f, dest / f"{f.parent.name}-{f.name}")
            for f in work.rglob("*.err"):
                shutil.copy(f, dest / f"{f.parent.name}-{f.name}")
        shutil.rmtree(work, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
