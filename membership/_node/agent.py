"""The node side of a client: its session, one heartbeat link per arbiter, fencing, reachability.

:class:`NodeAgent` owns what a :class:`~membership._client.MembershipClient`
with a ``node_id`` does besides watching: it answers the heartbeat links'
questions (:class:`membership._node.heartbeats.LinkOwner`: what to send, what an
ack means), feeds the acks to the sans-I/O session core
(:mod:`membership._node.session`), turns session events into log lines and the
application's ``on_event`` callback, logs which arbiters' leases it holds
when that changes, wakes when a lease runs out (the fence timer), and, while
it reaches fewer than a quorum of arbiters, says which ones and why every
``reachability_log_interval`` seconds.

It follows the arbiter set its acks carry (:mod:`membership._arbiters.arbiterset`):
a new configuration (a higher ``config_index``) opens a heartbeat link to each
arbiter added, closes the link of each one removed, and hands the voters to
the session, whose lease quorum is then theirs (session rule 9).

Its graceful leave is a Leave committed by a majority of the arbiters; the
session records the outcome (:meth:`membership._node.session.NodeSession.leave`,
session rules 5 and 8): an incarnation no arbiter ever answered, or that a
majority never heard, has nothing to leave and is retired at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from membership._arbiters import calls
from membership._arbiters.arbiterset import ArbiterFollower
from membership._arbiters.identity import ClusterCheck
from membership._arbiters.transport import Channels
from membership._config import ClientConfig
from membership._node.eventlog import LeaseLog, log_session_event
from membership._node.heartbeats import HeartbeatLink
from membership._node.linkrules import LinkTimings, odd_one_out
from membership._node.session import (
    EndReason,
    Fenced,
    NodeSession,
    SessionEvent,
    StateChanged,
    Superseded,
)
from membership.shared import convert, tls
from membership.shared.backoff import Backoff
from membership.shared.errors import (
    ClosedError,
    ClusterMismatch,
    MembershipError,
    PermissionDenied,
    RejectedError,
    UnavailableError,
)
from membership.shared.status import rtt_to_send
from membership.shared.view import Member, MemberState, View
from membership.v1 import membership_pb2 as pb

if TYPE_CHECKING:
    from membership._node.collector import StatusCollector
    from membership.shared.status import NodeStatus

__all__ = ["NodeAgent"]

log = logging.getLogger("membership.client")


class NodeAgent:
    """One node's heartbeats and session (see the module docstring).

    Args:
        node_id: the node's id (validated).
        incarnation: its starting incarnation (>= 1).
        arbiters: every arbiter's address.
        labels: its static labels (validated).
        config: the client's configuration.
        channels: where the links' connections come from.
        backoff: the links' reconnect backoff.
        check: the client's cluster identity check.
        status: the collector whose snapshot every heartbeat carries (None:
            a new one probing load, CPU, memory and GPUs when
            ``config.collect_status``, started and closed with the agent).
        on_event: the application's callback for session events, or None.
        fail: called when the agent must stop the client (a cluster mismatch).
        closed: returns True once the client is closed.
        discovery: the client's identity question (for messages while the
            first heartbeat waits for a majority's answers).
    """

    def __init__(
        self,
        *,
        node_id: str,
        incarnation: int,
        arbiters: Sequence[str],
        labels: Mapping[str, str],
        config: ClientConfig,
        channels: Channels,
        backoff: Backoff,
        check: ClusterCheck,
        status: StatusCollector | None,
        on_event: Callable[[SessionEvent], None] | None,
        fail: Callable[[MembershipError], None],
        closed: Callable[[], bool],
        discovery: calls.Discovery | None = None,
    ) -> None:
        self.node_id = node_id
        self.arbiters = list(arbiters)
        self.labels = dict(labels)
        self.config = config
        self.session = NodeSession(
            node_id=node_id,
            incarnation=incarnation,
            arbiters=self.arbiters,
            auto_rejoin=config.auto_rejoin,
            lease_guard=config.lease_guard,
        )
        self.links = {
            a: HeartbeatLink(a, owner=self, channels=channels, backoff=backoff)
            for a in self.arbiters
        }
        self.follower = ArbiterFollower(self.arbiters)  # membership/_arbiters/arbiterset.py
        self.link_tasks: dict[str, asyncio.Task[None]] = {}
        self.settled: asyncio.Event | None = None
        self.check = check  # the client's cluster identity check
        self.lease_log = LeaseLog(node_id, voters=len(self.arbiters))
        self._denied: dict[str, str] = {}  # arbiter address -> its PERMISSION_DENIED
        self._discovery = discovery
        self.channels = channels
        self.backoff = backoff
        self.left_epoch = 0  # the epoch the leave committed at (agent_leave.py)
        from membership._node.collector import StatusCollector  # threads: only for nodes

        self._own_status = status is None
        self.status = status or StatusCollector(
            providers=None if config.collect_status else [],
            probe_interval=config.status_probe_interval,
        )
        # (status snapshot, round trip sent, its message): rebuilt when either changes.
        self._status_pb: tuple[NodeStatus, float | None, pb.NodeStatus] | None = None
        self._on_event = on_event
        self._fail = fail
        self._closed = closed
        # Interval each arbiter suggested in its latest ack (seconds).
        self._suggested: dict[str, float] = {}
        self._timings = LinkTimings(  # cached per interval (timings())
            interval=0.0,
            hedge_after=0.0,
            ack_timeout=0.0,
            stall_timeout=0.0,
            slow_start_timeout=0.0,
        )
        self._warned_size = False
        # The cluster instance the acks came from ("" until one said).
        self.instance = ""
        self.ended = asyncio.Event()
        self.state_changed = asyncio.Event()
        self.fence_changed = asyncio.Event()
        self.acked = asyncio.Event()  # set by every ack (membership/_node/graces.py waits on it)

    def tasks(self, settled: asyncio.Event) -> list[asyncio.Task[None]]:
        """Starts the status probes (if its own), the links (once ``settled`` is set),
        the fence timer and the reachability log."""
        if self._own_status:
            self.status.start()
        loop = asyncio.get_running_loop()
        self.settled = settled
        tasks = [self.start_link(link) for link in self.links.values()]
        tasks.append(loop.create_task(self._fence_timer(), name="fence-timer"))
        tasks.append(loop.create_task(self._log_reachability(), name="reachability"))
        return tasks

    def start_link(self, link: HeartbeatLink) -> asyncio.Task[None]:
        """Runs ``link`` in a task of its own (at start, and for an arbiter added later)."""
        assert self.settled is not None
        task = asyncio.get_running_loop().create_task(
            self._run_link(link, self.settled), name=f"heartbeat-{link.address}"
        )
        self.link_tasks[link.address] = task
        return task

    def close_status(self) -> None:
        """Stops the status probes if the agent started them, and the links of arbiters
        added since the start (the client reaped the first ones)."""
        for task in self.link_tasks.values():
            task.cancel()
        if self._own_status:
            self.status.close()

    async def _run_link(self, link: HeartbeatLink, settled: asyncio.Event) -> None:
        await settled.wait()
        if self.finished():
            return
        while not self.finished():
            try:
                await link.run()
            except PermissionDenied as e:  # our certificate: a majority's refusal ends us
                link.last_error = f"refused: {e}"
                self._denied[link.address] = str(e)
                if len(self._denied) > len(self.arbiters) // 2:
                    return self._fail(PermissionDenied("; ".join(self._denied.values())))
                await asyncio.sleep(self.config.reachability_log_interval)
            except ClusterMismatch as e:
                # Identity rule 3: a stranger found after the client settled
                # is refused; the node keeps the cluster it has, and asks the
                # address again later (the real replica may come back there).
                if self.check.refuse(link.address, str(e)):
                    log.error(
                        "%s: arbiter %s refused (asked again every %gs): %s",
                        self.node_id,
                        link.address,
                        self.config.reachability_log_interval,
                        self.check.refused[link.address],
                    )
                link.last_error = f"refused: {self.check.refused[link.address]}"
                if self.check.lost():
                    self._fail(
                        ClusterMismatch(
                            "most of the arbiters given now belong to another cluster: "
                            + "; ".join(self.check.refused.values())
                        )
                    )
                    return
                await asyncio.sleep(self.config.reachability_log_interval)

    # --- what the heartbeat links ask (membership._node.heartbeats.LinkOwner) -------------

    @property
    def interval(self) -> float:
        """Seconds between heartbeats: the longest interval any arbiter suggested in its
        latest ack (no arbiter gets more than it asked for), the configured one until then."""
        return max(self._suggested.values(), default=self.config.heartbeat_interval)

    def timings(self) -> LinkTimings:
        """The links' current timings: the interval and the deadlines scaled with it."""
        c = self.config
        interval = self.interval
        cached = self._timings
        if cached.interval == interval:
            return cached
        scale = max(1.0, interval / c.heartbeat_interval)
        self._timings = LinkTimings(
            interval=interval,
            hedge_after=c.hedge_after * scale,
            ack_timeout=c.ack_timeout * scale,
            stall_timeout=c.stall_timeout * scale,
            slow_start_timeout=max(c.slow_start_timeout, c.stall_timeout * scale),
        )
        return self._timings

    def incarnation(self) -> int:
        """The incarnation the node heartbeats at now."""
        return self.session.incarnation

    def others_answer(self, address: str, now: float) -> bool:
        """True when another arbiter's link answers within half the silence of the link to
        ``address`` (membership/_node/linkrules.py rules 3, 4: ``odd_one_out``): then a silent
        stream to ``address`` is that connection's fault, not load's."""
        return odd_one_out(
            self.links[address].clocks(),
            (link.clocks() for a, link in self.links.items() if a != address),
            now,
        )

    def next_request(self, address: str, now: float) -> tuple[int, pb.HeartbeatRequest]:
        """The next heartbeat for ``address``, recorded by the session as sent at ``now``."""
        seq, incarnation = self.session.heartbeat(address, now)
        return seq, pb.HeartbeatRequest(
            node_id=self.node_id,
            incarnation=incarnation,
            seq=seq,
            send_time_unix=time.time(),
            labels=self.labels,
            status=self._status_message(now),
            # 0 until an arbiter suggested one: the arbiter's own default.
            interval_seconds=self.interval if self._suggested else 0.0,
        )

    def _status_message(self, now: float) -> pb.NodeStatus:
        """The status to send: the collector's, with the heartbeat round trip
        (``rtt_seconds``; a new value only once it moved: :func:`rtt_to_send`)."""
        snap = self.status.snapshot()
        cached = self._status_pb
        sent = None if cached is None else cached[1]
        rtt = rtt_to_send(sent, self.session.round_trip(now, 3 * self.interval))
        if cached is None or cached[0] is not snap or rtt != sent:
            msg = convert.status_to_pb(snap)
            if rtt is not None:
                msg.rtt_seconds = rtt
            cached = self._status_pb = (snap, rtt, msg)
        return cached[2]

    def expected_cluster(self) -> str:
        """The cluster identity every arbiter must have ("" while unknown)."""
        return self.check.expected or ""

    def finished(self) -> bool:
        """True once heartbeats must stop (closed, failed, or the session ended)."""
        return self._closed() or self.ended.is_set() or self.session.ended

    def on_ack(self, address: str, ack: pb.HeartbeatAck, now: float) -> None:
        """Takes one ack from ``address``: its identity, suggested interval, then the session.

        Raises:
            ClusterMismatch: the ack names another cluster.
        """
        if not self.check.record(address, ack.cluster, ack.arbiter_id):
            raise ClusterMismatch(self.check.refused[address])
        if ack.instance and ack.instance != self.instance:
            if self.instance:
                log.warning(
                    "%s: the cluster was reset (instance %s, now %s): its leases and "
                    "fencing epoch were the old cluster's; fencing tokens start again "
                    "(compare them with the instance too)",
                    self.node_id,
                    self.instance,
                    ack.instance,
                )
                self.dispatch(self.session.reset(now))
            self.instance = ack.instance
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
        self._follow(address, ack, now)
        self.dispatch(
            self.session.on_ack(
                address,
                seq=ack.seq,
                lease=ack.lease_seconds,
                state=convert.state_from_pb(ack.state) if ack.state else MemberState.JOINING,
                recorded_incarnation=ack.incarnation,
                epoch=ack.epoch,
                now=now,
                cluster_size=ack.cluster_size,
                grace=ack.grace_seconds,
                grace_id=ack.grace_id,
            )
        )
        self.acked.set()

    def _follow(self, address: str, ack: pb.HeartbeatAck, now: float) -> None:
        """Takes the arbiter set of one ack from ``address``; acts on a newer one."""
        self.follower.heard(address, ack.arbiter_id)
        plan = self.follower.offer(
            ((a.id, a.address, a.voter) for a in ack.arbiters), ack.config_index
        )
        if plan is None:
            return
        log.info(
            "%s follows the arbiter configuration at log index %d: voters %s; learners %s",
            self.node_id,
            plan.index,
            ",".join(plan.voters),
            ",".join(plan.learners) or "none",
        )
        for addr in plan.close:
            self.links.pop(addr, None)
            task = self.link_tasks.pop(addr, None)
            if task is not None:
                task.cancel()
        for addr in plan.open:
            link = HeartbeatLink(addr, owner=self, channels=self.channels, backoff=self.backoff)
            self.links[addr] = link
            if self.settled is not None:
                self.start_link(link)
        self.arbiters = list(self.links)
        self.dispatch(self.session.configure(plan.voters, plan.learners, plan.index, now))

    # --- standing -------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """True while links to at least a quorum of arbiters are up (acked)."""
        return sum(link.up for link in self.links.values()) >= self.session.quorum

    def reachability(self) -> str:
        """Which arbiters the heartbeats reach, and why the others fail, in words."""
        d = self._discovery
        if d is not None and not d.settled.is_set():
            waiting = tls.join_reasons(d.unreachable)
            return (
                f"waits for a majority of its {len(self.arbiters)} arbiters to say which "
                f"cluster they are before its first heartbeat "
                f"({len(self.arbiters) - len(d.unreachable)} answered); {waiting}"
            )
        up = sum(link.up for link in self.links.values())
        down = [
            f"{a}: {link.last_error or 'no ack yet'}"
            for a, link in self.links.items()
            if not link.up
        ]
        text = f"reaches {up} of {len(self.arbiters)} arbiters (a quorum is {self.session.quorum})"
        return text + ("; " + "; ".join(down) if down else "")

    # --- session events -------------------------------------------------------------

    def dispatch(self, events: list[SessionEvent]) -> None:
        """Logs session events (and the leases held, when they changed: :class:`LeaseLog`),
        passes them to ``on_event``, and notices the session's end."""
        for ev in events:
            log_session_event(self.node_id, ev)
            if isinstance(ev, (StateChanged, Superseded)):
                self.state_changed.set()
            elif isinstance(ev, Fenced):
                self.fence_changed.set()
            if self._on_event is not None:
                try:
                    self._on_event(ev)
                except Exception:
                    log.exception("on_event callback failed")
        s = self.session  # every change of the leases held passes here (acks, fence ticks)
        self.lease_log.note(s.holders(time.monotonic()), s.voters, s.quorum, self.check.ids)
        if self.session.ended and not self.ended.is_set():
            self.ended.set()
            self.state_changed.set()

    async def _fence_timer(self) -> None:
        while True:
            deadline = self.session.next_deadline()
            expiry = self.session.next_expiry(time.monotonic())  # for lease_log: any lease's end
            if deadline is not None and expiry is not None:
                deadline = min(deadline, expiry)
            delay = 0.05 if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.sleep(delay)
            self.dispatch(self.session.tick(time.monotonic()))

    async def _log_reachability(self) -> None:
        every = self.config.reachability_log_interval
        while not self.finished():
            await asyncio.sleep(every)
            if not self.healthy and not self.finished():
                log.warning(
                    "%s %s: it cannot %s until it does",
                    self.node_id,
                    self.reachability(),
                    "join" if self.session.state is MemberState.JOINING else "keep its leases",
                )

    # --- waits and the leave ----------------------------------------------------------

    async def wait_alive(
        self,
        timeout: float | None,
        error: Callable[[], MembershipError | None],
        closed: Callable[[], bool],
    ) -> None:
        """Waits until the node is ALIVE (see MembershipClient.wait_alive)."""
        session = self.session

        async def _wait() -> None:
            while session.state is not MemberState.ALIVE:
                failed = error()
                if failed is not None:
                    raise failed
                if closed() or session.ended:
                    why = session.end_reason.value if session.end_reason else "closed"
                    raise ClosedError(f"the client ended ({why}) before the node became ALIVE")
                self.state_changed.clear()
                await self.state_changed.wait()

        try:
            async with asyncio.timeout(timeout):
                await _wait()
        except TimeoutError:
            raise TimeoutError(
                f"{self.node_id} not ALIVE within {timeout:g}s: it is "
                f"{session.state.value} and {self.reachability()}"
            ) from None

    def member(self, view: View) -> Member:
        """This node as ``view`` has it, or as ALIVE at its incarnation when the view lags."""
        found = view.get(self.node_id)
        if found is not None and found.incarnation == self.session.incarnation:
            return found
        return Member(
            node_id=self.node_id,
            incarnation=self.session.incarnation,
            state=MemberState.ALIVE,
            labels=self.labels,
        )

    async def wait_fenced(self, fenced: bool, timeout: float | None) -> None:
        """Waits until the node's fencing equals ``fenced`` (see MembershipClient.wait_fenced)."""
        session = self.session

        async def _wait() -> None:
            while session.fenced(time.monotonic()) != fenced:
                self.fence_changed.clear()
                # leases run out without any event: wake at the next deadline too
                deadline = session.next_deadline()
                delay = None if deadline is None else max(0.0, deadline - time.monotonic())
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self.fence_changed.wait()

        try:
            async with asyncio.timeout(timeout):
                await _wait()
        except TimeoutError:
            word = "fenced" if fenced else "unfenced"
            raise TimeoutError(f"{self.node_id} not {word} within {timeout:g}s") from None

    async def leave(self, timeout: float, epoch_now: int) -> int:
        """Commits the node's leave (see MembershipClient.leave); returns the epoch.

        Args:
            timeout: seconds to try for.
            epoch_now: the view epoch the client holds (returned when nothing
                had to be committed).

        Raises:
            RejectedError: the session ended otherwise before.
            UnavailableError: no majority committed it within ``timeout``.
        """
        session = self.session
        if session.end_reason is EndReason.LEFT:
            return self.left_epoch
        if session.ended:
            raise RejectedError(
                f"{self.node_id} cannot leave: its session ended ({session.end_reason})"
            )
        if not session.heard:
            # Nothing can hold this incarnation: no arbiter ever answered it.
            self.dispatch(session.leave(time.monotonic(), joined=False))
            return epoch_now
        session.leaving = True  # an ack saying LEFT from now on is this leave's
        request = pb.LeaveRequest(
            node_id=session.node_id,
            incarnation=session.incarnation,
            cluster=self.check.expected or "",
        )
        deadline = time.monotonic() + timeout
        errors: dict[str, str] = {}
        attempt = 0
        while time.monotonic() < deadline:
            resp = await calls.leave_round(
                self.arbiters,
                self.channels,
                request,
                deadline=deadline,
                call_timeout=self.config.call_timeout,
                errors=errors,
                quorum=session.quorum,
            )
            if resp is calls.NOTHING_TO_LEAVE:
                # A majority never heard this incarnation: nothing can admit it.
                log.info("%s: no majority of arbiters heard it; nothing to leave", self.node_id)
                self.dispatch(session.leave(time.monotonic(), joined=False))
                return epoch_now
            if resp is not None:
                self.left_epoch = int(resp.epoch)
                self.dispatch(session.leave(time.monotonic(), joined=resp.joined))
                return self.left_epoch
            attempt += 1
            await asyncio.sleep(
                min(self.backoff.delay(attempt), max(0.0, deadline - time.monotonic()))
            )
        detail = tls.join_reasons(errors, "no arbiter tried")
        raise UnavailableError(f"leave not committed within {timeout:g}s ({detail})")
