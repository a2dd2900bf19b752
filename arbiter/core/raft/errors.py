"""The Raft core's exception hierarchy.

One root, :class:`RaftError` (itself an :class:`~arbiter.errors.ArbiterError`),
split by who is at fault (the h11 way): the caller asked for something Raft
cannot do now (:class:`ProposalDropped`), or handed the core an input that is
not valid for it (:class:`InvalidInput`), or a peer's message contradicts what
this replica holds durably (:class:`ConflictingState`). Broken invariants of
this replica's own state, which only a bug in the core or its caller can
break, are ``AssertionError``, never one of these: an ``assert`` vanishes under
``python -O``, so nothing a peer sends may be checked by one.
"""

from __future__ import annotations

from arbiter.errors import ArbiterError

__all__ = ["ConflictingState", "InvalidInput", "ProposalDropped", "RaftError"]


class RaftError(ArbiterError):
    """Root of every error the Raft core raises on purpose."""


class ProposalDropped(RaftError):
    """A proposal could not be accepted: no leader is known to take it.

    Raised by ``RaftNode.propose`` on a replica that knows no leader (it is a
    candidate, or its leader is unknown), and by ``RaftNode.step`` for a
    forwarded ``PROPOSE`` message that reaches a replica that is not the
    leader and cannot forward it on (etcd's ``ErrProposalDropped``). The
    proposal is lost; the proposer retries when a leader is known again.
    """


class TermNotCommitted(ProposalDropped):
    """A configuration change refused because the leader has not yet committed an
    entry of its own term (its no-op commits within a round: try again then)."""


class InvalidInput(RaftError, ValueError):
    """An input the core has no transition for.

    A message addressed to another replica or coming from a replica outside
    the configured membership, a message type that makes no sense on the
    wire (a ``PROPOSE`` carrying a term), restored state that contradicts
    itself, an unknown peer passed to ``report_unreachable``, or a message
    whose own fields contradict each other (an APPEND whose entries do not
    follow its previous index, a SNAPSHOT without a snapshot).
    """


class ConflictingState(RaftError):
    """A peer's message contradicts this replica's durable Raft state.

    Raft's guarantees rest on every replica keeping its term, vote and log
    across restarts (Ongaro & Ousterhout 2014, Fig. 2: "updated on stable
    storage before responding to RPCs"). A message that is only possible if
    that promise was broken, here or at the sender, raises this instead of
    being acted upon: a heartbeat committing an index beyond this log, a
    second leader in one term, a follower acknowledging an entry the leader
    does not hold. The usual cause is a data directory that was lost,
    wiped or replaced while the other replicas kept running; such a replica
    must not take part until an operator restores it. ``RaftNode.step``
    raises it before the message changes this replica's log, commit index
    or vote (a term change the message brought, and the contact time of its
    sender, have already been taken, as for any message of that term).
    """
