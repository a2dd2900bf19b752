"""Bounded history: when the leader proposes to forget DEAD and LEFT records.

Sans-I/O: time is the ``now`` argument (monotonic seconds of the replica that
runs it). :class:`arbiter.core.replica.Replica` owns one :class:`Retention`,
feeds it on every tick, and proposes what :meth:`Retention.due` returns; the
tally applies the :class:`~arbiter.core.forget.Forget` deterministically (its
rule 12), so every replica removes the same records at the same log index
whatever clock decided it.

Rules:

1. Age. Every replica notes, on its own clock, when it first saw each DEAD or
   LEFT record (node, incarnation, state) in its applied view: when it
   applied the change, or when it started or restored a snapshot that held
   it. Followers do it too, so a new leader already knows the ages. A record
   is *expired* once ``retention`` seconds passed since then: never earlier
   than ``retention`` after its change was committed, later by up to the
   time a replica was down (a restart restarts the count).
2. Count. Beyond ``max_tombstones`` DEAD and LEFT records, the oldest by the
   epoch of their change (then node id) are due at once, whatever their age.
3. Proposal. Only the leader proposes, one Forget of at most ``batch``
   records at a time: the oldest (by epoch) of the expired and over-count
   ones, sorted by node id. It is
   *pending* until none of its records is in the view any more; a pending
   Forget whose records are still there after ``retry_after`` seconds (lost
   with a leadership change, say) is proposed again. A duplicate is harmless:
   the tally skips records that no longer match.
4. Cost. The ages are rescanned from the view only when its epoch moved
   (O(members), as the observer's view sync); :meth:`Retention.next_deadline`
   is the earliest time a tick has retention work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from arbiter.core.forget import Forget
from arbiter.core.tally import MembershipState

__all__ = ["Retention", "RetentionPolicy"]

Key = tuple[str, int, str]  # (node id, incarnation, "DEAD" | "LEFT")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionPolicy:
    """How long DEAD and LEFT records stay in the view.

    Attributes:
        retention: seconds a record stays after this replica first saw it
            (rule 1); ``inf`` never forgets by age.
        max_tombstones: the most DEAD and LEFT records kept (rule 2); None
            for no bound by count.
        batch: the most records one Forget names (rule 3), >= 1.
        retry_after: seconds before a pending Forget is proposed again.

    Raises:
        ValueError: a negative or NaN retention, a negative max_tombstones,
            a batch below 1 or a retry_after that is not > 0.
    """

    retention: float = math.inf
    max_tombstones: int | None = None
    batch: int = 256
    retry_after: float = 1.0

    def __post_init__(self) -> None:
        if not self.retention >= 0:
            raise ValueError(f"retention must be >= 0 seconds, got {self.retention!r}")
        if self.max_tombstones is not None and self.max_tombstones < 0:
            raise ValueError(f"max_tombstones must be >= 0, got {self.max_tombstones!r}")
        if self.batch < 1 or not self.retry_after > 0:
            raise ValueError("batch must be >= 1 and retry_after > 0")

    @property
    def enabled(self) -> bool:
        """Whether anything is ever forgotten."""
        return math.isfinite(self.retention) or self.max_tombstones is not None


class Retention:
    """One replica's ages of DEAD and LEFT records, and the leader's pending Forget."""

    def __init__(self, policy: RetentionPolicy) -> None:
        self.policy = policy
        self._since: dict[Key, float] = {}  # rule 1
        self._epochs: dict[Key, int] = {}  # epoch of each record's change (rule 2)
        self._seen: tuple[int, int] | None = None  # (id(state), epoch) last scanned
        self._pending: tuple[frozenset[Key], float] | None = None  # rule 3

    def _sync(self, state: MembershipState, now: float) -> None:
        """Rule 1: notes new DEAD and LEFT records at ``now``, drops those gone."""
        seen = (id(state), state.epoch)
        if seen == self._seen:
            return
        self._seen = seen
        epochs = {
            (m.node_id, m.incarnation, m.state.value): m.epoch
            for m in state.view().members
            if m.state.is_final
        }
        self._since = {k: self._since.get(k, now) for k in epochs}
        self._epochs = epochs

    def tombstones(self) -> int:
        """How many DEAD and LEFT records the view held at the last tick."""
        return len(self._since)

    def due(self, state: MembershipState, now: float, *, leader: bool) -> Forget | None:
        """The Forget to propose now, or None (rules 1 to 3).

        Args:
            state: the applied state machine.
            now: monotonic seconds on this replica.
            leader: whether this replica leads now; only a leader proposes.

        Returns:
            A Forget, counted as pending from ``now``; None when nothing is
            due, this replica does not lead, or a Forget is pending.
        """
        p = self.policy
        if not p.enabled:
            return None
        self._sync(state, now)
        if not leader:
            self._pending = None
            return None
        if self._pending is not None:
            keys, at = self._pending
            if now < at + p.retry_after and any(k in self._since for k in keys):
                return None
            self._pending = None
        chosen = self._chosen(now)
        if not chosen:
            return None
        oldest = sorted(chosen, key=lambda k: (self._epochs[k], k))[: p.batch]
        records = tuple(sorted(oldest))
        self._pending = (frozenset(records), now)
        return Forget(records=records)

    def _chosen(self, now: float) -> set[Key]:
        p = self.policy
        # t + retention, as next_deadline computes it (now - t could round below).
        chosen = {k for k, t in self._since.items() if t + p.retention <= now}
        if p.max_tombstones is not None and len(self._since) > p.max_tombstones:
            oldest = sorted(self._since, key=lambda k: (self._epochs[k], k))
            chosen.update(oldest[: len(self._since) - p.max_tombstones])
        return chosen

    def next_deadline(self, *, leader: bool) -> float | None:
        """The earliest monotonic time :meth:`due` may return a Forget (rule 4), or None.

        Counts what the last :meth:`due` saw; a view that moved since is
        noticed by the caller (the observer's view sync makes the next tick due).
        """
        p = self.policy
        if not leader or not p.enabled or not self._since:
            return None
        if self._pending is not None and any(k in self._since for k in self._pending[0]):
            return self._pending[1] + p.retry_after
        if p.max_tombstones is not None and len(self._since) > p.max_tombstones:
            return -math.inf
        if math.isinf(p.retention):
            return None
        return min(self._since.values()) + p.retention
