"""RaftNode: the sans-I/O Raft state machine of one arbiter replica.

Time and randomness come in as arguments; messages, entries to persist and
entries to apply go out through ``ready()``. The model is etcd raft
(``tick``/``step``/``propose`` in, ``Ready`` out) and the algorithm is Ongaro
& Ousterhout, "In Search of an Understandable Consensus Algorithm", 2014
(cited as §n), with PreVote and CheckQuorum from Ongaro's thesis, 2014
(§9.6 and §6.2), and log compaction by snapshots from §7. Membership is
static.

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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Unpack

from arbiter.core.raft.config import RaftConfig, Rng
from arbiter.core.raft.election import Tally, TallyResult, may_grant
from arbiter.core.raft.errors import ConflictingState, InvalidInput, ProposalDropped
from arbiter.core.raft.follower import answer_append, answer_heartbeat, answer_snapshot
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
from arbiter.core.raft.quorum import quorum_size
from arbiter.core.raft.ready import MessageFields, Outbox
from arbiter.core.raft.replication import Replicator

__all__ = ["RaftNode"]


_VOTE_REQUESTS = (MessageType.VOTE, MessageType.PRE_VOTE)
_FOLLOWER_ANSWERS = {
    MessageType.APPEND: answer_append,
    MessageType.SNAPSHOT: answer_snapshot,
    MessageType.HEARTBEAT: answer_heartbeat,
}
_FROM_LEADER = tuple(_FOLLOWER_ANSWERS)


class RaftNode:
    """One replica's Raft state machine (static membership, no I/O).

    Args:
        node_id: this replica's id.
        peers: every replica id of the group, ``node_id`` included.
        config: timers and switches; validated here.
        rng: the source of election-timeout jitter.
        now: monotonic seconds at start.
        hard_state: the restored durable term, vote and commit, if any.
        snapshot: the restored durable snapshot, if any; the caller has
            restored its state machine from it.
        entries: the restored durable log, contiguous from the snapshot's
            index + 1 (from 1 without a snapshot).

    Raises:
        ValueError: for an invalid config (``RaftConfig.validate``).
        InvalidInput: if ``node_id`` is not in ``peers``, ``peers`` has
            duplicates, or the restored state is inconsistent.
    """

    def __init__(
        self,
        *,
        node_id: str,
        peers: Sequence[str],
        config: RaftConfig,
        rng: Rng,
        now: float,
        hard_state: HardState | None = None,
        entries: Sequence[Entry] = (),
        snapshot: Snapshot | None = None,
    ) -> None:
        config.validate()
        ids = sorted(set(peers))
        if len(ids) != len(peers) or node_id not in ids:
            raise InvalidInput(f"peers {list(peers)} must be distinct and include {node_id!r}")
        hs = hard_state if hard_state is not None else HardState(term=0, vote=None, commit=0)
        if hs.vote is not None and hs.vote not in ids:
            raise InvalidInput(f"restored vote for {hs.vote!r}, not a peer")
        # The commit index is durable only as a convenience: a snapshot is committed.
        commit = max(hs.commit, snapshot.index if snapshot is not None else 0)
        try:
            self._log = RaftLog(entries, snapshot=snapshot, committed=commit)
        except ValueError as e:
            raise InvalidInput(f"restored log: {e}") from e
        if self._log.last_term > hs.term:
            raise InvalidInput(f"restored log has term {self._log.last_term} > term {hs.term}")
        self._id = node_id
        self._others = tuple(p for p in ids if p != node_id)
        self._quorum = quorum_size(len(ids))
        self._config = config
        self._rng = rng
        self._term = hs.term
        self._vote = hs.vote
        self._role = Role.FOLLOWER
        self._lead: str | None = None
        self._out = Outbox(node_id, self._log, hs)
        self._tally = Tally(self._quorum)
        self._rep: Replicator | None = None
        self._leader_contact = -math.inf
        self._heartbeat_due = math.inf
        self._timeout = 0.0
        self._election_due = 0.0
        self._reset_election_timer(now)

    # --- inputs -------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Fires every timer due at ``now`` (monotonic seconds): election, heartbeat, quorum."""
        if self._role is Role.LEADER:
            rep = self._leader()
            if self._config.check_quorum and now >= rep.lease_expiry():
                self._become_follower(self._term, None, now)  # rule 5
                return
            if now >= self._heartbeat_due:
                rep.broadcast_heartbeat()
                self._heartbeat_due = now + self._config.heartbeat_interval
        elif now >= self._election_due:
            self._campaign(now, pre=self._config.pre_vote)

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
        if msg.dst != self._id or msg.src not in self._others:
            raise InvalidInput(f"{self._id}: message {msg.src!r} -> {msg.dst!r} is not for me")
        if msg.type is MessageType.PROPOSE:
            self._step_propose(msg)
            return
        if msg.term > self._term:
            if msg.type in _VOTE_REQUESTS and self._in_lease(now):
                self._refuse_vote(msg)  # rule 5: no term change
                return
            granted_pre_vote = msg.type is MessageType.PRE_VOTE_RESP and not msg.reject
            if msg.type is not MessageType.PRE_VOTE and not granted_pre_vote:
                self._become_follower(msg.term, None, now)  # an APPEND/HEARTBEAT sets the leader
        elif msg.term < self._term:
            self._step_stale(msg)
            return
        self._step_current(msg, now)

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
            self._append_local((data,))
        elif self._role is Role.FOLLOWER and self._lead is not None:
            entry = Entry(term=0, index=0, data=data)  # placed by the leader
            self._send(MessageType.PROPOSE, self._lead, term=0, entries=(entry,))
        else:
            raise ProposalDropped(f"{self._id} knows no leader in term {self._term}")

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

        Raises:
            InvalidInput: if ``peer`` is not another replica of the group.
        """
        if peer not in self._others:
            raise InvalidInput(f"{peer!r} is not a peer of {self._id}")
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

    def status(self) -> RaftStatus:
        """This replica's role, term, leader and log positions."""
        return RaftStatus(
            id=self._id,
            role=self._role,
            term=self._term,
            leader=self._lead,
            commit=self._log.committed,
            applied=self._log.applied,
            last_index=self._log.last_index,
            snapshot_index=self._log.snapshot_index,
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

    # --- role changes ----------------------------------------------------------------

    def _become_follower(self, term: int, lead: str | None, now: float) -> None:
        assert term >= self._term, f"term going back from {self._term} to {term}"
        if term > self._term:
            self._term = term
            self._vote = None
        self._role = Role.FOLLOWER
        self._lead = lead
        self._rep = None
        self._tally = Tally(self._quorum)
        self._reset_election_timer(now)

    def _campaign(self, now: float, *, pre: bool) -> None:
        """Rule 2: asks every peer for a (pre-)vote, voting for itself."""
        assert self._role is not Role.LEADER
        if pre:
            self._role = Role.PRE_CANDIDATE
            request, term = MessageType.PRE_VOTE, self._term + 1
        else:
            self._term += 1
            self._vote = self._id
            self._role = Role.CANDIDATE
            request, term = MessageType.VOTE, self._term
        self._lead = None
        self._tally = Tally(self._quorum)
        self._reset_election_timer(now)
        for peer in self._others:
            self._send(
                request, peer, term=term, index=self._log.last_index, log_term=self._log.last_term
            )
        self._poll(self._id, True, now)

    def _poll(self, voter: str, granted: bool, now: float) -> None:
        result = self._tally.record(voter, granted)
        if result is TallyResult.WON and self._role is Role.PRE_CANDIDATE:
            self._campaign(now, pre=False)
        elif result is TallyResult.WON:
            self._become_leader(now)
        elif result is TallyResult.LOST:
            self._become_follower(self._term, None, now)

    def _become_leader(self, now: float) -> None:
        assert self._role is Role.CANDIDATE, f"{self._role} cannot become leader"
        self._role = Role.LEADER
        self._lead = self._id
        self._tally = Tally(self._quorum)
        self._rep = Replicator(
            node_id=self._id,
            followers=self._others,
            term=self._term,
            log=self._log,
            config=self._config,
            send=self._out.messages.append,
            now=now,
        )
        self._heartbeat_due = now + self._config.heartbeat_interval if self._others else math.inf
        self._append_local((b"",))  # rule 4: commit earlier terms' entries soon (§8)

    # --- message handling -------------------------------------------------------------

    def _step_current(self, msg: Message, now: float) -> None:
        """Handles a message of the current term (or a pre-vote one for a future term)."""
        t = msg.type
        if t in _VOTE_REQUESTS:
            self._handle_vote_request(msg, now)
        elif t is MessageType.VOTE_RESP:
            if self._role is Role.CANDIDATE:
                self._poll(msg.src, not msg.reject, now)
        elif t is MessageType.PRE_VOTE_RESP:
            # A grant echoes the term asked for (term + 1); a refusal carries the voter's term.
            wanted = self._term if msg.reject else self._term + 1
            if self._role is Role.PRE_CANDIDATE and msg.term == wanted:
                self._poll(msg.src, not msg.reject, now)
        elif t in _FROM_LEADER:
            if self._role is Role.LEADER:
                raise ConflictingState(f"two leaders in term {self._term}: {self._id}, {msg.src}")
            if self._role is not Role.FOLLOWER:
                self._become_follower(self._term, msg.src, now)
            if self._lead is None:
                self._lead = msg.src
            if self._lead != msg.src:
                raise ConflictingState(f"term {self._term}: leaders {self._lead}, {msg.src}")
            self._leader_contact = now
            self._election_due = now + self._timeout
            answer = _FOLLOWER_ANSWERS[t]
            self._out.messages.append(answer(self._log, msg))
        elif self._rep is not None:  # APPEND_RESP, HEARTBEAT_RESP
            if t is MessageType.APPEND_RESP:
                self._rep.on_append_resp(msg, now)
            else:
                self._rep.on_heartbeat_resp(msg, now)
        # else: an answer to a leader this replica no longer is: stale, dropped.

    def _step_stale(self, msg: Message) -> None:
        """Answers a lower-term request with the current term (rule 1)."""
        if msg.type in _FROM_LEADER:
            self._send(
                MessageType.APPEND_RESP,
                msg.src,
                index=msg.index,
                reject=True,
                reject_hint=self._log.last_index,
            )
        elif msg.type in _VOTE_REQUESTS:
            self._refuse_vote(msg)

    def _step_propose(self, msg: Message) -> None:
        if msg.term != 0 or not msg.entries:
            raise InvalidInput(f"PROPOSE from {msg.src} must have term 0 and entries")
        if self._role is Role.LEADER:
            self._append_local(tuple(e.data for e in msg.entries))
        elif self._role is Role.FOLLOWER and self._lead not in (None, msg.src):
            assert self._lead is not None
            self._send(MessageType.PROPOSE, self._lead, term=0, entries=msg.entries)
        else:
            raise ProposalDropped(f"{self._id} cannot take or forward a proposal from {msg.src}")

    def _handle_vote_request(self, msg: Message, now: float) -> None:
        if not may_grant(
            msg,
            term=self._term,
            vote=self._vote,
            lead=self._lead,
            heard_from_leader=self._heard_from_leader(now),
            log=self._log,
        ):
            self._refuse_vote(msg)
            return
        if msg.type is MessageType.VOTE:
            self._vote = msg.src
            self._reset_election_timer(now)
            self._send(MessageType.VOTE_RESP, msg.src)
        else:
            self._send(MessageType.PRE_VOTE_RESP, msg.src, term=msg.term)  # echo the future term

    def _refuse_vote(self, msg: Message) -> None:
        resp = MessageType.VOTE_RESP if msg.type is MessageType.VOTE else MessageType.PRE_VOTE_RESP
        self._send(resp, msg.src, reject=True)

    # --- helpers -------------------------------------------------------------------

    def _append_local(self, datas: Sequence[bytes]) -> None:
        rep = self._leader()
        last = self._log.last_index
        self._log.append(
            [Entry(term=self._term, index=last + 1 + i, data=d) for i, d in enumerate(datas)]
        )
        rep.maybe_commit()  # a group of one commits at once
        rep.broadcast_append()

    def _send(
        self, type_: MessageType, dst: str, term: int | None = None, **f: Unpack[MessageFields]
    ) -> None:
        self._out.send(type_, dst, self._term if term is None else term, **f)

    def _leader(self) -> Replicator:
        assert self._rep is not None, f"{self._id} is {self._role}, not leader"
        return self._rep

    def _heard_from_leader(self, now: float) -> bool:
        if self._role is Role.LEADER:
            return True
        return self._lead is not None and now - self._leader_contact < self._config.election_timeout

    def _in_lease(self, now: float) -> bool:
        """Rule 5: whether a higher-term (pre-)vote request is refused without a term change."""
        return self._config.check_quorum and self._heard_from_leader(now)

    def _reset_election_timer(self, now: float) -> None:
        t = self._config.election_timeout
        self._timeout = t + t * self._rng.random()
        self._election_due = now + self._timeout

    def _hard_state(self) -> HardState:
        return HardState(term=self._term, vote=self._vote, commit=self._log.committed)
