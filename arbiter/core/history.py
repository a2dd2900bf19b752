"""The recent view changes a replica keeps for subscribers, and how a subscriber resumes.

Sans-I/O: no queues, tasks or clocks here. :mod:`arbiter.server.fanout.hub` keeps
one :class:`History` per replica and a bounded queue per subscriber; the
simulator's feed (``tests/sim/subscribers.py``) keeps the same
:class:`History` and streams items over its simulated network. Both call
the functions below, so the simulator checks the rules the server runs.

A subscriber *has* epoch e when it holds the view at e, or will once the
items already sent to it arrive. Rules (they make the subscriber ordering rule
of ``docs/architecture.md``, "Correctness rules", hold: the epochs a subscriber
sees are contiguous, or it is sent a fresh snapshot; nothing is lost silently):

1. Retention. The history keeps the last ``size`` committed changes, in
   epoch order. It is volatile: a restarted replica starts empty and refills
   as it applies its log again.
2. Resume (:meth:`History.resume`). A subscriber resuming after epoch e, on
   a replica whose view is at epoch v:

   a. e >= v, it is level with or ahead of this replica (it saw epoch e
      elsewhere): nothing yet; the changes after e follow as this replica
      applies them (rule 3). The server waits for that only briefly: its
      ``Subscribe`` refuses, with OUT_OF_RANGE, an e that this replica has
      not reached after ``FUTURE_EPOCH_WAIT`` seconds while in a quorum
      (``arbiter/server/api/servicers.py``).
   b. e < v and the history still holds epoch e + 1: the retained changes
      after e, in order.
   c. e < v and epoch e + 1 is gone, or the subscriber has no resume point
      (``since_epoch = 0`` on the wire: it holds no view at all): a snapshot
      of the view at v first, even of the empty view at epoch 0.

   Never a gap: a subscriber gets either every change after e or a snapshot.
3. Publish (:func:`deliver`). A newly committed change goes to every
   subscriber that does not have it yet (its epoch is above the subscriber's),
   once.
4. Slow subscriber (:func:`deliver` with a ``limit``). A subscriber whose
   backlog holds ``limit`` items gets, instead of the change, one snapshot of
   the current view in place of its whole backlog: memory stays bounded and
   nothing is lost silently. A shell without queues passes no limit.
5. Reset (:meth:`History.clear` and :func:`after_reset`). When the state
   machine is replaced by a leader's Raft snapshot (this replica was too far
   behind), the changes in between are not known here: the history is
   forgotten, and every subscriber behind the new view is sent a snapshot of
   it; one level with it or ahead gets nothing (rule 2a).
6. Forgotten records (bounded history, tally rule 12) need nothing here: the
   removal is an ordinary change at its own epoch (``MemberChange.forgotten``),
   retained, resumed and published like any other, so a subscriber folding
   changes and one taking a snapshot hold the same view at every epoch; a
   resume point older than the history gets a snapshot (rule 2c), never a
   view that still lists a record the cluster has forgotten.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterator
from dataclasses import dataclass

from arbiter.core.tally import ViewChange

__all__ = ["Delivery", "History", "Resume", "Start", "after_reset", "deliver"]


class Start(enum.Enum):
    """How a resuming subscriber starts (rule 2)."""

    WAIT = "wait"  # 2a: level or ahead: nothing yet
    CHANGES = "changes"  # 2b: the retained changes after its epoch
    SNAPSHOT = "snapshot"  # 2c: a snapshot of the current view first


@dataclass(frozen=True, slots=True, kw_only=True)
class Resume:
    """What a resuming subscriber is sent first: ``changes`` only with CHANGES."""

    start: Start
    changes: tuple[ViewChange, ...] = ()


class Delivery(enum.Enum):
    """What a subscriber is sent when a change is committed or the view jumps."""

    SKIP = "skip"  # it has that epoch already (rules 3, 5)
    CHANGE = "change"  # the change itself (rule 3)
    SNAPSHOT = "snapshot"  # a snapshot of the view, replacing its backlog (rules 4, 5)


class History:
    """The last ``size`` committed view changes of one replica (rule 1).

    Args:
        size: how many changes to retain (>= 0; 0 retains none, so every
            resume behind the view gets a snapshot).
    """

    def __init__(self, size: int) -> None:
        self._changes: collections.deque[ViewChange] = collections.deque(maxlen=size)

    def __len__(self) -> int:
        return len(self._changes)

    def __iter__(self) -> Iterator[ViewChange]:
        return iter(self._changes)

    def append(self, change: ViewChange) -> None:
        """Records a newly committed change (the next epoch); drops the oldest past ``size``."""
        self._changes.append(change)

    def clear(self) -> None:
        """Forgets every change: the view jumped to a leader's snapshot (rule 5)."""
        self._changes.clear()

    def retains(self, epoch: int) -> bool:
        """Whether the history reaches back to ``epoch``: its oldest change is at or before it."""
        return bool(self._changes) and self._changes[0].epoch <= epoch

    def resume(self, since: int | None, epoch: int) -> Resume:
        """What a subscriber resuming after ``since`` is sent first (rule 2).

        Args:
            since: the epoch the subscriber has, or None when it has no
                resume point (it holds no view).
            epoch: the epoch of this replica's current view; no retained
                change is above it (changes are recorded once applied).

        Returns:
            WAIT, CHANGES with the retained changes after ``since``, or
            SNAPSHOT.
        """
        if since is not None and since >= epoch:
            return Resume(start=Start.WAIT)
        if since is not None and self.retains(since + 1):
            return Resume(
                start=Start.CHANGES,
                changes=tuple(c for c in self._changes if c.epoch > since),
            )
        return Resume(start=Start.SNAPSHOT)


def deliver(epoch: int, has: int, backlog: int = 0, limit: int | None = None) -> Delivery:
    """What a subscriber gets when the change at ``epoch`` is committed (rules 3, 4).

    Args:
        epoch: the epoch of the committed change.
        has: the epoch the subscriber has, counting what is already queued
            or on its way to it.
        backlog: items queued for it and not yet sent.
        limit: the most items it may have queued; None for no bound.

    Returns:
        SKIP, CHANGE, or SNAPSHOT (too slow: one snapshot replaces its backlog).
    """
    if epoch <= has:
        return Delivery.SKIP
    if limit is not None and backlog >= limit:
        return Delivery.SNAPSHOT
    return Delivery.CHANGE


def after_reset(has: int, epoch: int) -> Delivery:
    """What a subscriber gets when the view jumped to ``epoch`` (rule 5).

    Args:
        has: the epoch the subscriber has, counting what is queued for it.
        epoch: the epoch of the view restored from a leader's snapshot.

    Returns:
        SNAPSHOT if it is behind that view, else SKIP.
    """
    return Delivery.SNAPSHOT if has < epoch else Delivery.SKIP
