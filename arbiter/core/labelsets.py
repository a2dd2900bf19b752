"""One shared copy of each distinct set of labels (docs/scale.md, "Memory per node").

A node's labels are static and, in a training cluster, most of them are
shared by many nodes (``job``, ``rack``, ``pool``, ``role``). Kept as a copy
per node in every record that holds them (a heartbeat stream's checks, the
tally's observations, the member record and its change), they cost a few
hundred bytes per node and replica. A :class:`LabelSets` hands out one
object per distinct set, in the form its holder keeps, so that N nodes with
the same labels hold one.

Rules:

1. Equal in, identical out: two calls of the same method with the same
   labels (the same pairs in the same order, or equal mappings iterated in
   the same order) return the same object while the table remembers them
   (rule 2). What is returned equals what a fresh copy would be: the pairs
   as given, or a read-only mapping of them with its items sorted by key
   (as :class:`membership.shared.view.Member` keeps them); every string in it is
   interned (``sys.intern``). Nothing returned may be changed: the tuples
   and mappings are immutable.
2. Bounded: each form remembers the ``capacity`` label sets used most
   recently (least recently used out first). Objects already handed out
   stay valid; only their sharing ends. The tables cost O(capacity)
   whatever the labels: nodes whose labels are all different (a label
   unique per node) cost what they did before, and the sharing holds for
   any number of nodes among up to ``capacity`` label sets in use.
3. A tuple of pairs whose strings are interned already (as commands decode
   them, commands rule 6) is itself the shared copy: the table holds no
   second one, and a mapping is keyed by it.
4. Sharing changes no value, only which of two equal objects is held, so a
   state machine that uses it stays deterministic: every replica applies
   the same entries to the same values.

Sans-I/O: no clock, no I/O; a plain object its owner keeps.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

__all__ = ["DEFAULT_CAPACITY", "LabelPairs", "LabelSets"]

LabelPairs = tuple[tuple[str, str], ...]

# Label sets remembered per form (rule 2): above the few a training cluster's
# jobs, racks and pools give; the most a table costs is about 0.1 MiB.
DEFAULT_CAPACITY = 256


class LabelSets:
    """Shared copies of label sets (module rules).

    Args:
        capacity: label sets remembered per form (>= 1; rule 2).

    Raises:
        ValueError: ``capacity`` < 1.
    """

    __slots__ = ("_capacity", "_mappings", "_pairs")

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._pairs: OrderedDict[LabelPairs, LabelPairs] = OrderedDict()
        self._mappings: OrderedDict[LabelPairs, Mapping[str, str]] = OrderedDict()

    def pairs(self, pairs: Iterable[tuple[str, str]]) -> LabelPairs:
        """The shared tuple of ``(key, value)`` pairs equal to ``pairs``, in their order
        (a tally observation's labels; rules 1 and 3)."""
        key = pairs if type(pairs) is tuple else tuple(_interned(pairs))
        table = self._pairs
        shared = table.get(key)
        if shared is not None:
            table.move_to_end(key)
            return shared
        shared = key
        if not all(sys.intern(k) is k and sys.intern(v) is v for k, v in key):
            shared = tuple((sys.intern(k), sys.intern(v)) for k, v in key)
        self._remember(table, key, shared)
        return shared

    def mapping(self, labels: Mapping[str, str] | Iterable[tuple[str, str]]) -> Mapping[str, str]:
        """The shared read-only mapping of these labels, its items sorted by key (a
        member record's labels, a heartbeat stream's; rules 1 and 3)."""
        items = labels.items() if isinstance(labels, Mapping) else labels
        # A key of interned strings: the table's copy of a set costs its tuples only.
        key = items if type(items) is tuple else tuple(_interned(items))
        table = self._mappings
        shared = table.get(key)
        if shared is not None:
            table.move_to_end(key)
            return shared
        shared = MappingProxyType({sys.intern(k): sys.intern(v) for k, v in sorted(key)})
        self._remember(table, key, shared)
        return shared

    def _remember(self, table: OrderedDict[LabelPairs, Any], key: LabelPairs, value: Any) -> None:
        if len(table) >= self._capacity:
            table.popitem(last=False)  # the least recently used (rule 2)
        table[key] = value

    def __len__(self) -> int:
        """Label sets remembered now, over both forms."""
        return len(self._pairs) + len(self._mappings)


def _interned(pairs: Iterable[tuple[str, str]]) -> Iterable[tuple[str, str]]:
    return ((sys.intern(k), sys.intern(v)) for k, v in pairs)
