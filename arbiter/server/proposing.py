"""The driver's proposals that an RPC waits for: a leave, a removal, a grace window.

A mixin of :class:`arbiter.server.driver.Driver` (split by concept, and so that
the driver stays within the module size the layering test sets): each
proposal gets a fresh request id, goes to the core, and the call waits until
the entry is applied here (:meth:`Proposing._resolve`, called by the driver
for every applied entry) or its timeout passes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from arbiter.core.replica import Replica
from arbiter.core.tally import ApplyResult, GraceOutcome, LeaveOutcome

__all__ = ["Proposing"]


class Proposing:
    """Proposals a caller waits for (see the module docstring)."""

    replica: Replica
    _wake: asyncio.Event
    _waiting: dict[str, asyncio.Future[Any]]

    async def leave(self, node_id: str, incarnation: int, timeout: float) -> LeaveOutcome:
        """Proposes a graceful leave and waits until it is applied.

        Raises:
            ProposalDropped: no leader is known to take the proposal.
            TimeoutError: not applied within ``timeout`` seconds.
        """
        outcome: LeaveOutcome = await self._await_outcome(
            lambda rid: self.replica.propose_leave(node_id, incarnation, rid, time.monotonic()),
            timeout,
        )
        return outcome

    async def remove(self, node_id: str, incarnation: int, by: str, timeout: float) -> LeaveOutcome:
        """Proposes an administrator's removal (tally rule 5a) and waits until it is applied.

        Args:
            node_id: the member to remove.
            incarnation: the incarnation to remove; 0 for the recorded one.
            by: who asked (non-empty).
            timeout: seconds to wait for the entry to be applied here.

        Raises:
            ProposalDropped: no leader is known to take the proposal.
            TimeoutError: not applied within ``timeout`` seconds.
        """
        outcome: LeaveOutcome = await self._await_outcome(
            lambda rid: self.replica.propose_remove(
                node_id, incarnation, by, rid, time.monotonic()
            ),
            timeout,
        )
        return outcome

    async def grace(
        self,
        node_id: str,
        incarnation: int,
        seconds: float,
        reason: str,
        timeout: float,
        by: str = "",
    ) -> tuple[GraceOutcome, float]:
        """Proposes a node's grace window, or its end (``seconds == 0``; tally rule 13), and
        waits until it is applied here; ``by``: "" for the node itself, else the
        administrator asking (grace rule 2).

        Returns:
            What became of it, and the seconds proposed (capped by ``max_grace``).

        Raises:
            ProposalDropped: no leader is known to take the proposal.
            TimeoutError: not applied within ``timeout`` seconds.
            ValueError: ``seconds`` not finite and >= 0, or a bad reason.
        """
        granted: list[float] = []

        def propose(rid: str) -> None:
            granted.append(
                self.replica.propose_grace(
                    node_id, incarnation, seconds, reason, rid, time.monotonic(), time.time(), by
                )
            )

        outcome: GraceOutcome = await self._await_outcome(propose, timeout)
        return outcome, granted[0]

    async def _await_outcome(self, propose: Callable[[str], None], timeout: float) -> Any:
        """Proposes with a fresh request id and waits for the applied outcome."""
        request_id = uuid.uuid4().hex
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = fut
        try:
            propose(request_id)
            self._wake.set()
            async with asyncio.timeout(timeout):
                return await fut
        finally:
            self._waiting.pop(request_id, None)

    def _resolve(self, result: ApplyResult) -> None:
        """Answers the call waiting for ``result``'s leave, removal or grace window."""
        outcome = result.leave or result.grace
        if outcome is not None:
            fut = self._waiting.get(outcome.request_id)
            if fut is not None and not fut.done():
                fut.set_result(outcome)
