"""The SDK's unary calls to the arbiters: the identity question, GetView, Leave.

Each asks several arbiters so that one frozen arbiter (a stopped process, a
wedged connection) never holds the answer up:

- :class:`Discovery` asks every arbiter at once for its cluster identity
  (``GetView`` without members) until one answers; heartbeats start once the
  others had a moment to answer too, so arbiters of two clusters are refused
  before anything registers the node (:mod:`membership.identity`).
- :func:`get_view` asks the first listed arbiter, then, if it has not
  answered in a quorum within ``subscribe_hedge`` seconds, the others
  (hedged requests: J. Dean and L. A. Barroso, "The Tail at Scale", 2013).
- :func:`leave_round` asks every arbiter at once: a leave is idempotent
  (a repeat is answered with the first one's outcome), the first answer wins.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from membership import convert
from membership.aiotools import reap
from membership.backoff import Backoff
from membership.config import ClientConfig
from membership.errors import ClusterMismatch, MembershipError, RejectedError, UnavailableError
from membership.identity import ClusterCheck
from membership.transport import Channels
from membership.v1 import membership_pb2 as pb
from membership.view import View

if TYPE_CHECKING:
    from membership.status import NodeStatus

__all__ = ["Discovery", "ViewInfo", "get_view", "leave_round"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewInfo:
    """A view as one arbiter returned it, with that arbiter's standing."""

    view: View
    arbiter_id: str
    leader_id: str | None
    in_quorum: bool
    suspected_by: Mapping[str, tuple[str, ...]]
    # Nodes the answering arbiter's own detector suspects now (committed or not).
    local_suspects: tuple[str, ...] = ()
    # Latest live status of each member, as the answering arbiter heard it.
    statuses: Mapping[str, NodeStatus] = dataclasses.field(default_factory=dict)
    # The answering arbiter's cluster identity, ``name@digest``.
    cluster: str = ""


class Discovery:
    """Learns the cluster identity from the arbiters (see the module docstring).

    Args:
        arbiters: every arbiter's address.
        channels: the client's channels.
        check: the client's identity check (filled in here).
        config: the client's configuration (call_timeout, subscribe_hedge).
        backoff: the wait between rounds in which nobody answered.
        fail: called with the mismatch when the arbiters disagree.
        closed: returns True once the client is closed.

    Attributes:
        connected: set once an arbiter answered.
        settled: set once heartbeats may start (or the client stopped).
        unreachable: address -> why it did not answer, for error messages.
    """

    def __init__(
        self,
        *,
        arbiters: Sequence[str],
        channels: Channels,
        check: ClusterCheck,
        config: ClientConfig,
        backoff: Backoff,
        fail: Callable[[MembershipError], None],
        closed: Callable[[], bool],
    ) -> None:
        self._arbiters = list(arbiters)
        self._channels = channels
        self._check = check
        self._config = config
        self._backoff = backoff
        self._fail = fail
        self._closed = closed
        self.connected = asyncio.Event()
        self.settled = asyncio.Event()
        self.unreachable: dict[str, str] = {}

    def release(self) -> None:
        """Wakes everyone waiting (the client closed or failed)."""
        self.connected.set()
        self.settled.set()

    def verify(self) -> bool:
        """Checks the identities heard so far; fails the client on a mismatch."""
        try:
            self._check.verify()
        except ClusterMismatch as e:
            self._fail(e)
            return False
        return True

    async def _ask(self, address: str) -> None:
        try:
            resp = await self._channels.summary(address, self._config.call_timeout)
        except grpc.aio.AioRpcError as e:
            self.unreachable[address] = f"{e.code().name}: {e.details()}"
            return
        self.unreachable.pop(address, None)
        self._check.note(address, resp.cluster)
        if self.settled.is_set():
            self.verify()  # a late answer: checked at once
        self.connected.set()

    async def run(self) -> None:
        """Asks every arbiter until one answered; the others are still checked after."""
        attempt = 0
        while not self._closed():
            tasks = [asyncio.ensure_future(self._ask(a)) for a in self._arbiters]
            try:
                pending = set(tasks)
                while pending and not self.connected.is_set():
                    _, pending = await asyncio.wait(pending, return_when="FIRST_COMPLETED")
                if self.connected.is_set() and pending:
                    # Heartbeats wait for the other answers a little: an arbiter
                    # of another cluster is refused before anything registers
                    # the node anywhere. A slower one is still checked (and
                    # refuses heartbeats that name another cluster).
                    _, pending = await asyncio.wait(pending, timeout=self._config.subscribe_hedge)
                if self.connected.is_set() and self.verify():
                    self.settled.set()
                if pending:
                    await asyncio.wait(pending)
            finally:
                for t in tasks:
                    await reap(t)
            if self.connected.is_set():
                return
            attempt += 1
            await asyncio.sleep(self._backoff.delay(attempt))


def view_info(address: str, resp: pb.GetViewResponse, check: ClusterCheck) -> ViewInfo:
    """A GetView answer as a :class:`ViewInfo` (its identity checked first).

    Raises:
        ClusterMismatch: the answer names another cluster.
    """
    check.record(address, resp.cluster)
    return ViewInfo(
        view=convert.view_from_pb(resp.view),
        arbiter_id=resp.arbiter_id,
        leader_id=resp.leader_id or None,
        in_quorum=resp.in_quorum,
        suspected_by={
            m.node_id: tuple(m.suspected_by) for m in resp.view.members if m.suspected_by
        },
        local_suspects=tuple(resp.local_suspects),
        statuses={
            m.node_id: convert.status_from_pb(m.status)
            for m in resp.view.members
            if m.HasField("status")
        },
        cluster=resp.cluster,
    )


async def get_view(
    arbiters: Sequence[str], channels: Channels, check: ClusterCheck, config: ClientConfig
) -> ViewInfo:
    """The view of the first arbiter that answers in a quorum, else of the first that answers.

    Raises:
        ClusterMismatch: the arbiters belong to different clusters.
        UnavailableError: no arbiter answered within ``call_timeout`` seconds.
    """
    errors: dict[str, str] = {}

    async def ask(addr: str) -> tuple[str, pb.GetViewResponse] | None:
        try:
            resp: pb.GetViewResponse = await channels.stub(addr).GetView(
                pb.GetViewRequest(), timeout=config.call_timeout
            )
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                channels.discard(addr)
            errors[addr] = e.code().name
            return None
        return addr, resp

    first = asyncio.ensure_future(ask(arbiters[0]))
    tasks = [first]
    fallback: tuple[str, pb.GetViewResponse] | None = None
    try:
        await asyncio.wait({first}, timeout=config.subscribe_hedge)
        answer = first.result() if first.done() else None
        if answer is not None and answer[1].in_quorum:
            return view_info(*answer, check)
        tasks += [asyncio.ensure_future(ask(a)) for a in arbiters[1:]]
        for fut in asyncio.as_completed(tasks):
            answer = await fut
            if answer is None:
                continue
            if answer[1].in_quorum:
                return view_info(*answer, check)
            fallback = fallback or answer
    finally:
        for t in tasks:
            await reap(t)
    if fallback is not None:
        return view_info(*fallback, check)
    raise UnavailableError(
        "no arbiter answered: " + "; ".join(f"{a}: {e}" for a, e in errors.items())
    )


async def leave_round(
    arbiters: Sequence[str],
    channels: Channels,
    request: pb.LeaveRequest,
    *,
    deadline: float,
    call_timeout: float,
    errors: dict[str, str],
) -> pb.LeaveResponse | None:
    """Asks every arbiter at once to commit ``request``; the first success wins.

    Args:
        arbiters: every arbiter's address.
        channels: the client's channels.
        request: the leave.
        deadline: monotonic seconds after which nothing more is asked.
        call_timeout: seconds per call at most.
        errors: filled with address -> why its call failed.

    Returns:
        The first successful answer, or None when every call failed.

    Raises:
        RejectedError: an arbiter refused the leave (FAILED_PRECONDITION).
    """

    async def ask(addr: str) -> pb.LeaveResponse | None:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            resp: pb.LeaveResponse = await channels.stub(addr).Leave(
                request, timeout=min(left, call_timeout)
            )
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise RejectedError(e.details() or "leave refused") from None
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                channels.discard(addr)
            errors[addr] = f"{e.code().name} {e.details()}"
            return None
        return resp

    tasks = [asyncio.ensure_future(ask(a)) for a in arbiters]
    try:
        for done in asyncio.as_completed(tasks):
            resp = await done
            if resp is not None:
                return resp
    finally:
        for t in tasks:
            await reap(t)
    return None
