"""The Raft core's exception hierarchy.

One root, :class:`RaftError`, split by who is at fault (the h11 way): the
caller asked for something Raft cannot do now (:class:`ProposalDropped`), or
handed the core an input that is not valid for it (:class:`InvalidInput`).
Broken internal invariants are ``AssertionError``, never one of these.
"""

from __future__ import annotations

__all__ = ["InvalidInput", "ProposalDropped", "RaftError"]


class RaftError(Exception):
    """Root of every error the Raft core raises on purpose."""


class ProposalDropped(RaftError):
    """A proposal could not be accepted: no leader is known to take it.

    Raised by ``RaftNode.propose`` on a replica that knows no leader (it is a
    candidate, or its leader is unknown), and by ``RaftNode.step`` for a
    forwarded ``PROPOSE`` message that reaches a replica that is not the
    leader and cannot forward it on (etcd's ``ErrProposalDropped``). The
    proposal is lost; the proposer retries when a leader is known again.
    """


class InvalidInput(RaftError, ValueError):
    """An input the core has no transition for.

    A message addressed to another replica or coming from a replica outside
    the configured membership, a message type that makes no sense on the
    wire (a ``PROPOSE`` carrying a term), restored state that contradicts
    itself, or an unknown peer passed to ``report_unreachable``.
    """
