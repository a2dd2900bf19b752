"""What applying one committed entry to the tally returns (:mod:`arbiter.core.tally`).

Plain frozen records, below the tally so that the history, the replica and the
shell can name them; :mod:`arbiter.core.tally` re-exports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from arbiter.core.leaves import LeaveOutcome
from membership.view import Member, MemberChange, MemberState

__all__ = ["ApplyResult", "ViewChange", "change"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewChange:
    """The view changes one committed entry made; ``epoch`` is the new epoch."""

    epoch: int
    changes: tuple[MemberChange, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyResult:
    """The outcome of applying the entry at log index ``index``.

    ``change`` is set when the view changed, ``leave`` for Leave and Remove
    commands, ``error`` when the entry was rejected (rule 9).
    """

    index: int
    change: ViewChange | None = None
    leave: LeaveOutcome | None = None
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
