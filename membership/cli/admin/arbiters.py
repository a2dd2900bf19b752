"""``membership admin arbiters list|add ID=HOST:PORT|remove ID|promote ID --arbiters ADDR[,...]``.

The Admin service's arbiter RPCs (arbiter/server/ops/admin_arbiters.py): the
arbiter group changes one replica at a time (Raft single-server changes,
Ongaro 2014 section 4.2.1), a new replica first as a learner that votes once
promoted (automatically once caught up, or by ``promote``).

Rules:

1. ``list`` asks the arbiters in the order given and prints the answer of
   the leader when one answers (it knows each arbiter's progress), else the
   first answer: one line per arbiter (``id address role``, and ``match``
   and ``lag`` when known), or with ``--json`` one JSON object per line with
   the keys ``id``, ``address``, ``role`` (``voter`` or ``learner``), and
   ``match`` and ``lag`` when known.
2. A change is sent to one arbiter at a time. A follower's answer
   FAILED_PRECONDITION "not the leader: the leader is ID at HOST:PORT" sends
   it on to that address; UNAVAILABLE or a deadline moves on to the next
   address (rounds until ``--timeout``). Any other answer is the group's:
   a change is not idempotent, so it is never sent to several at once.
3. Errors print one line and exit 1 (refused by the group: the status name
   and its message; no arbiter answered); a malformed ``ID=HOST:PORT`` or id
   is a usage error (exit 2). Under mutual TLS a change needs an admin
   certificate, a listing an admin or an observer one (PERMISSION_DENIED
   otherwise, exit 2 as every refused certificate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from membership._arbiters.transport import Channels
from membership._config import ClientConfig
from membership.cli.admin.remove import RETRY_ELSEWHERE, ask_in_rounds, refusal
from membership.cli.endpoints import add_arbiters_flag
from membership.shared import tls
from membership.shared.errors import InvalidArgument, RejectedError, UnavailableError
from membership.shared.exits import EXIT_OK, CliError
from membership.shared.interrupt import Interrupt, Interrupted
from membership.shared.validation import parse_address, validate_node_id
from membership.v1 import membership_pb2 as pb

__all__ = ["ArbiterRow", "change_arbiters", "list_arbiters", "register"]

_LEADER_AT = re.compile(r"the leader is (\S+) at (\S+)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class ArbiterRow:
    """One arbiter as ``list`` prints it.

    Attributes:
        id: replica id. address: ``host:port``. role: ``voter`` or ``learner``.
        match: highest log index known replicated on it (None: unknown, the
            answer did not come from the leader). lag: entries behind the leader.
    """

    id: str
    address: str
    role: str
    match: int | None = None
    lag: int | None = None

    def json(self) -> dict[str, Any]:
        """The ``--json`` object (rule 1)."""
        out: dict[str, Any] = {"id": self.id, "address": self.address, "role": self.role}
        if self.match is not None:
            out["match"], out["lag"] = self.match, self.lag
        return out


def _rows(resp: pb.ListArbitersResponse) -> list[ArbiterRow]:
    return [
        ArbiterRow(
            id=s.arbiter.id,
            address=s.arbiter.address,
            role="voter" if s.arbiter.voter else "learner",
            match=int(s.match_index) if s.progress_known else None,
            lag=int(s.lag) if s.progress_known else None,
        )
        for s in resp.arbiters
    ]


async def list_arbiters(
    arbiters: Sequence[str], *, timeout: float = 5.0, config: ClientConfig | None = None
) -> tuple[list[ArbiterRow], pb.ListArbitersResponse]:
    """The configuration in force (rule 1): its rows and the answer they come from.

    Raises:
        RejectedError: the group refused (PERMISSION_DENIED, another cluster).
        UnavailableError: no arbiter answered within ``timeout`` seconds.
    """
    config = (config or ClientConfig()).validate()
    channels = Channels.of(config)
    errors: dict[str, str] = {}
    try:

        async def one(addr: str) -> pb.ListArbitersResponse | None:
            try:
                resp: pb.ListArbitersResponse = await channels.admin(addr).ListArbiters(
                    pb.ListArbitersRequest(), timeout=timeout
                )
                return resp
            except grpc.aio.AioRpcError as e:
                if e.code() in RETRY_ELSEWHERE:
                    errors[addr] = e.code().name
                    return None
                raise refusal(e) from None

        answers = [a for a in await asyncio.gather(*(one(a) for a in arbiters)) if a]
    finally:
        await channels.close()
    if not answers:
        detail = tls.join_reasons(errors)
        raise UnavailableError(f"no arbiter answered ({detail})")
    best = next((a for a in answers if a.leader_id and a.leader_id == a.arbiter_id), answers[0])
    return _rows(best), best


async def change_arbiters(
    arbiters: Sequence[str],
    op: str,
    replica_id: str,
    address: str = "",
    *,
    timeout: float = 20.0,
    config: ClientConfig | None = None,
) -> pb.ArbiterChangeResponse:
    """One change of the arbiter group, sent to its leader (rule 2).

    Args:
        arbiters: arbiter addresses to ask, in order.
        op: ``add``, ``remove`` or ``promote``.
        replica_id: the arbiter the change is about.
        address: its ``host:port`` (``add`` only).
        timeout: seconds for the whole call.
        config: TLS files or ``insecure`` (default ``ClientConfig()``).

    Raises:
        InvalidArgument: a malformed id or address.
        RejectedError: the group refused it (message starts with the status name).
        UnavailableError: no leader could be reached within ``timeout``.
    """
    validate_node_id(replica_id)
    if op == "add":
        address = parse_address(address)
    config = (config or ClientConfig()).validate()
    channels = Channels.of(config)

    async def one(addr: str, left: float) -> pb.ArbiterChangeResponse:
        return await _send(channels.admin(addr), op, replica_id, address, left)

    try:
        return await ask_in_rounds(
            arbiters, timeout, one, what="arbiter leader made the change", redirect=_leader_named
        )
    finally:
        await channels.close()


def _leader_named(e: grpc.aio.AioRpcError) -> tuple[str, str | None] | None:
    """A follower's "not the leader: the leader is ID at HOST:PORT": ask that address next."""
    found = _LEADER_AT.search(e.details() or "")
    if e.code() == grpc.StatusCode.FAILED_PRECONDITION and found:
        return f"not the leader ({found.group(1)} is)", found.group(2)
    return None


async def _send(
    stub: Any, op: str, replica_id: str, address: str, timeout: float
) -> pb.ArbiterChangeResponse:
    if op == "add":
        call = stub.AddArbiter(
            pb.AddArbiterRequest(id=replica_id, address=address), timeout=timeout
        )
    elif op == "remove":
        call = stub.RemoveArbiter(pb.RemoveArbiterRequest(id=replica_id), timeout=timeout)
    else:
        call = stub.PromoteArbiter(pb.PromoteArbiterRequest(id=replica_id), timeout=timeout)
    resp: pb.ArbiterChangeResponse = await call
    return resp


def _id_address(value: str) -> tuple[str, str]:
    rid, sep, address = value.partition("=")
    try:
        if not sep:
            raise InvalidArgument(f"{value!r} is not ID=HOST:PORT")
        validate_node_id(rid)
        return rid, parse_address(address)
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def register(admin_sub: Any, arbiters_type: Any, arb_help: str) -> None:
    """Adds ``admin arbiters ACTION`` to the ``membership admin`` parser."""
    p = admin_sub.add_parser(
        "arbiters",
        help="list and change the arbiter group (add a learner, remove, promote)",
        description="List or change the arbiter group, one replica at a time. A replica is "
        "added as a learner, started with 'membership arbiter --join', promoted to voter "
        "automatically once caught up (or by 'promote'); see README 'Replacing an arbiter'. "
        "Exit 1 with one line when the group refuses or no arbiter answers.",
    )
    actions = p.add_subparsers(dest="arbiters_command", required=True, metavar="ACTION")
    specs = (
        ("list", "the configuration in force, with each arbiter's lag when the leader answers"),
        ("add", "add ID=HOST:PORT as a learner (it votes once promoted)"),
        ("remove", "remove ID from the group (a voter or a learner)"),
        ("promote", "make learner ID a voter now"),
    )
    for name, text in specs:
        q = actions.add_parser(name, help=text, description=text)
        if name == "add":
            q.add_argument("target", metavar="ID=HOST:PORT", type=_id_address)
        elif name != "list":
            q.add_argument("target", metavar="ID")
        else:
            q.add_argument("--json", action="store_true", help="one JSON object per arbiter")
        add_arbiters_flag(q, arbiters_type, arb_help)
        q.add_argument(
            "--timeout", type=float, default=20.0, help="seconds for the call (default 20)"
        )
        tls.add_tls_flags(q)
        q.set_defaults(func=_run, arbiters_action=name)


async def _run(args: argparse.Namespace, interrupt: Interrupt) -> int:
    config = ClientConfig(follow_view=False, **tls.config_fields(args))
    action = args.arbiters_action
    try:
        if action == "list":
            work: Any = list_arbiters(args.arbiters, timeout=args.timeout, config=config)
        else:
            target = args.target if action == "add" else (args.target, "")
            work = change_arbiters(
                args.arbiters, action, target[0], target[1], timeout=args.timeout, config=config
            )
        done, result = await interrupt.race(work)
    except (RejectedError, UnavailableError) as e:
        raise CliError(str(e)) from None
    if not done or result is None:
        assert interrupt.signum is not None
        raise Interrupted(interrupt.signum)
    if action == "list":
        rows, resp = result
        for row in rows:
            if args.json:
                print(json.dumps(row.json(), sort_keys=True))
            else:
                progress = "" if row.match is None else f" match {row.match} lag {row.lag}"
                leader = " leader" if row.id == resp.leader_id else ""
                print(f"{row.id} {row.address} {row.role}{leader}{progress}")
        return EXIT_OK
    conf = ", ".join(
        f"{a.id}={a.address} ({'voter' if a.voter else 'learner'})" for a in result.arbiters
    )
    print(
        f"arbiter {args.target if action != 'add' else args.target[0]}: {action} done; "
        f"configuration at log index {result.config_index}: {conf}",
        flush=True,
    )
    return EXIT_OK
