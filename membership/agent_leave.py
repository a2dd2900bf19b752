"""The node agent's graceful leave: a Leave committed by a majority of the arbiters.

Split from :mod:`membership.agent`. The session records the outcome
(:meth:`membership.session.NodeSession.leave`, session rules 5 and 8): an
incarnation no arbiter ever answered, or that a majority never heard, has
nothing to leave and is retired at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from membership import calls
from membership.errors import RejectedError, UnavailableError
from membership.session import EndReason
from membership.v1 import membership_pb2 as pb

if TYPE_CHECKING:
    from membership.agent import NodeAgent

__all__ = ["leave"]

log = logging.getLogger("membership.client")


async def leave(agent: NodeAgent, timeout: float, epoch_now: int) -> int:
    """Commits ``agent``'s leave (see MembershipClient.leave); returns the epoch.

    Args:
        agent: the node agent.
        timeout: seconds to try for.
        epoch_now: the view epoch the client holds (returned when nothing
            had to be committed).

    Raises:
        RejectedError: the session ended otherwise before.
        UnavailableError: no majority committed it within ``timeout``.
    """
    session = agent.session
    if session.end_reason is EndReason.LEFT:
        return agent.left_epoch
    if session.ended:
        raise RejectedError(
            f"{agent.node_id} cannot leave: its session ended ({session.end_reason})"
        )
    if not session.heard:
        # Nothing can hold this incarnation: no arbiter ever answered it.
        agent.dispatch(session.leave(time.monotonic(), joined=False))
        return epoch_now
    session.leaving = True  # an ack saying LEFT from now on is this leave's
    request = pb.LeaveRequest(
        node_id=session.node_id,
        incarnation=session.incarnation,
        cluster=agent.check.expected or "",
    )
    deadline = time.monotonic() + timeout
    errors: dict[str, str] = {}
    attempt = 0
    while time.monotonic() < deadline:
        resp = await calls.leave_round(
            agent.arbiters,
            agent.channels,
            request,
            deadline=deadline,
            call_timeout=agent.config.call_timeout,
            errors=errors,
            quorum=session.quorum,
        )
        if resp is calls.NOTHING_TO_LEAVE:
            # A majority never heard this incarnation: nothing can admit it.
            log.info("%s: no majority of arbiters heard it; nothing to leave", agent.node_id)
            agent.dispatch(session.leave(time.monotonic(), joined=False))
            return epoch_now
        if resp is not None:
            agent.left_epoch = int(resp.epoch)
            agent.dispatch(session.leave(time.monotonic(), joined=resp.joined))
            return agent.left_epoch
        attempt += 1
        await asyncio.sleep(
            min(agent.backoff.delay(attempt), max(0.0, deadline - time.monotonic()))
        )
    detail = "; ".join(f"{a}: {e}" for a, e in errors.items()) or "no arbiter tried"
    raise UnavailableError(f"leave not committed within {timeout:g}s ({detail})")
