"""What the shell learns from one Ready of a replica (:mod:`arbiter.core.replica`, rule 3).

Plain records and a predicate, kept apart from the replica (which re-exports
them) so that its composition stays within the module size the layering test
sets.
"""

from __future__ import annotations

from dataclasses import dataclass

from arbiter.core.raft import Entry, Ready, Snapshot
from arbiter.core.tally import ApplyResult

__all__ = ["Delivered", "must_persist"]


def must_persist(ready: Ready) -> bool:
    """True when ``ready`` carries anything for the disk: a snapshot, hard state or entries."""
    return ready.snapshot is not None or ready.hard_state is not None or bool(ready.entries)


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivered:
    """What delivering one persisted Ready did (replica rule 3).

    Attributes:
        restored: the leader's snapshot that replaced the state machine, if any
            (its changes are in the new view, not in ``applied``).
        applied: each committed entry with the result of applying it, in log order.
    """

    restored: Snapshot | None
    applied: tuple[tuple[Entry, ApplyResult], ...]
