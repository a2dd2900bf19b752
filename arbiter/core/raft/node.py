"""RaftNode: the sans-I/O Raft state machine of one arbiter replica.

Time and randomness come in as arguments; messages, entries to persist and
entries to apply go out through ``ready()``. The model is etcd raft
(``tick``/``step``/``propose`` in, ``Ready`` out) and the algorithm is Ongaro
& Ousterhout, "In Search of an Understandable Consensus Algorithm", 2014
(cited as §n), with PreVote and CheckQuorum from Ongaro's thesis, 2014
(§9.6 and §6.2), log compaction by snapshots from §7, and single-server
membership changes with learners from the thesis §4.1-4.2 (rule 9 and
:mod:`arbiter.core.raft.membership`).

Rules:

1. Terms (§5.1). A message with a higher term makes this replica a follower
   of that term (vote cleared), except: a PRE_VOTE and a granted
   PRE_VOTE_RESP never change a term (§9.6); and a VOTE or PRE_VOTE is refused
   without a term change while the replica is in a leader's lease (rule 5).
   A message with a lower term is stale: an APPEND, HEARTBEAT, VOTE or
   PRE_VOTE is answered with a refusal carrying the current term so its
   sender catches up (Fig. 2); stale answers are dropped.
2. Elections (§5.2). A follower or candidate that hears no leader for its
   election timeout, drawn uniformly from [T, 2T) at each role or term
   change, campaigns: with ``pre_vote`` first as PRE_CANDIDATE, asking for
   votes at term + 1 without taking it; on a quorum of grants it becomes
   CANDIDATE (term + 1, votes for itself) and asks for real votes. A quorum
   of grants makes it LEADER; a quorum of refusals makes it a follower again.
3. Voting (§5.2, §5.4.1). A vote is granted to a candidate whose log is at
   least as up to date, if this replica has not voted for another in the
   term and knows no leader in it. A pre-vote is granted for a future term
   to a candidate whose log is at least as up to date, if this replica has
   not heard from a leader within T (§9.6). Granting a vote restarts the
   election timer.
4. Leading (§5.3, §5.4.2, §8). A new leader appends a no-op entry at once,
   replicates (see ``replication``), heartbeats every heartbeat interval,
   and commits only entries of its own term by counting replicas.
5. CheckQuorum and leases (§6.2, §4.2.3). With ``check_quorum`` a leader
   that has not heard from a quorum (itself included) within T steps down;
   a follower that heard from its leader within T, or a leader, refuses
   higher-term votes and pre-votes without changing term (etcd). Pre-votes
   are refused on that condition even without ``check_quorum`` (rule 3).
6. Proposals. The leader appends; a follower that knows its leader
   forwards a PROPOSE; otherwise ``ProposalDropped`` is raised.
7. Output (etcd's Ready). Term and vote changes are in ``Ready.hard_state``
   of the same Ready as (or an earlier one than) every message that depends
   on them; the caller persists before it sends. No message to self.
8. Snapshots (§7). ``compact`` folds applied entries into a snapshot of the
   state machine that the caller took; a leader sends its snapshot to a
   follower whose next entry is compacted away (see ``replication``); a
   follower takes it as described in ``follower`` and hands it out in
   ``Ready.snapshot``. A restart restores the snapshot, then the entries
   after it.
9. Membership (thesis §4). The configuration in force is the latest in the
   log, committed or not (``configuration``); only its voters campaign,
   vote-count, commit and keep a leader's lease; a learner, a replica
   started to join and a removed one never campaign. Messages from replicas
   outside it are taken (a lagging follower may not know its new leader
   yet). Changes are proposed with ``propose_conf_change`` under the rules
   of :mod:`arbiter.core.raft.membership`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from arbiter.core.raft import membership
from arbiter.core.raft.config import RaftConfig, Rng
from arbiter.core.raft.configuration import EMPTY, ArbiterConfiguration, ConfChange, ConfChangeOp
from arbiter.core.raft.election import Tally
from arbiter.core.raft.errors import InvalidInput, ProposalDropped
from arbiter.core.raft.log import RaftLog
from arbiter.core.raft.messages import (
    Entry,
    HardState,
    Message,
    MessageType,
    RaftStatus,
    Ready,
    Role,
    Snapshot,
)
from arbiter.core.raft.protocol import VOTE_REQUESTS, RaftProtocol
from arbiter.core.raft.ready import Outbox

__all__ = ["RaftNode"]


class RaftNode(RaftProtocol):
    """One replica's Raft state machine (no I/O).

    Args:
        node_id: this replica's id.
        peers: the initial voters, ``node_id`` included (no addresses);
            ignored when ``configuration`` is given.
        config: timers and switches; validated here.
        rng: the source of election-timeout jitter.
        now: monotonic seconds at start.
        hard_state: the restored durable term, vote and commit, if any.
        snapshot: the restored durable snapshot, if any; the caller has
            restored its state machine from it.
        entries: the restored durable log, contiguous from the snapshot's
            index + 1 (from 1 without a snapshot).
        configuration: the initial configuration (index 0), used only
            where the snapshot carries none; it must then include ``node_id``.
        join: start with no configuration (a replica added to a running
            group with an empty disk): never campaign, learn the
            configuration from the leader's snapshot.

    Raises:
        ValueError: for an invalid config (``RaftConfig.validate``).
        InvalidInput: if ``node_id`` is not in the initial configuration
            (and not ``join``), ``peers`` has duplicates, or the restored
            state is inconsistent.
    """

    def __init__(
        self,
        *,
        node_id: str,
        peers: Sequence[str] = (),
        config: RaftConfig,
        rng: Rng,
        now: float,
        hard_state: HardState | None = None,
        entries: Sequence[Entry] = (),
        snapshot: Snapshot | None = None,
        configuration: ArbiterConfiguration | None = None,
        join: bool = False,
    ) -> None:
        config.validate()
        if join:
            configuration = EMPTY
        elif configuration is None:
            if len(set(peers)) != len(peers):
                raise InvalidInput(f"peers {list(peers)} must be distinct")
            configuration = ArbiterConfiguration.initial(dict.fromkeys(peers, ""))
        carried = snapshot is not None and snapshot.configuration is not None
        if not (join or carried) and node_id not in configuration:
            raise InvalidInput(f"the configuration {configuration} must include {node_id!r}")
        hs = hard_state if hard_state is not None else HardState(term=0, vote=None, commit=0)
        # The commit index is durable only as a convenience: a snapshot is committed.
        commit = max(hs.commit, snapshot.index if snapshot is not None else 0)
        try:
            self._log = RaftLog(
                entries, snapshot=snapshot, committed=commit, configuration=configuration
            )
        except ValueError as e:
            raise InvalidInput(f"restored log: {e}") from e
        if self._log.last_term > hs.term:
            raise InvalidInput(f"restored log has term {self._log.last_term} > term {hs.term}")
        self._id = node_id
        self._conf = self._log.configuration
        self._committed_conf = self._log.configuration_at(self._log.committed)
        self._term_start = math.inf  # index of this leader's no-op (membership rule 1)
        self._config = config
        self._rng = rng
        self._term = hs.term
        self._vote = hs.vote
        self._role = Role.FOLLOWER
        self._lead = None
        self._out = Outbox(node_id, self._log, hs)
        self._tally = Tally(self._conf.voters)
        self._rep = None
        self._leader_contact = -math.inf
        self._heartbeat_due = math.inf
        self._timeout = 0.0
        self._election_due = 0.0
        self._reset_election_timer(now)

    # --- inputs -------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Fires every timer due at ``now`` (monotonic seconds): election, heartbeat, quorum,
        and a leader's automatic promotion of caught-up learners (membership rule 4)."""
        if self._role is Role.LEADER:
            rep = self._leader()
            if self._config.check_quorum and now >= rep.lease_expiry():
                self._become_follower(self._term, None, now)  # rule 5
                return
            if now >= self._heartbeat_due:
                rep.broadcast_heartbeat()
                self._heartbeat_due = now + self._config.heartbeat_interval
                if self._config.auto_promote:
                    self._auto_promote(now)
        elif now >= self._election_due:
            if self._conf.is_voter(self._id):
                self._campaign(now, pre=self._config.pre_vote)
            else:
                self._reset_election_timer(now)  # rule 9: never campaigns

    def step(self, msg: Message, now: float) -> None:
        """Takes one message from a peer, received at ``now`` (monotonic seconds).

        Raises:
            InvalidInput: if the message is not for this replica, comes from
                outside the group, is malformed (an APPEND or SNAPSHOT whose
                fields disagree), or is a PROPOSE with a term or no entries.
            ProposalDropped: for a PROPOSE this replica can neither take (not
                the leader) nor forward (no leader known, or the leader is
                the sender). The proposal is lost; callers may ignore this.
            ConflictingState: it contradicts this replica's durable state.
        """
        if msg.dst != self._id or not msg.src or msg.src == self._id:
            raise InvalidInput(f"{self._id}: message {msg.src!r} -> {msg.dst!r} is not for me")
        if msg.type is MessageType.PROPOSE:
            self._step_propose(msg, now)
            return
        if msg.term > self._term:
            if msg.type in VOTE_REQUESTS and self._in_lease(now):
                self._refuse_vote(msg)  # rule 5: no term change
                return
            granted_pre_vote = msg.type is MessageType.PRE_VOTE_RESP and not msg.reject
            if msg.type is not MessageType.PRE_VOTE and not granted_pre_vote:
                self._become_follower(msg.term, None, now)  # an APPEND/HEARTBEAT sets the leader
        elif msg.term < self._term:
            self._step_stale(msg)
            return
        self._step_current(msg, now)
        self._sync_configuration(now)

    def propose(self, data: bytes, now: float) -> None:
        """Proposes ``data`` for the log (rule 6).

        Args:
            data: the command, opaque to Raft; must not be empty (``b""`` is
                the leader's no-op).
            now: monotonic seconds (kept so every input carries time).

        Raises:
            ValueError: if ``data`` is empty.
            ProposalDropped: if no leader is known.
        """
        if not data:
            raise ValueError("empty proposal: b'' is reserved for the leader's no-op entry")
        if self._role is Role.LEADER:
            self._append_local((Entry(term=self._term, index=0, data=data),), now)
        elif self._role is Role.FOLLOWER and self._lead is not None:
            entry = Entry(term=0, index=0, data=data)  # placed by the leader
            self._send(MessageType.PROPOSE, self._lead, term=0, entries=(entry,))
        else:
            raise ProposalDropped(f"{self._id} knows no leader in term {self._term}")

    def propose_conf_change(self, change: ConfChange, now: float) -> ArbiterConfiguration:
        """Proposes one single-server change (membership rules 1 and 2).

        Args:
            change: the change; its address is kept for ADD_LEARNER only.
            now: monotonic seconds.

        Returns:
            The configuration it makes, now in force on this leader (its
            ``index`` is the new entry's).

        Raises:
            ProposalDropped: this replica is not the leader, another change
                is not committed yet, or this leader's no-op is not committed.
            InvalidInput: the change does not apply to the configuration in
                force (``ArbiterConfiguration.apply``).
        """
        result = membership.check_change(
            change,
            leader=self._role is Role.LEADER,
            log=self._log,
            term_start=self._term_start,
            node_id=self._id,
        )
        self._append_local((membership.config_entry(change, result, self._term),), now)
        return self._log.configuration

    @property
    def leader(self) -> str | None:
        """The leader this replica knows of, or None: ``status().leader`` without
        building a status (read on every heartbeat ack)."""
        return self._lead

    @property
    def configuration(self) -> ArbiterConfiguration:
        """The configuration in force: the latest in the log, committed or not (§4.1)."""
        return self._log.configuration

    def configuration_at(self, index: int) -> ArbiterConfiguration:
        """The configuration in force at log ``index`` (at or above the snapshot's index)."""
        return self._log.configuration_at(index)

    @property
    def removed(self) -> bool:
        """True once a committed configuration no longer has this replica (membership rule 3)."""
        return membership.is_removed(self._log, self._id)

    def wants_snapshot(self) -> bool:
        """True when a leader needs a snapshot to send to a joining replica (replication
        rule 8) and has none; the caller compacts (``compact``) at its applied index."""
        return self._rep is not None and self._rep.snapshot_wanted

    def compact(self, index: int, data: bytes) -> Snapshot:
        """Takes ``data`` as the snapshot at ``index`` and discards the entries up to it (rule 8).

        Call between ``advance`` and the next ``ready``. The caller persists
        the returned snapshot, then may drop the entries up to ``index`` from
        its storage. Leaders send it to followers that need those entries.

        Args:
            index: a log index this replica has applied (``status().applied``
                or lower) and not compacted yet.
            data: the state machine after applying entries 1..``index``.

        Returns:
            The snapshot (index, term of the entry at ``index``, data).

        Raises:
            InvalidInput: if ``index`` is not above the current snapshot's
                index, or not applied yet.
        """
        log = self._log
        if not log.snapshot_index < index <= log.applied:
            raise InvalidInput(
                f"compact to {index}: must be in {log.snapshot_index + 1}..{log.applied} "
                "(above the snapshot, applied)"
            )
        return log.compact(index, data)

    def snapshot(self) -> Snapshot:
        """The latest snapshot (index 0 with empty data if nothing was compacted)."""
        return self._log.snapshot

    def report_unreachable(self, peer: str) -> None:
        """Transport hint: ``peer`` could not be reached; never changes term or role.

        A leader stops streaming to the peer and probes it again (etcd
        ``ReportUnreachable``); on any other role the hint has nothing to act on.

        A peer outside the configuration in force is ignored (it may have
        just been removed).
        """
        if self._rep is not None:
            self._rep.report_unreachable(peer)

    # --- outputs ------------------------------------------------------------------

    def has_ready(self) -> bool:
        """True if ``ready()`` has anything to persist, send or apply."""
        return self._out.has_ready(self._hard_state())

    def ready(self) -> Ready:
        """What to persist, send and apply now; see ``Ready`` for the order.

        Does not change the node: hand the result back with ``advance``.
        """
        return self._out.ready(self._hard_state())

    def advance(self, ready: Ready) -> None:
        """Acknowledges that ``ready``, the oldest one not yet acknowledged, was done.

        Inputs stepped between ``ready()`` and ``advance()`` are kept for the
        next Ready.

        Raises:
            InvalidInput: if ``ready`` is not the oldest unacknowledged Ready.
        """
        self._out.advance(ready)

    def next_deadline(self) -> float:
        """The monotonic time (seconds) at which ``tick`` next has something to do."""
        if self._role is Role.LEADER:
            due = self._heartbeat_due
            if self._config.check_quorum:
                due = min(due, self._leader().lease_expiry())
            return due
        return self._election_due

    def status(self, now: float | None = None) -> RaftStatus:
        """This replica's role, term, leader, log positions and configuration.

        Args:
            now: monotonic seconds, for a leader's ``progress[...].last_heard``;
                None leaves ``progress`` empty.
        """
        rep = self._rep
        return RaftStatus(
            id=self._id,
            role=self._role,
            term=self._term,
            leader=self._lead,
            commit=self._log.committed,
            applied=self._log.applied,
            last_index=self._log.last_index,
            snapshot_index=self._log.snapshot_index,
            progress=rep.status(now) if rep is not None and now is not None else {},
            configuration=self._log.configuration,
            removed=self.removed,
        )

    def in_quorum(self, now: float) -> bool:
        """Whether this replica is part of a working majority at ``now`` (seconds).

        Returns:
            For a leader: it heard from a quorum (itself included) within the
            last election timeout. For a follower: it heard from its leader
            within the last election timeout. Otherwise False.
        """
        if self._role is Role.LEADER:
            return now < self._leader().lease_expiry()
        return self._role is Role.FOLLOWER and self._heard_from_leader(now)

    def quorum_until(self) -> float:
        """Monotonic seconds before which :meth:`in_quorum` holds with no further input:
        ``in_quorum(now)`` is ``now < quorum_until()`` (-inf when it does not hold at all).
        A message or a tick may move it; read it again after one."""
        if self._role is Role.LEADER:
            return self._leader().lease_expiry()
        if self._role is Role.FOLLOWER and self._lead is not None:
            return self._leader_contact + self._config.election_timeout
        return -math.inf

    def _auto_promote(self, now: float) -> None:
        """Membership rule 4: proposes PROMOTE for the first caught-up learner."""
        for learner in self._leader().caught_up_learners(now):
            change = ConfChange(op=ConfChangeOp.PROMOTE, replica_id=learner)
            try:
                self.propose_conf_change(change, now)
            except (ProposalDropped, InvalidInput):
                return
            return
