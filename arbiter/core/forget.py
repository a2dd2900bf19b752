"""The Forget command: removing DEAD and LEFT records whose retention has passed.

Kept apart from :mod:`arbiter.core.commands` (which encodes it, as every
command, and re-exports it) so that module stays one concept per screenful.
Who proposes it and when is :mod:`arbiter.core.retention`; what applying it
does is tally rule 12 (:mod:`arbiter.core.tally`).

Rules (commands rule 3c):

1. A :class:`Forget` names each record by ``(node_id, incarnation, state)``,
   state ``"DEAD"`` or ``"LEFT"``, sorted by node id, one per node, at least
   one. The tally removes only the records that still match exactly, so a
   re-proposed or overtaken Forget is harmless.
2. Encoding (inside the command object of :func:`arbiter.core.commands.encode`):
   ``"records": [[node, incarnation, state], ...]``; decoding is strict like
   every command's: wrong types (a bool is not an int), unsorted or duplicate
   node ids and other states are refused.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

__all__ = ["FINAL_STATES", "Forget", "records_from_json", "records_to_json"]

FINAL_STATES = ("DEAD", "LEFT")
"""The :class:`membership.shared.view.MemberState` values a Forget may name."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Forget:
    """Removes DEAD and LEFT records whose retention has passed (rule 1; tally rule 12).

    Attributes:
        records: ``(node_id, incarnation, state)`` of each record to remove,
            ``state`` being ``"DEAD"`` or ``"LEFT"``, sorted by node id, one
            per node, at least one.

    Raises:
        ValueError: no records, an empty node id, a negative or non-int
            incarnation, another state, or records not sorted by unique node id.
    """

    records: tuple[tuple[str, int, str], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.records, tuple) or not self.records:
            raise ValueError("records must be a non-empty tuple of (node_id, incarnation, state)")
        for rec in self.records:
            if not isinstance(rec, tuple) or len(rec) != 3:
                raise ValueError(f"a record must be (node_id, incarnation, state), got {rec!r}")
            node, inc, state = rec
            if not isinstance(node, str) or not node:
                raise ValueError(f"node_id must be a non-empty string, got {node!r}")
            if type(inc) is not int or inc < 0:
                raise ValueError(f"incarnation must be an int >= 0, got {inc!r}")
            if state not in FINAL_STATES:
                raise ValueError(f"state must be DEAD or LEFT, got {state!r}")
        ids = [r[0] for r in self.records]
        if any(a >= b for a, b in itertools.pairwise(ids)):
            raise ValueError("records must be sorted by node id, one per node")


def records_to_json(command: Forget) -> list[list[Any]]:
    """The ``records`` field of the encoded command (rule 2)."""
    return [list(r) for r in command.records]


def records_from_json(value: Any) -> Forget:
    """The command whose ``records`` field is ``value`` (rule 2).

    Raises:
        ValueError: a row that is not ``[str, int, str]``, or what :class:`Forget` refuses.
    """
    if type(value) is not list:
        raise ValueError(f"forget.records: expected a list, got {type(value).__name__}")
    records = []
    for rec in value:
        if not (
            type(rec) is list
            and len(rec) == 3
            and type(rec[0]) is str
            and type(rec[1]) is int
            and type(rec[2]) is str
        ):
            raise ValueError(f"forget.records: expected [node, incarnation, state], got {rec!r}")
        records.append((rec[0], rec[1], rec[2]))
    return Forget(records=tuple(records))
