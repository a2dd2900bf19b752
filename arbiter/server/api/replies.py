"""How the public servicers refuse a call: one place for the statuses they share.

``MembershipServicer`` (``Leave``, and the cluster checks of every RPC) and
``AdminServicer`` (``RemoveNode``) end refused calls the same way:

* an authorizer's refusal: its own code (PERMISSION_DENIED, UNAUTHENTICATED);
* a request expecting another cluster: FAILED_PRECONDITION, naming both;
* a Leave or Remove the tally refuses (rules 5 and 5a): NOT_FOUND for an id
  the cluster has no record of, FAILED_PRECONDITION for every other refusal;
* a proposal that cannot commit: UNAVAILABLE (no leader, or no quorum in time).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TypeVar

import grpc

from arbiter.core.raft import ProposalDropped
from arbiter.core.tally import LeaveRefusal
from arbiter.server.net.authz import Refusal

__all__ = ["cluster_mismatch", "committed", "deny", "refusal_status"]

log = logging.getLogger("arbiter.api")
T = TypeVar("T")


def refusal_status(refusal: LeaveRefusal) -> grpc.StatusCode:
    """The gRPC status for a refused Leave or Remove (tally rules 5 and 5a).

    Returns:
        NOT_FOUND for an id the cluster has no record of (UNKNOWN),
        FAILED_PRECONDITION for every other refusal (STALE, FINAL, NOT_JOINING).
    """
    if refusal is LeaveRefusal.UNKNOWN:
        return grpc.StatusCode.NOT_FOUND
    return grpc.StatusCode.FAILED_PRECONDITION


def cluster_mismatch(mine: str, replica_id: str, expected: str, who: str) -> str | None:
    """The refusal of a request from ``who`` expecting cluster ``expected``, sent to
    replica ``replica_id`` of cluster ``mine`` (None when they match or either is "")."""
    if not expected or not mine or expected == mine:
        return None
    return (
        f"cluster mismatch: arbiter {replica_id} is in cluster {mine}, "
        f"the {who} expects {expected}: list the replicas of one cluster"
    )


async def deny(
    context: grpc.aio.ServicerContext, refusal: Refusal | None, level: int = logging.INFO
) -> None:
    """Ends the call with the authorizer's refusal, if there is one (logged at ``level``)."""
    if refusal is not None:
        log.log(level, "refused %s: %s", context.peer(), refusal)
        await context.abort(refusal.code, str(refusal))


async def committed(context: grpc.aio.ServicerContext, proposal: Awaitable[T], what: str) -> T:
    """Awaits ``proposal`` (a driver's leave or remove); ends the call with UNAVAILABLE
    when no leader took it or it did not commit in time ("``what`` not committed ...")."""
    try:
        return await proposal
    except ProposalDropped:
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, "no leader known to this arbiter; try another"
        )
    except TimeoutError:
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, f"{what} not committed in time (no quorum?)"
        )
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises
