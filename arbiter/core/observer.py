"""One replica's opinions of the nodes, the observations it owes the log, and its leases.

Sans-I/O: time is the ``now`` argument (monotonic seconds); nothing here reads a
clock, sends, sleeps or logs. The driver feeds heartbeats and ticks in, takes
observations out and proposes them to Raft (docs/architecture.md,
"Correctness rules": observations and leases).

Rules:

1. Opinion. A replica's opinion of a node is ALIVE from the first heartbeat it
   hears at an incarnation, and SUSPECT once its failure detector suspects the
   node; a later heartbeat makes it ALIVE again. Each change of opinion gets a
   new, higher sequence number and becomes an observation owed to the log.
2. Delivery. An owed observation is proposed when it is ready (new, or a
   retry timeout after it was last proposed) and again at that timeout until
   the committed state holds it (the state machine ignores duplicates). The
   timeout is ``retry_after`` while commits are fast and adapts to them when
   they are slow (:mod:`arbiter.core.retry`: RFC 6298's timer). A ready SUSPECT
   observation, and an ALIVE one that follows another voter's committed
   ALIVE observation, are proposed at once; any other ready ALIVE one is
   held until the pacer releases it (:mod:`arbiter.core.batching`, rules 1
   to 3), then proposed with every other held one, so a join storm commits
   in a few entries.
3. Incarnations. A heartbeat at an incarnation below the cluster's record, or
   at a DEAD or LEFT incarnation, or at one retired by a leave before it joined
   (the state machine's rule 5: answered LEFT), or at or below the floor of a
   forgotten record (rule 12: answered as that record was), is refused: it refreshes
   nothing and earns no lease. An opinion of a retired incarnation is
   forgotten instead of being proposed. A heartbeat at a higher incarnation
   than the one tracked restarts the detector for the node: heartbeats of one
   life never refresh another (a process restarted fast under the same id is
   a new life, not the old one revived).
4. Leases. A heartbeat earns a lease only while this replica's latest opinion
   of the node (the last one it produced, not merely the last committed) is
   ALIVE at the heartbeat's incarnation and committed. The detector is then
   held: it does not suspect the node before the lease runs out, measured
   from when the heartbeat was received.
5. Restart grace. For ``restart_grace`` seconds after start (one maximum lease)
   no suspicion is cast: a lease granted before a crash is still honoured.
   Nodes ALIVE in the committed view that this replica has not heard since
   its start are tracked as if heard when the view showed them, so a node that
   died while the replica was down is still suspected (after the grace); not
   before ``unheard_hold`` from then: the lease at the interval this replica
   suggests now, the pace the node was most likely told (a replica behind in
   a 3,000-node join storm learned of thousands of members from the others'
   commits before it read their first heartbeat, and suspected each at D of
   the configured 0.15 s while they heartbeat every 0.7 s). A node this
   replica refused itself (shedding: :meth:`Observer.refused`, with the retry
   hint it was given) is held until the hint runs out plus ``unheard_hold``:
   its silence here is the replica's own doing. Measured with four CPU hogs
   at 1,000 nodes: two loaded replicas shed the same joining node with a 3 to
   4 s hint, the third admitted it, both learned it ALIVE from the log,
   suspected it at 3.0 s (the lease) before it was allowed back, and the
   node was DEAD though it never stopped sending (bench/scale.py --hogs 4).
6. Local health (Dadgar, Phillips, Currey, "Lifeguard: Local Health
   Awareness for More Accurate Failure Detection", DSN Workshops 2018,
   arXiv:1707.00788: a member that is itself slow must not blame others).
   ``tick(now, state, lateness)`` is told how many seconds of the recent past
   this replica could not hear (its loop ran late, its ingest has a backlog).
   Silence is measured only up to ``heard_until = now - lateness`` (also the
   evidence's), so a node is never suspected for a silence the replica could
   not observe; a dead one is suspected ``lateness`` later, bounded by
   ``ReplicaSettings.max_lateness`` (the longest lease). Leases only gain: the
   detector's clock goes slower, never faster, than the one they were
   promised on.
7. Grace windows (:mod:`arbiter.core.grace_windows`, its rules there): a
   committed window holds back suspicions of its node until it ends here
   (then the node counts as heard at the end), and acks that grant a lease
   carry what is left of it. Synced at each tick (with ``tick``'s ``wall``).
8. Carriers (host streams, ``HostHeartbeat``): the heartbeats of the nodes an
   agent carries on one host stream share a :class:`Carrier`. When the
   detector suspects one of them and the stream has carried nothing since
   that node's last heartbeat, give or take :data:`SIBLING_WAIT` (the whole
   stream went silent, not one hung process the agent dropped: that one's
   stream goes on for a lease and more after it), every other node of the stream that is ALIVE
   here and holds no lease any more (its detector hold is over) is suspected
   at the same tick, with the same evidence: the suspicions go in one batch,
   so an agent that dies takes all its ids DEAD in one committed entry, not
   one epoch per id. The holds keep it safe: a node is never suspected before
   its detector hold (the lease it was granted, or the slow start's wait for
   an ack) runs out. When a stream-mate's hold ends later, by at most
   :data:`SIBLING_WAIT` (0.1 s: the slow start's hold runs from the ack's
   send, a moment after the heartbeat's receipt), the first suspicion waits
   for it, so that both go in one batch; a heartbeat meanwhile refutes it as
   ever. A node in its grace window is held back as in rule 7.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from arbiter.core.batching import BatchPacer, follows, refutes
from arbiter.core.commands import Observation, Opinion
from arbiter.core.detection import DetectorState, FailureDetector
from arbiter.core.grace_windows import GraceWindows
from arbiter.core.retry import RetryTimer
from arbiter.core.tally import HeartbeatVerdict, MembershipState
from membership.shared.view import MemberState

__all__ = ["Carrier", "HeartbeatVerdict", "Observer"]

SIBLING_WAIT = 0.1
"""Rule 8: seconds a silent stream's first suspicion may wait for a stream-mate's hold."""

# Cap of a suspicion level written to the log (phi can reach infinity).
_MAX_LEVEL = 1e6


class Carrier:
    """One host stream: the nodes whose last heartbeat it carried (rule 8).

    The shell makes one per stream and passes it with each entry's heartbeat;
    the observer keeps, per node, the carrier of its last heartbeat.
    """

    __slots__ = ("last", "nodes")

    def __init__(self) -> None:
        self.nodes: set[str] = set()
        self.last = -math.inf  # monotonic seconds of its last heartbeat (of any node)


class Observer:
    """Opinions, owed observations and leases of one replica.

    Args:
        replica_id: this replica's id, as in the configured arbiter list.
        detector: the failure detector, owned by this observer from now on.
        lease: seconds of lease granted per accepted heartbeat (<= the
            detector's suspicion time).
        retry_after: seconds to a retry while commits are fast (:attr:`retry`'s floor).
        seq_base: first observation sequence number; must exceed every number
            this replica used before a restart (the shell seeds it from a
            boot-time value, e.g. wall-clock nanoseconds).
        now: monotonic seconds at start.
        restart_grace: seconds after ``now`` during which no suspicion is cast.
        batch_interval: seconds between the leader's batches of held ALIVE
            observations (rule 2, :mod:`arbiter.core.batching`); 0 proposes
            everything at once.
        max_grace: the longest grace window this replica holds a node, seconds
            (rule 7).
        unheard_hold: seconds a member this replica learned of from the log,
            without hearing it, is not suspected (rule 5; :attr:`unheard_hold`,
            which the replica keeps at the lease of the interval it suggests).

    Raises:
        ValueError: a negative lease, grace or batch interval, or retry_after <= 0.
    """

    def __init__(
        self,
        *,
        replica_id: str,
        detector: FailureDetector,
        lease: float,
        retry_after: float,
        seq_base: int,
        now: float,
        restart_grace: float,
        batch_interval: float = 0.0,
        max_grace: float = 300.0,
        unheard_hold: float = 0.0,
    ) -> None:
        if lease < 0 or retry_after <= 0 or restart_grace < 0:
            raise ValueError("lease and restart_grace must be >= 0, retry_after > 0")
        self._replica_id = replica_id
        self._detector = detector
        self._lease = lease
        self.retry = RetryTimer(retry_after, 8 * retry_after)  # rule 2
        self._era = 0  # new_leader() calls so far
        self._seq = seq_base
        self._grace_until = now + restart_grace
        self.unheard_hold = unheard_hold
        self._opinions: dict[str, OpinionRecord] = {}
        self._carriers: dict[str, Carrier] = {}  # rule 8: node -> its last heartbeat's
        self._waiting: dict[str, float] = {}  # rule 8: suspicions waiting for stream-mates
        self._owed: set[str] = set()
        # nodes this replica refused (shedding), and until when it told them to stay away
        self._refused: dict[str, float] = {}
        self._seen_epoch = -1
        self._pacer = BatchPacer(batch_interval)
        self.windows = GraceWindows(max_grace)  # rule 7
        # The last scan of observations() (oldest held, how many, applied index, leading,
        # next due): until one moves or an opinion is made (_fresh), a scan is skipped.
        self._held_since: float | None = None
        self._held_count = 0
        self._scan_applied = -1
        self._scan_leading = False
        # The pacer's gathering at the last scan (the replica sets the pacer's before each
        # tick): a follower then holds nothing (gathering rule 4) and the leader holds its
        # following observations to its cut too.
        self._scan_gathering = False
        self._due_at = math.inf
        self._fresh = False

    @property
    def detector(self) -> FailureDetector:
        """The failure detector (for status: last heard, suspicion level)."""
        return self._detector

    def refused(self, node_id: str, until: float, now: float) -> None:
        """This replica refused ``node_id``'s stream at ``now`` and told it to come back
        no sooner than ``until`` (monotonic seconds; shedding's retry hint): if the view shows
        the node ALIVE before this replica hears it, it is not suspected before
        ``until`` plus ``unheard_hold`` (rule 5). Entries are forgotten once used,
        or when stale (a refusal older than its hint plus ``unheard_hold``)."""
        refused = self._refused
        if until > refused.get(node_id, -math.inf):
            refused[node_id] = until
        if len(refused) > 4096:  # bound the map: drop the stale ones
            stale = now - self.unheard_hold
            for n in [n for n, t in refused.items() if t < stale]:
                del refused[n]

    def opinion(self, node_id: str) -> Opinion | None:
        """This replica's latest opinion of ``node_id`` (None if it has none)."""
        op = self._opinions.get(node_id)
        return None if op is None else op.opinion

    def heard(self, node_id: str) -> int | None:
        """The incarnation of ``node_id`` heard last (its latest opinion's), or None: never
        heard, or only assumed ALIVE after a restart (rule 5; tally rule 5: joining)."""
        op = self._opinions.get(node_id)
        return None if op is None or op.assumed else op.incarnation

    def suspects(self) -> list[str]:
        """Node ids whose latest opinion here is SUSPECT, sorted."""
        return sorted(k for k, op in self._opinions.items() if op.opinion is Opinion.SUSPECT)

    def tracked(self) -> int:
        """How many nodes this replica has an opinion of (its heartbeat load)."""
        return len(self._opinions)

    def owed(self) -> int:
        """How many observations are not yet committed."""
        return len(self._owed)

    @property
    def pacer(self) -> BatchPacer:
        """The pacer of held observations (the replica tells it whether it leads)."""
        return self._pacer

    def held(self) -> int:
        """How many ready observations the pacer held back at the last :meth:`observations`."""
        return self._held_count

    def _new_opinion(
        self,
        node_id: str,
        incarnation: int,
        opinion: Opinion,
        labels: tuple[tuple[str, str], ...],
        now: float,
        evidence: tuple[float, float] | None = None,
    ) -> None:
        self._seq += 1
        self._opinions[node_id] = OpinionRecord(
            incarnation, opinion, self._seq, labels, evidence, since=now
        )
        self._owed.add(node_id)
        self._fresh = True

    def heartbeat(
        self,
        node_id: str,
        incarnation: int,
        labels: Mapping[str, str],
        now: float,
        state: MembershipState,
        interval: float | None = None,
        lease: float | None = None,
        carrier: Carrier | None = None,
    ) -> HeartbeatVerdict:
        """Takes one heartbeat received at ``now`` (rules 1, 3, 4, 8).

        Args:
            node_id: validated node id.
            incarnation: the heartbeat's incarnation (>= 1).
            labels: the node's static labels (validated).
            now: monotonic seconds at receipt.
            state: the committed state machine, for the node's record.
            interval: seconds the node waits between heartbeats (None: the
                detector's current one for the node).
            lease: seconds of lease this heartbeat may earn (None: the
                observer's ``lease``); it scales with ``interval``.
            carrier: the host stream that carried it (rule 8); None for a
                heartbeat of its own stream.

        Returns:
            The verdict to put in the ack.
        """
        # A forgotten record's floor refuses as the record did (tally rule 12).
        record = state.member(node_id) or state.floors.record(node_id)
        highest = max(state.highest_incarnation(node_id) or 0, incarnation)
        if record is not None and (
            incarnation < record.incarnation
            or (incarnation == record.incarnation and record.state.is_final)
        ):
            # Rule 3: an old life. Tell it the record; never refresh anything.
            dead = MemberState.DEAD if incarnation < record.incarnation else record.state
            return HeartbeatVerdict(accepted=False, state=dead, incarnation=highest, lease=0.0)
        if incarnation <= state.retired(node_id):
            # Rule 3: this life left before it joined the view.
            self._forget_retired(node_id, state)
            return HeartbeatVerdict(
                accepted=False, state=MemberState.LEFT, incarnation=highest, lease=0.0
            )
        current = self._opinions.get(node_id)
        if current is not None and incarnation < current.incarnation:
            # Older than what this replica already heard: refused as well. The
            # newer life may not be committed yet, so name it explicitly: the
            # node must learn it was superseded, not that it was declared DEAD.
            return HeartbeatVerdict(
                accepted=False,
                state=MemberState.DEAD,
                incarnation=max(highest, current.incarnation),
                lease=0.0,
            )
        if current is None or incarnation > current.incarnation:
            self._detector.remove(node_id)
            current = None
        self._detector.heartbeat(node_id, now, interval)
        self._carried(node_id, carrier, now)
        if self.windows.active:
            self.windows.heard(node_id)  # rule 7: a held-back suspicion is over
        if current is None or current.opinion is not Opinion.ALIVE or current.assumed:
            self._new_opinion(
                node_id, incarnation, Opinion.ALIVE, tuple(sorted(labels.items())), now
            )
            current = self._opinions[node_id]
        self._check_committed(node_id, current, state, now)
        granted, grace, grant = 0.0, 0.0, 0
        if current.committed:
            granted = self._lease if lease is None else lease
            self._detector.hold(node_id, now + granted)
            if self.windows.active:
                grace, grant = self.windows.lease(node_id, incarnation, now)
        member_state = MemberState.JOINING
        if record is not None and record.incarnation == incarnation:
            member_state = record.state
        return HeartbeatVerdict(
            accepted=True,
            state=member_state,
            incarnation=highest,
            lease=granted,
            grace=grace,
            grace_id=grant,
        )

    def _check_committed(
        self, node_id: str, op: OpinionRecord, state: MembershipState, now: float
    ) -> None:
        if op.committed or op.assumed:
            return
        rec = state.observation(self._replica_id, node_id)
        if rec is not None and (rec.incarnation, rec.seq) >= (op.incarnation, op.seq):
            if op.proposed_at is not None and not op.retried:
                self.retry.sample(now - op.proposed_at)  # rule 2: the commit time
            op.committed = True
            op.proposed_at = None
            self._owed.discard(node_id)

    def tick(
        self, now: float, state: MembershipState, lateness: float = 0.0, wall: float | None = None
    ) -> None:
        """Turns the detector's suspicions into SUSPECT opinions (rules 1, 5, 6, 7); tracks
        members ALIVE in the view but never heard here (rule 5), forgets final ones.

        Args:
            now: monotonic seconds.
            state: the committed state machine.
            lateness: seconds of the recent past this replica could not hear
                (rule 6; >= 0, bounded by the caller).
            wall: Unix seconds now, for the grace windows (rule 7); None: none.

        Raises:
            ValueError: ``lateness`` is negative or NaN.
        """
        if not lateness >= 0:
            raise ValueError(f"lateness must be >= 0, got {lateness!r}")
        if state.epoch != self._seen_epoch:
            self._sync_view(now, state)
        windows = self.windows
        if windows.needs_sync(state):
            for node_id in windows.sync(state, now, wall):
                windows.rearm(node_id, now, self._detector)
        if now < self._grace_until:
            return
        heard_until = now - lateness
        for node_id, end in windows.ended(heard_until):
            windows.rearm(node_id, end, self._detector)
        for node_id in self._detector.tick(heard_until):
            op = self._opinions.get(node_id)
            if op is None or op.opinion is Opinion.SUSPECT:
                continue
            if windows.active and windows.defer(
                node_id, op.incarnation, heard_until, self._detector
            ):
                continue  # rule 7: the node is in its grace window here
            carrier = self._carriers.get(node_id)
            if carrier is not None:
                wait = self._siblings_held(node_id, carrier, heard_until)
                if wait > heard_until:
                    self._waiting[node_id] = wait  # rule 8: suspected with them at ``wait``
                    continue
            self._suspect(node_id, op, heard_until, now)
        if self._waiting:
            for node_id, until in sorted(self._waiting.items()):
                if until > heard_until:
                    continue
                del self._waiting[node_id]
                op = self._opinions.get(node_id)
                suspect = self._detector.state(node_id) is DetectorState.SUSPECT
                if op is None or op.opinion is not Opinion.ALIVE or not suspect:
                    continue  # heard meanwhile (the detector is HEALTHY again), or gone
                self._suspect(node_id, op, heard_until, now)

    def _suspect(self, node_id: str, op: OpinionRecord, heard_until: float, now: float) -> None:
        """The node's SUSPECT opinion, and its silent stream-mates' (rule 8)."""
        evidence = self._evidence(node_id, heard_until)
        self._new_opinion(node_id, op.incarnation, Opinion.SUSPECT, op.labels, now, evidence)
        carrier = self._carriers.get(node_id)
        if carrier is not None:
            self._suspect_siblings(node_id, carrier, heard_until, now, evidence)

    def _siblings_held(self, node_id: str, carrier: Carrier, heard_until: float) -> float:
        """Rule 8: when the last hold of ``node_id``'s silent stream-mates ends, if within
        :data:`SIBLING_WAIT` of ``heard_until`` (else ``heard_until``: no wait)."""
        detector = self._detector
        last = detector.last_heard(node_id)
        if last is None or carrier.last > last + SIBLING_WAIT:
            return heard_until
        latest = heard_until
        for other in carrier.nodes:
            op = self._opinions.get(other)
            if other == node_id or op is None or op.opinion is not Opinion.ALIVE:
                continue
            held = detector.held_until(other)
            if heard_until < held <= heard_until + SIBLING_WAIT:
                latest = max(latest, held)
        return latest

    def _carried(self, node_id: str, carrier: Carrier | None, now: float = -math.inf) -> None:
        """Rule 8: ``node_id``'s last heartbeat came with ``carrier`` (None: on its own)."""
        old = self._carriers.get(node_id)
        if carrier is not None:
            carrier.last = max(carrier.last, now)
        if old is carrier:
            return
        if old is not None:
            old.nodes.discard(node_id)
        if carrier is None:
            self._carriers.pop(node_id, None)
        else:
            carrier.nodes.add(node_id)
            self._carriers[node_id] = carrier

    def _suspect_siblings(
        self,
        node_id: str,
        carrier: Carrier,
        heard_until: float,
        now: float,
        evidence: tuple[float, float],
    ) -> None:
        """Rule 8: the stream-mates of ``node_id``, suspected now when the stream went silent."""
        windows, detector = self.windows, self._detector
        last = detector.last_heard(node_id)
        if last is None or carrier.last > last + SIBLING_WAIT:
            return  # the stream carried others since: only this node went silent
        for other in sorted(carrier.nodes):
            op = self._opinions.get(other)
            if other == node_id or op is None or op.opinion is not Opinion.ALIVE:
                continue
            if detector.held_until(other) > heard_until:
                continue  # it still holds a lease of ours: never suspected before it ends
            if windows.active and windows.defer(other, op.incarnation, heard_until, detector):
                continue  # rule 7
            self._new_opinion(other, op.incarnation, Opinion.SUSPECT, op.labels, now, evidence)

    def _evidence(self, node_id: str, now: float) -> tuple[float, float]:
        """(silence, suspicion level) of a node just suspected, rounded for the log."""
        last = self.windows.last_heard(node_id, self._detector)
        silence = 0.0 if last is None else max(0.0, now - last)
        level = self._detector.suspicion(node_id, now)
        level = level if math.isfinite(level) else _MAX_LEVEL
        return round(silence, 3), round(min(max(level, 0.0), _MAX_LEVEL), 3)

    def _sync_view(self, now: float, state: MembershipState) -> None:
        self._seen_epoch = state.epoch
        for member in state.view().members:
            op = self._opinions.get(member.node_id)
            if member.state is MemberState.ALIVE:
                if op is None or op.incarnation < member.incarnation:
                    self._detector.remove(member.node_id)
                    self._detector.heartbeat(member.node_id, now)
                    hold = now + self.unheard_hold
                    refused = self._refused.pop(member.node_id, None)
                    if refused is not None and refused + self.unheard_hold > hold:
                        hold = refused + self.unheard_hold  # rule 5: we sent it away
                    self._detector.hold(member.node_id, hold)
                    self._opinions[member.node_id] = OpinionRecord(
                        member.incarnation, Opinion.ALIVE, 0, (), assumed=True
                    )
                    self._owed.discard(member.node_id)
            elif op is not None and op.incarnation <= member.incarnation:
                # DEAD or LEFT at the tracked life: nothing more to say about it.
                self._detector.remove(member.node_id)
                self.windows.forget(member.node_id)
                self._carried(member.node_id, None)
                del self._opinions[member.node_id]
                self._owed.discard(member.node_id)

    def _forget_retired(self, node_id: str, state: MembershipState) -> bool:
        """Drops the opinion of ``node_id`` if its incarnation is retired or forgotten (rule 3)."""
        op = self._opinions.get(node_id)
        floor = max(state.retired(node_id), state.floors.incarnation(node_id))
        if op is None or op.incarnation > floor:
            return False
        self._detector.remove(node_id)
        self._carried(node_id, None)
        del self._opinions[node_id]
        self._owed.discard(node_id)
        return True

    def observations(
        self, now: float, state: MembershipState, cut: bool = False
    ) -> tuple[Observation, ...]:
        """The observations to propose now: new ones and those due for a retry, the held
        ones once the pacer releases them (rule 2, :mod:`arbiter.core.batching`).

        Args:
            now: monotonic seconds.
            state: the committed state machine, to drop what is committed.
            cut: the gathering leader cuts now for the batches it gathered
                (:mod:`arbiter.core.gathering`, rule 3): the held ones go with
                them, whatever the pacer says of their own age.

        Returns:
            Observations sorted by node id, each counted as proposed at ``now``.
        """
        if (
            not self._fresh
            and not cut
            and now < self._due_at
            and state.applied_index == self._scan_applied
            and self._pacer.leading == self._scan_leading
            and self._pacer.gathering == self._scan_gathering
        ):
            return ()  # nothing new, committed, due or released since the last scan
        chosen: list[tuple[str, OpinionRecord]] = []
        following: list[tuple[str, OpinionRecord]] = []
        held: list[tuple[str, OpinionRecord]] = []
        voters = [r for r in state.arbiters if r != self._replica_id]
        pacing = self._pacer.interval > 0
        gathering, leading = self._pacer.gathering, self._pacer.leading
        me = self._replica_id
        retry_after = self.retry.timeout
        due = math.inf
        in_flight = False  # an ALIVE observation of ours proposed, not committed, not due
        for node_id in sorted(self._owed):
            if self._forget_retired(node_id, state):
                continue
            op = self._opinions[node_id]
            self._check_committed(node_id, op, state, now)
            if op.committed:
                continue
            if op.proposed_at is not None and now < op.proposed_at + retry_after:
                due = min(due, op.proposed_at + retry_after)
                in_flight = in_flight or op.opinion is Opinion.ALIVE
                continue
            if not pacing or op.opinion is Opinion.SUSPECT:
                chosen.append((node_id, op))
            elif gathering and not leading:
                following.append((node_id, op))  # gathering rule 4: the leader aligns
            elif gathering:  # the leader: everything to its cut, but a refutation
                if refutes(node_id, op.incarnation, me, state):
                    following.append((node_id, op))
                else:
                    held.append((node_id, op))
            elif follows(op.opinion, op.incarnation, node_id, me, voters, state):
                following.append((node_id, op))
            else:
                held.append((node_id, op))
        self._fresh = False
        self._held_since, self._held_count = None, 0
        self._scan_applied, self._scan_leading = state.applied_index, self._pacer.leading
        self._scan_gathering = gathering
        if in_flight and (following or held):
            # batching rule 6: one ALIVE batch in flight; the rest waits for its commit
            refuting = [p for p in following if refutes(p[0], p[1].incarnation, me, state)]
            chosen += refuting
            waiting = len(following) + len(held) - len(refuting)
            if waiting:
                self._held_since, self._held_count = now, waiting
            following, held = [], []
        chosen += following
        if held:
            oldest = min(
                op.since if op.proposed_at is None else op.proposed_at + retry_after
                for _, op in held
            )  # when each became ready: made, or due for a retry
            release = self._pacer.release_at(oldest)
            if now >= release or cut:
                self._pacer.released(now, oldest)
                chosen += held
            else:
                self._held_since, self._held_count = oldest, len(held)
                due = min(due, release)
        chosen.sort(key=lambda pair: pair[0])
        if chosen:
            due = min(due, now + retry_after)
        self._due_at = due
        out: list[Observation] = []
        retries = False
        for node_id, op in chosen:
            if op.proposed_at is not None:
                op.retried = True
                retries = retries or op.era == self._era  # not re-sent to a new leader
            op.proposed_at, op.era = now, self._era
            out.append(to_observation(node_id, op, self._detector.kind))
        if retries:
            self.retry.retried()
        return tuple(out)

    def new_leader(self) -> None:
        """A leader was elected, or a proposal found none (retry rule 4)."""
        self.retry.reset()
        self._era += 1
        self._fresh = True  # rescan: retries may be due sooner

    def follow_due(self, state: MembershipState) -> bool:
        """True when observations are held and entries were applied since they were
        judged: some may follow now (:mod:`arbiter.core.batching`, rule 3)."""
        return self._held_since is not None and state.applied_index != self._scan_applied

    def needs_sync(self, state: MembershipState) -> bool:
        """True when the view or grace windows moved since the last :meth:`tick` (rules 5, 7)."""
        return state.epoch != self._seen_epoch or self.windows.needs_sync(state)

    def next_deadline(self, lateness: float = 0.0) -> float | None:
        """Earliest monotonic time at which :meth:`tick` or :meth:`observations` has work.

        ``lateness``: as in :meth:`tick` (rule 6); a detector deadline is due
        that much later. A view that moved since the last tick is not counted
        here (the observer does not hold the state): callers check
        :meth:`needs_sync` too, and :meth:`follow_due` after an apply.
        """
        times: list[float] = []
        d = self._detector.next_deadline()
        if d is not None:
            times.append(max(_later(d, lateness), self._grace_until))
        g = self.windows.next_deadline()
        if g is not None:
            times.append(max(_later(g, lateness), self._grace_until))  # rule 7: a window's end
        if self._waiting:
            times.append(_later(min(self._waiting.values()), lateness))  # rule 8
        if self._fresh:
            times.append(0.0)  # a new opinion may be due at once
        elif self._owed and math.isfinite(self._due_at):
            times.append(self._due_at)  # a retry, or the pacer's release (last scan)
        return min(times) if times else None


def _later(deadline: float, lateness: float) -> float:
    """The earliest ``t`` with ``t - lateness >= deadline`` (seconds): :meth:`Observer.tick`
    at ``t`` sees the deadline passed. ``deadline + lateness`` alone may round so that
    ``t - lateness`` falls just short, and a driver woken then would tick, find nothing
    due, and be told the same deadline again (found by the simulator's slow-accept runs)."""
    t = deadline + lateness
    while t - lateness < deadline:
        t = math.nextafter(t, math.inf)
    return t


@dataclass(slots=True)
class OpinionRecord:
    """This replica's latest opinion of one node and where its observation stands.

    Attributes:
        incarnation: the node's life the opinion is about.
        opinion: ALIVE or SUSPECT.
        seq: the observation's sequence number (observer rule 1).
        labels: the node's labels, sorted (key, value) pairs.
        evidence: SUSPECT only: (silence seconds, suspicion level).
        assumed: ALIVE after a restart without hearing the node: never proposed
            (observer rule 5).
        proposed_at: monotonic seconds it was last proposed (None: never, or
            committed).
        committed: the committed state holds it.
        since: monotonic seconds it was made: ready to be proposed from then.
        retried: proposed more than once: no commit-time sample (Karn's rule,
            :mod:`arbiter.core.retry`).
        era: the leader era it was last proposed in (retry rule 4).
    """

    incarnation: int
    opinion: Opinion
    seq: int
    labels: tuple[tuple[str, str], ...]
    evidence: tuple[float, float] | None = None
    assumed: bool = False
    proposed_at: float | None = None
    committed: bool = False
    since: float = 0.0
    retried: bool = False
    era: int = 0


def to_observation(node_id: str, op: OpinionRecord, detector: str) -> Observation:
    """The observation ``op`` owes the log (labels only with ALIVE, evidence only with
    SUSPECT, ``detector`` naming the failure detector that produced the evidence)."""
    ev = op.evidence if op.opinion is Opinion.SUSPECT else None
    return Observation(
        node_id=node_id,
        incarnation=op.incarnation,
        opinion=op.opinion,
        seq=op.seq,
        labels=op.labels if op.opinion is Opinion.ALIVE else (),
        silence=None if ev is None else ev[0],
        suspicion=None if ev is None else ev[1],
        detector=detector if ev is not None else "",
    )
