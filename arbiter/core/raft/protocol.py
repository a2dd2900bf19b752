"""The transitions of :class:`~arbiter.core.raft.node.RaftNode`: role changes and messages.

:class:`RaftProtocol` holds the node's state and the private steps its
public inputs take: becoming follower, pre-candidate, candidate or leader,
answering a message of the current term, a stale one or a forwarded
proposal, appending as the leader and following the configuration in force.
The rules they implement are numbered in :mod:`arbiter.core.raft.node`; the
split is by concept: the public surface (inputs, outputs, queries) there,
the state transitions here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Unpack

from arbiter.core.raft import membership
from arbiter.core.raft.config import RaftConfig, Rng
from arbiter.core.raft.configuration import ArbiterConfiguration
from arbiter.core.raft.election import Tally, TallyResult, may_grant
from arbiter.core.raft.errors import ConflictingState, InvalidInput, ProposalDropped
from arbiter.core.raft.follower import answer_append, answer_heartbeat, answer_snapshot
from arbiter.core.raft.log import RaftLog
from arbiter.core.raft.messages import Entry, HardState, Message, MessageType, Role
from arbiter.core.raft.ready import MessageFields, Outbox
from arbiter.core.raft.replication import Replicator

__all__ = ["FROM_LEADER", "VOTE_REQUESTS", "RaftProtocol"]


VOTE_REQUESTS = (MessageType.VOTE, MessageType.PRE_VOTE)
_FOLLOWER_ANSWERS = {
    MessageType.APPEND: answer_append,
    MessageType.SNAPSHOT: answer_snapshot,
    MessageType.HEARTBEAT: answer_heartbeat,
}
FROM_LEADER = tuple(_FOLLOWER_ANSWERS)


class RaftProtocol:
    """The state of one Raft replica and its transitions (built by ``RaftNode``)."""

    _id: str
    _log: RaftLog
    _conf: ArbiterConfiguration
    _committed_conf: ArbiterConfiguration
    _term_start: float
    _config: RaftConfig
    _rng: Rng
    _term: int
    _vote: str | None
    _role: Role
    _lead: str | None
    _out: Outbox
    _tally: Tally
    _rep: Replicator | None
    _leader_contact: float
    _heartbeat_due: float
    _timeout: float
    _election_due: float

    # --- role changes ----------------------------------------------------------------

    def _become_follower(self, term: int, lead: str | None, now: float) -> None:
        assert term >= self._term, f"term going back from {self._term} to {term}"
        if term > self._term:
            self._term = term
            self._vote = None
        self._role = Role.FOLLOWER
        self._lead = lead
        self._rep = None
        self._term_start = math.inf
        self._tally = Tally(self._conf.voters)
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
        self._tally = Tally(self._conf.voters)
        self._reset_election_timer(now)
        for peer in self._conf.ids:
            if peer == self._id:
                continue
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
        self._tally = Tally(self._conf.voters)
        self._rep = Replicator(
            node_id=self._id,
            configuration=self._conf,
            term=self._term,
            log=self._log,
            config=self._config,
            send=self._out.messages.append,
            now=now,
        )
        self._heartbeat_due = now + self._config.heartbeat_interval
        self._term_start = self._log.last_index + 1
        self._append_local((Entry(term=self._term, index=0, data=b""),), now)  # rule 4 (§8)

    # --- message handling -------------------------------------------------------------

    def _step_current(self, msg: Message, now: float) -> None:
        """Handles a message of the current term (or a pre-vote one for a future term)."""
        t = msg.type
        if t in VOTE_REQUESTS:
            self._handle_vote_request(msg, now)
        elif t is MessageType.VOTE_RESP:
            if self._role is Role.CANDIDATE:
                self._poll(msg.src, not msg.reject, now)
        elif t is MessageType.PRE_VOTE_RESP:
            # A grant echoes the term asked for (term + 1); a refusal carries the voter's term.
            wanted = self._term if msg.reject else self._term + 1
            if self._role is Role.PRE_CANDIDATE and msg.term == wanted:
                self._poll(msg.src, not msg.reject, now)
        elif t in FROM_LEADER:
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
        if msg.type in FROM_LEADER:
            self._send(
                MessageType.APPEND_RESP,
                msg.src,
                index=msg.index,
                reject=True,
                reject_hint=self._log.last_index,
            )
        elif msg.type in VOTE_REQUESTS:
            self._refuse_vote(msg)

    def _step_propose(self, msg: Message, now: float) -> None:
        if msg.term != 0 or not msg.entries:
            raise InvalidInput(f"PROPOSE from {msg.src} must have term 0 and entries")
        if self._role is Role.LEADER:
            self._append_local(membership.forwarded(msg, self._term), now)
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

    def _append_local(self, entries: Sequence[Entry], now: float) -> None:
        """Appends ``entries`` (their index is set here) as the leader, then replicates."""
        rep = self._leader()
        last = self._log.last_index
        self._log.append([replace(e, index=last + 1 + i) for i, e in enumerate(entries)])
        self._sync_configuration(now)
        rep.maybe_commit()  # a group of one commits at once
        rep.broadcast_append()
        self._sync_configuration(now)

    def _sync_configuration(self, now: float) -> None:
        """Follows the configuration in force (rule 9), and steps a leader down once its
        own removal is committed (membership rule 3)."""
        log = self._log
        conf, committed = log.configuration, log.configuration_at(log.committed)
        if conf is not self._conf or committed is not self._committed_conf:
            self._conf, self._committed_conf = conf, committed
            if self._rep is not None:
                self._rep.set_configuration(conf, committed, now)
            if self._role in (Role.CANDIDATE, Role.PRE_CANDIDATE):
                self._tally = Tally(conf.voters)  # keep the answers' count honest
        if self._rep is not None and membership.leader_must_step_down(self._log, self._id):
            self._become_follower(self._term, None, now)

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
