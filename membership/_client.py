"""MembershipClient: the SDK's facade over the node agent, the watch and the unary calls.

A client with a ``node_id`` runs a :class:`membership._node.agent.NodeAgent` (its
session, one hedged heartbeat link per arbiter, fencing); every client can
watch (:mod:`membership._watch.subscription` over the pure :mod:`membership._watch.feed`)
and ask for the view (:mod:`membership._arbiters.calls`). Leaving ``async with``
leaves the cluster gracefully unless ``leave_on_exit=False``. The layers and
the data flow: docs/architecture.md.

Example::

    async with MembershipClient(["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"],
                                node_id="worker-3", labels={"rack": "r1"}) as client:
        await client.wait_alive(timeout=10)
        async for event in client.watch():
            print(event)

:class:`NodeState`, the client's mixin, holds where this node stands: its state,
incarnation, fencing, health, status reports, its rank and world size in its job,
and its grace windows. Every member here needs a ``node_id`` (a watch-only client raises
InvalidArgument) except the read-only properties, which answer for "no node".

Ranks and the fencing token (``arbiter/core/ranks.py``; README "Ranks"):
:attr:`NodeState.assignment` is the rank assignment of this node's job in the
latest view the client holds, and its ``epoch`` is the fencing token of a
process group of exactly those members and ranks. Re-form the group once per
assignment epoch, and only while :attr:`NodeState.is_member`::

    formed = 0
    async for event in client.watch():
        job = client.assignment
        if job is not None and job.epoch > formed and client.is_member:
            formed = job.epoch
            reform(rank=job.ranks[client.node_id], world_size=job.world_size, token=formed)

Every worker of the job sees the same assignment at the same epoch (each
from its own arbiter), so each re-forms exactly once per change, with the
same ranks, whatever else the cluster does (other jobs' changes do not move
the epoch of this one).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from membership._aiotools import reap
from membership._arbiters import calls
from membership._arbiters.calls import Discovery, ViewInfo
from membership._arbiters.identity import ClusterCheck
from membership._arbiters.transport import Channels
from membership._config import ClientConfig
from membership._node.agent import NodeAgent
from membership._node.graces import GraceWindow, ask_grace
from membership._node.session import EndReason, SessionEvent
from membership._watch.subscription import Watcher
from membership.shared import tls, validation
from membership.shared.backoff import Backoff
from membership.shared.errors import ClosedError, ClusterMismatch, InvalidArgument, MembershipError
from membership.shared.validation import (
    parse_arbiters,
    validate_cluster_name,
    validate_labels,
    validate_node_id,
)
from membership.shared.view import JobRanks, Member, MemberState, View, ViewEvent

if TYPE_CHECKING:
    from membership._node.collector import StatusCollector

__all__ = ["MAX_INCARNATION", "MembershipClient", "ViewInfo", "reap"]

# Incarnations travel as uint64; leave room for rejoins above any given start.
MAX_INCARNATION = validation.MAX_INCARNATION  # 2**53 - 1: docs/protocol.md

log = logging.getLogger("membership.client")


class NodeState:
    """Where this node stands (see the module docstring)."""

    node_id: str | None
    config: ClientConfig
    error: MembershipError | None
    _agent: NodeAgent | None
    _view: View
    _closed: bool

    def _need_node(self, what: str, open_: bool = False) -> NodeAgent:
        if self._agent is None:
            raise InvalidArgument(f"{what} needs a node_id (this client only watches)")
        if open_ and self._closed:
            raise ClosedError(f"{what} on a closed client")
        return self._agent

    @property
    def interval(self) -> float:
        """Seconds between this node's heartbeats: the longest interval any arbiter
        suggested in its latest ack, ``config.heartbeat_interval`` until one did."""
        return self._agent.interval if self._agent else self.config.heartbeat_interval

    def report(
        self,
        *,
        phase: str | None = None,
        step: int | None = None,
        progress: float | None = None,
        gpu_utilization: float | None = None,
        healthy: bool | None = None,
        reason: str | None = None,
        **gauges: float,
    ) -> None:
        """Sets live status values sent with the next heartbeats (they stay until changed).

        Example: ``client.report(phase="allreduce", step=1200, loss=0.31)``, or
        ``report(healthy=False, reason="ECC errors")``. Never blocks nor delays a heartbeat.

        Args:
            phase: training phase, up to 64 characters.
            step: training step, >= 0 (its rate is compared within the ``job``).
            progress: 0..1.
            gpu_utilization: 0..1 (overrides the NVML probe).
            healthy: ``False`` marks the node DEGRADED (README "Degraded nodes").
            reason: why it is unhealthy (with ``healthy=False``), <= 256 characters.
            **gauges: free-form numeric gauges (finite; at most 32).

        Raises:
            InvalidArgument: a value breaks a bound (nothing is changed then),
                or the client has no node_id (it sends no heartbeats).
            ClosedError: the client is closed.
        """
        values: dict[str, Any] = {"phase": phase, "step": step, "progress": progress, **gauges}
        self._need_node("report()", open_=True).status.report(
            **values, gpu_utilization=gpu_utilization, healthy=healthy, reason=reason
        )

    def clear(self, *names: str) -> None:
        """Unsets reported status values (``phase``, ``step``, ``progress``,
        ``gpu_utilization``, ``healthy`` or gauge names); no names clears everything reported.

        Raises:
            InvalidArgument: a name is not a string, or the client has no node_id.
            ClosedError: the client is closed.
        """
        self._need_node("clear()", open_=True).status.clear(*names)

    @property
    def state(self) -> MemberState:
        """This node's state at its current incarnation (JOINING until admitted)."""
        return self._agent.session.state if self._agent else MemberState.JOINING

    @property
    def incarnation(self) -> int | None:
        """This node's current incarnation (None for a watch-only client)."""
        return self._agent.session.incarnation if self._agent else None

    @property
    def end_reason(self) -> EndReason | None:
        """Why the session ended (left, removed, dead, superseded), None while it runs."""
        return self._agent.session.end_reason if self._agent else None

    @property
    def fenced(self) -> bool:
        """True while the node holds unexpired leases from fewer than a quorum of arbiters."""
        return self._agent.session.fenced(time.monotonic()) if self._agent else True

    @property
    def stream_healthy(self) -> dict[str, bool]:
        """Arbiter address -> whether its heartbeat link had an ack within the ack timeout."""
        return {a: ln.up for a, ln in self._agent.links.items()} if self._agent else {}

    @property
    def healthy(self) -> bool:
        """True while heartbeat streams to at least a quorum of arbiters are up (acked)."""
        return self._agent is not None and self._agent.healthy

    @property
    def is_member(self) -> bool:
        """True only while the node is ALIVE in the view it knows AND holds a quorum of leases.

        This is the "am I a member" answer to act on: it turns False as soon as
        the leases run out (before the cluster can have declared the node DEAD).
        """
        return self.state is MemberState.ALIVE and not self.fenced

    @property
    def fencing_epoch(self) -> int:
        """The latest view epoch seen while holding a quorum of leases (a fencing token)."""
        return self._agent.session.fencing_epoch if self._agent else 0

    @property
    def view(self) -> View:
        """The latest committed view this client has seen (empty before the first)."""
        return self._view

    def reachability(self) -> str:
        """Which arbiters this node's heartbeats reach, and why the others fail, in words.

        Raises:
            InvalidArgument: on a watch-only client.
        """
        return self._need_node("reachability()").reachability()

    async def wait_fenced(self, fenced: bool = True, timeout: float | None = None) -> None:
        """Waits until :attr:`fenced` equals ``fenced``.

        Raises:
            InvalidArgument: on a watch-only client.
            TimeoutError: after ``timeout`` seconds.
        """
        await self._need_node("wait_fenced").wait_fenced(fenced, timeout)

    # --- ranks (arbiter/core/ranks.py) and grace windows (membership/_node/graces.py) -------

    def _me(self) -> tuple[str, int] | None:
        agent = self._agent
        return None if agent is None else (agent.node_id, agent.session.incarnation)

    @property
    def assignment(self) -> JobRanks | None:
        """The rank assignment of this node's job in the latest view this client holds
        (its ``epoch`` is the fencing token); None while the node is not an ALIVE member
        of a job (no ``job`` label, not admitted yet, or the view lags)."""
        me = self._me()
        m = None if me is None else self._view.get(me[0])
        if m is None or me is None or m.incarnation != me[1] or m.rank is None:
            return None
        return self._view.job(m.job)

    @property
    def rank(self) -> int | None:
        """This node's rank in its job (``job`` label) in the latest view, or None."""
        job = self.assignment
        return None if job is None or self.node_id is None else job.ranks.get(self.node_id)

    @property
    def world_size(self) -> int:
        """How many ALIVE members this node's job has in the latest view (0: no rank)."""
        job = self.assignment
        return 0 if job is None else job.world_size

    async def grace(
        self, seconds: float, reason: str = "", timeout: float | None = None
    ) -> GraceWindow:
        """Asks the cluster not to suspect this node for ``seconds`` (a checkpoint...).

        The window is committed through the arbiters' log (a leader change keeps
        it), capped by their ``max_grace`` (300 s by default), and for this
        incarnation only; when the call returns the node holds it from a quorum
        of arbiters (:attr:`GraceWindow.covered`), so pausing for that long
        fences nothing. A node still silent when the window ends is declared
        DEAD one detection time later, as usual. ``grace(0)`` ends the window
        early. Rules: :mod:`membership._node.graces`.

        Args:
            seconds: the window, >= 0 (0: end it).
            reason: why, in words, at most 128 printable characters (shown in
                ``membership view`` and status events).
            timeout: seconds to wait at most (default ``config.leave_timeout``).

        Returns:
            The window committed and how long it covers the node.

        Raises:
            InvalidArgument: a bad argument, or a watch-only client.
            ClosedError: the client is closed.
            RejectedError: the node is not ALIVE at its incarnation (or its session ended).
            UnavailableError: no arbiter could commit it within ``timeout``.
        """
        agent = self._need_node("grace()", open_=True)
        wait = self.config.leave_timeout if timeout is None else timeout
        return await ask_grace(agent, seconds, reason, wait)

    @property
    def grace_left(self) -> float:
        """Seconds of its latest grace window the node holds from a quorum of arbiters now
        (0.0 without one)."""
        agent = self._agent
        if agent is None:
            return 0.0
        return agent.session.grace(0, time.monotonic())


class MembershipClient(NodeState):
    """SDK entry point: heartbeats (when ``node_id`` is given), view, watch, leave.

    Args:
        arbiters: every arbiter's ``host:port``.
        node_id: this node's id; None for a watch-only client.
        labels: static labels announced with the heartbeats.
        incarnation: starting incarnation; default wall-clock milliseconds, so
            a restarted process always starts higher than before.
        config: tunables (validated here).
        on_event: called with every session event (state change, fencing,
            rejoin) on the event loop; must not block.
        status: the collector of this node's live status, sent with every
            heartbeat; default: a new one probing load, CPU, memory and GPUs
            (when ``config.collect_status``), started and closed with the client.
        leave_on_exit: leaving the ``async with`` block leaves the cluster
            gracefully (LEFT), within ``config.leave_timeout`` seconds; False
            only stops (the cluster declares the node DEAD after D).
        cluster: the cluster name the arbiters must have (None: any, as long
            as they all have the same identity).
        via_agent: the unix socket of this host's agent (``membership agent``):
            every call goes through it and its host streams carry this node's
            heartbeats (docs/agent.md); the same as ``config.via_agent``.

    Raises:
        InvalidArgument: a malformed address, node id, label, config or TLS (Channels.of).
    """

    def __init__(
        self,
        arbiters: Sequence[str],
        *,
        node_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        incarnation: int | None = None,
        config: ClientConfig | None = None,
        on_event: Callable[[SessionEvent], None] | None = None,
        status: StatusCollector | None = None,
        leave_on_exit: bool = True,
        cluster: str | None = None,
        via_agent: str | os.PathLike[str] | None = None,
    ) -> None:
        self.arbiters = parse_arbiters(arbiters)
        if via_agent is not None:
            config = dataclasses.replace(config or ClientConfig(), via_agent=os.fspath(via_agent))
        if incarnation is not None and not 1 <= incarnation <= MAX_INCARNATION:
            raise InvalidArgument(f"incarnation must be in 1..{MAX_INCARNATION}, got {incarnation}")
        if cluster is not None:
            validate_cluster_name(cluster)
        self.config = (config or ClientConfig()).validate()
        self.labels = dict(validate_labels(dict(labels or {})))
        self.node_id = validate_node_id(node_id) if node_id is not None else None
        self.leave_on_exit = leave_on_exit
        c = self.config
        self._backoff = Backoff(c.backoff_initial, c.backoff_max, random.Random())
        self._channels = Channels.of(self.config)
        self._check = ClusterCheck(cluster, listed=len(self.arbiters))
        self._tasks: list[asyncio.Task[None]] = []
        self._discovery_task: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self._view = View()
        self._view_changed = asyncio.Event()  # set when the view moves (membership/cli/control.py)
        self.error: MembershipError | None = None
        """Why the client stopped by itself (e.g. ClusterMismatch), else None."""
        self._discovery = Discovery(
            arbiters=self.arbiters,
            channels=self._channels,
            check=self._check,
            config=self.config,
            backoff=self._backoff,
            fail=self._fail,
            closed=lambda: self._closed or self.error is not None,
        )
        self._agent: NodeAgent | None = None
        if self.node_id is not None:
            self._agent = NodeAgent(
                node_id=self.node_id,
                incarnation=incarnation or int(time.time() * 1000),
                arbiters=self.arbiters,
                labels=self.labels,
                config=self.config,
                channels=self._channels,
                backoff=self._backoff,
                check=self._check,
                discovery=self._discovery,
                status=status,
                on_event=on_event,
                fail=self._fail,
                closed=lambda: self._closed or self.error is not None,
            )
        self.ended = self._agent.ended if self._agent is not None else asyncio.Event()
        """Set when the session ends (see :attr:`end_reason`) or the client fails."""

    # --- lifecycle -----------------------------------------------------------------

    async def __aenter__(self) -> MembershipClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            agent = self._agent
            if self.leave_on_exit and agent is not None and not agent.session.ended:
                try:
                    await self.leave(timeout=self.config.leave_timeout)
                except MembershipError as e:
                    log.warning(
                        "%s could not leave on exit (%s); the cluster will declare it DEAD",
                        self.node_id,
                        e,
                    )
        finally:
            await self.close()

    async def start(self) -> None:
        """Starts learning the cluster identity, then the heartbeat links (for a
        node) and the view follower. Returns at once.

        Raises:
            ClosedError: the client was closed.
        """
        if self._closed:
            raise ClosedError("client is closed")
        if self._started:
            return
        self._started = True
        self._ensure_discovery()
        if self._agent is not None:
            self._tasks += self._agent.tasks(self._discovery.settled)
        if self.config.follow_view:
            loop = asyncio.get_running_loop()
            self._tasks.append(loop.create_task(self._follow_view(), name="follow-view"))

    async def close(self) -> None:
        """Stops every task and closes every channel (no leave: see :meth:`leave`)."""
        self._closed = True
        current = asyncio.current_task()
        for t in self._tasks:
            if t is not current:
                await reap(t)
        self._tasks.clear()
        if self._agent is not None:
            self._agent.close_status()
        await self._channels.close()
        self._discovery.release()
        if self._agent is not None:
            self._agent.state_changed.set()

    def _ensure_discovery(self) -> None:
        """Starts asking the arbiters for the cluster identity (once per client)."""
        if self._discovery_task is None and not self._closed:
            self._discovery_task = asyncio.get_running_loop().create_task(
                self._discovery.run(), name="discover-cluster"
            )
            self._tasks.append(self._discovery_task)

    def _fail(self, error: MembershipError) -> None:
        """Stops the client for ``error`` (heartbeats end; waits and watches raise it)."""
        if self.error is None:
            self.error = error
            log.info("%s stops: %s", self.node_id or "watcher", error)  # raised to waits too
        self.ended.set()
        self._discovery.release()
        if self._agent is not None:
            self._agent.state_changed.set()

    async def wait_connected(self, timeout: float | None = None) -> str:
        """Waits until the arbiters answered who they are (heartbeats may start).

        Returns:
            The cluster identity, ``name@digest`` ("" if the arbiters state none).

        Raises:
            ClusterMismatch: the arbiters belong to different clusters.
            ClosedError: the client was closed first.
            TimeoutError: no arbiter answered within ``timeout`` seconds.
        """
        self._ensure_discovery()
        try:
            async with asyncio.timeout(timeout):
                await self._discovery.settled.wait()
        except TimeoutError:
            reasons = tls.join_reasons(self._discovery.unreachable)
            raise TimeoutError(
                f"no arbiter answered within {timeout:g}s ({reasons or 'no answer'})"
            ) from None
        if self.error is not None:
            raise self.error
        if self._closed:
            raise ClosedError("client closed before an arbiter answered")
        return self._check.expected or ""

    @property
    def unreachable(self) -> dict[str, str]:
        """Arbiter address -> why it did not answer the client's identity question (so far)."""
        return dict(self._discovery.unreachable)

    # --- node state: membership/_client.py ----------------------------------------

    async def wait_alive(self, timeout: float | None = None) -> Member:
        """Waits until this node is ALIVE in the committed view.

        Returns:
            The node as a member (from the view when known).

        Raises:
            InvalidArgument: on a watch-only client.
            ClosedError: when the client closes or the session ends first.
            ClusterMismatch: the arbiters belong to different clusters.
            TimeoutError: after ``timeout`` seconds, saying where the node stands.
        """
        agent = self._need_node("wait_alive")
        await agent.wait_alive(timeout, lambda: self.error, lambda: self._closed)
        return agent.member(self._view)

    # --- leave and view --------------------------------------------------------------

    async def leave(self, timeout: float = 10.0) -> int:
        """Leaves gracefully: the node becomes LEFT (never DEAD), then heartbeats stop.

        An incarnation that never joined the view is retired instead: the view
        records nothing for it, and it can never join later. A node that no
        arbiter ever answered just stops. Every arbiter is asked at once.

        Returns:
            The epoch at which the node became LEFT (for an incarnation that
            never joined: the epoch then; the view did not change).

        Raises:
            InvalidArgument: on a watch-only client.
            RejectedError: the cluster refused (e.g. the incarnation is already DEAD).
            UnavailableError: no arbiter could commit the leave within ``timeout`` seconds.
        """
        epoch = await self._need_node("leave").leave(timeout, self._view.epoch)
        await self.close()
        return epoch

    async def get_view(self) -> ViewInfo:
        """Asks the arbiters for their view; prefers one that is in a quorum.

        Every arbiter is asked at once (a frozen one does not hold the answer
        up), and the answers are checked against each other.

        Returns:
            The view of the first in-quorum arbiter that answers, else of the
            first arbiter that answered.

        Raises:
            ClusterMismatch: the arbiters belong to different clusters.
            UnavailableError: when no arbiter answers within ``call_timeout``.
        """
        return await calls.get_view(self.arbiters, self._channels, self._check, self.config)

    async def _follow_view(self) -> None:
        with contextlib.suppress(MembershipError):
            async for _ in self.watch():
                pass

    def _set_view(self, view: View) -> None:
        self._view = view
        self._view_changed.set()

    async def watch(
        self,
        since_epoch: int = 0,
        *,
        status: bool = False,
        status_interval: float = 0.0,
        reset_if_ahead: bool = False,
        instance: str = "",
    ) -> AsyncIterator[ViewEvent]:
        """Yields the view as a stream: a snapshot (or the changes after
        ``since_epoch``), then every change, quorum transitions, and loss and
        return of contact; fails over between arbiters without gap or
        duplicate (rules in :mod:`membership._watch.feed`). Also updates :attr:`view`.

        Args:
            since_epoch: the last epoch the caller holds (0: start with a snapshot).
            status: also yield :class:`StatusUpdated` events (live status of
                the nodes, coalesced per node, from the serving arbiter).
            status_interval: seconds between status events (0: the arbiter's
                default; an arbiter never sends them more often than its own).
            reset_if_ahead: when ``since_epoch`` is beyond the cluster's epoch,
                or of another instance of it (it was reset), yield
                :class:`ViewReset` and start again from a fresh snapshot
                instead of raising.
            instance: the cluster instance ``since_epoch`` belongs to
                (:attr:`ViewSnapshot.instance`); "" unknown.

        Yields:
            ViewSnapshot, ViewChanged, QuorumChanged, Disconnected,
            Reconnected, ViewReset, and StatusUpdated when asked.

        Raises:
            InvalidArgument: for a bad argument, or an arbiter refused them.
            EpochOutOfRange: ``since_epoch`` is beyond the cluster's epoch
                (confirmed by two arbiters), unless ``reset_if_ahead``.
            ClusterMismatch: the arbiters belong to different clusters.
        """
        if self._closed:
            raise ClosedError("watch() on a closed client")
        self._ensure_discovery()  # arbiters of another cluster end the watch
        watcher = Watcher(
            addresses=self.arbiters,
            channels=self._channels,
            config=self.config,
            check=self._check,
            since_epoch=since_epoch,
            status=status,
            status_interval=status_interval,
            reset_if_ahead=reset_if_ahead,
            closed=lambda: self._closed or self.error is not None,
            on_view=self._set_view,
            backoff=self._backoff,
            instance=instance,
            settled=self._discovery.settled,
        )
        try:
            async for ev in watcher.events():
                yield ev
        except ClusterMismatch as e:
            self._fail(e)
            raise
        if self.error is not None:
            raise self.error
