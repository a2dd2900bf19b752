"""Simulated replicas: the real ``Replica`` core, a simulated disk, and the Ready loop.

Rules:

1. Ready handling follows the documented order: persist the hard state and
   entries to the replica's :class:`Disk`, send the messages, then
   ``advance`` (which applies the committed entries). The checker sees every
   message as it leaves and verifies that what it depends on is on disk.
2. A crash drops the ``Replica`` object and everything volatile (detector,
   opinions, feed). The disk survives. A restart builds a new ``Replica``
   from the disk, with a fresh random stream, a higher observation sequence
   base, and the restart grace; it replays its log to rebuild the view.
3. Timers are lazy (see ``clock``): one pending wake-up per replica, moved
   earlier when ``next_deadline()`` moves earlier; a wake-up that comes too
   early just schedules the real deadline.
4. After an apply that moves the epoch, ``Observer.tick`` has work (start
   tracking the view's ALIVE members). ``Replica.next_deadline()`` once did
   not report it (fixed; ``test_sim.py``,
   test_replica_next_deadline_reports_view_sync); the replica is still
   ticked once right after such an apply (``_view_moved``), a leftover
   workaround: removing it changes some seeded traces (not their outcome),
   so it stays until the traces change for another reason.
5. Mutant ``vote_after_send`` (for checking the checker): the hard state goes
   to disk only at the next Ready, after this Ready's messages were sent.
6. Membership changes: a replica added during the run starts with an empty
   disk and ``join=True`` (it learns the configuration from the leader's
   snapshot); it is *joined* once a configuration in its log makes it a
   voter. A replica whose removal is committed is *retired* by the operator
   (``reconfig``): its process stops for good. A replica whose machine is
   *gone* (disk lost) is never started again under its id. Acks carry the
   configuration in force (as ``arbiter/server/consensus/arbiterset.py`` does).
7. Starvation (:meth:`SimReplica.starve`): a replica whose process gets no CPU
   for a while, as on a machine whose neighbours take it (issue 24). It reads
   nothing and runs no timer: what is sent to it waits (a node's heartbeats
   held on the sender's side by flow control, so a stamp, if the simulated
   heartbeat had one, would be late too; Raft messages in its socket). When
   it runs again its timer fires first, before it reads what waited (the
   order that blames the nodes: an ingest worker flushes its batch before it
   reads), then it takes every input in arrival order. Its only knowledge of
   the stall is its own, the lateness a loop stall gives it in the shell
   (``arbiter/server/ingest/worker.py`` rule 7, the consensus process's
   ``LocalHealth``): a stall of L seconds, in progress or ended less than one
   heartbeat interval ago, makes it L seconds late (observer rule 6; the core
   bounds it). Mutant ``deaf_to_stalls`` (g) ticks without it.
8. Slow accepts (:attr:`SimReplica.accept_delay`, set by a run): a replica behind
   in *accepting* streams, as a starved ingest worker is, while it reads the
   streams it has on time. The first heartbeat of a node's incarnation to this
   replica opens its stream, which waits ``accept_delay(now)`` seconds before
   it is read; what the node sends meanwhile waits with it. While a run sets
   :attr:`SimReplica.read_lag`, the replica measures its lag as the shell
   does (``arbiter/server/load/readlag.py``, the real ``StreamBase``,
   ``HostBases`` and ``ReadLag``: every node on one host, whose address
   :attr:`SimReplica.peer_of` gives; the clocks agree here, so a heartbeat's
   delay is its receive time minus ``sent_at``), and that lag is lateness too.
   Mutant ``deaf_to_accepts`` (h) reads rule 2's median alone. Invariant S11
   is checked after every tick: no replica suspects a node that keeps
   sending while that node's stream waits in its accept queue.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from arbiter.core.commands import Opinion
from arbiter.core.raft import Entry, HardState, Message, Ready, Role
from arbiter.core.replica import Replica, ReplicaSettings
from arbiter.server.load.readlag import HostBases, ReadLag, StreamBase
from tests.sim.nodes import Ack, Heartbeat
from tests.sim.subscribers import Feed

if TYPE_CHECKING:
    from tests.sim.world import World

__all__ = ["Disk", "SimReplica"]

_SEQ_STRIDE = 10**12  # observation seq numbers per boot (the shell uses wall-clock ns)

# Snapshots (log compaction, snapshot transfer) when the core has them.
HAS_SNAPSHOTS = "snapshot" in inspect.signature(Replica.__init__).parameters
SNAPSHOT_EVERY = 16  # applied entries between snapshots: several per run
SETTINGS_HAVE_SNAPSHOT_EVERY = "snapshot_every" in {f.name for f in fields(ReplicaSettings)}


@dataclass
class Disk:
    """What a replica has made durable: a snapshot, the entries after it, the hard state."""

    hard_state: HardState = field(default_factory=lambda: HardState(term=0, vote=None, commit=0))
    entries: list[Entry] = field(default_factory=list)
    snapshot: Any = None  # arbiter.core.raft.Snapshot when the core has snapshots
    pending: HardState | None = None  # mutant vote_after_send: written at the next Ready

    @property
    def first_index(self) -> int:
        """Index of the first entry held (the one after the snapshot)."""
        return (self.snapshot.index if self.snapshot is not None else 0) + 1

    @property
    def last_index(self) -> int:
        """Index of the last entry held (the snapshot's if there is none after it)."""
        return self.first_index - 1 + len(self.entries)

    def entry(self, index: int) -> Entry | None:
        """The entry at ``index``, or None if compacted away or beyond the log."""
        first = self.first_index
        return self.entries[index - first] if first <= index <= self.last_index else None

    def persist(self, rd: Ready, *, hard_state: bool = True) -> None:
        """Writes ``rd``'s snapshot, hard state and entries (Ready contract, step 1)."""
        snap = getattr(rd, "snapshot", None)
        if snap is not None:
            self.snapshot = snap  # replaces every persisted entry
            self.entries = []
        if hard_state and rd.hard_state is not None:
            self.hard_state = rd.hard_state
        if rd.entries:
            first = rd.entries[0].index
            assert first <= self.last_index + 1, f"gap: persisting {first} after {self.last_index}"
            del self.entries[first - self.first_index :]
            self.entries.extend(rd.entries)

    def compact(self, snapshot: Any) -> None:
        """Stores a snapshot the replica took and drops the entries it covers."""
        self.entries = [e for e in self.entries if e.index > snapshot.index]
        self.snapshot = snapshot


class SimReplica:
    """One arbiter replica process of the simulation.

    Args:
        world: the simulation.
        replica_id: its id.
    """

    def __init__(self, world: World, replica_id: str, *, join: bool = False) -> None:
        self.world = world
        self.id = replica_id
        self.join = join
        self.joined = not join  # rule 6
        self.retired = False
        self.gone = False
        self.disk = Disk()
        self.core: Replica | None = None
        self.feed: Feed | None = None
        self.boots = 0
        self.role = Role.FOLLOWER
        self.term = 0
        self.epoch = 0
        self._token = 0
        self._wake_at = math.inf
        self._spins = 0
        self._spin_at = -1.0
        self._view_moved = False
        self._ack_conf: tuple[object, tuple[str, ...], tuple[str, ...]] = (None, (), ())
        # Rule 7: inputs held while starved, until when, and the latest stall's
        # (length, end) in seconds of virtual time.
        self.starved_until = -math.inf
        self._held: list[tuple[Any, Any]] = []
        self.stall = (0.0, -math.inf)
        self.stalls = 0
        self._stall_start = -math.inf
        # Rule 8: slow accepts and the read lag, when a run sets them.
        self.accept_delay: Callable[[float], float] | None = None
        self.read_lag: ReadLag | None = None
        self.peer_of: Callable[[str], str] = lambda node_id: "ipv4:10.0.0.1:40000"
        self._streams: dict[tuple[str, int], StreamBase] = {}  # accepted: node, incarnation
        self._waiting: dict[tuple[str, int], tuple[int, list[Heartbeat]]] = {}
        self._hosts = HostBases()
        self._token_streams = 0

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Starts from the disk (rule 2)."""
        w = self.world
        cfg = w.config
        self.boots += 1
        disk = self.disk
        restored: dict[str, Any] = {"snapshot": disk.snapshot} if HAS_SNAPSHOTS else {}
        self.core = Replica(
            replica_id=self.id,
            replica_ids=w.initial_ids,
            addresses=w.addresses,
            join=self.join,
            raft_config=w.raft_config,
            settings=w.settings,
            detector=cfg.detector(),
            rng=random.Random(f"{w.seed}/{self.id}/{self.boots}"),
            now=w.q.now,
            seq_base=self.boots * _SEQ_STRIDE,
            hard_state=disk.hard_state,
            entries=tuple(disk.entries),
            **restored,
        )
        self.feed = Feed(self, w.history)
        self.role = Role.FOLLOWER
        self.term = disk.hard_state.term
        self.epoch = 0
        w.checker.restored(self, self.core.state.view())
        self._wake_at = math.inf
        self._view_moved = True  # see rule 4: the restored view must be synced
        w.trace(
            f"{self.id} starts (boot {self.boots}, term {self.term}, "
            f"snapshot {disk.first_index - 1}, log {disk.last_index}, "
            f"commit {disk.hard_state.commit})"
        )
        self._after_input()

    def crash(self) -> None:
        """Drops the core and all volatile state (rule 2); the disk stays."""
        self.core = None
        self.starved_until, self._held = -math.inf, []  # rule 7: what waited is lost
        self._streams, self._waiting, self._hosts = {}, {}, HostBases()  # rule 8: streams end
        if self.read_lag is not None:
            self.read_lag = ReadLag()
        self._token += 1
        self._wake_at = math.inf
        self.disk.pending = None  # never reached the disk
        feed, self.feed = self.feed, None
        if feed is not None:
            feed.close()

    # --- starvation (rule 7) ----------------------------------------------------------------

    def starve(self, seconds: float) -> None:
        """Gives this replica's process no CPU for ``seconds`` from now (rule 7); a
        starvation under way is extended to end no earlier than that."""
        if self.core is None or seconds <= 0:
            return
        now = self.world.q.now
        if now >= self.starved_until:
            self._stall_start = now
            self._token += 1  # no timer runs while starved
            self._wake_at = math.inf
        until = max(self.starved_until, now + seconds)
        self.starved_until = until
        self.world.q.at(until, self._fed, until)

    def _fed(self, until: float) -> None:
        if until != self.starved_until or self.core is None:
            return  # extended since, or crashed
        now = self.world.q.now
        self.starved_until = -math.inf
        self.stall = (now - self._stall_start, now)
        self.stalls += 1
        self._view_moved = True  # the timer first (rule 7)
        self._wake(self._token)
        held, self._held = self._held, []
        for fn, arg in held:
            fn(arg)

    def lateness(self, now: float) -> float:
        """Seconds of the recent past this replica could not hear (rules 7 and 8)."""
        stalled, read = self._stall_lateness(now), self._read_lateness(now)
        return stalled if stalled > read else read

    def _stall_lateness(self, now: float) -> float:
        if self.world.mutants.deaf_to_stalls:
            return 0.0
        length, ended = self.stall
        # One expression for the end, here and in _schedule (float rounding: a wake-up at
        # the end must see the lateness over).
        return length if now < ended + self.world.config.heartbeat_interval else 0.0

    def _read_lateness(self, now: float) -> float:
        lag = self.read_lag
        if lag is None:
            return 0.0
        return lag.median(now) if self.world.mutants.deaf_to_accepts else lag.lateness(now)

    # --- inputs --------------------------------------------------------------------------

    def on_raft(self, msg: Message) -> None:
        """A Raft message arrives from a peer."""
        core = self.core
        if core is None:
            return
        if self.world.q.now < self.starved_until:  # rule 7
            self._held.append((self.on_raft, msg))
            return
        core.step(msg, self.world.q.now)
        self._after_input()

    def on_heartbeat(self, hb: Heartbeat) -> None:
        """A node's heartbeat arrives: answer it as the servicer does."""
        core = self.core
        if core is None:
            return
        w = self.world
        now = w.q.now
        if now < self.starved_until:  # rule 7
            self._held.append((self.on_heartbeat, hb))
            return
        if self.accept_delay is not None or self.read_lag is not None:  # rule 8
            key = (hb.node_id, hb.incarnation)
            stream = self._streams.get(key)
            if stream is None:
                waiting = self._waiting.get(key)
                if waiting is not None:
                    waiting[1].append(hb)
                    return
                delay = 0.0 if self.accept_delay is None else self.accept_delay(now)
                if delay > 0:
                    self._token_streams += 1
                    self._waiting[key] = (self._token_streams, [hb])
                    w.q.at(now + delay, self._accept, (key, self._token_streams))
                    return
                stream = self._streams[key] = StreamBase()
            lag = self.read_lag
            if lag is not None:
                host = self._hosts.of(self.peer_of(hb.node_id), now)
                lag.add(stream.queued(now - hb.sent_at, now, lag, host), now)
        v = core.heartbeat(hb.node_id, hb.incarnation, w.labels, now)
        w.checker.granted(self, hb.node_id, hb.incarnation, v.lease)
        conf = core.configuration
        if self._ack_conf[0] is not conf:  # rule 6: the set in acks, built once per change
            self._ack_conf = (conf, tuple(conf.voters), tuple(conf.learners))
        _, voters, learners = self._ack_conf
        ack = Ack(
            self.id,
            hb.node_id,
            hb.seq,
            v.lease,
            v.state,
            v.incarnation,
            core.state.epoch,
            core.in_quorum(now),
            voters,
            learners,
            conf.index,
            v.grace,
            v.grace_id,
        )
        w.net.send(self.id, hb.node_id, w.deliver_ack, ack)
        self._schedule()  # a new opinion is owed to the log at once

    def _accept(self, arg: tuple[tuple[str, int], int]) -> None:
        """Rule 8: a stream that waited is accepted; what it carried is read now."""
        key, token = arg
        waiting = self._waiting.get(key)
        if self.core is None or waiting is None or waiting[0] != token:
            return  # crashed since: the stream is gone
        if self.world.q.now < self.starved_until:  # rule 7: read when the replica runs
            self._held.append((self._accept, arg))
            return
        del self._waiting[key]
        self._streams[key] = StreamBase()
        for hb in waiting[1]:
            self.on_heartbeat(hb)

    def _check_accepts(self, core: Replica) -> None:
        """Invariant S11 (rule 8): nobody sending is suspected while its stream waits here."""
        sending = self.world.checker.sending
        if sending is None:
            return
        for node_id, incarnation in self._waiting:
            if node_id in sending and core.observer.opinion(node_id) is Opinion.SUSPECT:
                self.world.checker.fail(
                    f"S11: {self.id} suspects {node_id}#{incarnation}, which never stopped "
                    "sending, while its stream waits to be accepted here"
                )

    def _wake(self, token: int) -> None:
        if token != self._token or self.core is None:
            return
        self._wake_at = math.inf
        now = self.world.q.now
        late = self.lateness(now)
        if self._view_moved or self.core.next_deadline(late) <= now:
            self._view_moved = False
            if now == self._spin_at:
                self._spins += 1
                assert self._spins < 10_000, f"{self.id} ticks forever at {now}: livelock"
            else:
                self._spin_at, self._spins = now, 0
            self.core.tick(now, late, wall=now)  # the replicas' wall clocks agree here
            if self._waiting:
                self._check_accepts(self.core)
            self._after_input()
        else:
            self._schedule()

    # --- outputs ----------------------------------------------------------------------------

    def poke(self) -> None:
        """Something was proposed from outside (a node's grace window): flush and reschedule."""
        if self.core is not None and self.world.q.now < self.starved_until:  # rule 7
            self._held.append((lambda _: self.poke(), None))
        elif self.core is not None:
            self._after_input()

    def _after_input(self) -> None:
        core = self.core
        assert core is not None
        w = self.world
        if core.has_ready():
            self._flush(core)
        raft = core.raft
        role, term = raft._role, raft._term  # read per step: cheaper than status()
        if role is not self.role or term != self.term:
            if self.role is Role.LEADER:
                w.trace(f"{self.id} steps down in term {term}")
            self.role, self.term = role, term
            w.checker.role(self.id, role, term)
            if role is Role.LEADER:
                w.trace(f"{self.id} is leader in term {term}")
                w.checker.elected(self.id, self.disk)
        self._schedule()

    def _schedule(self) -> None:
        core = self.core
        assert core is not None
        now = self.world.q.now
        if now < self.starved_until:
            return  # rule 7: the timer runs when the replica does
        if self._view_moved:
            d = now
        else:
            late = self.lateness(now)
            d = core.next_deadline(late)
            interval = self.world.config.heartbeat_interval
            if self._stall_lateness(now) > 0:  # it ends after one interval: look again then
                d = min(d, self.stall[1] + interval)
            if self._read_lateness(now) > 0:  # rule 8: it falls as it ages
                d = min(d, now + interval)
        if d < self._wake_at:
            self._wake_at = d
            self._token += 1
            self.world.q.at(d, self._wake, self._token)

    def _flush(self, core: Replica) -> None:
        w = self.world
        check = w.checker
        disk = self.disk
        send = w.net.send
        deliver = w.deliver_raft
        while core.has_ready():
            rd = core.ready()
            snap = getattr(rd, "snapshot", None)
            if rd.entries:
                check.persisting(self.id, disk, rd.entries)
            if w.mutants.vote_after_send:
                if disk.pending is not None:
                    disk.hard_state = disk.pending
                disk.pending = rd.hard_state
                disk.persist(rd, hard_state=False)
            else:
                disk.persist(rd)

            def out(msg: Message) -> None:
                check.sent(self.id, disk, msg)
                send(self.id, msg.dst, deliver, msg)

            done = core.deliver(rd, out)
            if snap is not None:
                view = core.state.view()
                w.trace(
                    f"{self.id} restores the leader's snapshot at {snap.index}, epoch {view.epoch}"
                )
                check.restored(self, view)
                self._view_moved = True
                assert self.feed is not None
                self.feed.reset(view)
            for entry, result in done.applied:
                check.applied(self, entry, result)
                if result.grace is not None and result.grace.request_id in w.grace_asks:
                    w.grace_answered(self.id, result.grace)
                change = result.change
                if change is not None:
                    self._view_moved = True
                    assert self.feed is not None
                    self.feed.publish(change)
        if HAS_SNAPSHOTS:
            taken = core.maybe_compact()
            if taken is not None:
                disk.compact(taken)
        if not self.joined and core.configuration.is_voter(self.id):
            self.joined = True
            w.trace(f"{self.id} is a voter")

    def describe(self, now: float) -> str:
        """One line: role, term, epoch, quorum."""
        core = self.core
        if core is None:
            return f"{self.id}: down"
        st = core.status()
        q = "in quorum" if core.in_quorum(now) else "no quorum"
        return (
            f"{self.id}: {st.role.value} term {st.term} leader {st.leader or '-'} "
            f"epoch {core.state.epoch} {q}"
        )
