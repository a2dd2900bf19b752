"""The SDK's unary calls to the arbiters: the identity question, GetView, Leave.

Each asks several arbiters so that one frozen arbiter (a stopped process, a
wedged connection) never holds the answer up:

- :class:`Discovery` asks every arbiter at once for its cluster identity
  (``GetView`` without members) until one answers; heartbeats start once the
  others had a moment to answer too, so arbiters of two clusters are refused
  before anything registers the node (:mod:`membership._arbiters.identity`).
- :func:`get_view` asks the first listed arbiter, then, if it has not
  answered in a quorum within ``subscribe_hedge`` seconds, the others
  (hedged requests: J. Dean and L. A. Barroso, "The Tail at Scale", 2013).
- :func:`leave_round` asks every arbiter at once: a leave is idempotent
  (a repeat is answered with the first one's outcome), the first success
  wins. An arbiter that never heard the incarnation answers NOT_FOUND
  ("nothing to leave there"); a majority of those, and no success, means
  nothing anywhere can admit the incarnation: there is nothing to leave.
  A refusal (FAILED_PRECONDITION: a lagging arbiter may say so of an
  incarnation another one just admitted) counts only when no arbiter
  accepts the leave.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from membership._aiotools import reap
from membership._arbiters.identity import ClusterCheck
from membership._arbiters.transport import Channels
from membership._config import ClientConfig
from membership.shared import convert, tls
from membership.shared.backoff import Backoff
from membership.shared.errors import (
    ClusterMismatch,
    MembershipError,
    RejectedError,
    UnavailableError,
)
from membership.shared.view import Degradation, View
from membership.v1 import membership_pb2 as pb

if TYPE_CHECKING:
    from membership.shared.status import NodeStatus

__all__ = ["NOTHING_TO_LEAVE", "Discovery", "Liveness", "ViewInfo", "get_view", "leave_round"]

log = logging.getLogger("membership.client")


@dataclass(frozen=True, slots=True, kw_only=True)
class Liveness:
    """How the answering arbiter hears one ALIVE member right now.

    Attributes:
        silence: seconds since it last heard the node.
        suspicion: its failure detector's suspicion level of the node: phi
            (``detector`` "phi": 1 means a 10 % chance that a heartbeat this
            late still comes, 8 is the default threshold) or heartbeat
            intervals missed (``detector`` "missed": 5 is the default
            threshold); None when it does not track the node's incarnation.
        detector: the kind of that detector ("" when unknown).
    """

    silence: float | None
    suspicion: float | None
    detector: str


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
    # The answering arbiter's cluster identity, ``name@digest``, and instance id.
    cluster: str = ""
    instance: str = ""
    # Members in a grace window at the answering arbiter: node_id -> (seconds left, reason).
    graces: Mapping[str, tuple[float, str]] = dataclasses.field(default_factory=dict)
    # Its DEGRADED marks (only the DEGRADED members), and how it hears each ALIVE member.
    degraded: Mapping[str, tuple[Degradation, ...]] = dataclasses.field(default_factory=dict)
    liveness: Mapping[str, Liveness] = dataclasses.field(default_factory=dict)


class Discovery:
    """Learns the cluster identity from the arbiters (see the module docstring and
    :mod:`membership._arbiters.identity`).

    Args:
        arbiters: every arbiter's address.
        channels: the client's channels.
        check: the client's identity check (filled in here).
        config: the client's configuration (call_timeout).
        backoff: the wait between rounds that did not settle.
        fail: called with the mismatch when the answers disagree.
        closed: returns True once the client is closed.

    Attributes:
        settled: set once heartbeats and subscriptions may start (a majority
            agreed), or the client stopped.
        unreachable: address -> why it did not answer, for messages.
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
        self.settled = asyncio.Event()
        self.unreachable: dict[str, str] = {address: "not asked yet" for address in arbiters}

    def release(self) -> None:
        """Wakes everyone waiting (the client closed or failed)."""
        self.settled.set()

    async def _ask(self, address: str) -> bool:
        """Asks ``address`` who it is; returns False when it did not answer.

        Before the client settled the answer is only noted (the round judges
        its answers together, so an error names every address); after, it is
        judged at once (identity rule 3).
        """
        try:
            resp = await self._channels.summary(address, self._config.call_timeout)
        except grpc.aio.AioRpcError as e:
            hint = tls.handshake_hint(e.details(), insecure=self._config.insecure)
            self.unreachable[address] = f"{e.code().name}: {e.details()}{hint}"
            return False
        self.unreachable.pop(address, None)
        if not self._check.settled:
            self._check.note(address, resp.cluster, resp.arbiter_id)
            return True
        was_refused = address in self._check.refused
        if self._check.record(address, resp.cluster, resp.arbiter_id):
            if was_refused:
                log.info("arbiter %s is of this cluster again: refusal lifted", address)
        elif not was_refused:
            log.error("arbiter %s refused: %s", address, self._check.refused[address])
        if self._check.lost():
            self._fail(
                ClusterMismatch(
                    "most of the arbiters given now belong to another cluster: "
                    + "; ".join(self._check.refused.values())
                )
            )
        return True

    def _majority_answered(self) -> bool:
        return len(self._check.seen) * 2 > len(self._arbiters)

    async def run(self) -> None:
        """Asks every arbiter in rounds until a majority agreed (identity rules 1, 2).

        A round ends when every arbiter answered or failed, or once a
        majority answered and ``subscribe_hedge`` seconds more have passed
        (a frozen arbiter does not hold the start up); its answers are then
        judged together. The arbiters that have not answered yet keep being
        asked after that, and are refused if they turn out strangers; refused
        ones are asked again every ``reachability_log_interval`` seconds.
        """
        pending = list(self._arbiters)
        attempt = 0
        while not self._closed():
            if not pending:
                # Identity rule 3: refused addresses are asked again now and
                # then; the real replica may be back there.
                await asyncio.sleep(self._config.reachability_log_interval)
                pending = list(self._check.refused)
                continue
            tasks = {a: asyncio.ensure_future(self._ask(a)) for a in pending}
            try:
                waiting = set(tasks.values())
                hedge_until: float | None = None
                while waiting and not self._check.settled:
                    timeout = None
                    if hedge_until is not None:
                        timeout = max(0.0, hedge_until - time.monotonic())
                    done, waiting = await asyncio.wait(
                        waiting, timeout=timeout, return_when="FIRST_COMPLETED"
                    )
                    if hedge_until is None and self._majority_answered():
                        hedge_until = time.monotonic() + self._config.subscribe_hedge
                    if not done or not waiting:
                        self._judge()
                if not self._check.settled:
                    self._judge()
                if waiting:
                    await asyncio.wait(waiting)  # late answers: judged one by one
            finally:
                for t in tasks.values():
                    await reap(t)
            pending = [
                a for a, t in tasks.items() if t.cancelled() or t.exception() or not t.result()
            ]
            attempt = attempt + 1 if pending else 0
            await asyncio.sleep(self._backoff.delay(min(attempt, 5)))

    def _judge(self) -> None:
        """The round's answers together: a mismatch fails the client, a majority settles it."""
        if self._check.settled:
            return
        try:
            if self._check.try_settle():
                self.settled.set()
        except ClusterMismatch as e:
            self._fail(e)


def view_info(resp: pb.GetViewResponse) -> ViewInfo:
    """A GetView answer as a :class:`ViewInfo`."""
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
        instance=resp.instance,
        graces={
            m.node_id: (m.grace_seconds, m.grace_reason)
            for m in resp.view.members
            if m.grace_seconds > 0
        },
        degraded={
            m.node_id: convert.degraded_from_pb(m.degraded) for m in resp.view.members if m.degraded
        },
        liveness={
            m.node_id: Liveness(
                silence=m.silence_seconds if m.HasField("status") else None,
                suspicion=m.suspicion if m.detector else None,
                detector=m.detector,
            )
            for m in resp.view.members
            if m.HasField("status") or m.detector
        },
    )


async def get_view(
    arbiters: Sequence[str], channels: Channels, check: ClusterCheck, config: ClientConfig
) -> ViewInfo:
    """The view of the first listed arbiter that answers in a quorum, else of the
    first that answers.

    Every arbiter is asked at once; the answers that came within
    ``config.subscribe_hedge`` seconds of the first in a quorum (or all of
    them) are checked against each other, so arbiters of two clusters are
    refused even when the first one answers fast.

    Raises:
        ClusterMismatch: the arbiters belong to different clusters, or one is
            listed twice under two addresses.
        UnavailableError: no arbiter answered within ``call_timeout`` seconds.
    """
    errors: dict[str, str] = {}

    async def ask(addr: str) -> pb.GetViewResponse | None:
        try:
            resp: pb.GetViewResponse = await channels.stub(addr).GetView(
                pb.GetViewRequest(), timeout=config.call_timeout
            )
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                channels.discard(addr)
            # The reason too: a refused certificate says which one and why.
            hint = tls.handshake_hint(e.details(), insecure=config.insecure)
            errors[addr] = f"{e.code().name} {e.details()}".rstrip() + hint
            return None
        return resp

    tasks = {a: asyncio.ensure_future(ask(a)) for a in arbiters if a not in check.refused}
    answers: dict[str, pb.GetViewResponse] = {}
    try:
        pending = set(tasks.values())
        deadline: float | None = None
        while pending:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = await asyncio.wait(
                pending, timeout=timeout, return_when="FIRST_COMPLETED"
            )
            if not done:
                break
            for addr, t in tasks.items():
                if t in done and t.result() is not None:
                    answers[addr] = t.result()  # type: ignore[assignment]
            if deadline is None and any(r.in_quorum for r in answers.values()):
                deadline = time.monotonic() + config.subscribe_hedge
    finally:
        for t in tasks.values():
            await reap(t)
    usable = {}
    for addr in arbiters:
        resp = answers.get(addr)
        if resp is None:
            continue
        if check.settled:
            if check.record(addr, resp.cluster, resp.arbiter_id):
                usable[addr] = resp
        else:
            check.note(addr, resp.cluster, resp.arbiter_id)
            usable[addr] = resp
    if not check.settled:
        check.verify()
    best = next((r for r in usable.values() if r.in_quorum), None) or next(
        iter(usable.values()), None
    )
    if best is None:
        raise UnavailableError("no arbiter answered: " + tls.join_reasons(errors))
    return view_info(best)


NOTHING_TO_LEAVE = pb.LeaveResponse(epoch=0, joined=False)
"""What :func:`leave_round` returns when a majority never heard the incarnation."""


async def leave_round(
    arbiters: Sequence[str],
    channels: Channels,
    request: pb.LeaveRequest,
    *,
    deadline: float,
    call_timeout: float,
    errors: dict[str, str],
    quorum: int = 0,
) -> pb.LeaveResponse | None:
    """Asks every arbiter at once to commit ``request``; the first success wins.

    Args:
        arbiters: every arbiter's address.
        channels: the client's channels.
        request: the leave.
        deadline: monotonic seconds after which nothing more is asked.
        call_timeout: seconds per call at most.
        errors: filled with address -> why its call failed.
        quorum: how many NOT_FOUND answers mean that nothing can hold the
            incarnation (a majority of the cluster); 0: a majority of ``arbiters``.

    Returns:
        The first successful answer; :data:`NOTHING_TO_LEAVE` when at least
        ``quorum`` arbiters answered NOT_FOUND (they never heard the
        incarnation) and none accepted; None when the calls failed otherwise
        (try again).

    Raises:
        RejectedError: an arbiter refused the leave (FAILED_PRECONDITION) and
            none accepted it.
    """
    refused: list[str] = []
    not_found: list[str] = []

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
                refused.append(e.details() or "leave refused")
            elif e.code() == grpc.StatusCode.NOT_FOUND:
                not_found.append(addr)  # nothing to leave there
            elif e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
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
    if refused:
        raise RejectedError(refused[0])
    if len(not_found) >= (quorum or len(arbiters) // 2 + 1):
        return NOTHING_TO_LEAVE
    return None
