"""MembershipClient: the asyncio SDK over the sans-I/O session core.

A node opens one heartbeat stream to every arbiter at once. Each stream is
supervised on its own: it reconnects with jittered exponential backoff
(tenacity) and never disturbs the others; a stream whose oldest unacked
heartbeat waits ``ack_timeout`` seconds is abandoned even if its writes are
stuck (C03).
A client without ``node_id`` only watches.

Example::

    async with MembershipClient(["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"],
                                node_id="worker-3", labels={"rack": "r1"}) as client:
        await client.wait_alive(timeout=10)
        async for event in client.watch():
            print(event)
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from tenacity import AsyncRetrying, retry_if_exception_type, wait_random_exponential

from membership import convert
from membership.config import ClientConfig
from membership.errors import (
    ClosedError,
    InvalidArgument,
    RejectedError,
    UnavailableError,
)
from membership.session import (
    Fenced,
    NodeSession,
    Rejoined,
    SessionEvent,
    StateChanged,
    Superseded,
)
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc
from membership.validation import parse_address, validate_labels, validate_node_id
from membership.view import (
    Member,
    MemberState,
    QuorumChanged,
    StatusUpdated,
    View,
    ViewChanged,
    ViewEvent,
    ViewSnapshot,
)

if TYPE_CHECKING:
    from membership.collector import StatusCollector
    from membership.status import NodeStatus

__all__ = ["MAX_INCARNATION", "MembershipClient", "ViewInfo"]

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


async def reap(task: asyncio.Future[Any]) -> None:
    """Cancels ``task`` and waits until it has finished, whatever its outcome.

    Unlike ``suppress(CancelledError): await task``, this never swallows a
    cancellation of the *calling* task, so a supervisor being shut down
    cannot be kept alive by the child it is cleaning up.
    """
    # Cancel again until it ends: Python 3.11's asyncio.wait_for (in grpc or
    # in user code) can swallow a cancellation that races with its result.
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
    if not task.cancelled() and task.exception() is not None:
        log.debug("task ended with %r", task.exception())


class _StreamFailed(Exception):
    """A stream ended before it was ever healthy: back off before the next try."""


class _Resubscribe(Exception):
    """Leave the current subscription and open another (failover, gap, stall)."""

    def __init__(self, reason: str, move: bool = True) -> None:
        super().__init__(reason)
        self.move = move


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
        self.arbiters = [parse_address(a) for a in arbiters]
        if len(set(self.arbiters)) != len(self.arbiters):
            raise InvalidArgument("an arbiter address is listed twice")
        self.config = (config or ClientConfig()).validate()
        self.labels = dict(validate_labels(dict(labels or {})))
        self.node_id = validate_node_id(node_id) if node_id is not None else None
        self._session: NodeSession | None = None
        if self.node_id is not None:
            self._session = NodeSession(
                node_id=self.node_id,
                incarnation=incarnation or int(time.time() * 1000),
                arbiters=self.arbiters,
                auto_rejoin=self.config.auto_rejoin,
            )
        self._on_event = on_event
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._view = View()
        self._alive = asyncio.Event()
        self._state_changed = asyncio.Event()
        self._fence_changed = asyncio.Event()
        # Set when the session ends by itself: superseded by a newer incarnation,
        # or declared DEAD with auto_rejoin off.
        self.ended = asyncio.Event()
        # Interval each arbiter suggested in its latest ack (seconds).
        self._suggested: dict[str, float] = {}
        from membership.collector import StatusCollector

        self._own_status = status is None
        self._status = status or StatusCollector(
            providers=None if self.config.collect_status else [],
            probe_interval=self.config.status_probe_interval,
        )
        self._status_pb: tuple[NodeStatus, pb.NodeStatus] | None = None
        self.stream_healthy: dict[str, bool] = dict.fromkeys(self.arbiters, False)
        self._warned_size = False

    # --- lifecycle -----------------------------------------------------------------

    async def __aenter__(self) -> MembershipClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Starts the heartbeat streams (for a node) and the view follower."""
        if self._closed:
            raise ClosedError("client is closed")
        loop = asyncio.get_running_loop()
        if self._session is not None:
            if self._own_status:
                self._status.start()
            for addr in self.arbiters:
                self._tasks.append(
                    loop.create_task(self._supervise(addr), name=f"heartbeat-{addr}")
                )
            self._tasks.append(loop.create_task(self._fence_timer(), name="fence-timer"))
        if self.config.follow_view:
            self._tasks.append(loop.create_task(self._follow_view(), name="follow-view"))

    async def close(self) -> None:
        """Stops every task and closes every channel (no leave: see :meth:`leave`)."""
        self._closed = True
        for t in self._tasks:
            await reap(t)
        self._tasks.clear()
        if self._own_status:
            self._status.close()
        for ch in self._channels.values():
            await ch.close(grace=None)
        self._channels.clear()
        self._state_changed.set()

    def _stub(self, addr: str) -> pb_grpc.MembershipStub:
        ch = self._channels.get(addr)
        if ch is None:
            ch = grpc.aio.insecure_channel(addr, options=self.config.channel_options())
            self._channels[addr] = ch
        return pb_grpc.MembershipStub(ch)

    # --- node state ------------------------------------------------------------------

    @property
    def interval(self) -> float:
        """Seconds between this node's heartbeats: the longest interval any arbiter
        suggested in its latest ack (so no arbiter gets more than it asked for),
        ``config.heartbeat_interval`` until one did."""
        return max(self._suggested.values(), default=self.config.heartbeat_interval)

    def _ack_timeout(self) -> float:
        # The ack deadline scales with the interval: at 1 s between heartbeats
        # a 0.6 s deadline would abandon every stream between two of them.
        c = self.config
        return max(c.ack_timeout, c.ack_timeout * self.interval / c.heartbeat_interval)

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
            InvalidArgument: a value breaks a bound (nothing is changed then).
        """
        self._status.report(
            phase=phase, step=step, progress=progress, gpu_utilization=gpu_utilization, **gauges
        )

    def clear(self, *names: str) -> None:
        """Unsets reported status values (``phase``, ``step``, ``progress``,
        ``gpu_utilization`` or gauge names); no names clears everything reported.

        Raises:
            InvalidArgument: a name is not a string.
        """
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
    def fenced(self) -> bool:
        """True while the node holds unexpired leases from fewer than a quorum of arbiters."""
        return self._session.fenced(time.monotonic()) if self._session else True

    @property
    def healthy(self) -> bool:
        """True while heartbeat streams to at least a quorum of arbiters are up (acked) (C24)."""
        if self._session is None:
            return False
        return sum(self.stream_healthy.values()) >= self._session.quorum

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
        if self._session is None:
            raise InvalidArgument("wait_fenced needs a node_id")

        async def _wait() -> None:
            while self.fenced != fenced:
                self._fence_changed.clear()
                # leases run out without any event: wake at the next deadline too
                deadline = self._session.next_deadline() if self._session else None
                delay = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    async with asyncio.timeout(delay):
                        await self._fence_changed.wait()
                except TimeoutError:
                    pass

        async with asyncio.timeout(timeout):
            await _wait()

    @property
    def fencing_epoch(self) -> int:
        """The latest view epoch seen while holding a quorum of leases (a fencing token)."""
        return self._session.fencing_epoch if self._session else 0

    @property
    def view(self) -> View:
        """The latest committed view this client has seen (empty before the first)."""
        return self._view

    async def wait_alive(self, timeout: float | None = None) -> Member:
        """Waits until this node is ALIVE in the committed view.

        Returns:
            The node as a member (from the view when known).

        Raises:
            InvalidArgument: on a watch-only client.
            ClosedError: when the client closes or the node leaves first.
            TimeoutError: after ``timeout`` seconds.
        """
        if self._session is None:
            raise InvalidArgument("wait_alive needs a node_id")

        async def _wait() -> None:
            while self.state is not MemberState.ALIVE:
                if self._closed or (self._session is not None and self._session.ended):
                    raise ClosedError("client closed before the node became ALIVE")
                self._state_changed.clear()
                await self._state_changed.wait()

        async with asyncio.timeout(timeout):
            await _wait()
        member = self._view.get(self._session.node_id)
        if member is None or member.incarnation != self._session.incarnation:
            member = Member(
                node_id=self._session.node_id,
                incarnation=self._session.incarnation,
                state=MemberState.ALIVE,
                labels=self.labels,
            )
        return member

    def _dispatch(self, events: list[SessionEvent]) -> None:
        for ev in events:
            if isinstance(ev, StateChanged):
                log.info("%s incarnation %d is %s", self.node_id, ev.incarnation, ev.state.value)
                self._state_changed.set()
                if ev.state is MemberState.DEAD and not self.config.auto_rejoin:
                    self.ended.set()  # nothing more to do without a rejoin
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
                self.ended.set()
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

    async def _fence_timer(self) -> None:
        assert self._session is not None
        while True:
            deadline = self._session.next_deadline()
            delay = 0.05 if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.sleep(min(delay, 0.05) if deadline is None else delay)
            self._dispatch(self._session.tick(time.monotonic()))

    # --- heartbeats ------------------------------------------------------------------

    async def _supervise(self, addr: str) -> None:
        # One supervisor per arbiter; it never ends by itself and never dies
        # silently (C24): unexpected errors are logged and retried.
        while not self._closed and not (self._session is not None and self._session.ended):
            try:
                retrying = AsyncRetrying(
                    wait=wait_random_exponential(
                        multiplier=self.config.backoff_initial, max=self.config.backoff_max
                    ),
                    retry=retry_if_exception_type(_StreamFailed),
                )
                async for attempt in retrying:
                    with attempt:
                        await self._heartbeat_stream(addr)
                # The stream was healthy, then ended: reconnect after a short jitter.
                await asyncio.sleep(random.uniform(0, self.config.backoff_initial))
            except asyncio.CancelledError:
                raise
            except ClosedError:
                return
            except Exception:
                log.exception("heartbeat supervisor for %s failed; restarting", addr)
                await asyncio.sleep(self.config.backoff_max)

    async def _heartbeat_stream(self, addr: str) -> None:
        assert self._session is not None
        if self._closed:
            raise ClosedError("client closed")
        session = self._session
        call = self._stub(addr).Heartbeat()
        # Heartbeats sent and not yet acked: (seq, send time), oldest first.
        # The stream is abandoned when the oldest one waits longer than the
        # ack timeout (C03): measured from its *send*, so that a process that
        # was itself paused (GC, SIGSTOP, CPU starvation) first tries the
        # stream it has instead of dropping every stream on resuming.
        unacked: collections.deque[tuple[int, float]] = collections.deque()
        healthy = False

        async def reader() -> None:
            nonlocal healthy
            while True:
                ack = await call.read()
                if ack is grpc.aio.EOF:
                    return
                now = time.monotonic()
                while unacked and unacked[0][0] <= ack.seq:
                    unacked.popleft()
                if not healthy:
                    healthy = True
                    self.stream_healthy[addr] = True
                    log.debug("heartbeat stream to %s is up", addr)
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
                    self._suggested[addr] = ack.next_interval_seconds
                    if self.interval != before:
                        log.info(
                            "%s heartbeats every %.3fs now (suggested by the arbiters)",
                            self.node_id,
                            self.interval,
                        )
                self._dispatch(
                    session.on_ack(
                        addr,
                        seq=ack.seq,
                        lease=ack.lease_seconds,
                        state=convert.state_from_pb(ack.state)
                        if ack.state
                        else MemberState.JOINING,
                        recorded_incarnation=ack.incarnation,
                        epoch=ack.epoch,
                        now=now,
                        cluster_size=ack.cluster_size,
                    )
                )
                if session.ended:
                    return

        read_task = asyncio.get_running_loop().create_task(reader())
        try:
            while not read_task.done():
                now = time.monotonic()
                ack_timeout = self._ack_timeout()
                waiting = now - unacked[0][1] if unacked else 0.0
                if waiting > ack_timeout:
                    raise TimeoutError(f"no ack from {addr} for {waiting:.2f}s")
                seq, incarnation = session.heartbeat(addr, now)
                unacked.append((seq, now))
                interval = self.interval
                req = pb.HeartbeatRequest(
                    node_id=session.node_id,
                    incarnation=incarnation,
                    seq=seq,
                    send_time_unix=time.time(),
                    labels=self.labels,
                    status=self._status_message(),
                    # 0 until an arbiter suggested one: the arbiter's own default.
                    interval_seconds=interval if self._suggested else 0.0,
                )
                async with asyncio.timeout(ack_timeout):
                    await call.write(req)
                await asyncio.wait({read_task}, timeout=interval)
            await read_task  # re-raises a read error
        except (grpc.aio.AioRpcError, TimeoutError, asyncio.InvalidStateError) as e:
            detail = e.details() if isinstance(e, grpc.aio.AioRpcError) else str(e)
            code = e.code() if isinstance(e, grpc.aio.AioRpcError) else None
            if healthy:
                log.info("heartbeat stream to %s ended: %s", addr, detail)
            if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
                log.error("arbiter %s refused our heartbeats: %s", addr, detail)
            if not healthy:
                raise _StreamFailed(detail) from e
        finally:
            self.stream_healthy[addr] = False
            call.cancel()
            await reap(read_task)
        if not healthy:
            raise _StreamFailed("stream ended before any ack")

    # --- leave ---------------------------------------------------------------------------

    async def leave(self, timeout: float = 10.0) -> int:
        """Leaves gracefully: the node becomes LEFT (never DEAD), then heartbeats stop.

        Returns:
            The epoch at which the node became LEFT.

        Raises:
            InvalidArgument: on a watch-only client.
            RejectedError: the cluster refused (e.g. the incarnation is already DEAD).
            UnavailableError: no arbiter could commit the leave within ``timeout`` seconds.
        """
        if self._session is None:
            raise InvalidArgument("leave needs a node_id")
        session = self._session
        deadline = time.monotonic() + timeout
        last_error = "no arbiter tried"
        while time.monotonic() < deadline:
            for addr in self.arbiters:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    resp = await self._stub(addr).Leave(
                        pb.LeaveRequest(node_id=session.node_id, incarnation=session.incarnation),
                        timeout=min(left, self.config.call_timeout),
                    )
                except grpc.aio.AioRpcError as e:
                    if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                        raise RejectedError(e.details() or "leave refused") from None
                    last_error = f"{addr}: {e.code().name} {e.details()}"
                    continue
                session.left = True
                self._dispatch(session._set_state(MemberState.LEFT))
                await self.close()
                return int(resp.epoch)
            await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        raise UnavailableError(f"leave not committed within {timeout}s ({last_error})")

    # --- view ------------------------------------------------------------------------------

    async def get_view(self) -> ViewInfo:
        """Asks the arbiters for their view; prefers one that is in a quorum.

        Returns:
            The view of the first in-quorum arbiter that answers, else of any
            arbiter that answers.

        Raises:
            UnavailableError: when no arbiter answers within ``call_timeout``.
        """
        fallback: ViewInfo | None = None
        errors = []
        for addr in self.arbiters:
            try:
                resp = await self._stub(addr).GetView(
                    pb.GetViewRequest(), timeout=self.config.call_timeout
                )
            except grpc.aio.AioRpcError as e:
                errors.append(f"{addr}: {e.code().name}")
                continue
            info = ViewInfo(
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
            )
            if info.in_quorum:
                return info
            fallback = fallback or info
        if fallback is not None:
            return fallback
        raise UnavailableError("no arbiter answered: " + "; ".join(errors))

    async def _follow_view(self) -> None:
        async for _ in self.watch():
            pass

    async def watch(
        self, since_epoch: int = 0, *, status: bool = False, status_interval: float = 0.0
    ) -> AsyncIterator[ViewEvent]:
        """Yields the view as a stream: a snapshot (or the changes after
        ``since_epoch``), then every change, and quorum transitions.

        Fails over between arbiters and resumes from the last epoch it
        yielded, so epochs are contiguous (or a fresh snapshot is yielded):
        no gap, no duplicate. Also updates :attr:`view`.

        Args:
            since_epoch: the last epoch the caller holds (0: start with a snapshot).
            status: also yield :class:`StatusUpdated` events (live status of
                the nodes, coalesced per node, from the serving arbiter).
            status_interval: seconds between status events (0: the arbiter's
                default; an arbiter never sends them more often than its own).

        Yields:
            ViewSnapshot, ViewChanged, QuorumChanged, and StatusUpdated when asked.
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
        last = since_epoch
        index = 0
        in_quorum: bool | None = None
        failures = 0
        while not self._closed:
            addr = self.arbiters[index % len(self.arbiters)]
            call = self._stub(addr).Subscribe(
                pb.SubscribeRequest(
                    since_epoch=last, include_status=status, status_interval_seconds=status_interval
                )
            )
            got_any = False
            # One pending read at a time, never cancelled by a timeout: a
            # cancelled read would cancel the whole call.
            read: asyncio.Task[Any] | None = None
            try:
                quorum_lost_at: float | None = None
                while True:
                    timeout = self.config.stream_idle_timeout
                    if quorum_lost_at is not None:
                        timeout = self.config.failover_probe_interval
                    if read is None:
                        read = asyncio.ensure_future(call.read())
                    done, _ = await asyncio.wait({read}, timeout=timeout)
                    if done:
                        msg, read = read.result(), None
                    else:
                        if quorum_lost_at is None:
                            raise _Resubscribe(f"{addr}: nothing for {timeout:.0f}s") from None
                        target = await self._find_quorum(exclude=addr)
                        if target is not None:
                            index = self.arbiters.index(target)
                            raise _Resubscribe("failing over to an arbiter with quorum", False)
                        continue
                    if msg is grpc.aio.EOF:
                        raise _Resubscribe(f"{addr} ended the stream")
                    got_any = True
                    failures = 0
                    ev = convert.event_from_pb(msg)
                    if isinstance(ev, ViewSnapshot):
                        last = ev.view.epoch
                        self._view = ev.view
                        yield ev
                    elif isinstance(ev, ViewChanged):
                        if ev.epoch <= last:
                            continue  # already yielded (resume overlap)
                        if ev.epoch != last + 1:
                            raise _Resubscribe(f"gap: epoch {ev.epoch} after {last}", False)
                        last = ev.epoch
                        self._view = self._view.with_changes(ev.epoch, ev.changes)
                        yield ev
                    elif isinstance(ev, StatusUpdated):
                        if status:
                            yield ev
                    elif isinstance(ev, QuorumChanged):
                        if ev.in_quorum != in_quorum and (
                            in_quorum is not None or not ev.in_quorum
                        ):
                            yield ev
                        in_quorum = ev.in_quorum
                        quorum_lost_at = None if ev.in_quorum else time.monotonic()
                        if not ev.in_quorum:
                            target = await self._find_quorum(exclude=addr)
                            if target is not None:
                                index = self.arbiters.index(target)
                                raise _Resubscribe("failing over to an arbiter with quorum", False)
            except _Resubscribe as r:
                log.debug("subscription to %s: %s", addr, r)
                if r.move:
                    index += 1
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    detail = e.details()
                    raise InvalidArgument(f"{addr} refused the subscription: {detail}") from None
                log.debug("subscription to %s failed: %s", addr, e.code().name)
                index += 1
            finally:
                call.cancel()
                if read is not None:
                    await reap(read)
            if not got_any:
                failures += 1
                await asyncio.sleep(
                    random.uniform(
                        0,
                        min(
                            self.config.backoff_max,
                            self.config.backoff_initial * 2 ** min(failures, 10),
                        ),
                    )
                )

    async def _find_quorum(self, exclude: str) -> str | None:
        for addr in self.arbiters:
            if addr == exclude:
                continue
            try:
                resp = await self._stub(addr).GetView(
                    pb.GetViewRequest(), timeout=min(1.0, self.config.call_timeout)
                )
            except grpc.aio.AioRpcError:
                continue
            if resp.in_quorum:
                return addr
        return None
