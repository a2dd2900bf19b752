"""One arbiter replica as a sans-I/O whole: Raft, the state machine and the observer.

The asyncio driver and the deterministic simulator both run exactly this
composition; they differ only in where time, messages and storage come from.

Rules:

1. Inputs: ``heartbeat`` (a node's heartbeat received at ``now``), ``step`` (a
   Raft message from a peer), ``tick`` (time passes), ``propose_leave``,
   ``propose_remove``, ``propose_grace`` and ``propose_config_change``
   (:mod:`arbiter.core.replica`).
2. ``tick`` ticks Raft and the observer, then proposes the owed observations due
   now as one batch (observer rules 1, 2; :mod:`arbiter.core.batching`: the
   leader cuts a join storm into few batches, the others follow its commits;
   from rules version 3 the leader gathers the others' ALIVE batches,
   forwarded to it, into its cut's entry: :mod:`arbiter.core.gathering`).
   Without a leader the batch is dropped; the observer proposes it again after
   its retry interval. A replica that is not a member of the applied
   configuration (a joining or removed replica) proposes none. A learner does:
   the tally stores its observations without counting them (its rule 9), so
   its opinions are committed and it grants leases (observer rule 4) before
   it is promoted, so no node loses its quorum of leases when it starts to
   vote (session rule 9). A replica that is no member of the configuration in force (its
   removal appended, not yet committed) grants no lease: a node must not
   count on a replica that is leaving.
3. Output follows etcd's Ready: the caller takes ``ready()``, persists its
   snapshot, hard state and entries (when :func:`must_persist` says there are
   any), then hands it to ``deliver(ready, send)``, which sends its messages
   and advances: restores the state machine from the Ready's snapshot (a
   leader's, when this replica was too far behind), applies the committed
   entries and returns what that did (:class:`Delivered`). The asyncio driver
   and the simulator both take this one step; they differ only in how they
   persist (a writer thread, a simulated disk) and send.
4. Restart: a replica is built from its durable snapshot (the state machine
   is restored from it) and the log entries after it; the entries up to the
   restored commit index are applied again by the first Ready. The state
   machine's configuration in a snapshot must be the one Raft's snapshot
   carries (for a snapshot written before configurations were replicated:
   have exactly the initial voters): anything else is a
   :class:`RestoreError`, before anything is persisted.
5. Compaction: ``maybe_compact`` snapshots the state machine once
   ``settings.snapshot_every`` entries, or as many bytes as the last
   snapshot, were applied since it (:mod:`arbiter.core.compaction`) and
   returns the snapshot for the caller to persist (Raft §7).
6. Instance: a leader whose applied state has no instance id yet proposes a
   Bootstrap with a random one (drawn from the injected random source), once
   per term; the tally keeps the first applied (its rule 10). The Bootstrap
   carries this code's rules version, and a leader whose applied state has a
   lower one proposes one with the state's instance id (ranks rule 6).
7. Configuration (Raft single-server changes with learners, Ongaro's
   thesis §4; :mod:`arbiter.core.raft.membership`): ``configuration`` is the
   one in force in the log (Raft's peers), ``applied_configuration`` the one
   as of the applied index (the tally's quorum, tally rule 11); the initial
   one comes from the shell at first start only, later the snapshot and the
   log decide. Committed CONFIG entries are applied to the tally in log
   order with the other entries. A leader that needs a snapshot for a joining
   replica gets one from ``maybe_compact``.
8. Bounded history: ``tick`` also lets :mod:`arbiter.core.retention` age the
   DEAD and LEFT records on this replica's clock; a leader proposes the
   Forget it returns (tally rule 12), one pending at a time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from arbiter.core.commands import (
    RULES,
    Bootstrap,
    Grace,
    Leave,
    Observation,
    ObserveBatch,
    ObserveBatches,
    Opinion,
    Remove,
    encode,
)
from arbiter.core.compaction import MIN_COMPACT_BYTES, Compaction
from arbiter.core.detection import DetectorState, FailureDetector
from arbiter.core.detection.interval import IntervalGovernor, LoadPolicy, load_cap
from arbiter.core.gathering import GATHER_RULES, Gather
from arbiter.core.observer import Carrier, HeartbeatVerdict, Observer
from arbiter.core.raft import (
    ArbiterConfiguration,
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryType,
    HardState,
    InvalidInput,
    Message,
    MessageType,
    ProposalDropped,
    RaftConfig,
    RaftNode,
    RaftStatus,
    Ready,
    Rng,
    Role,
    Snapshot,
    decode_change,
)
from arbiter.core.restore import RestoreError, restore_state
from arbiter.core.retention import Retention, RetentionPolicy
from arbiter.core.tally import ApplyResult, MembershipState

__all__ = [
    "Delivered",
    "Replica",
    "ReplicaSettings",
    "RestoreError",
    "must_persist",
    "restore_state",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaSettings:
    """What a replica core needs besides Raft's own configuration.

    Attributes:
        lease: seconds of lease granted per accepted heartbeat (<= detection time).
        observation_retry: seconds before an uncommitted observation is proposed again.
        restart_grace: seconds after start without casting suspicion (one maximum lease).
        heartbeat_interval: seconds between heartbeats suggested to nodes of a
            small cluster (H0); the detector scales its timeout with it.
        snapshot_every: applied log entries between two snapshots of the
            state machine (rule 5); 0 never snapshots.
        snapshot_bytes: the fewest bytes of applied entries that call for a
            snapshot before ``snapshot_every`` entries, when they are also at
            least the last snapshot's size (:mod:`arbiter.core.compaction`).
        heartbeat_budget: heartbeats per second this replica should handle
            at most; the suggested interval grows with the number of nodes
            to stay within it (:func:`arbiter.core.detection.interval.suggest_interval`);
            ``inf`` always suggests ``heartbeat_interval``.
        max_heartbeat_interval: H_max, the cap of the suggested interval up to
            ``heartbeat_budget * max_heartbeat_interval`` nodes, seconds (>=
            heartbeat_interval); it grows beyond (interval rule 3).
        max_nodes: the most nodes a replica tracks; the longest interval ever
            suggested or accepted is the load cap at this many
            (:attr:`ceiling`, interval rule 5); 0: ``max_heartbeat_interval``.
        load_policy: how the measured load moves the interval (interval rule 4).
        retention: when DEAD and LEFT records are forgotten (replica rule 8); the
            default forgets nothing.
        observation_batch_interval: seconds between two batches of held
            (joining) ALIVE observations on the leader; the other replicas
            follow its commits and wait at most twice this
            (:mod:`arbiter.core.batching`); 0 proposes every owed
            observation on every tick.
        max_grace: the longest grace window a node is granted, seconds
            (``arbiter/core/grace_windows.py``); an ask for more gets this much.
    """

    lease: float
    observation_retry: float
    restart_grace: float
    heartbeat_interval: float
    snapshot_every: int = 0
    snapshot_bytes: int = MIN_COMPACT_BYTES
    heartbeat_budget: float = math.inf
    max_heartbeat_interval: float = math.inf
    max_nodes: int = 0
    load_policy: LoadPolicy = field(default_factory=LoadPolicy)
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    observation_batch_interval: float = 0.0
    max_grace: float = 300.0

    @property
    def ceiling(self) -> float:
        """The longest interval suggested or accepted from a node, seconds (interval rule 5)."""
        if self.max_nodes <= 0 or math.isinf(self.heartbeat_budget):
            return self.max_heartbeat_interval
        if math.isinf(self.max_heartbeat_interval):
            return math.inf
        return max(
            self.max_heartbeat_interval,
            load_cap(
                self.max_nodes, budget=self.heartbeat_budget, maximum=self.max_heartbeat_interval
            ),
        )

    def governor(self) -> IntervalGovernor:
        """A new :class:`IntervalGovernor` with these settings (the suggested interval)."""
        return IntervalGovernor(
            base=self.heartbeat_interval,
            budget=self.heartbeat_budget,
            maximum=max(self.heartbeat_interval, self.max_heartbeat_interval),
            ceiling=max(self.heartbeat_interval, self.ceiling),
            policy=self.load_policy,
        )

    @property
    def max_lateness(self) -> float:
        """The most lateness the detectors are shifted by (replica rule 9), seconds:
        the longest lease (the lease at :attr:`ceiling`), or 4 leases without a ceiling."""
        ceiling = self.ceiling
        return self.lease_for(ceiling) if math.isfinite(ceiling) else 4 * self.lease

    def lease_for(self, interval: float) -> float:
        """Seconds of lease for a node heartbeating every ``interval`` seconds.

        ``lease`` is the lease at ``heartbeat_interval``; it scales with the
        interval, as the detector's suspicion time does.
        """
        return self.lease * interval / self.heartbeat_interval


class Proposals:
    """The proposing half of a replica (see the module docstring)."""

    replica_id: str
    raft: RaftNode
    observer: Observer
    settings: ReplicaSettings
    state: MembershipState
    proposals_dropped: int
    _rng: Rng
    _bootstrap_term: int

    def _bootstrap(self, now: float) -> None:
        """Replica rule 6: a leader proposes an instance id while the applied state has
        none, or its rules version while the state's is lower (the state's instance
        id then), once per term (a second one applied changes nothing)."""
        st = self.raft.status()
        state = self.state
        if st.role is not Role.LEADER or self._bootstrap_term == st.term:
            return
        if state.instance and state.rules >= RULES:
            return
        self._bootstrap_term = st.term
        # 104 random bits from the injected source, as hex (reproducible in the simulator).
        instance = state.instance or "".join(
            f"{int(self._rng.random() * 2**52):013x}" for _ in range(2)
        )
        try:
            self.raft.propose(encode(Bootstrap(instance=instance, rules=RULES)), now)
        except ProposalDropped:
            self.proposals_dropped += 1

    def propose_leave(self, node_id: str, incarnation: int, request_id: str, now: float) -> None:
        """Proposes a graceful leave; the command says whether this replica's
        detector hears the node at ``incarnation`` (tally rule 5: it is joining).

        Raises:
            ProposalDropped: no leader is known.
        """
        heard_by = self.replica_id if self.observer.heard(node_id) == incarnation else ""
        command = Leave(
            node_id=node_id, incarnation=incarnation, request_id=request_id, heard_by=heard_by
        )
        self.raft.propose(encode(command), now)

    def propose_remove(
        self, node_id: str, incarnation: int, by: str, request_id: str, now: float
    ) -> None:
        """Proposes an administrator's removal of a member (tally rule 5a).

        Args:
            node_id: the member.
            incarnation: the incarnation to remove; 0 for the recorded one.
            by: who asked (non-empty).
            request_id: matches the applied outcome to the waiting call.
            now: monotonic seconds.

        Raises:
            ProposalDropped: no leader is known.
        """
        command = Remove(node_id=node_id, incarnation=incarnation, by=by, request_id=request_id)
        self.raft.propose(encode(command), now)

    def propose_grace(
        self,
        node_id: str,
        incarnation: int,
        seconds: float,
        reason: str,
        request_id: str,
        now: float,
        wall: float,
        by: str = "",
    ) -> float:
        """Proposes a node's grace window, or its end (``seconds == 0``; tally rule 13).

        Args:
            node_id: the node.
            incarnation: the incarnation asking.
            seconds: the window asked for, >= 0; capped at ``settings.max_grace``.
            reason: why, in words (``arbiter/core/grace.py`` rule 5).
            request_id: matches the applied outcome to the waiting call.
            now: monotonic seconds.
            wall: this replica's wall clock, Unix seconds (the window's ``until``
                is ``wall`` plus the seconds granted: grace_windows rule 1).
            by: "" when the node asks, else the administrator (grace rule 2).

        Returns:
            The seconds proposed (``seconds`` capped).

        Raises:
            ProposalDropped: no leader is known.
            ValueError: ``seconds`` is not a finite number >= 0, or a bad reason.
        """
        granted = float(min(seconds, self.settings.max_grace))
        command = Grace(
            node_id=node_id,
            incarnation=incarnation,
            seconds=granted,
            until=float(wall) + granted if granted > 0 else 0.0,
            reason=reason,
            request_id=request_id,
            by=by,
        )
        self.raft.propose(encode(command), now)
        return granted

    def propose_config_change(
        self, op: str, replica_id: str, address: str | None, now: float
    ) -> None:
        """Proposes one change of the arbiter group (rule 7; Raft membership rules 1-2).

        Args:
            op: ``"add_learner"`` (needs ``address``), ``"promote"`` or ``"remove"``.
            replica_id: the replica the change is about.
            address: its ``host:port`` for ``add_learner``; ignored otherwise.
            now: monotonic seconds.

        The change is in force on this leader at once (:attr:`configuration`)
        and committed like any entry; the tally follows it once it is applied
        (:attr:`applied_configuration`). Automatic promotion of a caught-up
        learner is ``RaftConfig.auto_promote`` (on by default).

        Raises:
            ProposalDropped: this replica is not the leader, another change
                is not committed yet, or this leader has not committed an
                entry of its term yet; retry later (or at the leader).
            InvalidInput: an unknown ``op``, or a change that does not apply:
                adding an existing id, an address already in use or none,
                promoting a replica that is not a learner, removing an
                unknown id or the last voter.
        """
        try:
            kind = ConfChangeOp(op)
        except ValueError:
            ops = ", ".join(o.value for o in ConfChangeOp)
            raise InvalidInput(f"unknown configuration change {op!r} (one of {ops})") from None
        addr = (address or "") if kind is ConfChangeOp.ADD_LEARNER else ""
        self.raft.propose_conf_change(ConfChange(op=kind, replica_id=replica_id, address=addr), now)


class Replica(Proposals):
    """Raft + membership state machine + observer of one replica.

    Args:
        replica_id: this replica's id.
        replica_ids: the group's first voters (the configuration at index
            0), this one included; ignored with ``join``. They count only
            until a snapshot carries the configuration, so a restart must
            pass the same ones as the first start (the shell keeps them in
            the data dir); the configuration in force is then the snapshot's
            and the log's (rule 7), whatever the command line says now.
        raft_config: Raft timings and features.
        settings: lease, retry and grace timings.
        detector: the failure detector (owned from now on).
        rng: randomness for Raft's election timeouts.
        now: monotonic seconds at start.
        seq_base: first observation sequence number (above any used before a restart).
        hard_state: restored Raft hard state, if any.
        entries: restored Raft log entries, contiguous after the snapshot
            (from index 1 without one), if any.
        snapshot: restored Raft snapshot, if any; the state machine starts
            from it (rule 4).
        addresses: replica id -> ``host:port`` of those first voters
            (missing ones are ``""``).
        join: this replica starts empty to join a running group: no initial
            configuration, it never campaigns, and it learns the
            configuration from the leader's snapshot once an ``add_learner``
            for it is in the leader's log. Ignored when restoring a snapshot
            (a replica that joined before restarts as any other).

    Raises:
        RestoreError: the snapshot does not fit the configuration (rule 4).
        InvalidInput: the restored Raft state contradicts itself, or this
            replica is not in the initial configuration (without ``join``).
    """

    def __init__(
        self,
        *,
        replica_id: str,
        replica_ids: Sequence[str],
        raft_config: RaftConfig,
        settings: ReplicaSettings,
        detector: FailureDetector,
        rng: Rng,
        now: float,
        seq_base: int,
        hard_state: HardState | None = None,
        entries: Sequence[Entry] = (),
        snapshot: Snapshot | None = None,
        addresses: Mapping[str, str] | None = None,
        join: bool = False,
    ) -> None:
        self.replica_id = replica_id
        self.replica_ids = () if join else tuple(replica_ids)
        self.settings = settings
        addresses = addresses or {}
        self._initial = ArbiterConfiguration.initial(
            {r: addresses.get(r, "") for r in self.replica_ids}
        )
        restoring = snapshot is not None and snapshot.index > 0
        join = join and not restoring
        if restoring:
            assert snapshot is not None
            self.state = restore_state(snapshot, self._initial)
            if snapshot.configuration is None:  # an old one: Raft takes the checked config
                snapshot = Snapshot(
                    index=snapshot.index,
                    term=snapshot.term,
                    data=snapshot.data,
                    configuration=self.state.configuration,
                )
        elif join:
            self.state = MembershipState([replica_id])  # a placeholder until the leader's snapshot
        else:
            self.state = MembershipState(self._initial)
        self._joining = join  # until the leader's snapshot replaces the placeholder state
        self._rng = rng
        self._bootstrap_term = -1
        self._leader_seen: str | None = None  # the leader at the last tick
        self.raft = RaftNode(
            node_id=replica_id,
            config=raft_config,
            rng=rng,
            now=now,
            hard_state=hard_state,
            entries=entries,
            snapshot=snapshot,
            configuration=self._initial,
            join=join,
        )
        # A leader's snapshot handed out by ready(), decoded once and checked there.
        self._restoring: tuple[Snapshot, MembershipState] | None = None
        self._compaction = Compaction(settings.snapshot_bytes)
        self.observer = Observer(
            replica_id=replica_id,
            detector=detector,
            lease=settings.lease,
            retry_after=settings.observation_retry,
            seq_base=seq_base,
            now=now,
            restart_grace=settings.restart_grace,
            batch_interval=settings.observation_batch_interval,
            max_grace=settings.max_grace,
        )
        self.retention = Retention(settings.retention)
        self.interval = settings.governor()  # the suggested interval (detection/interval.py)
        self.proposals_dropped = 0
        self.gather = Gather()  # the followers' ALIVE batches kept for the next cut
        # Observations proposed (retries included), for the replica's metrics.
        self.observations_proposed = 0

    # --- inputs ---------------------------------------------------------------------

    def heartbeat(
        self,
        node_id: str,
        incarnation: int,
        labels: Mapping[str, str],
        now: float,
        interval: float | None = None,
        carrier: Carrier | None = None,
    ) -> HeartbeatVerdict:
        """Takes a validated heartbeat received at ``now``; returns the verdict for the ack.

        Args:
            node_id: the node.
            incarnation: its incarnation (>= 1).
            labels: its static labels.
            now: monotonic seconds at receipt.
            interval: seconds the node says it heartbeats at (the interval
                suggested to it); None: ``settings.heartbeat_interval``. The
                detector expects this cadence and the lease scales with it.
            carrier: the host stream that carried it (observer rule 8).

        Raises:
            ValueError: ``interval`` is not in (0, settings.ceiling].
        """
        s = self.settings
        if interval is None:
            interval = s.heartbeat_interval
        elif not 0 < interval <= s.ceiling:
            raise ValueError(
                f"heartbeat interval must be in (0, {s.ceiling:g}] seconds, got {interval!r}"
            )
        verdict = self.observer.heartbeat(
            node_id, incarnation, labels, now, self.state, interval, s.lease_for(interval), carrier
        )
        suggested = self.suggested_interval()
        if suggested > interval and verdict.accepted:
            # The ack tells the node to heartbeat every `suggested` s from now on: its
            # next heartbeat may come that late, so no suspicion before D at that pace
            # (a first ack suggesting 0.94 s to a node at 0.15 s made it SUSPECT).
            self._hold(node_id, now + s.lease_for(suggested))
        if verdict.lease and self.replica_id not in self.raft.configuration:
            # Rule 2: a replica being removed promises nothing (a learner does).
            return dataclasses.replace(verdict, lease=0.0)
        return verdict

    def acked(self, node_id: str, incarnation: int, sent_at: float, interval: float | None) -> None:
        """Slow start (``membership/_node/linkrules.py`` rule 1): a node this replica has not
        granted a lease keeps one heartbeat in flight and sends the next only once the
        ack of the last reaches it. Its ack went out at ``sent_at`` (monotonic seconds),
        late if this replica was behind; the node's silence is counted from then: it is
        not suspected before ``sent_at`` plus the lease at ``interval`` (observer rule 6,
        Lifeguard's local health: a replica late in answering must not blame the node
        it kept waiting). Nothing for a node not ALIVE here at ``incarnation``, or
        already suspected.

        Args:
            node_id: the node acked.
            incarnation: the incarnation of the heartbeat acked.
            sent_at: monotonic seconds when the ack was handed to the transport.
            interval: the interval the node declared (None: the configured one).
        """
        obs = self.observer
        if obs.opinion(node_id) is not Opinion.ALIVE or obs.heard(node_id) != incarnation:
            return
        s = self.settings
        self._hold(node_id, sent_at + s.lease_for(interval or s.heartbeat_interval))

    def _hold(self, node_id: str, until: float) -> None:
        """No suspicion of ``node_id`` before ``until`` (monotonic seconds), unless it is
        suspected already (or not tracked)."""
        det = self.observer.detector
        if det.state(node_id) is DetectorState.HEALTHY:
            det.hold(node_id, until)

    def suggested_interval(self) -> float:
        """The heartbeat interval to suggest in acks now, seconds (``detection/interval.py``)."""
        return self.interval.suggest(self.observer.tracked())

    def observe_load(self, utilisation: float, now: float) -> bool:
        """Takes the replica's measured utilisation (0 to 1) at ``now``; True when the
        suggested interval moved (interval rule 4). Raises ValueError: negative or NaN."""
        return self.interval.observe(utilisation, self.observer.tracked(), now)

    def step(self, msg: Message, now: float) -> None:
        """Steps one Raft message from a peer (a forwarded proposal with no leader is dropped;
        on a gathering leader a forwarded ALIVE batch is kept for its next cut: gathering
        rule 2)."""
        if (
            msg.type is MessageType.PROPOSE
            and self._gathering()
            and self.gather.offer(msg.src, msg.entries, now, self.state)
        ):
            return
        try:
            self.raft.step(msg, now)
        except ProposalDropped:
            self.proposals_dropped += 1

    def tick(self, now: float, lateness: float = 0.0, wall: float | None = None) -> None:
        """Lets time pass: Raft timers, detector suspicions, owed observations (rule 2),
        and, on a leader of a cluster without an instance id, its Bootstrap (rule 6),
        and on a leader the Forget of records past their retention (rule 8).
        ``lateness``: seconds of the recent past this replica could not hear
        (observer rule 6, bounded by ``settings.max_lateness``). ``wall``: Unix seconds
        now, for the grace windows (observer rule 7; None: no wall clock)."""
        self.raft.tick(now)
        self._bootstrap(now)
        raft = self.raft.status()
        self.observer.pacer.leading = leader = raft.role is Role.LEADER
        if raft.leader != self._leader_seen:
            self._leader_seen = raft.leader
            self.observer.new_leader()  # retry rule 4
        forget = self.retention.due(self.state, now, leader=leader)
        if forget is not None:
            try:
                self.raft.propose(encode(forget), now)
            except ProposalDropped:
                self.proposals_dropped += 1
        s = self.settings
        self.observer.unheard_hold = s.lease_for(self.suggested_interval())  # observer rule 5
        in_force = self._gathering(leader=True)  # gathering rules 1, 4
        if in_force and not self.observer.pacer.gathering:
            self.observer.pacer.reset()  # rule 3: a cut before it does not delay the first
        self.observer.pacer.gathering = in_force
        gathering = self._gathering(leader)
        if not gathering and len(self.gather):
            self.proposals_dropped += self.gather.drop()  # gathering rule 5
        self.observer.tick(now, self.state, min(lateness, s.max_lateness), wall)
        self._cut_landed(now, gathering)
        oldest = self.gather.oldest
        cut = gathering and oldest is not None and now >= self.observer.pacer.release_at(oldest)
        owed = self.observer.observations(now, self.state, cut)  # gathering rule 3
        member = not self._joining and self.replica_id in self.state.configuration
        if owed and member:
            self.observations_proposed += len(owed)
        mine = ObserveBatch(replica_id=self.replica_id, observations=owed) if owed else None
        pacer = self.observer.pacer
        if oldest is not None and gathering and (cut or pacer.last == now):
            pacer.released(now, oldest)  # gathering rule 3: with the leader's own held
            batches = self.gather.take()
            if mine is not None and member and _all_alive(owed):
                batches.append(mine)
                mine = None
            self._propose_observations(batches, now)
        if mine is not None and member:
            self._propose_observations([mine], now)
        if gathering and pacer.last == now and pacer.pending is None:
            pacer.pending = self.raft.status().last_index  # batching rule 2b

    def _cut_landed(self, now: float, gathering: bool) -> None:
        """Forgets the leader's pending cut once applied here, on losing the lead, or after
        the observer's longest retry timeout (batching rule 2b). While a cut is pending no
        other goes out, so the pacer's last release is when it went out."""
        pacer = self.observer.pacer
        if pacer.pending is None:
            return
        timeout = pacer.last + self.observer.retry.ceiling
        if not gathering or self.state.applied_index >= pacer.pending or now >= timeout:
            pacer.pending = None

    def _gathering(self, leader: bool | None = None) -> bool:
        """True while this replica leads and gathers (gathering rule 1)."""
        if leader is None:
            leader = self.raft.leader == self.replica_id
        return (
            leader
            and self.state.rules >= GATHER_RULES
            and self.observer.pacer.interval > 0
            and not self._joining
        )

    def _propose_observations(self, batches: Sequence[ObserveBatch], now: float) -> None:
        """Proposes one entry: the batch, or several as one ObserveBatches (commands rule 2b)."""
        command = batches[0] if len(batches) == 1 else ObserveBatches(batches=tuple(batches))
        try:
            self.raft.propose(encode(command), now)
        except ProposalDropped:
            self.proposals_dropped += 1
            self.observer.new_leader()  # nothing was sent: no backoff (retry rule 4)

    @property
    def configuration(self) -> ArbiterConfiguration:
        """The arbiter configuration in force: the latest in the Raft log, committed or not."""
        return self.raft.configuration

    @property
    def applied_configuration(self) -> ArbiterConfiguration:
        """The arbiter configuration as of the applied index: the tally's (its rule 11)."""
        return self.state.configuration

    @property
    def removed(self) -> bool:
        """True once a committed configuration no longer has this replica: the shell stops it."""
        return self.raft.removed

    # --- outputs --------------------------------------------------------------------

    def has_ready(self) -> bool:
        """True when :meth:`ready` has something to persist, send or apply."""
        return self.raft.has_ready()

    def ready(self) -> Ready:
        """What to persist, then send; pass it back to :meth:`advance` afterwards.

        Raises:
            RestoreError: the Ready carries a leader's snapshot that does not
                fit this replica (rule 4); nothing must be persisted.
        """
        rd = self.raft.ready()
        snap = rd.snapshot
        if snap is not None and (self._restoring is None or self._restoring[0] is not snap):
            self._restoring = (snap, restore_state(snap, self._initial))
        return rd

    def advance(self, ready: Ready) -> list[ApplyResult]:
        """Restores ``ready``'s snapshot, applies its committed entries, acknowledges it (rule 3).

        Call only after ``ready``'s snapshot, hard state and entries are
        durable and its messages are sent. After a snapshot, :attr:`state` is
        a new object: callers read it through the replica, never keep it.

        Returns:
            One result per committed entry, in log order (a restored snapshot
            has none: its changes are in the new state's view).
        """
        if ready.snapshot is not None:
            assert self._restoring is not None and self._restoring[0] is ready.snapshot
            self.state = self._restoring[1]
            self._restoring = None
            self._joining = False
            self._compaction.reset()
        results = [self._apply(e) for e in ready.committed_entries]
        self._compaction.applied(ready.committed_entries)
        self.raft.advance(ready)
        return results

    def _apply(self, entry: Entry) -> ApplyResult:
        if entry.type is EntryType.CONFIG:
            _, conf = decode_change(entry.data, entry.index)  # checked when it was appended
            return self.state.apply_configuration(entry.index, conf)
        return self.state.apply(entry.index, entry.data)

    def deliver(self, ready: Ready, send: Callable[[Message], None]) -> Delivered:
        """Steps 2 to 4 of a persisted Ready: sends its messages, then :meth:`advance`.

        Call only after ``ready``'s snapshot, hard state and entries are
        durable (:func:`must_persist`), never twice for one Ready.

        Args:
            ready: the Ready from :meth:`ready`.
            send: called with each message, in order (must not block).

        Returns:
            The restored snapshot, if any, and each committed entry with its result.
        """
        for msg in ready.messages:
            send(msg)
        results = self.advance(ready)
        return Delivered(
            restored=ready.snapshot,
            applied=tuple(zip(ready.committed_entries, results, strict=True)),
        )

    def maybe_compact(self, every: int | None = None) -> Snapshot | None:
        """Snapshots the state machine if enough entries were applied since the last one (rule 5).

        Call between :meth:`advance` and the next :meth:`ready`. A leader
        that needs a snapshot for a joining replica (rule 7) snapshots at
        once, whatever ``every``.

        Args:
            every: applied entries between snapshots; default
                ``settings.snapshot_every``; 0 never snapshots.

        Returns:
            The new snapshot, for the caller to persist (after which it may
            drop the log entries up to its index), or None.
        """
        every = self.settings.snapshot_every if every is None else every
        st = self.raft.status()
        wanted = self.raft.wants_snapshot() and st.applied > st.snapshot_index
        size = len(self.raft.snapshot().data)
        if not (wanted or self._compaction.due(every, st.applied - st.snapshot_index, size)):
            return None
        assert self.state.applied_index == st.applied, "state machine and raft disagree"
        self._compaction.reset()
        return self.raft.compact(st.applied, self.state.to_bytes())

    def next_deadline(self, lateness: float = 0.0) -> float:
        """The earliest monotonic time at which :meth:`tick` has work (given the
        ``lateness`` the next tick will be passed: observer rule 6).

        ``-inf`` (due at once) after an apply moved the view: the observer must
        start tracking members it has not heard (found by the simulator), while
        observations are held: some may follow now (batching rule 3), or once a
        gathering leader's pending cut is applied (batching rule 2b).
        """
        pacer = self.observer.pacer
        pending = pacer.pending
        if self.observer.needs_sync(self.state) or self.observer.follow_due(self.state):
            return float("-inf")
        if pending is not None and self.state.applied_index >= pending:
            return float("-inf")  # batching rule 2b: the cut landed, the next may go
        d = self.observer.next_deadline(min(lateness, self.settings.max_lateness))
        r = self.raft.next_deadline()
        f = self.retention.next_deadline(leader=self.raft.status().role is Role.LEADER)
        oldest = self.gather.oldest
        g = None if oldest is None else pacer.release_at(oldest)  # gathering 3
        if pending is not None:  # batching rule 2b: forgotten after the longest retry timeout
            g = min(g if g is not None else math.inf, pacer.last + self.observer.retry.ceiling)
        return min(t for t in (r, d, f, g) if t is not None)

    def in_quorum(self, now: float) -> bool:
        """True while this replica has a leader it can reach (itself included)."""
        return self.raft.in_quorum(now)

    def status(self, now: float | None = None) -> RaftStatus:
        """Raft's role, term, leader, indexes and configuration; with ``now``
        (monotonic seconds), a leader's progress of each peer too."""
        return self.raft.status(now)


def must_persist(ready: Ready) -> bool:
    """True when ``ready`` carries anything for the disk: a snapshot, hard state or entries."""
    return ready.snapshot is not None or ready.hard_state is not None or bool(ready.entries)


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivered:
    """What delivering one persisted Ready did (replica rule 3).

    Attributes:
        restored: the leader's snapshot that replaced the state machine, if any
            (its changes are in the new view, not in ``applied``).
        applied: each committed entry with the result of applying it, in log order.
    """

    restored: Snapshot | None
    applied: tuple[tuple[Entry, ApplyResult], ...]


if TYPE_CHECKING:
    from arbiter.core.observer import Observer
    from arbiter.core.tally import MembershipState


def _all_alive(owed: Sequence[Observation]) -> bool:
    """True when every observation is ALIVE (the leader's own batch joins its cut's entry)."""
    return all(o.opinion is Opinion.ALIVE for o in owed)
