"""Fan-out of committed view changes to subscribers: bounded, resumable by epoch.

The rules (resume by epoch, a snapshot when the resume point is gone, the
slow-subscriber snapshot, the reset after a Raft snapshot restore) are in
:mod:`arbiter.core.history`, which the simulator runs too. This module holds
their asyncio side: one bounded queue per subscriber, the event that wakes
its ``Subscribe`` stream, quorum status items, and closing at shutdown.

A subscriber ahead of this replica (it saw a later epoch on another
replica) receives nothing until this replica catches up (history rule 2a);
``Subscribe`` in :mod:`arbiter.server.servicers` waits for that only
``FUTURE_EPOCH_WAIT`` seconds before it refuses the epoch with OUT_OF_RANGE.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass, field

from arbiter.core.history import Delivery, History, Start, after_reset, deliver
from arbiter.core.tally import ViewChange
from membership.view import View

__all__ = ["Hub", "HubStatus", "Subscription"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HubStatus:
    """Quorum status as last published to subscribers."""

    in_quorum: bool
    leader_id: str | None
    epoch: int


@dataclass(eq=False)
class Subscription:
    """One subscriber's queue. Items: ViewChange, HubStatus, or View (a snapshot)."""

    queue: collections.deque[ViewChange | HubStatus | View] = field(
        default_factory=collections.deque
    )
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    last_epoch: int = 0
    closed: bool = False

    async def get(self, timeout: float) -> ViewChange | HubStatus | View | None:
        """Next item, or None after ``timeout`` seconds with nothing (or when closed)."""
        while not self.queue:
            if self.closed:
                return None
            self.ready.clear()
            try:
                async with asyncio.timeout(timeout):
                    await self.ready.wait()
            except TimeoutError:
                return None
        item = self.queue.popleft()
        if isinstance(item, ViewChange | View):
            self.last_epoch = item.epoch
        return item


class Hub:
    """Keeps recent changes and pushes new ones to every subscription.

    Args:
        view: returns the current committed view (for snapshots).
        history_size: committed changes retained for resume.
        queue_limit: items per subscriber before it gets a snapshot instead
            (history rule 4).
    """

    def __init__(self, *, view: Callable[[], View], history_size: int, queue_limit: int) -> None:
        self._view = view
        self._history = History(history_size)
        self._queue_limit = queue_limit
        self._subs: set[Subscription] = set()
        self.snapshots_for_slowness = 0

    @property
    def subscribers(self) -> int:
        """Number of open subscriptions."""
        return len(self._subs)

    def subscribe(self, since_epoch: int) -> Subscription:
        """Registers a subscriber resuming after ``since_epoch`` (history rule 2).

        ``since_epoch = 0`` means no resume point: a snapshot comes first.
        """
        sub = Subscription(last_epoch=since_epoch)
        view = self._view()
        resume = self._history.resume(None if since_epoch == 0 else since_epoch, view.epoch)
        if resume.start is Start.SNAPSHOT:
            sub.queue.append(view)
            sub.last_epoch = view.epoch
        else:
            sub.queue.extend(resume.changes)
        if sub.queue:
            sub.ready.set()
        self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Forgets ``sub``."""
        self._subs.discard(sub)

    def publish(self, change: ViewChange) -> None:
        """Records a committed change and queues it for every subscriber (history rules 3, 4)."""
        self._history.append(change)
        for sub in self._subs:
            delivery = deliver(
                change.epoch, self._queued_epoch(sub), len(sub.queue), self._queue_limit
            )
            if delivery is Delivery.SKIP:
                continue
            if delivery is Delivery.SNAPSHOT:
                # Too slow: its backlog is replaced by one snapshot.
                sub.queue.clear()
                sub.queue.append(self._view())
                self.snapshots_for_slowness += 1
            else:
                sub.queue.append(change)
            sub.ready.set()

    @staticmethod
    def _queued_epoch(sub: Subscription) -> int:
        for item in reversed(sub.queue):
            if isinstance(item, ViewChange | View):
                return item.epoch
        return sub.last_epoch

    def reset(self) -> None:
        """The view jumped (a Raft snapshot was restored): history rule 5."""
        self._history.clear()
        view = self._view()
        for sub in self._subs:
            if after_reset(self._queued_epoch(sub), view.epoch) is Delivery.SKIP:
                continue  # already level with or ahead of this replica
            sub.queue.clear()
            sub.queue.append(view)
            sub.ready.set()

    def publish_status(self, status: HubStatus) -> None:
        """Queues a quorum status change for every subscriber."""
        for sub in self._subs:
            if len(sub.queue) < self._queue_limit:
                sub.queue.append(status)
                sub.ready.set()

    def close_all(self) -> None:
        """Ends every subscription (shutdown): streams finish and clients go elsewhere."""
        for sub in self._subs:
            sub.closed = True
            sub.ready.set()
