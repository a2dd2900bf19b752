"""A node's grace window, client side: ask for it, wait until the arbiters cover it, end it.

:meth:`membership._client.MembershipClient.grace` calls :func:`ask_grace`. The
cluster's half is ``arbiter/core/grace.py`` (the committed window) and
``arbiter/core/grace_windows.py`` (each replica holds it on its clock and says
so in its acks); the node's half of the fencing rule is session rule 10
(``membership/_node/session.py``).

Rules:

1. Ask. The session first stops counting every window (session rule 10),
   then the arbiters are asked one at a time (each proposes the command,
   which commits through the leader), the first answer wins: the window's
   grant, or the index of its end. A second arbiter is asked only when the
   one before could not answer (UNAVAILABLE, a timeout); a window committed
   by a call that timed out is harmless: the answer to a later ask counts
   only what the arbiters still hold.
2. Cover. For a window (``seconds > 0``) the call then waits until a quorum
   of arbiters has acked a heartbeat with it (the next heartbeats, within an
   interval), so that when it returns the node may pause for
   :attr:`GraceWindow.covered` seconds without being fenced by its own
   pause. If the acks do not come within the call's timeout (no quorum
   reachable), it returns with ``covered`` 0: the window is committed (the
   arbiters do not suspect the node), but the node would be fenced if it
   stopped now.
3. Refusals. FAILED_PRECONDITION and NOT_FOUND (the node is not ALIVE at its
   incarnation, or an administrator's ask met a window the node holds) raise
   :class:`RejectedError`; INVALID_ARGUMENT raises :class:`InvalidArgument`;
   PERMISSION_DENIED raises :class:`PermissionDenied`; no answer from any
   arbiter within the timeout raises :class:`UnavailableError`.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from membership.shared import tls
from membership.shared.errors import (
    InvalidArgument,
    PermissionDenied,
    RejectedError,
    UnavailableError,
)
from membership.v1 import membership_pb2 as pb

if TYPE_CHECKING:
    from membership._node.agent import NodeAgent

__all__ = ["MAX_REASON", "GraceWindow", "ask_grace"]

MAX_REASON = 128
"""Characters of a window's reason, at most (the arbiters refuse more)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GraceWindow:
    """What :meth:`MembershipClient.grace` got.

    Attributes:
        seconds: the window committed, seconds (capped by the arbiters'
            ``max_grace``, 300 s by default); 0.0 for an end.
        grant: the log index of the entry that granted it (or that ended it).
        covered: seconds, from the call's return, for which the node holds the
            window from a quorum of arbiters: it may pause that long without
            being fenced (rule 2); 0.0 for an end, or when the acks did not come.
        reason: the reason given.
    """

    seconds: float
    grant: int
    covered: float
    reason: str


def check_grace(seconds: float, reason: str) -> None:
    """Raises InvalidArgument unless ``seconds`` is finite and >= 0 and ``reason`` is at
    most MAX_REASON printable characters."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidArgument(f"seconds must be a number, got {seconds!r}")
    if not (math.isfinite(seconds) and seconds >= 0):
        raise InvalidArgument(f"seconds must be a finite number >= 0, got {seconds!r}")
    if not isinstance(reason, str) or len(reason) > MAX_REASON or not reason.isprintable():
        raise InvalidArgument(f"reason must be at most {MAX_REASON} printable characters")


async def ask_grace(agent: NodeAgent, seconds: float, reason: str, timeout: float) -> GraceWindow:
    """Asks for a grace window of ``seconds`` (0: ends the node's window), rules 1 to 3.

    Raises:
        InvalidArgument: a bad ``seconds`` or ``reason``, or an arbiter refused them.
        RejectedError: the cluster refused (rule 3), or the session has ended.
        PermissionDenied: the node's certificate may not ask.
        UnavailableError: no arbiter answered within ``timeout`` seconds.
    """
    check_grace(seconds, reason)
    session = agent.session
    if session.ended:
        raise RejectedError(f"{agent.node_id} cannot ask for a grace window: its session ended")
    deadline = time.monotonic() + timeout
    agent.dispatch(session.end_grace(time.monotonic()))  # session rule 10
    request = pb.GraceRequest(
        node_id=agent.node_id,
        incarnation=session.incarnation,
        seconds=float(seconds),
        reason=reason,
        cluster=agent.expected_cluster(),
    )
    resp = await _ask(agent, request, deadline)
    granted = resp.granted_seconds > 0
    session.grace_answered(resp.grace_id, granted)
    covered = 0.0
    if granted:
        covered = await _wait_covered(agent, resp.grace_id, deadline)
    return GraceWindow(
        seconds=resp.granted_seconds, grant=resp.grace_id, covered=covered, reason=reason
    )


async def _ask(agent: NodeAgent, request: pb.GraceRequest, deadline: float) -> pb.GraceResponse:
    """Rule 1: one arbiter at a time until one answers."""
    errors: dict[str, str] = {}
    attempt = 0
    while time.monotonic() < deadline:
        for addr in agent.arbiters:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                resp: pb.GraceResponse = await agent.channels.stub(addr).Grace(
                    request, timeout=min(left, agent.config.call_timeout)
                )
                return resp
            except grpc.aio.AioRpcError as e:
                code, details = e.code(), e.details() or ""
                if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                    raise RejectedError(details) from None
                if code is grpc.StatusCode.INVALID_ARGUMENT:
                    raise InvalidArgument(details) from None
                if code is grpc.StatusCode.PERMISSION_DENIED:
                    raise PermissionDenied(details) from None
                if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                    agent.channels.discard(addr)
                errors[addr] = f"{code.name} {details}"
        attempt += 1
        await asyncio.sleep(
            min(agent.backoff.delay(attempt), max(0.0, deadline - time.monotonic()))
        )
    detail = tls.join_reasons(errors, "no arbiter tried")
    raise UnavailableError(f"grace window not committed in time ({detail})")


async def _wait_covered(agent: NodeAgent, grant: int, deadline: float) -> float:
    """Rule 2: seconds of window ``grant`` the node holds from a quorum once acks carry it
    (0.0 if they do not by ``deadline``)."""
    session = agent.session
    while (covered := session.grace(grant, time.monotonic())) <= 0:
        left = deadline - time.monotonic()
        if left <= 0 or session.ended:
            return 0.0
        agent.acked.clear()
        try:
            async with asyncio.timeout(left):
                await agent.acked.wait()
        except TimeoutError:
            return 0.0
    return covered
