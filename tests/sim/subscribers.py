"""Subscribers and each replica's feed, on the hub's own rules (``arbiter/core/history.py``).

Rules:

1. A replica's feed keeps a :class:`~arbiter.core.history.History` of its
   last ``history`` view changes and applies its rules as the server's hub
   does: resume by epoch (history rule 2), each new change to whoever does
   not have it yet (rule 3), a snapshot for whoever is behind when the
   replica restores a leader's snapshot (rule 5). There is no queue here
   (items are on the wire at once), so the slow-subscriber rule 4 never
   applies. A subscriber always has a resume point: it starts with the
   empty view at epoch 0.
2. The history is volatile: a restarted replica starts empty and refills as
   it replays its log.
3. Items travel on a FIFO stream. The stream breaks when the replica crashes
   or a link between the two is cut; the subscriber notices after
   ``detect`` seconds and resumes on a randomly chosen running replica.
4. The subscriber checks what it gets: changes are contiguous (epoch = its
   epoch + 1, each once), a snapshot never goes back, and after each item its
   view equals the view the cluster committed at that epoch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arbiter.core.history import Delivery, History, Start, after_reset, deliver
from arbiter.core.tally import ViewChange
from membership.shared.view import View

if TYPE_CHECKING:
    from tests.sim.replicas import SimReplica
    from tests.sim.world import World

__all__ = ["Feed", "SimSubscriber"]


class Feed:
    """One replica life's retained changes and attached subscribers (rules 1, 2)."""

    def __init__(self, replica: SimReplica, history: int) -> None:
        self.replica = replica
        self.history = History(history)
        self.subs: list[SimSubscriber] = []

    def attach(self, sub: SimSubscriber) -> None:
        """Attaches ``sub`` from its epoch (history rule 2)."""
        self.subs.append(sub)
        core = self.replica.core
        assert core is not None
        sub.cursor = sub.epoch
        resume = self.history.resume(sub.epoch, core.state.epoch)
        if resume.start is Start.SNAPSHOT:
            self._push(sub, core.state.view())
        for c in resume.changes:  # none unless CHANGES; WAIT: they come as they are applied
            self._push(sub, c)

    def publish(self, change: ViewChange) -> None:
        """Records a newly applied change and streams it to every subscriber past it."""
        self.history.append(change)
        for sub in list(self.subs):
            if deliver(change.epoch, sub.cursor) is Delivery.CHANGE:
                self._push(sub, change)

    def reset(self, view: View) -> None:
        """The replica's view jumped (a leader's snapshot): a snapshot for whoever is behind."""
        self.history.clear()
        for sub in list(self.subs):
            if after_reset(sub.cursor, view.epoch) is Delivery.SNAPSHOT:
                self._push(sub, view)

    def _push(self, sub: SimSubscriber, item: ViewChange | View) -> None:
        w = sub.world
        rid = self.replica.id
        if not (w.net.connected(rid, sub.id) and w.net.connected(sub.id, rid)):
            sub.broken(self)
            return
        sub.cursor = item.epoch
        w.q.at(w.net.stream_delay(rid, sub.id), sub.receive, sub.generation, item)

    def close(self) -> None:
        """The replica crashed: every stream breaks."""
        for sub in list(self.subs):
            sub.broken(self)


class SimSubscriber:
    """A subscriber that keeps its view and resumes by epoch (rules 3, 4)."""

    def __init__(self, world: World, sub_id: str, detect: float = 1.0) -> None:
        self.world = world
        self.id = sub_id
        self.detect = detect
        self.view = View()
        self.epoch = 0
        self.cursor = 0
        self.feed: Feed | None = None
        self.generation = 0
        self.snapshots = 0
        self.changes = 0
        self.manual = False  # a scenario decides when it resumes

    def connect(self, replica: SimReplica) -> None:
        """Opens a stream to ``replica`` from this subscriber's epoch."""
        assert replica.feed is not None
        self.generation += 1
        self.feed = replica.feed
        self.world.trace(f"{self.id} subscribes to {replica.id} since epoch {self.epoch}")
        replica.feed.attach(self)

    def disconnect(self, *, manual: bool = True) -> None:
        """Closes the stream (a scenario's ``disconnect``); items in flight are lost."""
        if self.feed is not None:
            self.feed.subs.remove(self)
            self.feed = None
        self.generation += 1
        self.manual = manual

    def broken(self, feed: Feed) -> None:
        """The stream to ``feed`` broke: resume elsewhere after ``detect`` seconds."""
        if self.feed is not feed:
            return
        self.disconnect(manual=False)
        self.world.trace(f"{self.id} loses its stream to {feed.replica.id}")
        self.world.q.at(self.world.q.now + self.detect, self._reconnect, self.generation)

    def _reconnect(self, generation: int) -> None:
        if generation != self.generation or self.feed is not None or self.manual:
            return
        w = self.world
        up = [r for r in w.replicas.values() if r.core is not None]
        up = [r for r in up if w.net.connected(r.id, self.id) and w.net.connected(self.id, r.id)]
        if not up:
            w.q.at(w.q.now + self.detect, self._reconnect, self.generation)
            return
        self.connect(w.sub_rng.choice(up))

    def receive(self, generation: int, item: ViewChange | View) -> None:
        """Takes one stream item and checks it (rule 4)."""
        if generation != self.generation:
            return
        check = self.world.checker
        if isinstance(item, View):
            check.expect(
                item.epoch >= self.epoch,
                f"{self.id} got a snapshot at epoch {item.epoch} after epoch {self.epoch}",
            )
            self.view = item
            self.snapshots += 1
            self.world.trace(f"{self.id} <- snapshot at epoch {item.epoch}")
        else:
            check.expect(
                item.epoch == self.epoch + 1,
                f"{self.id} got epoch {item.epoch} after epoch {self.epoch}: not contiguous",
            )
            self.view = self.view.with_changes(item.epoch, item.changes, item.ranks)
            self.changes += 1
            if self.world.verbose:
                self.world.trace(f"{self.id} <- epoch {item.epoch}")
        self.epoch = item.epoch
        check.subscriber_view(self.id, self.view)
