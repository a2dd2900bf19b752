"""Quorum arithmetic for the voters of one Raft configuration.

The callers pass the voters of the configuration in force (learners never
count; see ``configuration`` and ``replication`` rule 7). Pure functions,
kept apart so they can be checked against a brute-force definition (Ongaro
& Ousterhout, "In Search of an Understandable Consensus Algorithm", 2014,
§5.2 and §5.3; etcd raft ``quorum/majority.go``).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["committed_index", "quorum_size"]


def quorum_size(n: int) -> int:
    """The size of a strict majority of ``n`` voters.

    Args:
        n: the number of voters in the group; at least 1.

    Returns:
        ``n // 2 + 1``: any two sets of this size out of ``n`` intersect.

    Raises:
        ValueError: if ``n`` is less than 1.
    """
    if n < 1:
        raise ValueError(f"a Raft group needs at least one voter, got {n}")
    return n // 2 + 1


def committed_index(match_indexes: Sequence[int]) -> int:
    """The highest log index stored on a quorum of voters.

    Args:
        match_indexes: for every voter (the leader included), the highest log
            index known to be stored on it; one value per voter.

    Returns:
        The largest ``i`` such that at least ``quorum_size(len(match_indexes))``
        voters have a match index ``>= i``. This is the order statistic at
        position ``quorum - 1`` of the indexes sorted in descending order.
        Whether that index may be committed also depends on its term (Raft
        §5.4.2); that check is the caller's.

    Raises:
        ValueError: if ``match_indexes`` is empty.
    """
    q = quorum_size(len(match_indexes))
    return sorted(match_indexes, reverse=True)[q - 1]
