"""``membership admin status``: every replica's standing in the arbiter group.

Rules:

1. Every address of ``--arbiters`` is asked at once (``Admin.Status``, one
   call each, ``--timeout`` seconds), and each gets one line, in the order
   given: with ``--json`` one JSON object per line, otherwise a row of an
   aligned table (then the configuration, and each failure, below it).
2. A replica that answered: ``arbiter`` (its id), ``address``, ``role``,
   ``term``, ``leader`` (null when it knows none), ``commit_index``,
   ``applied_index``, ``last_index``, ``snapshot_index``, ``epoch``,
   ``in_quorum``, ``version``, ``cluster``, ``instance``, ``configuration``
   (``{"voters": {id: address}, "learners": {...}}``) and, on the leader,
   ``followers`` (``{id: {"match_index": N, "lag": N, "last_heard_seconds":
   S}}``: the lag in log entries, the leader's last index minus the
   follower's match index; the seconds since the leader last heard it, so a
   stopped follower, whose lag stays 0 while nothing is appended, shows).
3. A replica that did not: ``arbiter`` and ``address`` (both the address
   given) and ``error`` (``"UNAVAILABLE: ..."``, ``"PERMISSION_DENIED:
   ..."``).
4. Exit 0 when at least one replica answered, whatever it said; exit 1 when
   none did (all unreachable or refusing), after printing every line, with
   one error line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

import grpc

from membership._arbiters.transport import Channels
from membership._config import ClientConfig
from membership.cli.admin.remove import REFUSED
from membership.shared import tls
from membership.shared.errors import InvalidArgument
from membership.shared.exits import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from membership.shared.interrupt import Interrupt, Interrupted
from membership.shared.validation import parse_address
from membership.v1 import membership_pb2 as pb

__all__ = ["admin_status", "ask_replica", "replica_statuses", "status_json", "status_table"]


def status_json(address: str, resp: pb.StatusResponse) -> dict[str, Any]:
    """One answering replica's line (rule 2)."""
    line: dict[str, Any] = {
        "arbiter": resp.arbiter_id,
        "address": address,
        "role": resp.role,
        "term": resp.term,
        "leader": resp.leader_id or None,
        "commit_index": resp.commit_index,
        "applied_index": resp.applied_index,
        "last_index": resp.last_index,
        "snapshot_index": resp.snapshot_index,
        "epoch": resp.epoch,
        "in_quorum": resp.in_quorum,
        "version": resp.version,
        "cluster": resp.cluster,
        "instance": resp.instance,
        "configuration": {
            "voters": dict(sorted(resp.voters.items())),
            "learners": dict(sorted(resp.learners.items())),
        },
    }
    if resp.role == "leader":
        line["followers"] = {
            rid: {
                "match_index": p.match_index,
                "lag": p.lag,
                "last_heard_seconds": round(p.last_heard_seconds, 3),
            }
            for rid, p in sorted(resp.followers.items())
        }
    return line


async def ask_replica(channels: Channels, address: str, timeout: float) -> dict[str, Any]:
    """One replica's line (rules 2 and 3): its ``Admin.Status``, or the error."""
    try:
        resp: pb.StatusResponse = await channels.admin(address).Status(
            pb.StatusRequest(), timeout=timeout
        )
    except grpc.aio.AioRpcError as e:
        return {"arbiter": address, "address": address, "error": f"{e.code().name}: {e.details()}"}
    return status_json(address, resp)


async def replica_statuses(
    arbiters: Sequence[str], *, timeout: float = 3.0, config: ClientConfig | None = None
) -> list[dict[str, Any]]:
    """Asks every replica for its standing at once (rule 1); one dict per address, in order.

    Args:
        arbiters: arbiter addresses ``host:port``.
        timeout: seconds to wait for each.
        config: the client configuration (TLS files or ``insecure``); default
            ``ClientConfig()`` (the ``MEMBERSHIP_TLS_*`` environment).

    Returns:
        The lines of rules 2 and 3.

    Raises:
        InvalidArgument: a malformed address, no address, or no TLS settings
            and no ``insecure``.
    """
    addrs = list(dict.fromkeys(parse_address(a) for a in arbiters))
    if not addrs:
        raise InvalidArgument("no arbiter address given")
    channels = Channels.of((config or ClientConfig()).validate())
    try:
        return list(await asyncio.gather(*(ask_replica(channels, a, timeout) for a in addrs)))
    finally:
        await channels.close()


_COLUMNS = (
    ("ARBITER", "arbiter"),
    ("ADDRESS", "address"),
    ("ROLE", "role"),
    ("TERM", "term"),
    ("LEADER", "leader"),
    ("COMMIT", "commit_index"),
    ("APPLIED", "applied_index"),
    ("EPOCH", "epoch"),
    ("QUORUM", "in_quorum"),
    ("VERSION", "version"),
    ("FOLLOWERS (match/lag/heard)", "followers"),
)


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "in_quorum":
        return "yes" if value else "NO"
    if key == "followers":
        return " ".join(_follower(r, p) for r, p in value.items()) or "-"
    return str(value)


def _follower(rid: str, p: dict[str, Any]) -> str:
    """``a2=41/0/0.1s``: match index, lag, seconds since the leader heard it (an old
    replica's line has no such field: ``a2=41/0``)."""
    heard = p.get("last_heard_seconds")
    cell = f"{rid}={p['match_index']}/{p['lag']}"
    return cell if heard is None else f"{cell}/{heard:.1f}s"


def status_table(lines: Sequence[dict[str, Any]]) -> str:
    """The readable form of the lines (rule 1): a table, the configurations, the failures."""
    answered = [line for line in lines if "error" not in line]
    rows = [[title for title, _ in _COLUMNS]]
    rows += [[_cell(key, line.get(key)) for _, key in _COLUMNS] for line in answered]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    configs: dict[str, list[str]] = {}
    for line in answered:
        cfg = line["configuration"]
        text = "voters " + (", ".join(f"{k}={v}" for k, v in cfg["voters"].items()) or "none")
        if cfg["learners"]:
            text += "; learners " + ", ".join(f"{k}={v}" for k, v in cfg["learners"].items())
        configs.setdefault(text, []).append(line["arbiter"])
    for text, who in configs.items():
        out.append(f"configuration ({', '.join(who)}): {text}")
    out += [f"{line['address']}: error: {line['error']}" for line in lines if "error" in line]
    return "\n".join(out)


async def admin_status(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """``membership admin status``: prints every replica's line (rules 1 to 4).

    Raises:
        InvalidArgument: no TLS settings and no ``--insecure`` (exit 2).
        Interrupted: a signal came first.
    """
    done, lines = await interrupt.race(
        replica_statuses(
            args.arbiters,
            timeout=args.timeout,
            config=ClientConfig(follow_view=False, **tls.config_fields(args)),
        )
    )
    if not done or lines is None:
        assert interrupt.signum is not None
        raise Interrupted(interrupt.signum)
    if args.json:
        for line in lines:
            print(json.dumps(line), flush=True)
    else:
        print(status_table(lines), flush=True)
    if any("error" not in line for line in lines):
        return EXIT_OK
    refused = tuple(code.name for code in REFUSED)  # how the lines name them (rule 2)
    denied = sum(line["error"].startswith(refused) for line in lines)
    n = len(lines)
    if denied == n:  # every one answered, and refused: not an outage (exit 2, as a node's)
        print(
            f"membership admin status: error: all {n} arbiter(s) refused this certificate "
            "(PERMISSION_DENIED): admin status needs an admin or an observer certificate of "
            "this cluster (spiffe://CLUSTER/admin/NAME or spiffe://CLUSTER/observer/NAME; "
            "docs/security.md)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    why = f": {denied} refused this certificate (PERMISSION_DENIED)" if denied else ""
    print(
        f"membership admin status: error: none of the {n} arbiter(s) answered{why}", file=sys.stderr
    )
    return EXIT_FAILURE
