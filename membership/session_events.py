"""The events of a node's session, and why a session ends (:mod:`membership.session`).

Plain frozen data, split from the session's rules (which re-exports every name
here) so that the session core stays within the module size the layering test
sets; the rule numbers are the session's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from membership.view import MemberState

__all__ = [
    "EndReason",
    "Evicted",
    "Fenced",
    "Rejoined",
    "SessionEvent",
    "StateChanged",
    "Superseded",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class StateChanged:
    """The node's state at ``incarnation`` in the committed view changed."""

    state: MemberState
    incarnation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Fenced:
    """The node lost (``fenced=True``) or regained a quorum of leases.

    ``epoch`` is the fencing token: the latest view epoch seen while the node
    held a quorum of leases.
    """

    fenced: bool
    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejoined:
    """The old incarnation ended (DEAD or superseded); the session goes on at a new one."""

    old_incarnation: int
    new_incarnation: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Superseded:
    """Another process took this node id over with a higher incarnation; the session ended."""

    incarnation: int
    by: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Evicted:
    """The cluster ended this incarnation without the node's asking (rules 4, 5).

    Attributes:
        incarnation: the incarnation that was ended.
        state: DEAD (a quorum of arbiters suspected the node) or LEFT (an
            administrator removed it, or someone else's Leave named it).
        rejoining: the session goes on at a higher incarnation (DEAD with
            ``auto_rejoin``; a :class:`Rejoined` event follows); False: the
            session has ended.
    """

    incarnation: int
    state: MemberState
    rejoining: bool


SessionEvent = StateChanged | Fenced | Rejoined | Superseded | Evicted


class EndReason(enum.Enum):
    """Why a session ended (rule 8)."""

    LEFT = "left"  # the node left gracefully (it asked)
    REMOVED = "removed"  # the cluster records it LEFT, without its asking
    DEAD = "dead"  # declared DEAD, and auto_rejoin is off
    SUPERSEDED = "superseded"  # another process took the node id over
