"""Fan-out of committed view changes to subscribers: bounded, resumable by epoch, cheap per stream.

The rules (resume by epoch, a snapshot when the resume point is gone, the
slow-subscriber snapshot, the reset after a Raft snapshot restore) are in
:mod:`arbiter.core.history`, which the simulator runs too. This module holds
their asyncio side: one bounded queue per subscriber, the wake-up of its
``Subscribe`` stream, quorum status items, the progress and status timing,
and closing at shutdown.

A subscriber ahead of this replica (it saw a later epoch on another
replica) receives nothing until this replica catches up (history rule 2a);
``Subscribe`` in :mod:`arbiter.server.api.servicers` waits for that only
``FUTURE_EPOCH_WAIT`` seconds before it refuses the epoch with OUT_OF_RANGE.

What one event costs, with S subscribers (the fan-out rules):

1. Encoded once. A queued item is the shared object (the committed
   ViewChange, the View of a snapshot, the HubStatus, a :class:`Marker`);
   :mod:`arbiter.server.fanout.frames` serialises each once per replica and every
   stream writes the same bytes (``Subscribe`` has a pass-through response
   serializer): no per-subscriber conversion or serialisation.
2. One wake-up per stream and batch. A stream waits on a future of its
   own, with no timer; publishing resolves it, and the stream writes what is
   queued, one ``write`` per item.
3. One timer per replica: the pulse (every ``progress_interval /
   PULSE_SLOTS`` seconds, :meth:`Hub.pulse`) queues the progress marker for
   streams idle ``progress_interval`` (less a per-stream offset below a
   quarter of it, so that streams a change synchronised do not all come due
   in one pulse), the status items of streams that asked for them, and ends
   a write that has waited ``subscriber_write_timeout`` (limits rule 6). A
   stream is silent at most ``progress_interval`` plus one pulse.
4. Changes first. A progress marker not yet written is dropped when a
   change, snapshot or status is queued behind it: those carry the epoch too.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import itertools
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from arbiter.core.history import Delivery, History, Start, after_reset, deliver
from arbiter.core.tally import ViewChange
from membership.shared.view import View

__all__ = ["PULSE_SLOTS", "Hub", "HubStatus", "Marker", "NotReading", "Subscription"]

# Pulses per progress interval (rule 3): the bound on a stream's silence past
# progress_interval is one pulse.
PULSE_SLOTS = 8


class NotReading(Exception):
    """A subscriber's event waited ``timeout`` seconds (subscriber_write_timeout)."""

    def __init__(self, timeout: float) -> None:
        super().__init__(
            f"subscriber_write_timeout: an event waited more than {timeout:g}s to be sent "
            "(the subscriber does not read); resume from the last epoch received"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class HubStatus:
    """Quorum status as last published to subscribers."""

    in_quorum: bool
    leader_id: str | None
    epoch: int


class Marker(enum.Enum):
    """A queued item that is not a view: what the stream writes is made when it is written."""

    PROGRESS = "progress"  # the replica's progress marker (its epoch, quorum, arbiters)
    STATUS = "status"  # this subscriber's status updates are due


Item = ViewChange | HubStatus | View | Marker


@dataclass(eq=False)
class Subscription:
    """One subscriber's queue and its stream's timing (loop seconds).

    Items: ViewChange, HubStatus, View (a snapshot) or Marker. ``status_every``
    is inf for a subscriber that did not ask for status updates.
    """

    queue: collections.deque[Item] = field(default_factory=collections.deque)
    last_epoch: int = 0
    closed: bool = False
    status_every: float = math.inf
    next_status: float = math.inf
    sent_at: float = 0.0  # when its last write ended (or it subscribed)
    writing_since: float | None = None
    not_reading: bool = False
    offset: float = 0.0  # rule 3: progress comes due this much early
    _waiter: asyncio.Future[None] | None = None
    _task: asyncio.Task[object] | None = None

    def wake(self) -> None:
        """Resumes the stream waiting in :meth:`get` (if it waits)."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> Item | None:
        """The next item, waiting for one; None once closed with nothing left."""
        while not self.queue:
            if self.closed:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self.queue.popleft()
        while item is Marker.PROGRESS and self.queue:
            item = self.queue.popleft()  # rule 4: what follows carries the epoch
        if isinstance(item, ViewChange | View):
            self.last_epoch = item.epoch
        return item

    async def write(
        self, write: Callable[[bytes], Awaitable[None]], data: bytes, timeout: float
    ) -> None:
        """Awaits ``write(data)`` (the stream's ``context.write``); the pulse ends it
        after ``timeout`` seconds (rule 3).

        Raises:
            NotReading: it waited ``timeout`` seconds: the subscriber does not read.
        """
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._task = asyncio.current_task()
        self.writing_since = loop.time()
        try:
            await write(data)
        except asyncio.CancelledError:
            if self.not_reading and self._task is not None and self._task.uncancel() == 0:
                raise NotReading(timeout) from None
            raise
        finally:
            self.writing_since = None
        self.sent_at = loop.time()


class Hub:
    """Keeps recent changes and pushes new ones to every subscription.

    Args:
        view: returns the current committed view (for snapshots).
        history_size: committed changes retained for resume.
        queue_limit: items per subscriber before it gets a snapshot instead
            (history rule 4).
        progress_interval: seconds of silence after which a stream is sent
            the progress marker (rule 3).
        write_timeout: seconds a write may wait for a subscriber that does not
            read (``subscriber_write_timeout``).
    """

    def __init__(
        self,
        *,
        view: Callable[[], View],
        history_size: int,
        queue_limit: int,
        progress_interval: float = 1.0,
        write_timeout: float = 10.0,
    ) -> None:
        self._view = view
        self._history = History(history_size)
        self._queue_limit = queue_limit
        self._subs: set[Subscription] = set()
        self._progress_every = progress_interval
        self.write_timeout = write_timeout
        self._offsets = itertools.cycle(
            [progress_interval / 4 * i / PULSE_SLOTS for i in range(PULSE_SLOTS)]
        )
        self._pulse: asyncio.TimerHandle | None = None
        self.status: HubStatus | None = None
        self.snapshots_for_slowness = 0
        self.not_reading = 0

    @property
    def subscribers(self) -> int:
        """Number of open subscriptions."""
        return len(self._subs)

    def subscribe(
        self, since_epoch: int, status_every: float = math.inf, now: float = 0.0
    ) -> Subscription:
        """Registers a subscriber resuming after ``since_epoch`` (history rule 2).

        Args:
            since_epoch: 0 means no resume point: a snapshot comes first.
            status_every: seconds between its status items (inf: none); the
                first comes after the snapshot or catch-up changes.
            now: loop seconds (its silence counts from then).
        """
        sub = Subscription(
            last_epoch=since_epoch,
            status_every=status_every,
            next_status=now + status_every,
            sent_at=now,
            offset=next(self._offsets),
        )
        view = self._view()
        resume = self._history.resume(None if since_epoch == 0 else since_epoch, view.epoch)
        if resume.start is Start.SNAPSHOT:
            sub.queue.append(view)
            sub.last_epoch = view.epoch
        else:
            sub.queue.extend(resume.changes)
        if math.isfinite(status_every):
            sub.queue.append(Marker.STATUS)  # never before the view it refers to
        self._subs.add(sub)
        self._start_pulse()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Forgets ``sub``."""
        self._subs.discard(sub)

    def _enqueue(self, sub: Subscription, item: Item) -> None:
        if sub.queue and sub.queue[-1] is Marker.PROGRESS:
            sub.queue.pop()  # rule 4
        sub.queue.append(item)
        sub.wake()

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
                self._enqueue(sub, self._view())
                self.snapshots_for_slowness += 1
            else:
                self._enqueue(sub, change)

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
            self._enqueue(sub, view)

    def publish_status(self, status: HubStatus) -> None:
        """Queues a quorum status change for every subscriber."""
        self.status = status
        for sub in self._subs:
            if len(sub.queue) < self._queue_limit:
                self._enqueue(sub, status)

    def pulse(self, now: float) -> None:
        """Rule 3 at loop time ``now``: progress markers, status items, writes waiting too long."""
        every = self._progress_every
        for sub in self._subs:
            if sub.writing_since is not None:
                if now - sub.writing_since >= self.write_timeout and not sub.not_reading:
                    sub.not_reading = True  # Subscription.write raises NotReading
                    self.not_reading += 1
                    if sub._task is not None:
                        sub._task.cancel()
                continue
            if sub.queue:
                continue
            if now >= sub.next_status:
                sub.next_status = now + sub.status_every
                self._enqueue(sub, Marker.STATUS)
            elif now - sub.sent_at >= every - sub.offset:
                self._enqueue(sub, Marker.PROGRESS)

    def _start_pulse(self) -> None:
        if self._pulse is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test drives pulse() itself)
        period = self._progress_every / PULSE_SLOTS

        def tick() -> None:
            if not self._subs:
                self._pulse = None
                return
            self._pulse = loop.call_later(period, tick)
            self.pulse(loop.time())

        self._pulse = loop.call_later(period, tick)

    def close_all(self) -> None:
        """Ends every subscription (shutdown): streams finish and clients go elsewhere."""
        for sub in self._subs:
            sub.closed = True
            sub.wake()
        if self._pulse is not None:
            self._pulse.cancel()
            self._pulse = None
