"""Ranks per job: the rule the replicated state machine applies with every view change.

A training job needs every worker to agree on who has which rank and how
many there are. The tally (:mod:`arbiter.core.tally`) applies this rule on
every replica to the same committed entries, so the ranks are the same on
every replica and subscriber at the same epoch; they are history-dependent
(stable), hence state: they are in the snapshot
(:mod:`arbiter.core.tally_snapshot`). Pure functions, no I/O.

Rules:

Rule 1. Jobs. A member's job is the value of its ``job`` label
    (:data:`membership.shared.view.JOB_LABEL`); a job's members are its ALIVE
    members. A member without the label, or with an empty value, has no rank.
Rule 2. Stable. A member keeps its rank through every entry that leaves it
    in its job with a rank below the job's new world size: other members'
    joins, deaths and leaves do not move it, and neither does its own
    restart within one entry (DEAD at k and ALIVE at k' in the same entry,
    tally rule 3: the view never shows it gone).
Rule 3. Dense. After an entry a job of W members has ranks 0..W-1. The
    members whose rank is W or more (the job shrank below them) move into
    the free ranks below W, the highest rank into the lowest free rank, then
    the next highest into the next ("the highest rank moves into the gap";
    several gaps: the lowest gap takes the highest rank, repeated).
Rule 4. Joins. Members new to the job take the free ranks left after rule 3,
    lowest first, in node_id order ("a join takes the next rank").
Rule 5. Epoch. An entry that changes a member of a job (a join, death, leave
    or restart in it) gives that job a new assignment at the entry's epoch,
    even when no rank moved (its process group has a new member process),
    and only such an entry does: a rank never changes without a view change,
    so the epoch of the assignment is its fencing token. A job left with no
    member gets an empty assignment, once, and is then gone.
Rule 6. Upgrade. The state keeps ranks from the entry that raises its rules
    version to :data:`RANKS_RULES` on (tally rule 10: a Bootstrap that
    carries it); a fresh cluster's first leader proposes it as it starts to
    lead, usually before any join commits. That entry derives every job's
    ranks from the view (:func:`derive`: its members ordered by the epoch at
    which they became ALIVE, then node_id) and, when some member has a job
    (joins that committed first; a state restored from a snapshot written
    before ranks existed, rules 1), is a view change of its own (an epoch
    with no member change). Deriving at a committed entry, never while a
    snapshot is loaded, keeps replicas that restored snapshots of different
    indexes (or none) in agreement.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from membership.shared.view import JOB_LABEL, Member, MemberState

__all__ = ["RANKS_RULES", "assign", "derive", "job_of", "update"]

RANKS_RULES = 2
"""The rules version from which the state keeps ranks (rule 6)."""


def job_of(member: Member | None) -> str:
    """The job whose ranks ``member`` is in: its ``job`` label while ALIVE, else ""."""
    if member is None or member.state is not MemberState.ALIVE:
        return ""
    return member.labels.get(JOB_LABEL, "")


def assign(previous: Mapping[str, int], members: Iterable[str]) -> dict[str, int]:
    """A job's ranks after an entry (rules 2 to 4).

    Args:
        previous: node_id -> rank before the entry (dense, possibly empty).
        members: the job's members after the entry (node ids, distinct).

    Returns:
        node_id -> rank for exactly ``members``, dense ``0..len(members) - 1``.
    """
    now = set(members)
    size = len(now)
    ranks = {n: r for n, r in previous.items() if n in now and r < size}  # rule 2
    free = sorted(set(range(size)) - set(ranks.values()))
    movers = sorted(
        (n for n, r in previous.items() if n in now and r >= size), key=lambda n: -previous[n]
    )  # rule 3: highest rank first
    joiners = sorted(now - set(previous))  # rule 4: node_id order
    for node_id, rank in zip([*movers, *joiners], free, strict=True):
        ranks[node_id] = rank
    return ranks


def update(
    ranks: dict[str, int], by_rank: list[str | None], gone: Iterable[str], new: Iterable[str]
) -> dict[str, int]:
    """Rules 2 to 4 in place, in time O(changes), not O(job): what :func:`assign` computes.

    The tally keeps, per job, ``ranks`` (node_id -> rank) and its inverse
    ``by_rank`` (rank -> node_id), so that a death in a job of N members
    costs O(1) and not O(N) (``bench/ranks_cost.py``); :func:`assign` is the
    plain statement of the rule, and the tests check that both agree.

    Args:
        ranks: node_id -> rank before the entry, dense; updated in place.
        by_rank: its inverse, ``len(ranks)`` long; updated in place.
        gone: members that left the job in the entry (others are ignored).
        new: members that joined it (members already in it are ignored).

    Returns:
        The members whose rank is new or moved, node_id -> rank.
    """
    left = [n for n in set(gone) if n in ranks]
    joined = sorted(n for n in set(new) if n not in ranks)
    top = len(by_rank)
    size = top - len(left) + len(joined)
    free = []
    for n in left:
        r = ranks.pop(n)
        by_rank[r] = None
        if r < size:
            free.append(r)
    free.sort()
    free += range(top, size)  # the job grew: new ranks at the top
    movers = [m for r in range(top - 1, size - 1, -1) if (m := by_rank[r]) is not None]
    del by_rank[size:]
    by_rank.extend([None] * (size - len(by_rank)))
    moved: dict[str, int] = {}
    for node, r in zip([*movers, *joined], free, strict=True):  # rule 3, then rule 4
        ranks[node] = r
        by_rank[r] = node
        moved[node] = r
    return moved


def derive(members: Iterable[Member]) -> dict[str, dict[str, int]]:
    """Every job's ranks from a view alone (rule 6): by (epoch, node_id) per job.

    Args:
        members: the view's members (any order; only ALIVE ones with a job count).

    Returns:
        job -> node_id -> rank.
    """
    jobs: dict[str, list[Member]] = {}
    for m in members:
        job = job_of(m)
        if job:
            jobs.setdefault(job, []).append(m)
    return {
        job: {m.node_id: r for r, m in enumerate(sorted(ms, key=lambda m: (m.epoch, m.node_id)))}
        for job, ms in jobs.items()
    }
