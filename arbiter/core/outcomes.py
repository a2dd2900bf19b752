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

__all__ = ["ApplyResult", "ViewChange", "change"]


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
