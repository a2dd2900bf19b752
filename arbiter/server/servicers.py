"""The public gRPC API of a replica: thin decode -> driver -> encode.

Bad input ends only the offending stream or call, with INVALID_ARGUMENT or
RESOURCE_EXHAUSTED and a message that says what was wrong; every other
node and subscriber is served as before.

Every ack, event and view carries the replica's cluster identity
(``name@digest`` of its first arbiter set, fixed at the group's first start:
arbiter/server/stored.py); acks, QuorumStatus, Progress and GetView also
carry the arbiter configuration in force and its log index
(arbiter/server/arbiterset.py), which clients follow. A request that names another identity
is refused with FAILED_PRECONDITION before it is acted on, so a client given
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
from typing import Any

import grpc

from arbiter.core.tally import ViewChange
from arbiter.server import limits
from arbiter.server.arbiterset import ArbiterSet, to_protos
from arbiter.server.authz import AllowAll, Authorizer, Refusal
from arbiter.server.decoding import Undecodable, checks_requests, refuse
from arbiter.server.driver import Driver
from arbiter.server.encoding import ViewEncoder
from arbiter.server.heartbeat_path import AckBuilder, ClusterMismatch, HeartbeatChecks
from arbiter.server.hub import Hub, HubStatus
from arbiter.server.limits import LimitExceeded
from arbiter.server.replies import cluster_mismatch, committed, deny, refusal_status
from arbiter.server.shedding import Shed, check_shedding
from arbiter.server.statusboard import StatusBoard
from membership.errors import InvalidArgument
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc
from membership.validation import validate_incarnation, validate_node_id
from membership.view import MemberState, View

__all__ = ["MembershipServicer"]

log = logging.getLogger("arbiter.api")


# Seconds a subscription resuming after an epoch this replica has not applied
# waits for it before OUT_OF_RANGE. A follower in a quorum learns its leader's
# commit index every Raft heartbeat (0.1 s by default) and applies at once, so
# a real epoch arrives well within this; an epoch from before a reset never does.
FUTURE_EPOCH_WAIT = 1.0


class MembershipServicer(pb_grpc.MembershipServicer):
    """Heartbeat, Subscribe, GetView and Leave for one replica.

    Args:
        driver: the replica's driver (cores and loop).
        hub: the fan-out of committed changes to subscribers.
        cluster: this replica's cluster identity, ``name@digest``
            (:func:`arbiter.server.app.cluster_identity`); "" checks nothing.
        authz: who may do what (:mod:`arbiter.server.authz`); default
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
        self.board = StatusBoard()
        self._views = ViewEncoder(driver, self.board)
        self._acks = AckBuilder(driver.replica_id, cluster)
        self._pruned_at = time.monotonic()
        # The configuration in force (set by the server: arbiter/server/arbiterset.py).
        self.arbiters: Callable[[], ArbiterSet] = lambda: ArbiterSet(voters={})
        self._wire: tuple[ArbiterSet, list[pb.Arbiter]] = (ArbiterSet(voters={}), [])

    def _arbiter_set(self) -> tuple[list[pb.Arbiter], int]:
        """The configuration in force on the wire and its index (arbiterset.py rule 2)."""
        now = self.arbiters()
        if self._wire[0] is not now:
            self._wire = (now, to_protos(now))
        return self._wire[1], now.index

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
    async def Heartbeat(
        self,
        request_iterator: AsyncIterator[pb.HeartbeatRequest],  # or an Undecodable
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.HeartbeatAck]:
        """One node's heartbeat stream: an ack for every heartbeat (the stream's checks of
        :mod:`arbiter.server.heartbeat_path` and :mod:`arbiter.server.limits`, then the
        driver's verdict, in one call; the ack copied from the builder's template).

        A request that does not decode ends the stream (:mod:`arbiter.server.decoding`);
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
        checks = HeartbeatChecks(cfg, self.cluster, driver.replica_id)
        vouch = not isinstance(self.authz, AllowAll)  # --insecure: nobody to ask
        self.heartbeat_streams += 1
        counters, last_at = driver.counters, None  # metrics: plain ints, no calls
        board, acks, closing, monotonic = self.board, self._acks, self._closing, time.monotonic
        try:
            async for req in request_iterator:
                if req.__class__ is Undecodable:  # type: ignore[comparison-overlap]
                    await refuse(context, req)
                if vouch:  # the first heartbeat: may the caller speak for its node?
                    vouch = False
                    await self._deny(context, self.authz.node(context, req.node_id))
                counters.heartbeats += 1
                if closing.is_set():
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "arbiter shutting down")
                now = monotonic()
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
                # The stream's interned node id and labels (heartbeat_path rule 5): the
                # records the driver and the board keep share them.
                node_id = checks.node_id
                verdict, standing = driver.heartbeat(
                    node_id, req.incarnation, checks.labels, req.interval_seconds or None, now
                )
                if last_at is not None:
                    counters.interarrival.observe(now - last_at)
                last_at = now
                if verdict.accepted:
                    board.update(node_id, req.incarnation, req.status, now)
                    if now - self._pruned_at > 10.0:
                        self._pruned_at = now
                        board.prune(now)
                counters.acks += 1
                yield acks.ack(req.seq, verdict, standing, self.arbiters())
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
        except limits.NotReading as e:
            # Not context.abort(): its status would wait behind the event gRPC
            # cannot send, and so would this handler, holding the slot. Ended
            # so, the handler returns now; gRPC sends the status after that
            # event, should the subscriber ever read.
            context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
            context.set_details(str(e))
        finally:
            self.subscriptions -= 1

    async def _send(self, context: grpc.aio.ServicerContext, event: pb.MembershipEvent) -> None:
        """Writes one event to a subscriber, or ends the call if it does not read."""
        timeout = self._config.subscriber_write_timeout
        try:
            async with asyncio.timeout(timeout):
                await context.write(event)
        except TimeoutError:
            log.info("subscriber %s does not read: its subscription is ended", context.peer())
            raise limits.NotReading(timeout) from None

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
        status_every = max(self._config.status_interval, request.status_interval_seconds)
        sent: dict[str, tuple[int, tuple[str, ...]]] = {}
        loop = asyncio.get_running_loop()
        next_status = loop.time() if request.include_status else math.inf
        status = self._driver.status()
        await self._send(
            context,
            self._quorum_event(
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
        sub = self._hub.subscribe(request.since_epoch)
        try:
            next_progress = loop.time() + self._config.progress_interval
            while not self._closing.is_set():
                # Status only once the snapshot or catch-up changes are out:
                # a status must never arrive before the view it refers to.
                if loop.time() >= next_status and not sub.queue:
                    for update in self._views.status_updates(sent):
                        await self._send(context, self._event(status=update))
                    next_status = loop.time() + status_every
                item = await sub.get(max(0.0, min(next_progress, next_status) - loop.time()))
                if item is None:
                    if sub.closed:
                        break
                    if loop.time() >= next_progress:
                        await self._send(
                            context,
                            self._event(
                                progress=pb.Progress(
                                    epoch=self._driver.state.epoch,
                                    in_quorum=self._driver.status().in_quorum,
                                    progress_interval_seconds=self._config.progress_interval,
                                    arbiters=self._arbiter_set()[0],
                                    config_index=self._arbiter_set()[1],
                                ),
                            ),
                        )
                        next_progress = loop.time() + self._config.progress_interval
                    continue
                next_progress = loop.time() + self._config.progress_interval
                if isinstance(item, View):
                    event = self._event(snapshot=pb.ViewSnapshot(view=self._views.view_pb(item)))
                elif isinstance(item, ViewChange):
                    event = self._views.change_event(item, self._event)
                else:
                    assert isinstance(item, HubStatus)
                    event = self._quorum_event(item)
                await self._send(context, event)
                if isinstance(item, ViewChange):
                    self._driver.counters.delivered(item.epoch, time.monotonic())
        finally:
            self._hub.unsubscribe(sub)

    def _event(self, **event: Any) -> pb.MembershipEvent:
        """An event to a subscriber, stamped with this replica, its cluster and instance."""
        return pb.MembershipEvent(
            arbiter_id=self._driver.replica_id,
            cluster=self.cluster,
            instance=self._driver.state.instance,
            **event,
        )

    def _quorum_event(self, status: HubStatus) -> pb.MembershipEvent:
        """A subscriber's quorum status event: this replica's standing now or at a change."""
        return self._event(
            quorum=pb.QuorumStatus(
                in_quorum=status.in_quorum,
                leader_id=status.leader_id or "",
                epoch=status.epoch,
                arbiters=self._arbiter_set()[0],
                config_index=self._arbiter_set()[1],
            ),
        )

    async def _wait_for_resume(
        self, since: int, instance: str, context: grpc.aio.ServicerContext
    ) -> None:
        """Waits until this replica can serve a resume after epoch ``since`` of the
        cluster instance ``instance`` ("" unknown), or refuses it (module docstring).

        Another instance's epoch is refused with OUT_OF_RANGE at once. An epoch
        beyond this replica's is waited for; once the replica has been in a
        quorum for FUTURE_EPOCH_WAIT seconds and is still behind, it is refused
        with OUT_OF_RANGE. A replica without quorum cannot tell, and never
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
            if not self._driver.status().in_quorum:
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
            arbiters=self._arbiter_set()[0],
            config_index=self._arbiter_set()[1],
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
