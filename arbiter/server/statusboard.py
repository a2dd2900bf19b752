"""The latest status each node reported to this replica (live status, not replicated).

A node's status (load, GPU use, training phase, gauges...) rides on every
heartbeat. It is informational: never read by a failure detector, never
written to the log. Each replica keeps only the latest status per node, and
subscribers that opt in receive it coalesced per node and rate-limited.

Rules:

1. :meth:`StatusBoard.update` keeps the latest status of a node and bumps its
   version only when the status or incarnation changed, so a subscriber is
   sent a node again only when something changed.
2. Memory is bounded by the nodes the replica hears: an entry not updated for
   ``forget_after`` seconds is dropped by :meth:`prune`.
"""

from __future__ import annotations

from dataclasses import dataclass

from membership.v1 import membership_pb2 as pb

__all__ = ["StatusBoard", "StatusEntry"]


@dataclass(slots=True)
class StatusEntry:
    """One node's latest status as heard here.

    Attributes:
        incarnation: the incarnation that reported it.
        status: the reported status (a protobuf message, never mutated).
        heard: monotonic seconds of the last heartbeat carrying it.
        version: board version of the last change (rule 1).
    """

    incarnation: int
    status: pb.NodeStatus
    heard: float
    version: int


class StatusBoard:
    """Latest status per node (see the module rules).

    Args:
        forget_after: seconds without a heartbeat after which a node's entry
            is dropped by :meth:`prune`.
    """

    def __init__(self, forget_after: float = 60.0) -> None:
        self._entries: dict[str, StatusEntry] = {}
        self._version = 0
        self._forget_after = forget_after

    @property
    def version(self) -> int:
        """The version of the most recent change."""
        return self._version

    def update(self, node_id: str, incarnation: int, status: pb.NodeStatus, now: float) -> None:
        """Records a heartbeat's status received at ``now`` (monotonic seconds); rule 1."""
        entry = self._entries.get(node_id)
        if entry is not None and entry.incarnation == incarnation and entry.status == status:
            entry.heard = now
            return
        self._version += 1
        self._entries[node_id] = StatusEntry(
            incarnation=incarnation, status=status, heard=now, version=self._version
        )

    def get(self, node_id: str) -> StatusEntry | None:
        """The node's entry, or None."""
        return self._entries.get(node_id)

    def items(self) -> list[tuple[str, StatusEntry]]:
        """Every (node_id, entry), sorted by node id."""
        return sorted(self._entries.items())

    def prune(self, now: float) -> int:
        """Drops entries not heard for ``forget_after`` seconds (rule 2); returns how many."""
        old = [n for n, e in self._entries.items() if now - e.heard > self._forget_after]
        for n in old:
            del self._entries[n]
        return len(old)

    def __len__(self) -> int:
        """Number of nodes with an entry."""
        return len(self._entries)
