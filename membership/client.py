"""MembershipClient: the SDK's facade over the session core, the heartbeat links and the watch.

A node opens one heartbeat link to every arbiter at once
(:mod:`membership.heartbeats`: supervised, hedged onto a fresh connection
when an ack is late); acks feed the sans-I/O session core
(:mod:`membership.session`: leases, fencing, rejoin). A watch
(:mod:`membership.subscription` over the pure :mod:`membership.feed`)
follows the committed view. A client without ``node_id`` only watches.

Lifecycle: ``async with MembershipClient(...)`` starts the client and, on the
way out (normally, by an exception, or by cancellation), leaves the cluster
gracefully, so the node becomes LEFT and never DEAD; pass
``leave_on_exit=False`` to keep the old behaviour (the cluster then declares
the node DEAD after D). :meth:`close` stops without leaving.

Before a node sends its first heartbeat it learns the cluster identity from
the arbiters (a cheap ``GetView``); every request then names it, and
arbiters of different clusters are refused with
:class:`~membership.errors.ClusterMismatch`, naming them.

Example::

    async with MembershipClient(["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"],
                                node_id="worker-3", labels={"rack": "r1"}) as client:
        await client.wait_alive(timeout=10)
        async for event in client.watch():
            print(event)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from membership import convert
from membership.aiotools import reap
from membership.backoff import Backoff
from membership.config import ClientConfig
from membership.errors import (
    ClosedError,
    ClusterMismatch,
    InvalidArgument,
    MembershipError,
    RejectedError,
    UnavailableError,
)
from membership.heartbeats import HeartbeatLink, LinkTimings
from membership.identity import ClusterCheck
from membership.session import (
    EndReason,
    Fenced,
    NodeSession,
    Rejoined,
    SessionEvent,
    StateChanged,
    Superseded,
)
from membership.subscription import Watcher
from membership.transport import Channels
from membership.v1 import membership_pb2 as pb
from membership.validation import parse_address, validate_labels, validate_node_id
from membership.view import Member, MemberState, View, ViewEvent

if TYPE_CHECKING:
    from membership.collector import StatusCollector
    from membership.status import NodeStatus

__all__ = ["MAX_INCARNATION", "MembershipClient", "ViewInfo", "reap"]

# Incarnations travel as uint64; leave room for rejoins above any given start.
MAX_INCARNATION = 2**62

log = logging.getLogger("membership.client")


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


class MembershipClient:
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

    Raises:
        InvalidArgument: for a malformed address, node id, label or config.
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
    ) -> None:
        if isinstance(arbiters, str):
            raise InvalidArgument("arbiters must be a list of 'host:port' strings, not one string")
        if not arbiters:
            raise InvalidArgument("at least one arbiter address is needed")
        if labels is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise InvalidArgument("labels must map strings to strings")
        if incarnation is not None and not 1 <= incarnation <= MAX_INCARNATION:
            raise InvalidArgument(f"incarnation must be in 1..{MAX_INCARNATION}, got {incarnation}")
        if cluster is not None and not (isinstance(cluster, str) and cluster):
            raise InvalidArgument(f"cluster must be a non-empty name, got {cluster!r}")
        self.arbiters = [parse_address(a) for a in arbiters]
        if len(set(self.arbiters)) != len(self.arbiters):
            raise InvalidArgument("an arbiter address is listed twice")
        self.config = (config or ClientConfig()).validate()
        self.labels = dict(validate_labels(dict(labels or {})))
        self.node_id = validate_node_id(node_id) if node_id is not None else None
        self.leave_on_exit = leave_on_exit
        self._session: NodeSession | None = None
        if self.node_id is not None:
            self._session = NodeSession(
                node_id=self.node_id,
                incarnation=incarnation or int(time.time() * 1000),
                arbiters=self.arbiters,
                auto_rejoin=self.config.auto_rejoin,
            )
        self._on_event = on_event
        self._rng = random.Random()
        self._backoff = Backoff(self.config.backoff_initial, self.config.backoff_max, self._rng)
        self._channels = Channels(self.config.channel_options())
        self._check = ClusterCheck(cluster)
        self._links = {
            a: HeartbeatLink(a, owner=self, channels=self._channels, backoff=self._backoff)
            for a in self.arbiters
        }
        self._tasks: list[asyncio.Task[None]] = []
        self._discovery: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self._view = View()
        self._connected = asyncio.Event()
        # Set once heartbeats may start (the identity question answered enough).
        self._settled = asyncio.Event()
        self._state_changed = asyncio.Event()
        self._fence_changed = asyncio.Event()
        self.ended = asyncio.Event()
        """Set when the session ends (it left, was removed, declared DEAD without
        rejoin, superseded) or the client fails (:attr:`error`)."""
        self.error: MembershipError | None = None
        """Why the client stopped by itself (e.g. ClusterMismatch), else None."""
        self._left_epoch = 0
        # Arbiter address -> why it did not answer the identity question.
        self._unreachable: dict[str, str] = {}
        # Interval each arbiter suggested in its latest ack (seconds).
        self._suggested: dict[str, float] = {}
        from membership.collector import StatusCollector

        self._own_status = status is None
        self._status = status or StatusCollector(
            providers=None if self.config.collect_status else [],
            probe_interval=self.config.status_probe_interval,
        )
        self._status_pb: tuple[NodeStatus, pb.NodeStatus] | None = None
        self._warned_size = False

    # --- lifecycle -----------------------------------------------------------------

    async def __aenter__(self) -> MembershipClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            session = self._session
            if self.leave_on_exit and session is not None and not session.ended:
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
        loop = asyncio.get_running_loop()
        self._ensure_discovery()
        if self._session is not None:
            if self._own_status:
                self._status.start()
            for addr, link in self._links.items():
                self._tasks.append(loop.create_task(self._run_link(link), name=f"heartbeat-{addr}"))
            self._tasks.append(loop.create_task(self._fence_timer(), name="fence-timer"))
            self._tasks.append(loop.create_task(self._log_reachability(), name="reachability"))
        if self.config.follow_view:
            self._tasks.append(loop.create_task(self._follow_view(), name="follow-view"))

    async def close(self) -> None:
        """Stops every task and closes every channel (no leave: see :meth:`leave`)."""
        self._closed = True
        current = asyncio.current_task()
        for t in self._tasks:
            if t is not current:
                await reap(t)
        self._tasks.clear()
        if self._own_status:
            self._status.close()
        await self._channels.close()
        self._state_changed.set()
        self._connected.set()
        self._settled.set()

    def _ensure_discovery(self) -> None:
        """Starts asking the arbiters for the cluster identity (once per client)."""
        if self._discovery is None and not self._closed:
            self._discovery = asyncio.get_running_loop().create_task(
                self._discover(), name="discover-cluster"
            )
            self._tasks.append(self._discovery)

    def _fail(self, error: MembershipError) -> None:
        """Stops the client for ``error`` (heartbeats end; waits and watches raise it)."""
        if self.error is None:
            self.error = error
            log.error("%s: %s", self.node_id or "watcher", error)
        self.ended.set()
        self._state_changed.set()
        self._connected.set()
        self._settled.set()

    async def wait_connected(self, timeout: float | None = None) -> str:
        """Waits until an arbiter answered (the cluster identity is known).

        Returns:
            The cluster identity, ``name@digest`` ("" if the arbiters state none).

        Raises:
            ClusterMismatch: the arbiters belong to different clusters.
            ClosedError: the client was closed first.
            TimeoutError: no arbiter answered within ``timeout`` seconds.
        """
        try:
            async with asyncio.timeout(timeout):
                await self._settled.wait()
        except TimeoutError:
            reasons = "; ".join(f"{a}: {r}" for a, r in self._unreachable.items())
            raise TimeoutError(
                f"no arbiter answered within {timeout:g}s ({reasons or 'no answer'})"
            ) from None
        if self.error is not None:
            raise self.error
        if self._closed:
            raise ClosedError("client closed before an arbiter answered")
        return self._check.expected or ""

    async def _discover(self) -> None:
        """Asks every arbiter for its cluster identity until one answers (module docstring)."""
        attempt = 0
        while not self._closed:

            async def ask(addr: str) -> None:
                try:
                    resp = await self._channels.summary(addr, self.config.call_timeout)
                except grpc.aio.AioRpcError as e:
                    self._unreachable[addr] = f"{e.code().name}: {e.details()}"
                    return
                self._unreachable.pop(addr, None)
                self._check.note(addr, resp.cluster)
                if self._settled.is_set():
                    self._verify()  # a late answer: checked at once
                self._connected.set()

            tasks = [asyncio.ensure_future(ask(a)) for a in self.arbiters]
            try:
                pending = set(tasks)
                while pending and not self._connected.is_set():
                    _, pending = await asyncio.wait(pending, return_when="FIRST_COMPLETED")
                if self._connected.is_set() and pending:
                    # Heartbeats wait for the other answers a little: an arbiter
                    # of another cluster is refused before anything registers
                    # the node anywhere. A slower one is still checked (and
                    # refuses heartbeats that name another cluster).
                    _, pending = await asyncio.wait(pending, timeout=self.config.subscribe_hedge)
                if self._connected.is_set() and self._verify():
                    self._settled.set()
                if pending:
                    await asyncio.wait(pending)
            finally:
                for t in tasks:
                    await reap(t)
            if self._connected.is_set():
                return
            attempt += 1
            await asyncio.sleep(self._backoff.delay(attempt))

    def _verify(self) -> bool:
        """Checks the identities heard so far; fails the client on a mismatch."""
        try:
            self._check.verify()
        except ClusterMismatch as e:
            self._fail(e)
            return False
        return True

    async def _run_link(self, link: HeartbeatLink) -> None:
        await self._settled.wait()
        if self.error is not None or self._closed:
            return
        try:
            await link.run()
        except ClusterMismatch as e:
            self._fail(e)

    # --- what the heartbeat links ask (membership.heartbeats.LinkOwner) -------------

    def timings(self) -> LinkTimings:
        """The links' current timings: the interval and the deadlines scaled with it."""
        c = self.config
        scale = max(1.0, self.interval / c.heartbeat_interval)
        return LinkTimings(
            interval=self.interval,
            hedge_after=c.hedge_after * scale,
            ack_timeout=c.ack_timeout * scale,
        )

    def next_request(self, address: str, now: float) -> tuple[int, pb.HeartbeatRequest]:
        """The next heartbeat for ``address``, recorded by the session as sent at ``now``."""
        session = self._session
        assert session is not None
        seq, incarnation = session.heartbeat(address, now)
        return seq, pb.HeartbeatRequest(
            node_id=session.node_id,
            incarnation=incarnation,
            seq=seq,
            send_time_unix=time.time(),
            labels=self.labels,
            status=self._status_message(),
            # 0 until an arbiter suggested one: the arbiter's own default.
            interval_seconds=self.interval if self._suggested else 0.0,
        )

    def expected_cluster(self) -> str:
        """The cluster identity every arbiter must have ("" while unknown)."""
        return self._check.expected or ""

    def finished(self) -> bool:
        """True once heartbeats must stop."""
        session = self._session
        return self._closed or self.error is not None or session is None or session.ended

    def on_ack(self, address: str, ack: pb.HeartbeatAck, now: float) -> None:
        """Takes one ack from ``address`` (identity, interval, then the session).

        Raises:
            ClusterMismatch: the ack names another cluster.
        """
        session = self._session
        assert session is not None
        self._check.record(address, ack.cluster)
        if ack.cluster_size > len(self.arbiters) and not self._warned_size:
            self._warned_size = True
            log.warning(
                "%s lists %d arbiter(s) but the cluster has %d: it can join only if "
                "it reaches a majority (%d); list every arbiter",
                self.node_id,
                len(self.arbiters),
                ack.cluster_size,
                ack.cluster_size // 2 + 1,
            )
        if ack.next_interval_seconds > 0:
            before = self.interval
            self._suggested[address] = ack.next_interval_seconds
            if self.interval != before:
                log.info(
                    "%s heartbeats every %.3fs now (suggested by the arbiters)",
                    self.node_id,
                    self.interval,
                )
        self._dispatch(
            session.on_ack(
                address,
                seq=ack.seq,
                lease=ack.lease_seconds,
                state=convert.state_from_pb(ack.state) if ack.state else MemberState.JOINING,
                recorded_incarnation=ack.incarnation,
                epoch=ack.epoch,
                now=now,
                cluster_size=ack.cluster_size,
            )
        )

    # --- node state ------------------------------------------------------------------

    @property
    def interval(self) -> float:
        """Seconds between this node's heartbeats: the longest interval any arbiter
        suggested in its latest ack (so no arbiter gets more than it asked for),
        ``config.heartbeat_interval`` until one did."""
        return max(self._suggested.values(), default=self.config.heartbeat_interval)

    def _need_node(self, what: str) -> NodeSession:
        if self._session is None:
            raise InvalidArgument(f"{what} needs a node_id (this client only watches)")
        return self._session

    def report(
        self,
        *,
        phase: str | None = None,
        step: int | None = None,
        progress: float | None = None,
        gpu_utilization: float | None = None,
        **gauges: float,
    ) -> None:
        """Sets live status values sent with the next heartbeats (they stay until changed).

        Example: ``client.report(phase="allreduce", step=1200, loss=0.31)``.
        Never blocks and never delays a heartbeat.

        Args:
            phase: training phase, up to 64 characters.
            step: training step, >= 0.
            progress: 0..1.
            gpu_utilization: 0..1 (overrides the NVML probe).
            **gauges: free-form numeric gauges (finite; at most 32).

        Raises:
            InvalidArgument: a value breaks a bound (nothing is changed then),
                or the client has no node_id (it sends no heartbeats).
            ClosedError: the client is closed.
        """
        self._need_node("report()")
        if self._closed:
            raise ClosedError("report() on a closed client")
        self._status.report(
            phase=phase, step=step, progress=progress, gpu_utilization=gpu_utilization, **gauges
        )

    def clear(self, *names: str) -> None:
        """Unsets reported status values (``phase``, ``step``, ``progress``,
        ``gpu_utilization`` or gauge names); no names clears everything reported.

        Raises:
            InvalidArgument: a name is not a string, or the client has no node_id.
            ClosedError: the client is closed.
        """
        self._need_node("clear()")
        if self._closed:
            raise ClosedError("clear() on a closed client")
        self._status.clear(*names)

    def _status_message(self) -> pb.NodeStatus:
        snap = self._status.snapshot()
        cached = self._status_pb
        if cached is None or cached[0] is not snap:
            cached = self._status_pb = (snap, convert.status_to_pb(snap))
        return cached[1]

    @property
    def state(self) -> MemberState:
        """This node's state at its current incarnation (JOINING until admitted)."""
        return self._session.state if self._session else MemberState.JOINING

    @property
    def incarnation(self) -> int | None:
        """This node's current incarnation (None for a watch-only client)."""
        return self._session.incarnation if self._session else None

    @property
    def end_reason(self) -> EndReason | None:
        """Why the session ended (left, removed, dead, superseded), None while it runs."""
        return self._session.end_reason if self._session else None

    @property
    def fenced(self) -> bool:
        """True while the node holds unexpired leases from fewer than a quorum of arbiters."""
        return self._session.fenced(time.monotonic()) if self._session else True

    @property
    def stream_healthy(self) -> dict[str, bool]:
        """Arbiter address -> whether its heartbeat link had an ack within the ack timeout."""
        return {a: link.up for a, link in self._links.items()}

    @property
    def healthy(self) -> bool:
        """True while heartbeat streams to at least a quorum of arbiters are up (acked) (C24)."""
        if self._session is None:
            return False
        return sum(link.up for link in self._links.values()) >= self._session.quorum

    @property
    def is_member(self) -> bool:
        """True only while the node is ALIVE in the view it knows AND holds a quorum of leases.

        This is the "am I a member" answer to act on: it turns False as soon as
        the leases run out (before the cluster can have declared the node DEAD).
        """
        return self.state is MemberState.ALIVE and not self.fenced

    async def wait_fenced(self, fenced: bool = True, timeout: float | None = None) -> None:
        """Waits until :attr:`fenced` equals ``fenced``.

        Raises:
            InvalidArgument: on a watch-only client.
            TimeoutError: after ``timeout`` seconds.
        """
        session = self._need_node("wait_fenced")

        async def _wait() -> None:
            while self.fenced != fenced:
                self._fence_changed.clear()
                # leases run out without any event: wake at the next deadline too
                deadline = session.next_deadline()
                delay = None if deadline is None else max(0.0, deadline - time.monotonic())
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._fence_changed.wait()

        try:
            async with asyncio.timeout(timeout):
                await _wait()
        except TimeoutError:
            word = "fenced" if fenced else "unfenced"
            raise TimeoutError(f"{self.node_id} not {word} within {timeout:g}s") from None

    @property
    def fencing_epoch(self) -> int:
        """The latest view epoch seen while holding a quorum of leases (a fencing token)."""
        return self._session.fencing_epoch if self._session else 0

    @property
    def view(self) -> View:
        """The latest committed view this client has seen (empty before the first)."""
        return self._view

    def reachability(self) -> str:
        """Which arbiters this node's heartbeats reach, and why the others fail, in words."""
        session = self._session
        up = sum(link.up for link in self._links.values())
        quorum = session.quorum if session else len(self.arbiters) // 2 + 1
        down = [
            f"{a}: {link.last_error or 'no ack yet'}"
            for a, link in self._links.items()
            if not link.up
        ]
        text = f"reaches {up} of {len(self.arbiters)} arbiters (a quorum is {quorum})"
        return text + ("; " + "; ".join(down) if down else "")

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
        session = self._need_node("wait_alive")

        async def _wait() -> None:
            while self.state is not MemberState.ALIVE:
                if self.error is not None:
                    raise self.error
                if self._closed or session.ended:
                    why = session.end_reason.value if session.end_reason else "closed"
                    raise ClosedError(f"the client ended ({why}) before the node became ALIVE")
                self._state_changed.clear()
                await self._state_changed.wait()

        try:
            async with asyncio.timeout(timeout):
                await _wait()
        except TimeoutError:
            raise TimeoutError(
                f"{self.node_id} not ALIVE within {timeout:g}s: it is {self.state.value} and "
                f"{self.reachability()}"
            ) from None
        member = self._view.get(session.node_id)
        if member is None or member.incarnation != session.incarnation:
            member = Member(
                node_id=session.node_id,
                incarnation=session.incarnation,
                state=MemberState.ALIVE,
                labels=self.labels,
            )
        return member

    def _dispatch(self, events: list[SessionEvent]) -> None:
        for ev in events:
            if isinstance(ev, StateChanged):
                log.info("%s incarnation %d is %s", self.node_id, ev.incarnation, ev.state.value)
                self._state_changed.set()
            elif isinstance(ev, Fenced):
                self._fence_changed.set()
                log.info(
                    "%s %s (epoch %d)",
                    self.node_id,
                    "fenced" if ev.fenced else "holds a quorum of leases",
                    ev.epoch,
                )
            elif isinstance(ev, Superseded):
                log.error(
                    "%s: incarnation %d was taken over by incarnation %d (another process "
                    "with the same node id?); this client stops heartbeating",
                    self.node_id,
                    ev.incarnation,
                    ev.by,
                )
                self._state_changed.set()
            elif isinstance(ev, Rejoined):
                log.info(
                    "%s: incarnation %d is over (%s); rejoining as %d",
                    self.node_id,
                    ev.old_incarnation,
                    ev.reason,
                    ev.new_incarnation,
                )
            if self._on_event is not None:
                try:
                    self._on_event(ev)
                except Exception:
                    log.exception("on_event callback failed")
        session = self._session
        if session is not None and session.ended and not self.ended.is_set():
            if session.end_reason is EndReason.REMOVED:
                log.warning("%s was made LEFT by the cluster without asking", self.node_id)
            self.ended.set()
            self._state_changed.set()

    async def _fence_timer(self) -> None:
        session = self._session
        assert session is not None
        while True:
            deadline = session.next_deadline()
            delay = 0.05 if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.sleep(delay)
            self._dispatch(session.tick(time.monotonic()))

    async def _log_reachability(self) -> None:
        """Logs, every ``reachability_log_interval`` seconds while the node reaches fewer
        than a quorum of arbiters, which ones and why."""
        session = self._session
        assert session is not None
        every = self.config.reachability_log_interval
        while not self.finished():
            await asyncio.sleep(every)
            if not self.healthy and not self.finished():
                log.warning(
                    "%s %s: it cannot %s until it does",
                    self.node_id,
                    self.reachability(),
                    "join" if self.state is MemberState.JOINING else "keep its leases",
                )

    # --- leave ---------------------------------------------------------------------------

    async def leave(self, timeout: float = 10.0) -> int:
        """Leaves gracefully: the node becomes LEFT (never DEAD), then heartbeats stop.

        An incarnation that never joined the view is retired instead: the view
        records nothing for it, and it can never join later. A node that no
        arbiter ever answered just stops.

        Returns:
            The epoch at which the node became LEFT (for an incarnation that
            never joined: the epoch then; the view did not change).

        Raises:
            InvalidArgument: on a watch-only client.
            RejectedError: the cluster refused (e.g. the incarnation is already DEAD).
            UnavailableError: no arbiter could commit the leave within ``timeout`` seconds.
        """
        session = self._need_node("leave")
        if session.end_reason is EndReason.LEFT:
            return self._left_epoch
        if session.ended:
            raise RejectedError(
                f"{self.node_id} cannot leave: its session ended ({session.end_reason})"
            )
        if not session.heard:
            # Nothing can hold this incarnation: no arbiter ever answered it.
            self._dispatch(session.leave(time.monotonic()))
            await self.close()
            return self._view.epoch
        request = pb.LeaveRequest(
            node_id=session.node_id,
            incarnation=session.incarnation,
            cluster=self._check.expected or "",
        )
        deadline = time.monotonic() + timeout
        errors: dict[str, str] = {}
        attempt = 0
        while time.monotonic() < deadline:
            resp = await self._leave_round(request, deadline, errors)
            if resp is not None:
                self._left_epoch = int(resp.epoch)
                self._dispatch(session.leave(time.monotonic()))
                await self.close()
                return self._left_epoch
            attempt += 1
            await asyncio.sleep(
                min(self._backoff.delay(attempt), max(0.0, deadline - time.monotonic()))
            )
        detail = "; ".join(f"{a}: {e}" for a, e in errors.items()) or "no arbiter tried"
        raise UnavailableError(f"leave not committed within {timeout:g}s ({detail})")

    async def _leave_round(
        self, request: pb.LeaveRequest, deadline: float, errors: dict[str, str]
    ) -> pb.LeaveResponse | None:
        """Asks every arbiter at once (a leave is idempotent); the first success wins."""

        async def ask(addr: str) -> pb.LeaveResponse | None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                resp: pb.LeaveResponse = await self._channels.stub(addr).Leave(
                    request, timeout=min(left, self.config.call_timeout)
                )
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    raise RejectedError(e.details() or "leave refused") from None
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    self._channels.discard(addr)
                errors[addr] = f"{e.code().name} {e.details()}"
                return None
            return resp

        tasks = [asyncio.ensure_future(ask(a)) for a in self.arbiters]
        try:
            for done in asyncio.as_completed(tasks):
                resp = await done
                if resp is not None:
                    return resp
        finally:
            for t in tasks:
                await reap(t)
        return None

    # --- view ------------------------------------------------------------------------------

    async def get_view(self) -> ViewInfo:
        """Asks the arbiters for their view; prefers one that is in a quorum.

        The first listed arbiter is asked first; if it has not answered in a
        quorum within ``config.subscribe_hedge`` seconds, the others are asked
        too (a frozen arbiter does not hold the answer up).

        Returns:
            The view of the first in-quorum arbiter that answers, else of the
            first arbiter that answered.

        Raises:
            ClusterMismatch: the arbiters belong to different clusters.
            UnavailableError: when no arbiter answers within ``call_timeout``.
        """
        errors: dict[str, str] = {}

        async def ask(addr: str) -> tuple[str, pb.GetViewResponse] | None:
            try:
                resp = await self._channels.stub(addr).GetView(
                    pb.GetViewRequest(), timeout=self.config.call_timeout
                )
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    self._channels.discard(addr)
                errors[addr] = e.code().name
                return None
            return addr, resp

        first = asyncio.ensure_future(ask(self.arbiters[0]))
        tasks = [first]
        fallback: tuple[str, pb.GetViewResponse] | None = None
        try:
            done, _ = await asyncio.wait({first}, timeout=self.config.subscribe_hedge)
            if done and first.result() is not None and first.result()[1].in_quorum:  # type: ignore[index]
                addr, resp = first.result()  # type: ignore[misc]
                return self._view_info(addr, resp)
            tasks += [asyncio.ensure_future(ask(a)) for a in self.arbiters[1:]]
            for fut in asyncio.as_completed(tasks):
                answer = await fut
                if answer is None:
                    continue
                if answer[1].in_quorum:
                    return self._view_info(*answer)
                fallback = fallback or answer
        finally:
            for t in tasks:
                await reap(t)
        if fallback is not None:
            return self._view_info(*fallback)
        raise UnavailableError(
            "no arbiter answered: " + "; ".join(f"{a}: {e}" for a, e in errors.items())
        )

    def _view_info(self, address: str, resp: pb.GetViewResponse) -> ViewInfo:
        self._check.record(address, resp.cluster)
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

    async def _follow_view(self) -> None:
        with contextlib.suppress(MembershipError):
            async for _ in self.watch():
                pass

    def _set_view(self, view: View) -> None:
        self._view = view

    async def watch(
        self,
        since_epoch: int = 0,
        *,
        status: bool = False,
        status_interval: float = 0.0,
        reset_if_ahead: bool = False,
    ) -> AsyncIterator[ViewEvent]:
        """Yields the view as a stream: a snapshot (or the changes after
        ``since_epoch``), then every change, quorum transitions, and loss and
        return of contact.

        Fails over between arbiters and resumes from the last epoch it
        yielded, so epochs are contiguous (or a fresh snapshot is yielded):
        no gap, no duplicate (rules in :mod:`membership.feed`). Also updates
        :attr:`view`.

        Args:
            since_epoch: the last epoch the caller holds (0: start with a snapshot).
            status: also yield :class:`StatusUpdated` events (live status of
                the nodes, coalesced per node, from the serving arbiter).
            status_interval: seconds between status events (0: the arbiter's
                default; an arbiter never sends them more often than its own).
            reset_if_ahead: when ``since_epoch`` is beyond the cluster's epoch,
                yield :class:`ViewReset` and start again from a fresh snapshot
                instead of raising.

        Yields:
            ViewSnapshot, ViewChanged, QuorumChanged, Disconnected,
            Reconnected, ViewReset, and StatusUpdated when asked.

        Raises:
            InvalidArgument: for a bad argument, or an arbiter refused them.
            EpochOutOfRange: ``since_epoch`` is beyond the cluster's epoch
                (confirmed by two arbiters), unless ``reset_if_ahead``.
            ClusterMismatch: the arbiters belong to different clusters.
        """
        if (
            isinstance(status_interval, bool)
            or not isinstance(status_interval, int | float)
            or not math.isfinite(status_interval)
            or status_interval < 0
        ):
            raise InvalidArgument(
                f"status_interval must be a number of seconds >= 0, got {status_interval!r}"
            )
        if isinstance(since_epoch, bool) or not isinstance(since_epoch, int) or since_epoch < 0:
            raise InvalidArgument(f"since_epoch must be an int >= 0, got {since_epoch!r}")
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
        )
        try:
            async for ev in watcher.events():
                yield ev
        except ClusterMismatch as e:
            self._fail(e)
            raise
        if self.error is not None:
            raise self.error
