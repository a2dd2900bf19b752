"""The asyncio shell of a watch: subscriptions opened, hedged and replaced as the feed decides.

:class:`Watcher` opens ``Subscribe`` calls to the arbiters and feeds what they
send (and how they fail) into :class:`membership._watch.feed.FeedState`, the
sans-I/O core that decides what to pass on, when to resubscribe and when the
watcher is blind. What it adds is I/O:

1. Hedged opening (J. Dean and L. A. Barroso, "The Tail at Scale", CACM
   2013): a subscription is opened on the preferred arbiter first; if that
   one has not answered that it is in a quorum within ``subscribe_hedge``
   seconds (a frozen replica, a half-open connection, a replica without
   quorum), every other arbiter is asked too, and the first that answers in
   a quorum serves; the others are cancelled. When none is in a quorum, the
   first that answered serves (its status says so) while a probe looks for
   one that is.
2. A round in which every arbiter failed is followed by a jittered
   exponential backoff (:class:`membership.shared.backoff.Backoff`).
3. Every arbiter's first message names its cluster; one of another cluster
   ends the watch with :class:`~membership.shared.errors.ClusterMismatch`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from membership._aiotools import reap
from membership._arbiters.arbiterset import ArbiterFollower
from membership._arbiters.identity import ClusterCheck
from membership._arbiters.transport import Channels
from membership._config import ClientConfig
from membership._watch.feed import FeedState
from membership.shared import convert
from membership.shared.backoff import Backoff
from membership.shared.errors import ClusterMismatch, InvalidArgument
from membership.shared.view import QuorumChanged, View, ViewEvent
from membership.v1 import membership_pb2 as pb

__all__ = ["Watcher"]

log = logging.getLogger("membership.subscription")


@dataclass(eq=False)
class _Call:
    """One Subscribe call: its address and the read in flight (never cancelled alone:
    cancelling a read cancels the whole call)."""

    address: str
    call: Any
    read: asyncio.Future[Any] = field(init=False)
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.read = asyncio.ensure_future(self.call.read())

    def next_read(self) -> None:
        self.read = asyncio.ensure_future(self.call.read())

    async def cancel(self) -> None:
        self.call.cancel()
        await reap(self.read)


class Watcher:
    """One watch over the arbiters (see the module rules).

    Args:
        addresses: every arbiter's ``host:port``.
        channels: the client's channels.
        config: the client's configuration.
        check: the client's cluster identity check.
        since_epoch: the last epoch the caller holds (0: a snapshot first).
        status: also pass StatusUpdated events on.
        status_interval: seconds between status events (0: the arbiter's).
        reset_if_ahead: on a future epoch, start again from a snapshot
            (ViewReset) instead of raising EpochOutOfRange.
        closed: returns True once the client is closed (the watch ends).
        on_view: called with the view after every event that changed it.
        backoff: the backoff between failed rounds.
        instance: the cluster instance ``since_epoch`` belongs to ("" unknown).
        settled: set once the client knows which cluster it talks to (no
            subscription starts before; None: at once).

    Raises:
        InvalidArgument: for a negative or non-integer epoch, or a bad status interval.
    """

    def __init__(
        self,
        *,
        addresses: Sequence[str],
        channels: Channels,
        config: ClientConfig,
        check: ClusterCheck,
        since_epoch: int,
        status: bool,
        status_interval: float,
        reset_if_ahead: bool,
        closed: Callable[[], bool],
        on_view: Callable[[View], None],
        backoff: Backoff,
        instance: str = "",
        settled: asyncio.Event | None = None,
    ) -> None:
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
        self._addresses = list(addresses)
        self._follower = ArbiterFollower(self._addresses)  # membership/_arbiters/arbiterset.py
        self._settled = settled
        self._settling: asyncio.Future[Any] | None = None
        self._channels = channels
        self._config = config
        self._check = check
        self._status = status
        self._status_interval = status_interval
        self._closed = closed
        self._on_view = on_view
        self._backoff = backoff
        self.feed = FeedState(
            since_epoch=since_epoch,
            include_status=status,
            idle_timeout=config.stream_idle_timeout,
            disconnect_after=config.disconnect_after,
            probe_interval=config.failover_probe_interval,
            reset_if_ahead=reset_if_ahead,
            arbiters=len(self._addresses),
            instance=instance,
            now=time.monotonic(),
        )
        self._serving: _Call | None = None
        self._attempts: dict[str, _Call] = {}
        self._fallback: tuple[_Call, Any, Any] | None = None  # (call, first message, event)
        self._queue: list[str] = []  # addresses still to try in this round
        self._hedge_at: float | None = None
        self._retry_at = 0.0
        self._failures = 0
        self._probe: asyncio.Task[str | None] | None = None
        self._last_index = 0

    async def events(self) -> AsyncIterator[ViewEvent]:
        """Yields the watch's events until the client closes.

        Raises:
            ClusterMismatch: an arbiter belongs to another cluster.
            EpochOutOfRange: ``since_epoch`` is beyond the cluster's epoch
                (unless ``reset_if_ahead``).
            InvalidArgument: an arbiter refused the subscription's arguments.
        """
        try:
            while not self._closed():
                now = time.monotonic()
                self._maybe_start_round(now)
                self._maybe_hedge(now)
                if self._probe is None and self.feed.wants_probe(now):
                    self._probe = asyncio.ensure_future(self._find_quorum())
                waiting = [c.read for c in self._attempts.values()]
                if self._serving is not None:
                    waiting.append(self._serving.read)
                if self._probe is not None:
                    waiting.append(self._probe)
                if self._settled is not None and not self._settled.is_set():
                    if self._settling is None:
                        self._settling = asyncio.ensure_future(self._settled.wait())
                    waiting.append(self._settling)
                deadline = self.feed.next_deadline()
                if self._hedge_at is not None:
                    deadline = min(deadline, self._hedge_at)
                for c in self._attempts.values():
                    deadline = min(deadline, c.started + self.feed.idle_timeout)
                if self._serving is None and not self._attempts:
                    deadline = min(deadline, self._retry_at)
                timeout = max(0.0, min(deadline - time.monotonic(), 1.0))
                if waiting:
                    await asyncio.wait(waiting, timeout=timeout, return_when="FIRST_COMPLETED")
                else:
                    await asyncio.sleep(timeout)
                now = time.monotonic()
                for ev in self._take_probe():
                    yield ev
                for addr in [a for a, c in self._attempts.items() if c.read.done()]:
                    if addr not in self._attempts:
                        continue  # cancelled: another attempt won meanwhile
                    for ev in await self._attempt_done(addr, now):
                        yield ev
                for ev in await self._give_up_silent_attempts(now):
                    yield ev
                if self._serving is not None and self._serving.read.done():
                    for ev in await self._serving_done(now):
                        yield ev
                for ev in self.feed.tick(now):
                    yield ev
                await self._maybe_resubscribe()
        finally:
            await self._cancel_all()

    # --- rounds ---------------------------------------------------------------------

    def _order(self, prefer: str | None, avoid: str | None) -> list[str]:
        n = len(self._addresses)
        order = [self._addresses[(self._last_index + i) % n] for i in range(n)]
        order = [a for a in order if a not in self._check.refused] or order
        if avoid in order and len(order) > 1:
            order.remove(avoid)
            order.append(avoid)
        if prefer in order:
            order.remove(prefer)
            order.insert(0, prefer)
        return order

    def _maybe_start_round(self, now: float) -> None:
        if self._serving is not None or self._attempts or now < self._retry_at:
            return
        if self._settled is not None and not self._settled.is_set():
            return  # not before the client knows which cluster it talks to
        decision = self.feed.take_resubscribe()
        prefer = decision.prefer if decision else None
        avoid = decision.avoid if decision else None
        if decision is not None:
            log.debug("subscribing: %s", decision.reason)
        self._queue = self._order(prefer, avoid)
        self._fallback = None
        self._start(self._queue.pop(0))
        self._hedge_at = now + self._config.subscribe_hedge

    def _maybe_hedge(self, now: float) -> None:
        if self._hedge_at is None or now < self._hedge_at or self._serving is not None:
            return
        self._hedge_at = None
        while self._queue:
            self._start(self._queue.pop(0))

    def _start(self, address: str) -> None:
        request = pb.SubscribeRequest(
            since_epoch=self.feed.last_epoch,
            include_status=self._status,
            status_interval_seconds=self._status_interval,
            cluster=self._check.expected or "",
            instance=self.feed.instance,
        )
        self._attempts[address] = _Call(address, self._channels.stub(address).Subscribe(request))

    async def _attempt_done(self, address: str, now: float) -> list[ViewEvent]:
        attempt = self._attempts.pop(address)
        try:
            msg = attempt.read.result()
        except grpc.aio.AioRpcError as e:
            self._refused(address, e)
            self.feed.on_failure(address, f"{e.code().name}: {e.details()}", now)
            return await self._round_over(now)
        except asyncio.CancelledError:
            return await self._round_over(now)
        if msg is grpc.aio.EOF:
            self.feed.on_failure(address, "ended the subscription", now)
            return await self._round_over(now)
        was_refused = address in self._check.refused
        if not self._check.record(address, msg.cluster, msg.arbiter_id):
            # Identity rule 3: a stranger found after the client settled.
            if not was_refused:
                log.error("arbiter %s refused: %s", address, self._check.refused[address])
            if self._check.lost():
                raise ClusterMismatch(
                    "most of the arbiters given now belong to another cluster: "
                    + "; ".join(self._check.refused.values())
                )
            await attempt.cancel()
            self.feed.on_failure(address, self._check.refused[address], now)
            return await self._round_over(now)
        ev = convert.event_from_pb(msg)
        if isinstance(ev, QuorumChanged) and ev.in_quorum:
            return await self._serve(attempt, msg, ev, now)
        # Not in a quorum: keep it in case no arbiter is, and ask the others now.
        if self._fallback is None:
            self._fallback = (attempt, msg, ev)
        else:
            await attempt.cancel()
        self._hedge_at = now
        self._maybe_hedge(now)
        return await self._round_over(now)

    async def _give_up_silent_attempts(self, now: float) -> list[ViewEvent]:
        """Cancels attempts that brought nothing for the idle timeout (a frozen arbiter)."""
        events: list[ViewEvent] = []
        for addr, attempt in list(self._attempts.items()):
            waited = now - attempt.started
            if waited >= self.feed.idle_timeout and not attempt.read.done():
                del self._attempts[addr]
                await attempt.cancel()
                self.feed.on_failure(addr, f"no answer for {waited:.1f}s", now)
                events += await self._round_over(now)
        return events

    async def _round_over(self, now: float) -> list[ViewEvent]:
        """Called when an attempt ended without serving: serve the fallback or back off."""
        if self._attempts or self._serving is not None:
            return []
        if self._queue:
            self._hedge_at = now
            self._maybe_hedge(now)
            return []
        if self._fallback is not None:
            attempt, msg, ev = self._fallback
            self._fallback = None
            return await self._serve(attempt, msg, ev, now)
        self._failures += 1
        self._retry_at = now + self._backoff.delay(self._failures)
        return []

    async def _serve(self, attempt: _Call, msg: Any, ev: Any, now: float) -> list[ViewEvent]:
        for other in list(self._attempts.values()):
            await other.cancel()
        self._attempts.clear()
        if self._fallback is not None and self._fallback[0] is not attempt:
            await self._fallback[0].cancel()
        self._fallback = None
        self._queue = []
        self._hedge_at = None
        self._failures = 0
        if attempt.address in self._addresses:
            self._last_index = self._addresses.index(attempt.address)
        self._serving = attempt
        self._follow(attempt.address, msg)
        attempt.next_read()
        epoch = msg.quorum.epoch if msg.WhichOneof("event") == "quorum" else 0
        reset = self.feed.opened(
            attempt.address, msg.arbiter_id, now, instance=msg.instance, epoch=epoch
        )
        if reset:  # another instance of the cluster: start again from a snapshot
            self._serving = None
            await attempt.cancel()
            return self._passed_on(reset)
        log.debug("subscribed to %s (%s)", attempt.address, msg.arbiter_id)
        return self._passed_on(self.feed.on_event(attempt.address, ev, now))

    async def _serving_done(self, now: float) -> list[ViewEvent]:
        serving = self._serving
        assert serving is not None
        try:
            msg = serving.read.result()
        except grpc.aio.AioRpcError as e:
            self._serving = None
            if e.code() == grpc.StatusCode.OUT_OF_RANGE:
                return self._passed_on(self.feed.on_out_of_range(serving.address, now))
            self._refused(serving.address, e)
            self.feed.on_failure(serving.address, f"{e.code().name}: {e.details()}", now)
            return []
        if msg is grpc.aio.EOF:
            self._serving = None
            self.feed.on_failure(serving.address, "ended the subscription", now)
            return []
        serving.next_read()
        self._follow(serving.address, msg)
        ev = convert.event_from_pb(msg)
        if ev is None:
            return []
        return self._passed_on(self.feed.on_event(serving.address, ev, now))

    def _follow(self, address: str, msg: Any) -> None:
        """The arbiters to subscribe to follow the set QuorumStatus and Progress carry
        (membership/_arbiters/arbiterset.py): an added arbiter is tried in the next rounds, a
        removed one no more (the one serving, when removed, stops and is left)."""
        kind = msg.WhichOneof("event")
        if kind not in ("quorum", "progress"):
            return
        inner = getattr(msg, kind)
        self._follower.heard(address, msg.arbiter_id)
        plan = self._follower.offer(
            ((a.id, a.address, a.voter) for a in inner.arbiters), inner.config_index
        )
        if plan is None:
            return
        self._addresses = list(self._follower.links)
        self._last_index = 0
        log.info(
            "watch follows the arbiter configuration at log index %d: %s",
            plan.index,
            ",".join(self._addresses),
        )

    def _refused(self, address: str, e: grpc.aio.AioRpcError) -> None:
        detail = e.details() or ""
        if e.code() == grpc.StatusCode.FAILED_PRECONDITION and "cluster mismatch" in detail:
            raise ClusterMismatch(f"{address}: {detail}")
        if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
            raise InvalidArgument(f"{address} refused the subscription: {detail}") from None
        log.debug("subscription to %s failed: %s %s", address, e.code().name, detail)

    def _passed_on(self, events: list[ViewEvent]) -> list[ViewEvent]:
        if events:
            self._on_view(self.feed.view)
        return events

    async def _maybe_resubscribe(self) -> None:
        """Leaves the serving subscription when the feed decided to (the next round
        takes the decision, with its preference)."""
        decision = self.feed.pending
        if self._serving is None or decision is None:
            return
        log.debug("subscription to %s: %s", self._serving.address, decision.reason)
        serving, self._serving = self._serving, None
        await serving.cancel()
        self.feed.on_failure(serving.address, decision.reason, time.monotonic())

    # --- probes ---------------------------------------------------------------------

    async def _find_quorum(self) -> str | None:
        """The first other arbiter that says it is in a quorum (asked in parallel), or None."""
        serving = self._serving.address if self._serving else None
        others = [a for a in self._addresses if a != serving]
        if not others:
            return None
        timeout = min(1.0, self._config.call_timeout)

        async def ask(addr: str) -> str | None:
            try:
                resp = await self._channels.summary(addr, timeout)
            except grpc.aio.AioRpcError:
                return None
            return addr if resp.in_quorum else None

        tasks = [asyncio.ensure_future(ask(a)) for a in others]
        try:
            for done in asyncio.as_completed(tasks):
                found = await done
                if found is not None:
                    return found
        finally:
            for t in tasks:
                await reap(t)
        return None

    def _take_probe(self) -> list[ViewEvent]:
        probe = self._probe
        if probe is None or not probe.done():
            return []
        self._probe = None
        found = None if probe.cancelled() or probe.exception() else probe.result()
        if found is not None:
            self.feed.quorum_found(found)
        return []

    async def _cancel_all(self) -> None:
        for attempt in list(self._attempts.values()):
            await attempt.cancel()
        self._attempts.clear()
        if self._fallback is not None:
            await self._fallback[0].cancel()
            self._fallback = None
        if self._serving is not None:
            await self._serving.cancel()
            self._serving = None
        if self._probe is not None:
            await reap(self._probe)
            self._probe = None
        if self._settling is not None:
            await reap(self._settling)
            self._settling = None
