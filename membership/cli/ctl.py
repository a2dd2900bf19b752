"""``membership node-ctl``: a script's client of a ``membership node`` sidecar's control socket.

``membership node --control-socket PATH`` serves the socket
(:mod:`membership.cli.control`, its protocol there); this command asks it, so a
shell or Python script (one that is not an asyncio program) reads its rank,
world size, epoch and fencing state and asks for grace windows:

    membership node-ctl --socket /run/n1.sock status --json
    membership node-ctl --socket /run/n1.sock grace 90 --reason checkpoint
    membership node-ctl --socket /run/n1.sock wait --after 12 --timeout 60 --json
    membership node-ctl --socket /run/n1.sock grace 0

``--socket`` defaults to ``$MEMBERSHIP_CONTROL_SOCKET``. Exit codes: 0 ok; 1
the sidecar refused (one line on stderr: why) or is not there; 2 a usage
error; ``wait`` that timed out exits 1 too (after printing the status).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
from collections.abc import Callable
from typing import Any

from membership._node.graces import MAX_REASON
from membership.cli.control import request
from membership.shared.exits import EXIT_FAILURE, EXIT_OK, CliError

__all__ = ["ENV_SOCKET", "node_ctl", "register"]

ENV_SOCKET = "MEMBERSHIP_CONTROL_SOCKET"
# Seconds node-ctl waits beyond a timeout it gave the sidecar (grace, wait), for the
# sidecar's answer at its end (a timed-out status, why the window was not committed).
ANSWER_SLACK = 1.0


def register(sub: Any, *, positive: Callable[[str], float]) -> None:
    """Adds ``node-ctl`` and its actions to the ``membership`` parser's sub-commands.

    Args:
        sub: the top parser's sub-parsers.
        positive: the argument type of :mod:`membership.cli` for seconds > 0.
    """
    ctl = sub.add_parser(
        "node-ctl",
        help="ask a `membership node --control-socket` sidecar: status, grace, wait",
        description="Talk to the control socket of a `membership node` sidecar (its owner "
        "only, mode 0600): read the node's rank, world size, epoch and fencing state, ask "
        "for a grace window. The socket defaults to $" + ENV_SOCKET + ".",
    )
    socket_help = f"the sidecar's --control-socket (default ${ENV_SOCKET})"
    timeout_help = "seconds to wait for the answer, or wait's change (30)"
    ctl.add_argument(
        "--socket", default=os.environ.get(ENV_SOCKET, ""), metavar="PATH", help=socket_help
    )
    ctl.add_argument("--timeout", type=positive, default=30.0, help=timeout_help)
    # The same two after the action too (`node-ctl wait --timeout 60`); given there, they win.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--socket", default=argparse.SUPPRESS, metavar="PATH", help=socket_help)
    common.add_argument("--timeout", type=positive, default=argparse.SUPPRESS, help=timeout_help)
    actions = ctl.add_subparsers(dest="ctl_command", required=True, metavar="ACTION")
    p = actions.add_parser(
        "status", parents=[common], help="the node's state, fencing, rank and world size"
    )
    p.add_argument("--json", action="store_true", help="one JSON object")
    p = actions.add_parser(
        "grace",
        parents=[common],
        help="ask the cluster not to suspect the node for SECONDS (0: end the window)",
        description="Ask for a grace window: committed through the arbiters' log, capped by "
        "their --max-grace (300 s by default); answers once a quorum of arbiters holds it "
        "(the seconds printed as covered: the node may pause that long). 0 ends it early.",
    )
    p.add_argument("seconds", type=_seconds, help="the window, seconds (0: end it)")
    p.add_argument(
        "--reason", default="", type=_reason, help="why, in words (shown in view and watch)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object")
    p = actions.add_parser(
        "wait",
        parents=[common],
        help="wait until the rank assignment changes (its epoch grows) or the node is fenced",
    )
    p.add_argument(
        "--after",
        type=_epoch,
        default=None,
        help="the rank epoch the caller holds (default: the current one)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object")
    ctl.set_defaults(func=node_ctl)


def _seconds(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not math.isfinite(f) or f < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be a finite number >= 0")
    return f


def _reason(value: str) -> str:
    if len(value) > MAX_REASON or not value.isprintable():
        raise argparse.ArgumentTypeError(f"at most {MAX_REASON} printable characters")
    return value


def _epoch(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be >= 0")
    return n


async def node_ctl(args: argparse.Namespace, interrupt: object) -> int:
    """``membership node-ctl``: one request to the sidecar, its answer printed.

    Raises:
        CliError: no socket given, nothing listens there, or the sidecar refused (code 1).
    """
    if not args.socket:
        raise CliError(f"no control socket: give --socket PATH or set ${ENV_SOCKET}", 2)
    req: dict[str, Any] = {"cmd": args.ctl_command}
    wait = args.timeout  # status: the answer comes at once, or the sidecar is stuck
    if args.ctl_command == "grace":
        req.update(seconds=args.seconds, reason=args.reason, timeout=args.timeout)
    elif args.ctl_command == "wait":
        req["timeout"] = args.timeout
        if args.after is not None:
            req["after"] = args.after
    if "timeout" in req:  # the sidecar's own answer when its time is up, not ours
        wait += ANSWER_SLACK
    try:
        answer = await asyncio.to_thread(request, args.socket, req, wait)
    except (OSError, TimeoutError, ValueError) as e:
        raise CliError(f"control socket {args.socket}: {e}") from None
    if not answer.get("ok"):
        raise CliError(str(answer.get("error", "refused")))
    if args.json:
        print(json.dumps(answer), flush=True)
    elif args.ctl_command == "grace":
        print(_grace_text(answer), flush=True)
    else:
        print(_status_text(answer), flush=True)
    return EXIT_FAILURE if answer.get("timed_out") else EXIT_OK


def _grace_text(a: dict[str, Any]) -> str:
    if not a.get("seconds"):
        return f"grace window ended (at log index {a.get('grant')})"
    return (
        f"grace window of {a['seconds']:g}s committed (grant {a['grant']}); "
        f"covered for {a['covered']:.1f}s"
    )


def _status_text(a: dict[str, Any]) -> str:
    line = (
        f"{a['node_id']} incarnation {a['incarnation']} {a['state']}"
        f"{' member' if a['is_member'] else ''}{' FENCED' if a['fenced'] else ''} "
        f"(fencing epoch {a['fencing_epoch']}, view epoch {a['epoch']})"
    )
    if a.get("rank") is not None:
        line += f"  job {a['job']} rank {a['rank']}/{a['world_size']} (epoch {a['rank_epoch']})"
    if a.get("grace_left"):
        line += f"  GRACE {a['grace_left']:.0f}s"
    return line + ("  (timed out)" if a.get("timed_out") else "")
