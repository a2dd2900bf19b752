"""When a replica compacts its Raft log into a snapshot of the state machine (Raft §7).

Sans-I/O: the replica (:meth:`arbiter.core.replica.Replica.maybe_compact`)
counts what it applies and asks; nothing here reads a clock or a disk.

Rules:

1. Count. Compaction is due once ``every`` entries were applied since the
   last snapshot (``snapshot_every``; 0 never compacts), or
2. Bytes. once the entries applied since it hold at least as many bytes as
   the state machine's last snapshot, and at least ``min_bytes``
   (``ReplicaSettings.snapshot_bytes``). The log is
   held in memory (and cached by its storage) until it is compacted, so it
   never holds much more than the state itself: a join storm whose
   observations are proposed again and again while the leader is slow to
   commit (observer rule 2) would otherwise keep every copy, kilobytes per
   node, until ``every`` entries (docs/scale.md, "Memory per node"). A
   snapshot costs one serialisation of the state, so compacting after as
   many bytes as the state holds costs at most about one byte serialised
   per byte appended (the usual amortised doubling argument). Rule 2 applies
   only where rule 1 may compact at all (``every`` > 0).
"""

from __future__ import annotations

from collections.abc import Iterable

from arbiter.core.raft import Entry

__all__ = ["MIN_COMPACT_BYTES", "Compaction"]

# Rule 2's floor, bytes: below it a log is not worth a snapshot (at 1,000 nodes
# a quarter of a KiB per node; a snapshot of so few nodes is about as large).
MIN_COMPACT_BYTES = 256 * 1024


class Compaction:
    """The bytes applied since the last snapshot, and whether compaction is due (module rules).

    Args:
        min_bytes: rule 2's floor, bytes (0: rule 2 from the first byte).
    """

    __slots__ = ("_min_bytes", "applied_bytes")

    def __init__(self, min_bytes: int = MIN_COMPACT_BYTES) -> None:
        self._min_bytes = min_bytes
        self.applied_bytes = 0

    def applied(self, entries: Iterable[Entry]) -> None:
        """Counts entries just applied."""
        self.applied_bytes += sum(len(e.data) for e in entries)

    def reset(self) -> None:
        """A snapshot now holds everything applied (taken, or restored from the leader)."""
        self.applied_bytes = 0

    def due(self, every: int, entries: int, snapshot_bytes: int) -> bool:
        """Whether to compact now (rules 1 and 2).

        Args:
            every: entries between snapshots (``snapshot_every``; 0 never).
            entries: entries applied since the last snapshot.
            snapshot_bytes: the size of the last snapshot's data, bytes.
        """
        if every <= 0 or entries <= 0:
            return False
        return entries >= every or self.applied_bytes >= max(self._min_bytes, snapshot_bytes)
