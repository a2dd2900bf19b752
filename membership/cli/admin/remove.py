"""The Admin service's client: :func:`remove_node` and ``membership admin remove``.

Removing another node is an administrative act (the Admin service's
``RemoveNode``; under mutual TLS it needs an admin certificate): the member
becomes LEFT at its recorded incarnation, committed like any view change,
and the removed node stops without rejoining. Its change in the view
carries who removed it (``MemberChange.removed_by``).

:func:`remove_node` asks the arbiters one at a time, in the order given,
moving on only when one cannot answer (UNAVAILABLE, a deadline); any other
answer is the cluster's: a removal is not idempotent (a second one finds the
member LEFT already), so it is never sent to several arbiters at once. When
none can answer (no leader yet, all down) it tries again every
``_ROUND_PAUSE`` seconds until the timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from membership._arbiters.transport import Channels
from membership._config import ClientConfig
from membership.shared import tls
from membership.shared.errors import (
    InvalidArgument,
    MembershipError,
    PermissionDenied,
    RejectedError,
    UnavailableError,
)
from membership.shared.exits import EXIT_OK, CliError
from membership.shared.interrupt import Interrupt, Interrupted
from membership.shared.validation import parse_address, validate_node_id
from membership.v1 import membership_pb2 as pb

__all__ = [
    "REFUSED",
    "RETRY_ELSEWHERE",
    "Removal",
    "admin_remove",
    "ask_in_rounds",
    "refusal",
    "remove_node",
]

# Answers that mean "this arbiter cannot say now; ask another".
RETRY_ELSEWHERE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# A certificate refused for what it asked: exit 2 from every command (refusal()).
REFUSED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
# Seconds between two rounds over the arbiters when none could answer.
_ROUND_PAUSE = 0.25


def refusal(e: grpc.aio.AioRpcError) -> MembershipError:
    """The error an admin command raises for an arbiter's refusal ``e``: a refused
    certificate (PERMISSION_DENIED, UNAUTHENTICATED) is :class:`PermissionDenied`,
    exit 2 as for a node whose heartbeats are refused (one code for one cause); any
    other refusal :class:`RejectedError`, exit 1."""
    text = f"{e.code().name}: {e.details()}"
    if e.code() in REFUSED:
        return PermissionDenied(text)
    return RejectedError(text)


T = TypeVar("T")


async def ask_in_rounds(
    addrs: Sequence[str],
    timeout: float,
    call: Callable[[str, float], Awaitable[T]],
    *,
    what: str,
    redirect: Callable[[grpc.aio.AioRpcError], tuple[str, str | None] | None] | None = None,
) -> T:
    """Asks the arbiters one at a time, in rounds, until one answers (the admin calls
    that only the leader, or a replica in quorum, can answer).

    Args:
        addrs: arbiter addresses, asked in this order each round.
        timeout: seconds for the whole call.
        call: ``call(address, seconds_left)`` asks one arbiter.
        what: what failed, for the error (``"arbiter could commit the removal"``).
        redirect: for a refusal that means "ask another": why (recorded), and
            the address to ask next or None (a follower naming its leader);
            None for any other refusal.

    Returns:
        The first answer.

    Raises:
        RejectedError: a refusal that is neither UNAVAILABLE, DEADLINE_EXCEEDED
            nor redirected (the message starts with the status name).
        UnavailableError: nobody answered within ``timeout``: ``no {what}
            within {timeout}s (address: why; ...)``. An UnavailableError that
            ``call`` raises counts as that arbiter not answering.
    """
    deadline = time.monotonic() + timeout
    errors: dict[str, str] = {}
    while time.monotonic() < deadline:
        queue = list(addrs)
        while queue:
            addr = queue.pop(0)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                return await call(addr, left)
            except UnavailableError as e:
                errors[addr] = str(e)
            except grpc.aio.AioRpcError as e:
                redirected = None if redirect is None else redirect(e)
                if redirected is not None:
                    errors[addr], leader = redirected
                    if leader is not None:
                        queue.insert(0, leader)
                elif e.code() in RETRY_ELSEWHERE:
                    errors[addr] = f"{e.code().name} {e.details()}"
                else:
                    raise refusal(e) from None
        # None could answer (no leader yet, all down): a round again shortly.
        await asyncio.sleep(min(_ROUND_PAUSE, max(0.0, deadline - time.monotonic())))
    detail = tls.join_reasons(errors, "out of time")
    raise UnavailableError(f"no {what} within {timeout:g}s ({detail})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Removal:
    """A committed removal.

    Attributes:
        node_id: the removed member.
        incarnation: the incarnation that became LEFT.
        epoch: the view epoch at which it did.
        removed_by: who the cluster records as having removed it.
        arbiter: the address of the arbiter that answered.
    """

    node_id: str
    incarnation: int
    epoch: int
    removed_by: str
    arbiter: str


async def remove_node(
    arbiters: Sequence[str],
    node_id: str,
    *,
    incarnation: int = 0,
    timeout: float = 10.0,
    config: ClientConfig | None = None,
) -> Removal:
    """Removes a member from the cluster: it becomes LEFT (module docstring).

    Args:
        arbiters: arbiter addresses ``host:port``, asked in this order.
        node_id: the member to remove.
        incarnation: the incarnation to remove; 0 for whichever the cluster records.
        timeout: seconds for the whole call.
        config: the client configuration (channel options, TLS files or
            ``insecure``); default ``ClientConfig()`` (TLS from the
            ``MEMBERSHIP_TLS_*`` environment, or ``MEMBERSHIP_INSECURE=1``).

    Returns:
        The committed removal.

    Raises:
        InvalidArgument: a malformed address or node id, a negative
            incarnation, or no TLS settings and no ``insecure``.
        RejectedError: the cluster refused: ``NOT_FOUND`` (no member of that
            id), ``FAILED_PRECONDITION`` (already DEAD or LEFT, at another
            incarnation, or another cluster), ``PERMISSION_DENIED`` (not an
            administrator); the message starts with the status name.
        UnavailableError: no arbiter could answer within ``timeout``.
    """
    addrs = [parse_address(a) for a in arbiters]
    if not addrs:
        raise InvalidArgument("no arbiter address given")
    validate_node_id(node_id)
    if incarnation < 0:
        raise InvalidArgument(f"incarnation must be >= 0, got {incarnation}")
    config = (config or ClientConfig()).validate()
    channels = Channels.of(config)
    request = pb.RemoveNodeRequest(node_id=node_id, incarnation=incarnation)

    async def one(addr: str, left: float) -> Removal:
        resp: pb.RemoveNodeResponse = await channels.admin(addr).RemoveNode(
            request, timeout=min(left, config.call_timeout * 3)
        )
        return Removal(
            node_id=node_id,
            incarnation=int(resp.incarnation),
            epoch=int(resp.epoch),
            removed_by=resp.removed_by,
            arbiter=addr,
        )

    try:
        return await ask_in_rounds(addrs, timeout, one, what="arbiter could commit the removal")
    finally:
        await channels.close()


async def admin_remove(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """``membership admin remove NODE``: prints the removal; exit 0.

    Raises:
        CliError: the cluster refused it or could not answer (exit 1, one line).
        InvalidArgument: a malformed node id (exit 2).
        Interrupted: a signal came first.
    """
    try:
        done, removal = await interrupt.race(
            remove_node(
                args.arbiters,
                args.node,
                incarnation=args.incarnation,
                timeout=args.timeout,
                config=ClientConfig(follow_view=False, **tls.config_fields(args)),
            )
        )
    except (RejectedError, UnavailableError) as e:
        raise CliError(str(e)) from None
    if not done or removal is None:
        assert interrupt.signum is not None
        raise Interrupted(interrupt.signum)
    print(
        f"{removal.node_id} removed: incarnation {removal.incarnation} is LEFT at epoch "
        f"{removal.epoch} (by {removal.removed_by})",
        flush=True,
    )
    return EXIT_OK
