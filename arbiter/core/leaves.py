"""How the tally judges a Leave (its rule 5) and an administrator's Remove (rule 5a).

Pure functions of what the state records for one node id: its member record,
the incarnations of its stored observations and its retired incarnation.
:class:`arbiter.core.tally.MembershipState` applies the verdicts; the API
asks the same question before it proposes a command (a refused one commits
nothing). The rules, numbered as in :mod:`arbiter.core.tally`:

Rule 5. Leave(n, i) ends only a life the cluster knows: the incarnation it
    records for n, or the one n is joining with. Judged in this order (the
    proposing replica asks the same question first, :func:`judge_leave`):
    a. A record at i: ALIVE becomes LEFT at i; DEAD or LEFT refuses the leave
       (FINAL). A record above i refuses it (STALE).
    b. i at or below n's retired incarnation: accepted, changes nothing (a
       second leave of a retired incarnation).
    c. i above the record (or no record) and *joining*: the command says its
       proposing replica's detector heard n at i (``heard_by``, a configured
       arbiter), or a committed observation of n at exactly i exists.
       Incarnation i never joined the view, so the view records nothing for
       it (no LEFT record, no epoch of its own), but n's incarnations up to i
       are *retired*: no observation at or below i is counted any more (tally
       2), so an ALIVE observation still in flight can never admit a node
       that has gone. If n was ALIVE at k < i, DEAD at k is committed (the
       old life was replaced by i, which has now left), as in rule 3.
    d. Anything else changes nothing at all (no record, no retirement, no
       epoch): UNKNOWN when the cluster never heard of n (no record, no
       observation, nothing retired: a "ghost"), NOT_JOINING when i is above
       what it records and no replica heard i. In particular a Leave can
       never kill a live member's life as a side effect.
    LEFT and DEAD are final for their incarnation.
Rule 5a. Remove(n, i, by), an administrator's removal (the Admin service):
    n's record ALIVE at i (i = 0: at whatever incarnation it records)
    becomes LEFT, the change carrying ``removed_by = by``. LEFT, not DEAD:
    the node did not fail (a DEAD change would claim a quorum suspected it,
    tally rule 4a), LEFT is final for the incarnation as DEAD is, and a node told
    it is DEAD rejoins at a higher incarnation by itself, which would undo
    the removal. No record refuses it (UNKNOWN: a node only joining has no
    record to remove); a record at another incarnation than a non-zero i
    (STALE) or a final one (FINAL) refuses it too. Observations of higher
    incarnations are kept: a new process under the id joins as any would.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from membership.shared.view import Member

__all__ = ["LeaveOutcome", "LeaveRefusal", "judge_leave", "judge_remove"]


class LeaveRefusal(enum.Enum):
    """Why a Leave or Remove changed nothing (rules 5, 5a); the API maps each to a status."""

    UNKNOWN = "unknown"  # the cluster has no record of the id (NOT_FOUND)
    STALE = "stale"  # the cluster records another incarnation (FAILED_PRECONDITION)
    FINAL = "final"  # the incarnation is already DEAD or LEFT (FAILED_PRECONDITION)
    NOT_JOINING = "not_joining"  # above the record, heard by no replica (FAILED_PRECONDITION)
    # A grace window that only its node may end or replace (grace rule 2: FAILED_PRECONDITION).
    WINDOW = "window"


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaveOutcome:
    """What became of a Leave (rule 5) or Remove (rule 5a) command.

    Attributes:
        request_id: the command's request_id, to answer the waiting RPC.
        node_id: the node that asked to leave, or was to be removed.
        accepted: True if the node is now LEFT at the incarnation (or that
            incarnation is retired: rule 5).
        reason: why, in words: what the cluster records.
        epoch: the epoch after the entry was applied.
        joined: the incarnation had joined the view, so a LEFT record was
            committed (False for one retired before it joined: rule 5).
        refusal: why it was refused; None when accepted.
        incarnation: the incarnation that left or was removed (for a Remove
            of incarnation 0, the one recorded); for a refusal, the one asked.
    """

    request_id: str
    node_id: str
    accepted: bool
    reason: str
    epoch: int
    joined: bool = False
    refusal: LeaveRefusal | None = None
    incarnation: int = 0


def _incarnations(observed: Sequence[int]) -> str:
    return ", ".join(str(i) for i in sorted(set(observed)))


def judge_leave(
    node_id: str,
    incarnation: int,
    heard: bool,
    *,
    record: Member | None,
    observed: Sequence[int],
    retired: int,
) -> tuple[LeaveRefusal | None, str]:
    """Rule 5's verdict on Leave(node_id, incarnation).

    Args:
        node_id: the node.
        incarnation: the incarnation that would leave.
        heard: the proposing replica's detector hears the node at
            ``incarnation`` (the command's ``heard_by`` is a configured arbiter).
        record: the node's member record, or None.
        observed: the incarnations of the node's stored observations, one per
            replica that has one.
        retired: the node's highest retired incarnation (0 for none).

    Returns:
        ``(None, what the leave does)`` when accepted, else ``(refusal, what
        the cluster records)``.
    """
    n, i = node_id, incarnation
    if record is not None and record.incarnation > i:
        at = f"{record.incarnation} ({record.state.value})"
        return LeaveRefusal.STALE, f"stale incarnation {i}: {n} is at incarnation {at}"
    if record is not None and record.incarnation == i:
        if record.state.is_final:
            return LeaveRefusal.FINAL, f"{n} is already {record.state.value} at incarnation {i}"
        return None, f"{n} left at incarnation {i}"
    if retired >= i:
        return None, f"{n} incarnation {i} was already retired"
    if heard or i in observed:
        return None, f"{n} left at incarnation {i}, which had not joined the view"
    if record is None and retired == 0 and not observed:
        return (
            LeaveRefusal.UNKNOWN,
            f"{n} is unknown to the cluster: no record, and no arbiter heard it",
        )
    if record is not None:
        records = f"records {n} {record.state.value} at incarnation {record.incarnation}"
    else:
        records = f"has no record of {n}"
        if observed:
            records += f" (heard at incarnation {_incarnations(observed)})"
        if retired:
            records += f", incarnations up to {retired} retired"
    return (
        LeaveRefusal.NOT_JOINING,
        f"incarnation {i} of {n} is neither recorded nor joining (no arbiter heard it): "
        f"the cluster {records}",
    )


def judge_remove(
    node_id: str, incarnation: int, *, record: Member | None, observed: Sequence[int]
) -> tuple[LeaveRefusal | None, str]:
    """Rule 5a's verdict on Remove(node_id, incarnation).

    Args:
        node_id: the member to remove.
        incarnation: the incarnation to remove; 0 for the recorded one.
        record: the node's member record, or None.
        observed: the incarnations of the node's stored observations.

    Returns:
        ``(None, what the removal does)`` when accepted, else ``(refusal,
        what the cluster records)``.
    """
    n = node_id
    if record is None:
        more = f" (heard at incarnation {_incarnations(observed)}, not a member yet)"
        return (
            LeaveRefusal.UNKNOWN,
            f"{n} is not a member: the cluster has no record of it{more if observed else ''}",
        )
    if incarnation and incarnation != record.incarnation:
        return (
            LeaveRefusal.STALE,
            f"{n} is at incarnation {record.incarnation} ({record.state.value}), not {incarnation}",
        )
    if record.state.is_final:
        return (
            LeaveRefusal.FINAL,
            f"{n} is already {record.state.value} at incarnation {record.incarnation}",
        )
    return None, f"{n} removed at incarnation {record.incarnation}"
