"""One data-parallel training worker: a membership node of its job, a gloo group per epoch.

Run by ``run.py`` (one process per worker), or by hand::

    MEMBERSHIP_INSECURE=1 python examples/torch_training/worker.py --id w1 \\
        --arbiters 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 --start-world 3

What it does (README.md of this folder, "How it works"):

1. starts its ``TCPStore`` server and joins the cluster through the blocking
   client (:class:`membership.sync.MembershipClient`) with the labels
   ``job=<job>`` and ``store=<host:port>``;
2. forms a gloo group for its job's rank assignment (rank, world size, and
   the assignment's epoch as the fencing token; ``elastic.py``), the first
   time once ``--start-world`` workers are in it;
3. agrees with the group on the last consistent step (the lowest rank at the
   highest step sends its model and optimizer state);
4. trains: each step its shard's gradient, one allreduce, the update; reports
   ``phase``, ``step``, ``progress`` and ``loss`` in its status; rank 0
   checkpoints every ``--checkpoint-every`` steps inside a grace window;
5. when the assignment moves (a worker died, left or joined), abandons the
   collective in flight and goes back to 2 at the new epoch.

``--baseline`` runs the same training without membership (rank and world
size given, rank 0's store at ``--master``), as a static launcher would:
a collective waits for gloo's own timeout, and a failure ends the worker.

Each event of the timeline is one JSON line on stdout:
``{"t": <monotonic s>, "w": <id>, "ev": <event>, ...}`` (CLOCK_MONOTONIC is
the same for every process of a machine: run.py compares them).
Exit status: 0 finished, 1 failed (no new group in time, or an error), 3
baseline: a collective failed, 130/143 interrupted.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import datetime
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from elastic import EpochGroups, RegroupTimeout, StoreServer
from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore
from train import Trainer, TrainingConfig, load_checkpoint, save_checkpoint

_out_lock = threading.Lock()


def make_log(worker: str) -> Any:
    """``log(event, **fields)``: one JSON line on stdout, from any thread."""

    def log(ev: str, **fields: Any) -> None:
        line = json.dumps({"t": round(time.monotonic(), 6), "w": worker, "ev": ev, **fields})
        with _out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    return log


def hold_gil(seconds: float) -> None:
    """Sleeps in C holding the GIL (ctypes.PyDLL keeps it), as a checkpoint written with
    pickle or an extension that never releases the GIL does: every other thread of the
    process, the client's heartbeats included, stops meanwhile."""
    libc = ctypes.PyDLL(ctypes.util.find_library("c"))
    libc.usleep(ctypes.c_uint(int(seconds * 1e6)))


class StaticGroup:
    """``--baseline``: one gloo group, rank and world size given, rank 0's store at
    ``master``; no membership, so a lost group cannot be re-formed."""

    def __init__(self, rank: int, world_size: int, master: str, timeout: float, log: Any):
        self.rank, self.world_size, self.epoch = rank, world_size, 0
        self.master, self.log = master, log
        self.timeout = datetime.timedelta(seconds=timeout)
        self.pg: Any = None
        self.formations = 0

    def form(self, min_world: int = 1) -> None:
        if self.formations:
            raise SystemExit(3)  # no membership: nobody says who is left
        host, port = self.master.rsplit(":", 1)
        store = TCPStore(host, int(port), self.world_size, self.rank == 0, timeout=self.timeout)
        opts = ProcessGroupGloo._Options()
        opts._devices = [ProcessGroupGloo.create_device(hostname=host)]
        opts._timeout = self.timeout
        self.pg = ProcessGroupGloo(PrefixStore("static", store), self.rank, self.world_size, opts)
        self.formations = 1
        self.log("formed", epoch=0, rank=self.rank, world_size=self.world_size, seconds=0.0)

    def _wait(self, work: Any, what: str) -> bool:
        t0 = time.monotonic()
        try:
            work.wait()  # blocks until done, failed, or gloo's timeout
            return True
        except RuntimeError as e:
            self.log(
                "collective_failed",
                epoch=0,
                op=what,
                error=str(e)[:300],
                waited=round(time.monotonic() - t0, 3),
            )
            raise SystemExit(3) from None

    def allreduce_sum(self, t: torch.Tensor) -> bool:
        return self._wait(self.pg.allreduce([t]), "allreduce")

    def sync_state(self, step: int, state: Any, numel: int) -> Any:
        vec = state() if self.rank == 0 else torch.empty(numel, dtype=torch.float32)
        self._wait(self.pg.broadcast(vec, 0), "broadcast")
        return step, vec, 0


def train(group: Any, trainer: Trainer, args: argparse.Namespace, log: Any, client: Any) -> None:
    """The training loop, the same for both modes: (re-)form, agree on the step, train."""
    min_world = args.start_world
    while trainer.step < args.steps:
        if group.pg is None:
            if client is not None:
                client.report(phase="rendezvous", step=trainer.step)
            group.form(min_world)
            min_world = 1  # later assignments: whoever is left
            synced = group.sync_state(trainer.step, trainer.state_vector, 2 * trainer.numel)
            if synced is None:
                continue
            step, vec, src = synced
            trainer.load_state_vector(vec, step)
            log("synced", epoch=group.epoch, step=step, src=src, rank=group.rank)
            continue
        started = time.monotonic()
        flat = trainer.local_gradient(group.rank, group.world_size)
        rest = args.step_time - (time.monotonic() - started)
        if rest > 0:
            time.sleep(rest)  # stands for the compute of a real model
        if not group.allreduce_sum(flat):
            continue  # abandoned: re-form at the new epoch, redo this step
        loss = trainer.apply(flat)
        log("step", step=trainer.step, loss=round(loss, 6), epoch=group.epoch, rank=group.rank)
        if client is not None:
            client.report(
                phase="train", step=trainer.step, progress=trainer.step / args.steps, loss=loss
            )
            every = args.checkpoint_every
            if every and group.rank == 0 and trainer.step % every == 0:
                checkpoint(client, trainer, group, args, log)


# Seconds the grace window outlasts the pause: the heartbeats resume and are acked
# meanwhile, and the window then ends by itself. Ending it with ``client.grace(0)``
# right after a pause longer than the lease fences the node until its next ack (the
# client stops counting a window as soon as it asks to end it); harmless, but noise.
GRACE_MARGIN = 1.0


def checkpoint(client: Any, trainer: Trainer, group: Any, args: argparse.Namespace, log: Any):
    """Rank 0 writes the checkpoint inside a grace window (unless ``--no-grace``), then
    holds the GIL ``--checkpoint-pause`` seconds: a slow checkpoint, longer than the
    detection time, during which the node sends no heartbeat. The window is the pause
    and ``GRACE_MARGIN``."""
    if not client.is_member:  # fenced: it writes nothing for the job (elastic.py rule 6)
        log("checkpoint_skipped", step=trainer.step, reason="fenced")
        return
    client.report(phase="checkpoint", step=trainer.step)
    from membership import MembershipError

    covered = None
    if not args.no_grace:
        try:
            window = client.grace(seconds=args.checkpoint_pause + GRACE_MARGIN, reason="checkpoint")
        except MembershipError as e:  # no window, no slow checkpoint: the job goes on
            log("checkpoint_skipped", step=trainer.step, reason=str(e)[:200])
            return
        covered = round(window.covered, 3)
    t0 = time.monotonic()
    save_checkpoint(trainer, Path(args.checkpoint_dir) / f"{args.job}.pt")
    hold_gil(args.checkpoint_pause)
    paused = time.monotonic() - t0
    log(
        "checkpoint",
        step=trainer.step,
        epoch=group.epoch,
        paused=round(paused, 3),
        grace_covered=covered,
        incarnation=client.incarnation,
        member=client.is_member,
        fencing_epoch=client.fencing_epoch,
    )


def run_member(args: argparse.Namespace, log: Any) -> int:
    from membership import ClientConfig
    from membership.sync import MembershipClient

    server = StoreServer(args.host, args.timeout)
    groups = EpochGroups(args.job, args.host, args.timeout, args.regroup_timeout, log)
    trainer = Trainer(TrainingConfig())
    if args.checkpoint_dir and load_checkpoint(
        trainer, Path(args.checkpoint_dir) / f"{args.job}.pt"
    ):
        log("resumed", step=trainer.step)
    client = MembershipClient(
        args.arbiters.split(","),
        node_id=args.id,
        labels={"job": args.job, "store": server.address},
        # One subscription: the watch of elastic.py moves client.view and client.assignment.
        config=ClientConfig(follow_view=False),
        on_event=groups.on_session_event,
    )
    with client:
        log("started", store=server.address, pid=os.getpid())
        client.wait_alive(timeout=60)
        log("alive", incarnation=client.incarnation)
        groups.attach(client)
        try:
            train(groups, trainer, args, log, client)
            client.report(phase="done", step=trainer.step, progress=1.0)
            if args.checkpoint_dir:  # for run.py's check against one process
                torch.save(
                    trainer.state_vector(), Path(args.checkpoint_dir) / f"final-{args.id}.pt"
                )
            log(
                "done",
                step=trainer.step,
                checksum=trainer.checksum(),
                epoch=groups.epoch,
                formations=groups.formations,
                abandoned=groups.abandoned,
            )
        finally:
            groups.close()
    return 0


def run_baseline(args: argparse.Namespace, log: Any) -> int:
    group = StaticGroup(args.rank, args.world_size, args.master, args.timeout, log)
    trainer = Trainer(TrainingConfig())
    log("started", pid=os.getpid(), rank=args.rank)
    train(group, trainer, args, log, None)
    log("done", step=trainer.step, checksum=trainer.checksum(), epoch=0, formations=1, abandoned=0)
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--id", required=True, help="node id (w1, w2, ...)")
    p.add_argument("--job", default="j1", help="the job label (default j1)")
    p.add_argument("--arbiters", default="", help="host:port,host:port,...")
    p.add_argument("--steps", type=int, default=300, help="total steps of the job")
    p.add_argument("--step-time", type=float, default=0.05, help="seconds a step takes at least")
    p.add_argument("--start-world", type=int, default=1, help="workers the first group waits for")
    p.add_argument("--host", default="127.0.0.1", help="address of this worker's store and gloo")
    p.add_argument("--timeout", type=float, default=60.0, help="gloo and store timeout, seconds")
    p.add_argument(
        "--regroup-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for a new assignment after a collective failed",
    )
    p.add_argument("--checkpoint-dir", default="", help="where rank 0 writes <job>.pt")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps (0: never)")
    p.add_argument("--checkpoint-pause", type=float, default=2.0, help="seconds the GIL is held")
    p.add_argument("--no-grace", action="store_true", help="checkpoint without a grace window")
    p.add_argument("--baseline", action="store_true", help="no membership (static ranks)")
    p.add_argument("--rank", type=int, default=0, help="--baseline: this worker's rank")
    p.add_argument("--world-size", type=int, default=1, help="--baseline: the world size")
    p.add_argument("--master", default="", help="--baseline: rank 0's store, host:port")
    return p.parse_args(argv)


def main() -> None:
    args = parse()
    torch.set_num_threads(1)  # leave the other cores to the peers and the heartbeats
    log = make_log(args.id)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # leaves the cluster, as Ctrl-C
    code = 1
    try:
        code = run_baseline(args, log) if args.baseline else run_member(args, log)
    except KeyboardInterrupt:
        code = 130
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except RegroupTimeout as e:
        log("failed", error=str(e))
    except Exception as e:
        log("failed", error=f"{type(e).__name__}: {e}"[:500])
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # Abandoned groups (elastic.py rule 4) would make the interpreter's exit wait
        # for gloo's timeout in their destructors; the client is closed already.
        os._exit(code)


if __name__ == "__main__":
    main()
