"""Floors of forgotten records: what the tally keeps of a node once its DEAD or
LEFT record is removed from the view (tally rule 12), so no old life comes back.

Sans-I/O and deterministic, like the tally that owns one :class:`Floors`.

Rules:

1. A floor is the removed record's (incarnation, state), one per node id,
   kept while the id has no record. The tally judges every observation,
   Leave and Remove of a node without a record against its floor exactly as
   it judged them against the record (:meth:`Floors.record` gives the floor
   back as that record): at or below the floor nothing is admitted.
2. When the id gets a record again (a higher incarnation joins), the floor is
   dropped: the record refuses everything the floor refused.
3. Memory: one dict slot, the node id string and a 2-tuple of an int and a
   shared enum member per removed id. bench/tombstones.py measures it
   (180 to 220 bytes for a 10-character id, with the dict's share). The map is
   bounded by the number of distinct node ids that ever left or died without
   coming back, not by time: dropping a floor would let that id's old
   incarnation join again (a process restarted from an old checkpoint with
   its old incarnation), the one thing forgetting must never allow. Clusters
   reuse node ids (host or rank names), so the map stays about as large as
   the fleet.
"""

from __future__ import annotations

from collections.abc import Iterable

from membership.shared.view import Member, MemberState

__all__ = ["Floors"]


class Floors:
    """node id -> (incarnation, state) of its forgotten record (rules 1 to 3)."""

    def __init__(self, rows: Iterable[tuple[str, int, MemberState]] = ()) -> None:
        self._floors: dict[str, tuple[int, MemberState]] = {n: (i, s) for n, i, s in rows}

    def __len__(self) -> int:
        return len(self._floors)

    def set(self, node_id: str, incarnation: int, state: MemberState) -> None:
        """Records the floor of a record just forgotten (rule 1)."""
        assert state.is_final, f"only DEAD or LEFT records are forgotten, not {state}"
        self._floors[node_id] = (incarnation, state)

    def drop(self, node_id: str) -> None:
        """The id has a record again (rule 2)."""
        self._floors.pop(node_id, None)

    def incarnation(self, node_id: str) -> int:
        """The floor's incarnation; 0 for none (incarnations at or below it never count)."""
        floor = self._floors.get(node_id)
        return 0 if floor is None else floor[0]

    def has(self, node_id: str) -> bool:
        """Whether the id has a floor."""
        return node_id in self._floors

    def record(self, node_id: str) -> Member | None:
        """The floor as the record it replaced (``epoch`` 0, no labels), or None (rule 1)."""
        floor = self._floors.get(node_id)
        if floor is None:
            return None
        return Member(node_id=node_id, incarnation=floor[0], state=floor[1])

    def rows(self) -> tuple[tuple[str, int, MemberState], ...]:
        """Every floor as (node id, incarnation, state), sorted by node id (for the snapshot)."""
        return tuple((n, *self._floors[n]) for n in sorted(self._floors))
