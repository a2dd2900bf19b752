"""Fan-out of committed view changes to subscribers: bounded, resumable by epoch.

Rules (DESIGN.md section 5, rule 7):

1. A subscriber that gives ``since_epoch = e`` receives every change with
   epoch > e, in order, once, if the hub still retains epoch e + 1;
   otherwise (or for e = 0) it receives a snapshot first. Never a gap.
2. A subscriber ahead of this replica (e > applied epoch) receives nothing
   until the replica catches up, then the changes after e.
3. Each subscriber's queue is bounded. When a slow subscriber's queue is
   full its queue is dropped and it is sent a fresh snapshot instead: memory
   stays bounded and nothing is lost silently.
4. When the replica's state machine is replaced by a Raft snapshot (it was
   too far behind the leader), the changes in between are not known here:
   the history is dropped and every subscriber behind the new view is sent
   a fresh snapshot of it.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass, field

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
        queue_limit: items per subscriber before it gets a snapshot instead.
    """

    def __init__(self, *, view: Callable[[], View], history_size: int, queue_limit: int) -> None:
        self._view = view
        self._history: collections.deque[ViewChange] = collections.deque(maxlen=history_size)
        self._queue_limit = queue_limit
        self._subs: set[Subscription] = set()
        self.snapshots_for_slowness = 0

    @property
    def subscribers(self) -> int:
        """Number of open subscriptions."""
        return len(self._subs)

    def subscribe(self, since_epoch: int) -> Subscription:
        """Registers a subscriber resuming after ``since_epoch`` (rules 1 and 2)."""
        sub = Subscription(last_epoch=since_epoch)
        view = self._view()
        if since_epoch == 0 or (since_epoch < view.epoch and not self._retains(since_epoch + 1)):
            sub.queue.append(view)
            sub.last_epoch = view.epoch
        else:
            sub.queue.extend(c for c in self._history if c.epoch > since_epoch)
        if sub.queue:
            sub.ready.set()
        self._subs.add(sub)
        return sub

    def _retains(self, epoch: int) -> bool:
        return bool(self._history) and self._history[0].epoch <= epoch

    def unsubscribe(self, sub: Subscription) -> None:
        """Forgets ``sub``."""
        self._subs.discard(sub)

    def publish(self, change: ViewChange) -> None:
        """Records a committed change and queues it for every subscriber."""
        self._history.append(change)
        for sub in self._subs:
            if change.epoch <= self._queued_epoch(sub):
                continue  # rule 2: the subscriber already has it
            if len(sub.queue) >= self._queue_limit:
                # rule 3: too slow; replace its backlog with one snapshot.
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
        """The view jumped (a Raft snapshot was restored): rule 4."""
        self._history.clear()
        view = self._view()
        for sub in self._subs:
            if self._queued_epoch(sub) >= view.epoch:
                continue  # rule 2: already ahead of this replica
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
