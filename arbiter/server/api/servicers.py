"""The public gRPC API of a replica: thin decode -> driver -> encode.

Bad input ends only the offending stream or call, with INVALID_ARGUMENT or
RESOURCE_EXHAUSTED and a message that says what was wrong; every other
node and subscriber is served as before.

Every ack, event and view carries the replica's cluster identity
(``name@digest`` of its first arbiter set, fixed at the group's first start:
arbiter/server/consensus/stored.py); acks, QuorumStatus, Progress and GetView also
carry the arbiter configuration in force and its log index
(arbiter/server/consensus/arbiterset.py), which clients follow. A request that names
another identity is refused with FAILED_PRECONDITION before it is acted on, so a client given
the replicas of two clusters joins neither by mistake. A subscription that
resumes after an epoch this replica has not reached waits up to
``FUTURE_EPOCH_WAIT`` seconds for it (a follower may lag its leader by a Raft
round); still behind after being in a quorum that long, it ends with
OUT_OF_RANGE: the subscriber holds an epoch the cluster never committed (it
was reset, or the epoch is another cluster's). Events and views also carry
the cluster's instance id (tally rule 10); a resume that names another
instance is refused with OUT_OF_RANGE at once: the cluster was reset since,
and its epochs belong to another history, even where the numbers exist.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable

import grpc

from arbiter.core.labelsets import LabelSets
from arbiter.core.observer import Carrier
from arbiter.core.tally import ViewChange
from arbiter.server.api import limits
from arbiter.server.api.decoding import Undecodable, checks_requests, refuse
from arbiter.server.api.grace_api import grace_call
from arbiter.server.api.heartbeat_path import AckBuilder, ClusterMismatch, HeartbeatChecks
from arbiter.server.api.host_stream import HostEntries, SlowStart
from arbiter.server.api.limits import LimitExceeded
from arbiter.server.api.replies import cluster_mismatch, committed, deny, refusal_status
from arbiter.server.api.shedding import Shed, check_shedding
from arbiter.server.consensus.arbiterset import ArbiterSet
from arbiter.server.consensus.driver import Driver
from arbiter.server.fanout.degradation import DegradedMarks
from arbiter.server.fanout.encoding import ViewEncoder
from arbiter.server.fanout.frames import EventFrames
from arbiter.server.fanout.hub import Hub, HubStatus, Marker, NotReading
from arbiter.server.fanout.statusboard import StatusBoard
from arbiter.server.load.readlag import HostBases, ReadLag, StreamBase
from arbiter.server.net.authz import AllowAll, Authorizer, Refusal
from membership.shared.errors import InvalidArgument
from membership.shared.validation import validate_incarnation, validate_node_id
from membership.shared.view import MemberState, View
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc

__all__ = ["MembershipServicer"]

log = logging.getLogger("arbiter.api")


# Seconds a subscription resuming after an epoch this replica has not applied
# waits for it before OUT_OF_RANGE. A follower in a quorum learns its leader's
# commit index every Raft heartbeat (0.1 s by default) and applies at once, so
# a real epoch arrives well within this; an epoch from before a reset never does.
FUTURE_EPOCH_WAIT = 1.0


class MembershipServicer(pb_grpc.MembershipServicer):
    """Heartbeat, Subscribe, GetView, Leave and Grace for one replica.

    Args:
        driver: the replica's driver (cores and loop).
        hub: the fan-out of committed changes to subscribers.
        cluster: this replica's cluster identity, ``name@digest``
            (:func:`arbiter.server.app.cluster_identity`); "" checks nothing.
        authz: who may do what (:mod:`arbiter.server.net.authz`); default
            :class:`AllowAll` (``--insecure``).
    """

    def __init__(
        self, driver: Driver, hub: Hub, cluster: str = "", authz: Authorizer | None = None
    ) -> None:
        self.authz: Authorizer = authz or AllowAll()
        self._driver = driver
        self._hub = hub
        self.cluster = cluster
        self._config = driver.config
        self._closing = asyncio.Event()
        self.heartbeat_streams = 0
        self.subscriptions = 0
        self.board = StatusBoard(step_window=driver.config.degraded_step_window)
        self.degraded = DegradedMarks(driver, self.board, driver.config.degraded_policy())
        self._views = ViewEncoder(driver, self.board, self.degraded)
        self._acks = AckBuilder(driver.replica_id, cluster)
        self._labelsets = LabelSets()  # one copy of each label set for every stream
        self._pruned_at = time.monotonic()
        # Queueing delay of the heartbeats read (arbiter/server/load/readlag.py): a lateness source.
        self.read_lag = ReadLag()
        self.host_bases = HostBases()  # readlag rule 1b
        # The configuration in force (set by the server: arbiter/server/consensus/arbiterset.py).
        self.arbiters: Callable[[], ArbiterSet] = lambda: ArbiterSet(voters={})
        self._frames = EventFrames(
            driver, self._views, cluster, lambda: self.arbiters(), self._config.progress_interval
        )

    def close(self) -> None:
        """Shutdown: heartbeat streams end with UNAVAILABLE so nodes go elsewhere."""
        self._closing.set()
        self._hub.close_all()

    @staticmethod
    async def _deny(context: grpc.aio.ServicerContext, refusal: Refusal | None) -> None:
        """Ends the call with the authorizer's refusal, if there is one."""
        await deny(context, refusal)

    def _cluster_mismatch(self, expected: str, who: str) -> str | None:
        """The refusal for a request expecting cluster ``expected`` (None when it matches)."""
        return cluster_mismatch(self.cluster, self._driver.replica_id, expected, who)

    @checks_requests
    async def Heartbeat(  # type: ignore[override]  # writes bytes (frames.add_membership_service)
        self,
        request_iterator: AsyncIterator[pb.HeartbeatRequest],  # or an Undecodable
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[bytes]:
        """One node's heartbeat stream: an ack for every heartbeat (the stream's checks of
        :mod:`arbiter.server.api.heartbeat_path` and :mod:`arbiter.server.api.limits`, then the
        driver's verdict, in one call; the ack serialised from the builder's template,
        sent as it is: :func:`arbiter.server.fanout.frames.add_membership_service`).

        A request that does not decode ends the stream (:mod:`arbiter.server.api.decoding`);
        under mutual TLS the caller must be allowed to speak for the first heartbeat's
        node id, which the stream rules then hold for the whole stream. Both are checked
        here rather than by wrapping the request iterator: a stream lives as long as
        its node, and a wrapper per stream costs memory per node.
        """
        cfg = self._config
        driver = self._driver
        refusal = limits.stream_slot(
            "max_heartbeat_streams", self.heartbeat_streams, cfg, driver.replica_id
        )
        if refusal is not None:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        checks = HeartbeatChecks(cfg, self.cluster, driver.replica_id, self._labelsets)
        vouch = not isinstance(self.authz, AllowAll)  # --insecure: nobody to ask
        self.heartbeat_streams += 1
        counters, last_at = driver.counters, None  # metrics: plain ints, no calls
        board, acks, closing, monotonic = self.board, self._acks, self._closing, time.monotonic
        read_lag, base, wall = self.read_lag, StreamBase(), time.time
        host = self.host_bases.of(context.peer(), time.monotonic())  # readlag rule 1b
        try:
            async for req in request_iterator:
                if req.__class__ is Undecodable:  # type: ignore[comparison-overlap]
                    await refuse(context, req)
                if vouch:  # the first heartbeat: may the caller speak for its node?
                    vouch = False
                    await self._deny(context, self.authz.node(context, req.node_id))
                counters.heartbeats += 1
                now = monotonic()
                if 0.0 < req.send_time_unix < math.inf:  # readlag rule 1 (NaN: no)
                    read_lag.add(base.queued(wall() - req.send_time_unix, now, read_lag, host), now)
                if closing.is_set():
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "arbiter shutting down")
                try:
                    wait, first = checks.check(req, now)
                    if first:
                        limits.check_new_node(driver, cfg.max_nodes, req.node_id)
                        check_shedding(driver, req.node_id, now)
                except InvalidArgument as e:
                    log.info("heartbeat refused from %s: %s", context.peer(), e)
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                except LimitExceeded as e:  # a Shed carries its retry hint (shedding.py)
                    (log.debug if isinstance(e, Shed) else log.info)(
                        "heartbeat stream cut from %s: %s", context.peer(), e
                    )
                    await context.abort(e.code, str(e), trailing_metadata=e.trailing)
                except ClusterMismatch as e:
                    log.info("heartbeat refused from %s: %s", context.peer(), e)
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
                if wait > 0:
                    # Throttled (limits rule 3): handled, and acked, once its token is there.
                    await asyncio.sleep(wait)
                    now = monotonic()
                # The stream's interned node id, its one incarnation int and its labels
                # (heartbeat_path rule 5): the records the driver and the board keep
                # share them.
                node_id, incarnation = checks.node_id, checks.incarnation
                verdict, standing = driver.heartbeat(
                    node_id, incarnation, checks.labels, req.interval_seconds or None, now
                )
                if last_at is not None:
                    counters.interarrival.observe(now - last_at)
                last_at = now
                if verdict.accepted:
                    board.update(node_id, incarnation, req.status, now)
                    if now - self._pruned_at > 10.0:
                        self._pruned_at = now
                        board.prune(now)
                counters.acks += 1
                ack = acks.ack(req.seq, verdict, standing, self.arbiters())
                slow_start = verdict.accepted and not verdict.lease
                # The frame waits at the yield for as long as the node lives: what it
                # holds there is held per node, and the next heartbeat needs no verdict.
                del verdict, standing
                yield ack
                if slow_start:  # resumed once the ack is sent: the node waited for it
                    driver.acked(node_id, incarnation, req.interval_seconds or None, monotonic())
        finally:
            self.heartbeat_streams -= 1

    async def HostHeartbeat(  # type: ignore[override]  # writes bytes, as Heartbeat
        self,
        request_iterator: AsyncIterator[pb.HeartbeatRequest],  # or an Undecodable
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[bytes]:
        """A host's heartbeat stream: one request per interval with an entry per node id
        the agent vouches for, one ack with an entry ack each
        (:mod:`arbiter.server.api.host_stream`); each entry is given to the driver as
        one heartbeat of its node id, as :meth:`Heartbeat` gives its requests.
        """
        cfg = self._config
        driver = self._driver
        refusal = limits.stream_slot(
            "max_heartbeat_streams", self.heartbeat_streams, cfg, driver.replica_id
        )
        if refusal is not None:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        authz = self.authz
        secure = not isinstance(authz, AllowAll)

        def may_speak(node_id: str) -> str | None:
            why = authz.node(context, node_id)
            return None if why is None else str(why)

        host = HostEntries(
            cfg, self.cluster, driver.replica_id, self._labelsets, may_speak if secure else None
        )
        self.heartbeat_streams += 1
        counters, last_at = driver.counters, None
        board, acks, closing, monotonic = self.board, self._acks, self._closing, time.monotonic
        read_lag, base, wall = self.read_lag, StreamBase(), time.time
        peer = context.peer()
        lag_host = self.host_bases.of(peer, monotonic())
        first = True
        carrier = Carrier()  # this stream's nodes (observer rule 8)
        try:
            async for req in request_iterator:
                if req.__class__ is Undecodable:  # type: ignore[comparison-overlap]
                    await refuse(context, req)
                if first and secure:  # a caller without a certificate ends here
                    first = False
                    no_cert = authz.node(context, "")
                    if no_cert is not None and no_cert.code != grpc.StatusCode.PERMISSION_DENIED:
                        await self._deny(context, no_cert)
                now = monotonic()
                if 0.0 < req.send_time_unix < math.inf:  # readlag rule 1 (NaN: no)
                    read_lag.add(
                        base.queued(wall() - req.send_time_unix, now, read_lag, lag_host), now
                    )
                if closing.is_set():
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "arbiter shutting down")
                try:
                    host.check_request(req)
                except InvalidArgument as e:
                    log.info("host heartbeat refused from %s: %s", peer, e)
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                except ClusterMismatch as e:
                    log.info("host heartbeat refused from %s: %s", peer, e)
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
                entries, wait = host.check_entries(req, driver, now)
                if wait > 0:
                    await asyncio.sleep(wait)  # throttled (host_stream rule 6)
                    now = monotonic()
                if last_at is not None:
                    counters.interarrival.observe(now - last_at)
                last_at = now
                slow: list[SlowStart] = []
                answers = []
                standing = None
                for entry, checks, ack in entries:
                    answers.append(ack)
                    if checks is None:
                        continue  # refused alone (host_stream rule 2)
                    counters.heartbeats += 1
                    node_id, incarnation = checks.node_id, checks.incarnation
                    interval = entry.interval_seconds or None
                    verdict, standing = driver.heartbeat(
                        node_id, incarnation, checks.labels, interval, now, carrier
                    )
                    if verdict.accepted:
                        board.update(node_id, incarnation, entry.status, now)
                        if not verdict.lease:
                            slow.append((node_id, incarnation, interval))
                    HostEntries.answer(ack, verdict)
                    counters.acks += 1
                if standing is None:
                    standing = driver.standings.now(now)
                if now - self._pruned_at > 10.0:
                    self._pruned_at = now
                    board.prune(now)
                frame = acks.host_ack(req.seq, answers, standing, self.arbiters())
                del entries, answers, standing
                yield frame
                for node_id, incarnation, interval in slow:  # slow start, as Heartbeat
                    driver.acked(node_id, incarnation, interval, monotonic())
        finally:
            self.heartbeat_streams -= 1

    async def Subscribe(  # type: ignore[override]  # writes with context.write (a timeout)
        self, request: pb.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """Snapshot or resumed changes, then every change, quorum status and progress.

        With ``include_status``, also StatusUpdate events: every node whose
        status or suspicions changed, at most once per status interval.

        At most ``max_subscribers`` at once; an event that gRPC does not take
        within ``subscriber_write_timeout`` (the subscriber does not read)
        ends the call, both with RESOURCE_EXHAUSTED.
        """
        await self._deny(context, self.authz.reader(context))
        cfg = self._config
        refusal = limits.stream_slot(
            "max_subscribers", self.subscriptions, cfg, self._driver.replica_id
        )
        if refusal is not None:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        self.subscriptions += 1
        try:
            await self._subscription(request, context)
        except NotReading as e:
            log.info("subscriber %s does not read: its subscription is ended", context.peer())
            # Not context.abort(): its status would wait behind the event gRPC
            # cannot send, and so would this handler, holding the slot. Ended
            # so, the handler returns now; gRPC sends the status after that
            # event, should the subscriber ever read.
            context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
            context.set_details(str(e))
        finally:
            self.subscriptions -= 1

    async def _send(self, context: grpc.aio.ServicerContext, data: bytes) -> None:
        """Writes one event (serialised) to a subscriber not yet in the hub, or ends the
        call if it does not read."""
        timeout = self._config.subscriber_write_timeout
        try:
            async with asyncio.timeout(timeout):
                await context.write(data)
        except TimeoutError:
            raise NotReading(timeout) from None

    def _in_quorum(self) -> bool:
        """Whether this replica is in a quorum, as the driver last published it (its
        turns are at most 0.05 s apart) or, before that, now."""
        status = self._hub.status
        return self._driver.status().in_quorum if status is None else status.in_quorum

    async def _subscription(
        self, request: pb.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> None:
        refusal = self._cluster_mismatch(request.cluster, "subscriber")
        if refusal is not None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        if not (
            math.isfinite(request.status_interval_seconds) and request.status_interval_seconds >= 0
        ):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"status_interval_seconds must be a number >= 0, got "
                f"{request.status_interval_seconds}",
            )
        # Never more often than the configured interval: a subscriber may only ask for less.
        status_every = (
            max(self._config.status_interval, request.status_interval_seconds)
            if request.include_status
            else math.inf
        )
        status = self._driver.status()
        frames = self._frames
        await self._send(
            context,
            frames.quorum(
                HubStatus(
                    in_quorum=status.in_quorum, leader_id=status.leader_id, epoch=status.epoch
                )
            ),
        )
        state = self._driver.state
        if request.since_epoch > 0 and (
            request.since_epoch > state.epoch
            or (request.instance and request.instance != state.instance)
        ):
            await self._wait_for_resume(request.since_epoch, request.instance, context)
        sub = self._hub.subscribe(
            request.since_epoch, status_every, asyncio.get_running_loop().time()
        )
        # The fan-out's hot path (hub.py rules): bytes made once per replica, one
        # write per item, no timer of its own.
        write, timeout, counters = context.write, self._hub.write_timeout, self._driver.counters
        sent: dict[str, tuple[object, ...]] = {}
        try:
            while not self._closing.is_set():
                item = await sub.get()
                if isinstance(item, ViewChange):
                    await sub.write(write, frames.change(item), timeout)
                    counters.delivered(item.epoch, time.monotonic())
                elif item is Marker.PROGRESS:
                    await sub.write(write, frames.progress(self._in_quorum()), timeout)
                elif isinstance(item, View):
                    await sub.write(write, frames.snapshot(item), timeout)
                elif isinstance(item, HubStatus):
                    await sub.write(write, frames.quorum(item), timeout)
                elif item is Marker.STATUS:
                    # After the snapshot or catch-up changes: never before the view
                    # it refers to (the marker was queued behind them).
                    for update in self._views.status_updates(sent):
                        data = frames.event(status=update).SerializeToString()
                        await sub.write(write, data, timeout)
                else:
                    break  # closed
        finally:
            self._hub.unsubscribe(sub)

    async def _wait_for_resume(
        self, since: int, instance: str, context: grpc.aio.ServicerContext
    ) -> None:
        """Waits until this replica can serve a resume after epoch ``since`` of the
        cluster instance ``instance`` ("" unknown), or refuses it (module docstring).

        Another instance's epoch is refused with OUT_OF_RANGE at once. An epoch
        beyond this replica's is waited for; once the replica has been in a
        quorum for FUTURE_EPOCH_WAIT seconds and is still behind, it is refused
        with OUT_OF_RANGE (the wait counts only while it has applied every entry
        it knows committed). A replica without quorum cannot tell, and never
        serves another history: it keeps waiting (its subscriber, told
        ``in_quorum = false``, goes elsewhere); so does a replica that does
        not know its instance yet when the subscriber names one.
        """
        loop = asyncio.get_running_loop()
        in_quorum_since: float | None = None
        while not self._closing.is_set():
            state = self._driver.state
            if instance and state.instance and instance != state.instance:
                await context.abort(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"since_epoch {since} is of another instance of this cluster ({instance}; "
                    f"it is {state.instance} now): the cluster was reset since; resume from 0 "
                    "for a fresh snapshot",
                )
            if state.epoch >= since and (not instance or state.instance):
                return
            now = loop.time()
            raft = self._driver.raft.status()
            if not self._driver.status().in_quorum or raft.applied < raft.commit:
                # Out of quorum it cannot tell; with committed entries still to
                # apply it is behind its own log, not the subscriber ahead of it.
                in_quorum_since = None
            elif in_quorum_since is None:
                in_quorum_since = now
            elif now - in_quorum_since >= FUTURE_EPOCH_WAIT and state.epoch < since:
                await context.abort(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"since_epoch {since} is beyond the cluster's epoch {state.epoch} "
                    "(was the cluster reset, or is that epoch another cluster's?); "
                    "resume from 0 for a fresh snapshot",
                )
            # An instance named but not known here yet (a cluster just started:
            # its leader's Bootstrap is on its way): wait for it.
            await asyncio.sleep(0.05)

    async def GetView(
        self, request: pb.GetViewRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetViewResponse:
        """The committed view as this replica has applied it (only its standing and
        epoch with ``summary``)."""
        await self._deny(context, self.authz.reader(context))
        status = self._driver.status()
        if request.summary:
            view = pb.View(epoch=status.epoch)
        else:
            view = self._views.view_pb(self._driver.state.view(), with_status=True)
        return pb.GetViewResponse(
            view=view,
            arbiter_id=status.arbiter_id,
            leader_id=status.leader_id or "",
            in_quorum=status.in_quorum,
            term=status.term,
            local_suspects=[] if request.summary else self._driver.local_suspects(),
            cluster=self.cluster,
            instance=self._driver.state.instance,
            arbiters=self._frames.arbiter_set()[0],
            config_index=self._frames.arbiter_set()[1],
        )

    async def Leave(
        self, request: pb.LeaveRequest, context: grpc.aio.ServicerContext
    ) -> pb.LeaveResponse:
        """Commits LEFT for the node's incarnation (or retires an incarnation that
        is joining); answers once applied here.

        A leave the tally would refuse (its rule 5) is refused before it is
        proposed, so it commits nothing: NOT_FOUND for an id the cluster never
        heard, FAILED_PRECONDITION for an incarnation below the recorded one,
        one already DEAD, or one above it that no arbiter heard (the message
        says what this arbiter records). A leave of an incarnation already
        LEFT answers as the first one did.
        """
        await self._deny(context, self.authz.node(context, request.node_id))
        try:
            validate_node_id(request.node_id)
        except InvalidArgument as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        refusal = self._cluster_mismatch(request.cluster, f"node {request.node_id}")
        if refusal is not None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        try:
            validate_incarnation(request.incarnation)
        except InvalidArgument as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        node_id, incarnation = request.node_id, request.incarnation
        me = self._driver.replica_id

        def already_left() -> pb.LeaveResponse | None:
            member = self._driver.state.member(node_id)
            if (
                member is not None
                and member.state is MemberState.LEFT
                and member.incarnation == incarnation
            ):
                return pb.LeaveResponse(epoch=member.epoch, joined=True)
            return None

        heard_by = me if self._driver.heard(node_id) == incarnation else ""
        judged, reason = self._driver.state.judge_leave(node_id, incarnation, heard_by)
        if judged is not None:
            done = already_left()
            if done is not None:
                return done
            log.info("leave of %s incarnation %d refused: %s", node_id, incarnation, reason)
            await context.abort(refusal_status(judged), f"arbiter {me}: {reason}")
        outcome = await committed(
            context,
            self._driver.leave(node_id, incarnation, timeout=self._config.election_timeout * 3),
            "leave",
        )
        if outcome.refusal is not None:
            done = already_left()
            if done is not None:
                return done
            await context.abort(refusal_status(outcome.refusal), outcome.reason)
        return pb.LeaveResponse(epoch=outcome.epoch, joined=outcome.joined)

    async def Grace(
        self, request: pb.GraceRequest, context: grpc.aio.ServicerContext
    ) -> pb.GraceResponse:
        """Commits the node's grace window, or its end (:mod:`arbiter.server.api.grace_api`)."""
        return await grace_call(self._driver, self.authz, self.cluster, request, context)
