"""The ``membership`` command: node, watch, view, demo, and (when installed) arbiter.

Errors are one line on stderr and a non-zero exit code, never a traceback:
2 for bad flags, 1 for anything else (unreachable arbiters, refused request).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import signal
import stat
import sys
import time
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any

from membership.errors import MembershipError, UnavailableError
from membership.session import Fenced, Rejoined, SessionEvent, StateChanged, Superseded
from membership.status import NodeStatus
from membership.validation import parse_address
from membership.view import (
    Disconnected,
    Evidence,
    MemberChange,
    MemberState,
    QuorumChanged,
    Reconnected,
    StatusUpdated,
    View,
    ViewChanged,
    ViewEvent,
    ViewReset,
    ViewSnapshot,
)

__all__ = ["main"]

log = logging.getLogger("membership.cli")


class CliError(Exception):
    """A failure to report as one line on stderr (exit code 1)."""


def _arbiters(value: str) -> list[str]:
    try:
        addrs = [parse_address(a) for a in value.split(",") if a.strip()]
    except MembershipError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not addrs:
        raise argparse.ArgumentTypeError("no arbiter address given")
    return addrs


def _label(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"label {value!r} is not key=value")
    return key, val


def _positive(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not math.isfinite(f) or f <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be a finite number > 0")
    return f


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _member_json(m: Any) -> dict[str, Any]:
    return {
        "node_id": m.node_id,
        "incarnation": m.incarnation,
        "state": m.state.value,
        "labels": dict(m.labels),
        "epoch": m.epoch,
    }


def status_json(status: NodeStatus) -> dict[str, Any]:
    """A node status as a JSON object: only the fields that are present."""
    d: dict[str, Any] = {}
    for name in (
        "load",
        "cpu_utilization",
        "memory_utilization",
        "gpu_utilization",
        "gpu_memory_utilization",
        "phase",
        "step",
        "progress",
    ):
        value = getattr(status, name)
        if value is not None:
            d[name] = value
    if status.gauges:
        d["gauges"] = dict(status.gauges)
    return d


def status_text(status: NodeStatus) -> str:
    """A node status in one short line, e.g. ``load 0.52 cpu 12% mem 40% phase allreduce``."""
    parts = []
    if status.load is not None:
        parts.append(f"load {status.load:.2f}")
    for label, value in (
        ("cpu", status.cpu_utilization),
        ("mem", status.memory_utilization),
        ("gpu", status.gpu_utilization),
        ("gpu-mem", status.gpu_memory_utilization),
        ("progress", status.progress),
    ):
        if value is not None:
            parts.append(f"{label} {value:.0%}")
    if status.phase is not None:
        parts.append(f"phase {status.phase}")
    if status.step is not None:
        parts.append(f"step {status.step}")
    parts.extend(f"{k}={v:g}" for k, v in sorted(status.gauges.items()))
    return " ".join(parts) or "(no status)"


def _evidence_json(e: Evidence) -> dict[str, Any]:
    return {
        "arbiter": e.arbiter_id,
        "silence_seconds": e.silence,
        "suspicion": e.suspicion,
        "detector": e.detector or None,
    }


def _evidence_text(evidence: tuple[Evidence, ...]) -> str:
    parts = []
    for e in evidence:
        what = e.arbiter_id
        if e.silence is not None:
            what += f" after {e.silence:.2f}s silent"
        if e.suspicion is not None:
            unit = "phi" if e.detector == "phi" else "missed"
            what += f" ({unit} {e.suspicion:.1f})"
        parts.append(what)
    return "; suspected by " + ", ".join(parts) if parts else ""


def _change_json(ev: ViewChanged, c: MemberChange) -> dict[str, Any]:
    d: dict[str, Any] = {
        "type": "change",
        "epoch": ev.epoch,
        "node_id": c.node_id,
        "incarnation": c.incarnation,
        "state": c.state.value,
        "labels": dict(c.labels),
        "arbiter": ev.arbiter_id,
    }
    if c.evidence:
        d["evidence"] = [_evidence_json(e) for e in c.evidence]
    return d


def event_lines(ev: ViewEvent, as_json: bool) -> list[str]:
    """Renders one watch event as output lines (one per member change or status report).

    JSON shapes: ``{"type": "snapshot", "epoch", "members": [...]}``,
    ``{"type": "change", "epoch", "node_id", "incarnation", "state", "labels"}``
    (a DEAD decided by a quorum adds ``"evidence": [{"arbiter",
    "silence_seconds", "suspicion", "detector"}]``),
    ``{"type": "quorum", "in_quorum", "arbiter", "leader"}``,
    ``{"type": "status", "node_id", "incarnation", "status": {...},
    "suspected_by", "silence_seconds", "arbiter"}``,
    ``{"type": "disconnected", "epoch", "silence_seconds", "arbiter", "reason"}``,
    ``{"type": "reconnected", "epoch", "silence_seconds", "arbiter"}``,
    ``{"type": "reset", "since_epoch", "cluster_epoch"}``.
    """
    if isinstance(ev, Disconnected):
        if as_json:
            return [
                json.dumps(
                    {
                        "type": "disconnected",
                        "epoch": ev.epoch,
                        "silence_seconds": ev.silence,
                        "arbiter": ev.arbiter_id or None,
                        "reason": ev.reason,
                    }
                )
            ]
        return [
            f"disconnected: nothing from an arbiter in a quorum for {ev.silence:.1f}s "
            f"(view at epoch {ev.epoch} may be stale; {ev.reason})"
        ]
    if isinstance(ev, Reconnected):
        if as_json:
            return [
                json.dumps(
                    {
                        "type": "reconnected",
                        "epoch": ev.epoch,
                        "silence_seconds": ev.silence,
                        "arbiter": ev.arbiter_id,
                    }
                )
            ]
        return [f"reconnected to {ev.arbiter_id} after {ev.silence:.1f}s (at epoch {ev.epoch})"]
    if isinstance(ev, ViewReset):
        if as_json:
            return [
                json.dumps(
                    {
                        "type": "reset",
                        "since_epoch": ev.since_epoch,
                        "cluster_epoch": ev.cluster_epoch,
                    }
                )
            ]
        return [
            f"reset: epoch {ev.since_epoch} is beyond the cluster's ({ev.cluster_epoch}); "
            "a fresh snapshot follows"
        ]
    if isinstance(ev, StatusUpdated):
        if as_json:
            return [
                json.dumps(
                    {
                        "type": "status",
                        "node_id": r.node_id,
                        "incarnation": r.incarnation,
                        "status": status_json(r.status),
                        "suspected_by": list(r.suspected_by),
                        "silence_seconds": r.silence,
                        "arbiter": ev.arbiter_id,
                    }
                )
                for r in ev.reports
            ]
        return [
            f"status {r.node_id} (incarnation {r.incarnation}): {status_text(r.status)}"
            + (f"  SUSPECT by {','.join(r.suspected_by)}" if r.suspected_by else "")
            for r in ev.reports
        ]
    if isinstance(ev, ViewSnapshot):
        if as_json:
            return [
                json.dumps(
                    {
                        "type": "snapshot",
                        "epoch": ev.view.epoch,
                        "members": [_member_json(m) for m in ev.view.members],
                        "arbiter": ev.arbiter_id,
                    }
                )
            ]
        members = ", ".join(f"{m.node_id}={m.state.value}" for m in ev.view.members) or "(empty)"
        return [f"epoch {ev.view.epoch}  snapshot from {ev.arbiter_id}: {members}"]
    if isinstance(ev, ViewChanged):
        if as_json:
            return [json.dumps(_change_json(ev, c)) for c in ev.changes]
        return [
            f"epoch {ev.epoch}  {c.node_id} (incarnation {c.incarnation}) {c.state.value}"
            + _evidence_text(c.evidence)
            for c in ev.changes
        ]
    assert isinstance(ev, QuorumChanged)
    if as_json:
        return [
            json.dumps(
                {
                    "type": "quorum",
                    "in_quorum": ev.in_quorum,
                    "arbiter": ev.arbiter_id,
                    "leader": ev.leader_id,
                }
            )
        ]
    word = "regained" if ev.in_quorum else "lost"
    return [f"arbiter {ev.arbiter_id} {word} its quorum (leader: {ev.leader_id or 'none'})"]


def session_event_line(node_id: str, ev: SessionEvent) -> str | None:
    """How ``membership node`` prints a session event (None for an event it does not print).

    Lines: ``n1: incarnation 7 is ALIVE``, ``n1: fenced (fencing epoch 5)``,
    ``n1: unfenced (...)``, ``n1: incarnation 7 taken over by 8; stopping``,
    ``n1: incarnation 7 over (DEAD); rejoining as 8``.
    """
    if isinstance(ev, StateChanged):
        return f"{node_id}: incarnation {ev.incarnation} is {ev.state.value}"
    if isinstance(ev, Fenced):
        word = "fenced" if ev.fenced else "unfenced"
        return f"{node_id}: {word} (fencing epoch {ev.epoch})"
    if isinstance(ev, Superseded):
        return f"{node_id}: incarnation {ev.incarnation} taken over by {ev.by}; stopping"
    if isinstance(ev, Rejoined):
        return (
            f"{node_id}: incarnation {ev.old_incarnation} over ({ev.reason}); "
            f"rejoining as {ev.new_incarnation}"
        )
    return None


def _print(line: str) -> None:
    print(line, flush=True)


async def _until_signal(main: Callable[[asyncio.Event], Any]) -> Any:
    """Runs ``main(stop)`` with ``stop`` set by SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        return await main(stop)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _config_ok(what: str, client: Any, settings: dict[str, Any]) -> int:
    """The ``--check-config`` report of a client command, as the arbiter's: an OK line,
    then one ``name = value`` line per setting and per ClientConfig field."""
    _print(f"{what}: configuration OK")
    for name, value in {"arbiters": ",".join(client.arbiters), **settings}.items():
        _print(f"  {name} = {value}")
    for f in dataclasses.fields(client.config):
        _print(f"  {f.name} = {getattr(client.config, f.name)}")
    return 0


async def _wait_reachable(client: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await client.get_view()
        except UnavailableError as e:
            if time.monotonic() >= deadline:
                raise CliError(f"no arbiter reachable within {timeout:g}s ({e})") from None
            await asyncio.sleep(0.5)


# --- node -------------------------------------------------------------------------------


async def _node(args: argparse.Namespace) -> int:
    from membership.client import MembershipClient
    from membership.config import ClientConfig

    def on_event(ev: SessionEvent) -> None:
        line = session_event_line(args.id, ev)
        if line is not None:
            _print(line)

    client = MembershipClient(
        args.arbiters,
        node_id=args.id,
        labels=dict(args.label),
        incarnation=args.incarnation,
        config=ClientConfig(
            auto_rejoin=not args.no_rejoin,
            follow_view=False,
            collect_status=not args.no_status_probes,
        ),
        on_event=on_event,
    )
    if args.check_config:
        # The client checked every address, the id, the labels and its config,
        # and connected to nothing (channels open on first use).
        return _config_ok(
            f"node {client.node_id}",
            client,
            {
                "labels": ",".join(f"{k}={v}" for k, v in client.labels.items()),
                "incarnation": args.incarnation or "wall-clock milliseconds at start",
                "connect_timeout": args.connect_timeout,
                "leave_timeout": args.leave_timeout,
            },
        )

    async def run(stop: asyncio.Event) -> int:
        await _wait_reachable(client, args.connect_timeout)
        await client.start()
        stopper = asyncio.ensure_future(stop.wait())
        ended = asyncio.ensure_future(client.ended.wait())
        await asyncio.wait({stopper, ended}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        ended.cancel()
        if client.ended.is_set():
            if client.error is not None:
                raise client.error
            if args.no_rejoin and client.state is MemberState.DEAD:
                raise CliError(f"{args.id} was declared DEAD and --no-rejoin is set")
            if client.state is MemberState.LEFT:
                raise CliError(f"{args.id} was made LEFT by the cluster without asking")
            raise CliError(
                f"node id {args.id!r} was taken over by a newer incarnation "
                "(is another process running with the same id?)"
            )
        _print(f"{args.id}: leaving")
        try:
            epoch = await client.leave(timeout=args.leave_timeout)
        except MembershipError as e:
            raise CliError(f"leave failed: {e}") from None
        _print(f"{args.id}: LEFT at epoch {epoch}")
        return 0

    try:
        result: int = await _until_signal(run)
        return result
    finally:
        await client.close()


# --- watch / view ---------------------------------------------------------------------------


async def _watch(args: argparse.Namespace) -> int:
    from membership.client import MembershipClient, reap
    from membership.config import ClientConfig

    client = MembershipClient(args.arbiters, config=ClientConfig(follow_view=False))
    if args.check_config:
        return _config_ok(
            "watch",
            client,
            {
                "json": args.json,
                "since_epoch": args.since_epoch,
                "status": args.status,
                "status_interval": args.status_interval or "the arbiter's",
                "connect_timeout": args.connect_timeout,
            },
        )

    async def run(stop: asyncio.Event) -> int:
        await _wait_reachable(client, args.connect_timeout)

        async def pump() -> None:
            async for ev in client.watch(
                since_epoch=args.since_epoch,
                status=args.status,
                status_interval=args.status_interval,
            ):
                for line in event_lines(ev, args.json):
                    _print(line)

        loop = asyncio.get_running_loop()
        task = loop.create_task(pump())
        stopper = loop.create_task(stop.wait())
        if stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode):
            # A pipe's write end polls as an error once its reader is gone:
            # stop then, not at the next event (which may be far off).
            def reader_gone() -> None:
                loop.remove_reader(sys.stdout.fileno())
                stop.set()

            loop.add_reader(sys.stdout.fileno(), reader_gone)
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            stopper.cancel()
            exc = task.exception()
            if isinstance(exc, BrokenPipeError | MembershipError):
                raise exc
            raise CliError(f"watch ended unexpectedly: {exc!r}")
        for t in (task, stopper):
            await reap(t)
        return 0

    try:
        result: int = await _until_signal(run)
        return result
    finally:
        await client.close()


def view_json(info: Any) -> dict[str, Any]:
    """The ``view --json`` object: epoch, leader, in_quorum, arbiter, members."""
    members = []
    for m in info.view.members:
        d = _member_json(m)
        d["suspected_by"] = list(info.suspected_by.get(m.node_id, ()))
        status = info.statuses.get(m.node_id)
        if status is not None:
            d["status"] = status_json(status)
        members.append(d)
    return {
        "epoch": info.view.epoch,
        "leader": info.leader_id,
        "in_quorum": info.in_quorum,
        "arbiter": info.arbiter_id,
        "local_suspects": list(info.local_suspects),
        "members": members,
    }


async def _view(args: argparse.Namespace) -> int:
    from membership.client import MembershipClient
    from membership.config import ClientConfig

    client = MembershipClient(
        args.arbiters, config=ClientConfig(follow_view=False, call_timeout=args.timeout)
    )
    if args.check_config:
        return _config_ok("view", client, {"json": args.json})
    try:
        info = await client.get_view()
    except UnavailableError as e:
        raise CliError(str(e)) from None
    finally:
        await client.close()
    if args.json:
        _print(json.dumps(view_json(info)))
        return 0
    view: View = info.view
    _print(
        f"epoch {view.epoch}  arbiter {info.arbiter_id}  leader {info.leader_id or 'none'}  "
        f"in_quorum {str(info.in_quorum).lower()}"
    )
    for m in view.members:
        labels = ",".join(f"{k}={v}" for k, v in m.labels.items())
        suspects = info.suspected_by.get(m.node_id)
        extra = f"  SUSPECT by {','.join(suspects)}" if suspects else ""
        _print(
            f"  {m.node_id:<20} {m.state.value:<6} incarnation {m.incarnation}  "
            f"since epoch {m.epoch}  {labels}{extra}"
        )
        status = info.statuses.get(m.node_id)
        if status is not None:
            _print(f"  {'':<20} {status_text(status)}")
    return 0


# --- parser -------------------------------------------------------------------------------


def _add_connect_timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--connect-timeout",
        type=_positive,
        default=10.0,
        help="seconds to wait for a first arbiter to answer (default 10)",
    )


def _add_check_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--check-config",
        action="store_true",
        help="validate the flags and configuration without connecting, print them, and exit",
    )


def _epoch_arg(value: str) -> int:
    try:
        epoch = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if epoch < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be >= 0")
    return epoch


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command (plugins such as ``arbiter`` included)."""
    parser = argparse.ArgumentParser(
        prog="membership",
        description="Cluster membership over gRPC with quorum arbitration.",
    )
    parser.add_argument(
        "--log-level",
        default=None,
        choices=["debug", "info", "warning", "error"],
        help="log level on stderr (default: info for arbiter, warning otherwise)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    arb_help = "comma-separated arbiter addresses host:port (list every replica)"
    p = sub.add_parser("node", help="run a node: heartbeat to every arbiter until SIGINT/SIGTERM")
    p.add_argument("--id", required=True, help="node id (letters, digits, . _ -; up to 128)")
    p.add_argument("--arbiters", required=True, type=_arbiters, help=arb_help)
    p.add_argument(
        "--label",
        action="append",
        type=_label,
        default=[],
        metavar="KEY=VALUE",
        help="static label (repeatable)",
    )
    p.add_argument(
        "--incarnation",
        type=int,
        default=None,
        help="starting incarnation (default: wall-clock milliseconds)",
    )
    p.add_argument(
        "--no-rejoin",
        action="store_true",
        help="do not rejoin at a higher incarnation when declared DEAD",
    )
    p.add_argument(
        "--no-status-probes",
        action="store_true",
        help="do not probe load, CPU, memory and GPUs for the live status",
    )
    _add_connect_timeout(p)
    p.add_argument(
        "--leave-timeout",
        type=_positive,
        default=5.0,
        help="seconds to wait for the leave to commit on shutdown (default 5)",
    )
    _add_check_config(p)
    p.set_defaults(func=_node)

    p = sub.add_parser("watch", help="print view events as they happen")
    p.add_argument("--arbiters", required=True, type=_arbiters, help=arb_help)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument(
        "--since-epoch",
        type=_epoch_arg,
        default=0,
        help="resume after this epoch (default 0: start with a snapshot)",
    )
    p.add_argument(
        "--status",
        action="store_true",
        help="also print the nodes' live status (load, CPU, memory, GPU, phase, step, gauges, "
        "which replicas suspect them) as it changes",
    )
    p.add_argument(
        "--status-interval",
        type=_positive,
        default=0.0,
        help="seconds between status updates (default: the arbiter's, 1 s; never faster)",
    )
    _add_connect_timeout(p)
    _add_check_config(p)
    p.set_defaults(func=_watch)

    p = sub.add_parser("view", help="print the current view")
    p.add_argument("--arbiters", required=True, type=_arbiters, help=arb_help)
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument(
        "--timeout",
        type=_positive,
        default=3.0,
        help="seconds to wait for each arbiter (default 3)",
    )
    _add_check_config(p)
    p.set_defaults(func=_view)

    from membership import demo

    demo.add_parser(sub)

    # The server registers its own sub-command, so that this package never imports it.
    for ep in entry_points(group="membership.commands"):
        try:
            ep.load()(sub)
        except ImportError as e:  # pragma: no cover - broken install
            log.warning("command %s unavailable: %s", ep.name, e)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``membership`` command; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except MembershipError as e:
        parser.error(str(e))
    # A server logs what it decides (elections, deaths); clients stay quiet.
    _setup_logging(args.log_level or ("info" if args.command == "arbiter" else "warning"))
    try:
        result = args.func(args)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return int(result or 0)
    except BrokenPipeError:
        # The reader of our output went away (``membership watch | head -3``):
        # end quietly, as other command-line tools do.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (CliError, MembershipError, OSError) as e:
        print(f"membership {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
