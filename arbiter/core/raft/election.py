"""Election rules: whether to grant a (pre-)vote, and counting the answers.

Pure pieces of leader election (Ongaro & Ousterhout, "In Search of an
Understandable Consensus Algorithm", 2014, §5.2 and §5.4.1; PreVote from
Ongaro's thesis, 2014, §9.6; as in etcd raft's ``Step`` and ``poll``).
"""

from __future__ import annotations

import enum
from collections.abc import Collection

from arbiter.core.raft.log import RaftLog
from arbiter.core.raft.messages import Message, MessageType

__all__ = ["Tally", "TallyResult", "may_grant"]


def may_grant(
    request: Message,
    *,
    term: int,
    vote: str | None,
    lead: str | None,
    heard_from_leader: bool,
    log: RaftLog,
) -> bool:
    """Whether to grant a VOTE or PRE_VOTE of the voter's current term or later.

    Args:
        request: the VOTE or PRE_VOTE.
        term: the voter's current term (after any step-up for a VOTE).
        vote: whom the voter voted for in ``term``.
        lead: the leader the voter knows in ``term``.
        heard_from_leader: the voter heard from a leader within the election
            timeout (or is the leader).
        log: the voter's log.

    Returns:
        VOTE: the voter has not voted for another candidate in ``term`` and
        knows no leader in it, and the candidate's log is at least as up to
        date (§5.4.1). PRE_VOTE: the request is for a later term, the voter
        has not heard from a leader within the election timeout, and the log
        is at least as up to date (§9.6).
    """
    if request.type is MessageType.PRE_VOTE:
        can_vote = request.term > term and not heard_from_leader
    else:
        assert request.type is MessageType.VOTE and request.term == term
        can_vote = vote == request.src or (vote is None and lead is None)
    return can_vote and log.is_up_to_date(request.index, request.log_term)


class TallyResult(enum.Enum):
    """Where a campaign stands."""

    PENDING = "pending"
    WON = "won"
    LOST = "lost"


class Tally:
    """The answers to one campaign (pre-vote or vote round).

    Args:
        voters: the voters of the configuration in force; a strict majority
            of them wins, and of refusals loses. Answers from anyone else (a
            learner, a replica removed since) are not counted.
    """

    def __init__(self, voters: Collection[str]) -> None:
        self._voters = frozenset(voters)
        self._quorum = len(self._voters) // 2 + 1
        self._votes: dict[str, bool] = {}

    def record(self, voter: str, granted: bool) -> TallyResult:
        """Counts one voter's answer (only its first one counts, as in etcd)."""
        if voter in self._voters:
            self._votes.setdefault(voter, granted)
        yes = sum(self._votes.values())
        if yes >= self._quorum:
            return TallyResult.WON
        if len(self._votes) - yes >= self._quorum:
            return TallyResult.LOST
        return TallyResult.PENDING
