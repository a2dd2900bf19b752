"""What applying one committed entry to the tally returns (:mod:`arbiter.core.tally`).

Plain frozen records, below the tally so that the history, the replica and the
shell can name them; :mod:`arbiter.core.tally` re-exports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from arbiter.core.grace import GraceOutcome
from arbiter.core.leaves import LeaveOutcome
from membership.view import JobRanks, Member, MemberChange, MemberState

__all__ = ["ApplyResult", "HeartbeatVerdict", "ViewChange", "change"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatVerdict:
    """What the replica answers to one heartbeat (:mod:`arbiter.core.observer`).

    Attributes:
        accepted: the heartbeat counted (refreshed the detector).
        state: the node's state at the heartbeat's incarnation in the committed
            view (JOINING when it is not a member at that incarnation).
        incarnation: the highest incarnation the cluster records for the node
            id (at least the heartbeat's own when accepted).
        lease: seconds of lease granted, counted by the node from its send
            time; 0.0 when none.
        grace: seconds left of the node's grace window on this replica,
            counted as the lease is (``arbiter/core/grace_windows.py`` rule
            3); 0.0 when none, or when no lease is granted.
        grace_id: the grant naming that window (its log index); 0 with none.
    """

    accepted: bool
    state: MemberState
    incarnation: int
    lease: float
    grace: float = 0.0
    grace_id: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewChange:
    """The view changes one committed entry made; ``epoch`` is the new epoch.

    ``ranks`` is the new assignment of every job the entry changed, sorted by
    job (:mod:`arbiter.core.ranks`, rule 5); ``changes`` may be empty when
    only ranks changed (ranks rule 6).
    """

    epoch: int
    changes: tuple[MemberChange, ...]
    ranks: tuple[JobRanks, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyResult:
    """The outcome of applying the entry at log index ``index``.

    ``change`` is set when the view changed, ``leave`` for Leave and Remove
    commands, ``grace`` for Grace commands, ``error`` when the entry was
    rejected (rule 9).
    """

    index: int
    change: ViewChange | None = None
    leave: LeaveOutcome | None = None
    grace: GraceOutcome | None = None
    error: str | None = None


def change(
    node_id: str,
    incarnation: int,
    state: MemberState,
    labels: Mapping[str, str] | Member | None = None,
) -> MemberChange:
    """A change; ``labels`` may be the member record whose labels it repeats (rule 6)."""
    if isinstance(labels, Member):
        labels = labels.labels
    return MemberChange(node_id=node_id, incarnation=incarnation, state=state, labels=labels or {})
