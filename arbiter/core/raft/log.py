"""The in-memory Raft log, with the bookkeeping the Ready cycle needs.

The log holds entries ``first_index .. last_index``. Everything up to
``snapshot_index`` has been compacted into ``snapshot``, the state machine as
of that index; only its index and term matter to the consistency check at
the boundary (Ongaro & Ousterhout, "In Search of an Understandable Consensus
Algorithm", 2014, §7).

Rules:

1. Compaction (``compact``) folds applied, persisted entries into a snapshot
   the caller took of its state machine; they are gone from memory at once,
   the caller drops them from disk after persisting the snapshot.
2. Restoring (``restore``) replaces the whole log with a snapshot from the
   leader that this log does not already contain; the snapshot is *pending*
   until it has been handed out, persisted and applied (etcd raft
   ``unstable.snapshot``). Entries after it are applied only after it.

3. Configurations (Ongaro's thesis, 2014, §4.1). The configuration in force
   is the one made by the last CONFIG entry in the log, committed or not, or
   else the snapshot's (else the one the log was created with). It is
   tracked as entries are appended and goes back to the previous one when
   its entry is truncated; ``configuration_at(i)`` is the one in force at
   index ``i`` (the state machine's when it has applied ``i``). A snapshot
   carries the configuration at its index.

Besides the entries the log tracks three positions (etcd raft
``raftLog``/``unstable``): ``committed``; ``applied`` (handed out to the
state machine and acknowledged); and ``unstable_from``, the first index not
yet handed out for persistence.
"""

from __future__ import annotations

from collections.abc import Sequence

from arbiter.core.raft.configuration import EMPTY, ArbiterConfiguration, decode_change
from arbiter.core.raft.messages import Entry, EntryType, Snapshot

__all__ = ["EMPTY_SNAPSHOT", "RaftLog"]

EMPTY_SNAPSHOT = Snapshot(index=0, term=0, data=b"")
"""The snapshot of a log that never compacted anything."""


class RaftLog:
    """Entries, commit and apply positions of one replica.

    Args:
        entries: restored, already durable entries, contiguous, starting at
            ``snapshot.index + 1``.
        snapshot: the restored snapshot (None: nothing compacted). The state
            machine is taken to be restored from it: ``applied`` starts at
            its index.
        committed: restored commit index (from the snapshot index to the
            last index).
        configuration: the configuration before the first entry when the
            snapshot carries none (the initial one; :data:`EMPTY` to join).

    Raises:
        ValueError: if the restored entries are not contiguous from
            ``snapshot.index + 1`` with terms that never decrease, a CONFIG
            entry does not decode, or ``committed`` is outside them.
    """

    def __init__(
        self,
        entries: Sequence[Entry] = (),
        *,
        snapshot: Snapshot | None = None,
        committed: int = 0,
        configuration: ArbiterConfiguration = EMPTY,
    ) -> None:
        self.snapshot = snapshot if snapshot is not None else EMPTY_SNAPSHOT
        if self.snapshot.configuration is None:
            self.snapshot = Snapshot(
                index=self.snapshot.index,
                term=self.snapshot.term,
                data=self.snapshot.data,
                configuration=configuration.at(self.snapshot.index),
            )
        self._confs: list[ArbiterConfiguration] = []  # rule 3: CONFIG entries after the snapshot
        self._base: ArbiterConfiguration = self.snapshot.configuration or configuration
        # Rule 3: the configuration in force, the last CONFIG entry's, else the snapshot's.
        self.configuration: ArbiterConfiguration = self._base
        self.pending_snapshot: Snapshot | None = None
        snapshot_index = self.snapshot.index
        self._entries: list[Entry] = list(entries)
        term = self.snapshot.term
        for pos, e in enumerate(self._entries):
            if e.index != snapshot_index + 1 + pos:
                raise ValueError(
                    f"restored entries must be contiguous from {snapshot_index + 1}, "
                    f"found index {e.index} at position {pos}"
                )
            if e.term < term:
                raise ValueError(f"restored entry {e.index} has term {e.term} < {term} before it")
            term = e.term
        if not snapshot_index <= committed <= self.last_index:
            raise ValueError(f"commit {committed} outside {snapshot_index}..{self.last_index}")
        self.committed = committed
        self.applied = snapshot_index
        self.unstable_from = self.last_index + 1
        self._track(self._entries)

    # --- positions ------------------------------------------------------------

    @property
    def snapshot_index(self) -> int:
        """Index of the last compacted entry (0: none)."""
        return self.snapshot.index

    @property
    def first_index(self) -> int:
        """Index of the first entry still held."""
        return self.snapshot.index + 1

    @property
    def last_index(self) -> int:
        """Index of the last entry (the snapshot index if the log is empty)."""
        return self.snapshot.index + len(self._entries)

    @property
    def last_term(self) -> int:
        """Term of the last entry (0 for an empty log)."""
        return self.term(self.last_index)

    def term(self, index: int) -> int:
        """The term of the entry at ``index``.

        Args:
            index: from ``snapshot_index`` to ``last_index``.

        Raises:
            AssertionError: for an index compacted away or beyond the log;
                callers check the bounds first.
        """
        if index == self.snapshot.index:
            return self.snapshot.term
        assert self.snapshot.index < index <= self.last_index, (
            f"term of {index} outside {self.snapshot.index}..{self.last_index}"
        )
        return self._entries[index - self.snapshot.index - 1].term

    def matches(self, index: int, term: int) -> bool:
        """True if the log holds an entry at ``index`` with ``term`` (Raft §5.3)."""
        return self.snapshot.index <= index <= self.last_index and self.term(index) == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """True if a log ending at (last_index, last_term) is at least as up to date (§5.4.1)."""
        return last_term > self.last_term or (
            last_term == self.last_term and last_index >= self.last_index
        )

    def slice(self, lo: int, hi: int) -> tuple[Entry, ...]:
        """Entries with ``lo <= index < hi`` (``hi`` is clamped to the log's end)."""
        assert lo >= self.first_index, f"entry {lo} is compacted (first is {self.first_index})"
        off = self.snapshot.index + 1
        return tuple(self._entries[lo - off : max(lo, hi) - off])

    # --- configurations (rule 3) ---------------------------------------------------

    def configuration_at(self, index: int) -> ArbiterConfiguration:
        """The configuration in force at ``index`` (at or above the snapshot index)."""
        for conf in reversed(self._confs):
            if conf.index <= index:
                return conf
        return self._base

    def _track(self, entries: Sequence[Entry]) -> None:
        """Records the configurations of newly appended entries (after any truncation)."""
        for e in entries:
            if e.type is EntryType.CONFIG:
                self._confs.append(decode_change(e.data, e.index)[1])
        self.configuration = self._confs[-1] if self._confs else self._base

    # --- changes ----------------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        """Appends entries, truncating any existing entries from ``entries[0].index`` on.

        Raises:
            AssertionError: if the entries leave a gap, or would overwrite a
                committed entry (that would break Raft's Leader Completeness).
        """
        if not entries:
            return
        start = entries[0].index
        assert self.committed < start <= self.last_index + 1, (
            f"append at {start}: committed {self.committed}, last {self.last_index}"
        )
        del self._entries[start - self.snapshot.index - 1 :]
        self._entries.extend(entries)
        self.unstable_from = min(self.unstable_from, start)
        self._confs = [c for c in self._confs if c.index < start]  # rule 3: revert
        self._track(entries)

    def find_conflict(self, entries: Sequence[Entry]) -> int:
        """The index of the first of ``entries`` that is new or conflicts, 0 if none."""
        for e in entries:
            if not self.matches(e.index, e.term):
                return e.index
        return 0

    def maybe_append(
        self, prev_index: int, prev_term: int, commit: int, entries: Sequence[Entry]
    ) -> int | None:
        """The follower side of AppendEntries (Raft §5.3, etcd ``maybeAppend``).

        Args:
            prev_index: index of the entry just before ``entries``.
            prev_term: the leader's term for that entry.
            commit: the leader's commit index.
            entries: the entries that follow ``prev_index``.

        Returns:
            The index of the last entry now known to match the leader's log,
            or None if the consistency check fails.
        """
        if not self.matches(prev_index, prev_term):
            return None
        last_new = prev_index + len(entries)
        conflict = self.find_conflict(entries)
        if conflict:
            self.append(entries[conflict - prev_index - 1 :])
        self.commit_to(min(commit, last_new))
        return last_new

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """The last index ``<= index`` whose term is ``<= term``, and its term (etcd).

        Used on both sides of a rejected APPEND to skip a whole divergent
        term per round trip instead of one entry.

        Returns:
            ``(i, term(i))``; ``(i, 0)`` if ``i`` is compacted (term unknown).
        """
        index = min(index, self.last_index)
        while index > self.snapshot.index:
            t = self.term(index)
            if t <= term:
                return index, t
            index -= 1
        return index, self.snapshot.term if index == self.snapshot.index else 0

    def commit_to(self, index: int) -> bool:
        """Raises the commit index to ``index`` if higher; returns whether it moved."""
        if index <= self.committed:
            return False
        assert index <= self.last_index, f"commit {index} beyond last index {self.last_index}"
        self.committed = index
        return True

    # --- the Ready cycle -------------------------------------------------------

    def unstable_entries(self) -> tuple[Entry, ...]:
        """Entries not yet handed out for persistence."""
        return self.slice(self.unstable_from, self.last_index + 1)

    def stable_to(self, index: int, term: int) -> None:
        """Marks entries up to (index, term) as persisted.

        Ignored if the entry at ``index`` has been overwritten since it was
        handed out (its term differs): the new entry is still unstable.
        """
        if index >= self.unstable_from and self.matches(index, term):
            self.unstable_from = index + 1

    def entries_to_apply(self) -> tuple[Entry, ...]:
        """Committed entries not yet handed out to the state machine.

        While a snapshot is pending these are the ones after it (rule 2).
        """
        return self.slice(max(self.applied, self.snapshot.index) + 1, self.committed + 1)

    def applied_to(self, index: int) -> None:
        """Records that entries up to ``index`` were handed to the state machine."""
        assert self.applied <= index <= self.committed, (
            f"applied {index}: was {self.applied}, committed {self.committed}"
        )
        self.applied = index

    # --- snapshots -------------------------------------------------------------

    def compact(self, index: int, data: bytes) -> Snapshot:
        """Folds entries up to ``index`` into a snapshot of the state machine (rule 1).

        Args:
            index: from ``snapshot_index + 1`` to ``applied``; the entries up
                to it must have been handed out for persistence.
            data: the state machine after applying entries 1..``index``.

        Returns:
            The new snapshot, now this log's ``snapshot``.

        Raises:
            AssertionError: for an index outside those bounds (callers check).
        """
        assert self.snapshot.index < index <= self.applied < self.unstable_from, (
            f"compact to {index}: snapshot {self.snapshot.index}, applied {self.applied}"
        )
        conf = self.configuration_at(index)
        snapshot = Snapshot(index=index, term=self.term(index), data=data, configuration=conf)
        del self._entries[: index - self.snapshot.index]
        self._confs = [c for c in self._confs if c.index > index]
        self.snapshot = snapshot
        self._base = conf
        return snapshot

    def restore(self, snapshot: Snapshot) -> None:
        """Replaces the whole log with a leader's snapshot (rule 2).

        Only for a snapshot beyond the commit index that this log does not
        contain (Raft §7: "discard the entire log").
        """
        assert snapshot.index > self.committed and not self.matches(snapshot.index, snapshot.term)
        if snapshot.configuration is None:  # from a leader that predates configurations
            snapshot = Snapshot(
                index=snapshot.index,
                term=snapshot.term,
                data=snapshot.data,
                configuration=self.configuration.at(snapshot.index),
            )
        self._entries.clear()
        self._confs.clear()
        self.snapshot = snapshot
        assert snapshot.configuration is not None
        self._base = self.configuration = snapshot.configuration
        self.pending_snapshot = snapshot
        self.committed = snapshot.index
        self.unstable_from = snapshot.index + 1

    def snapshot_applied(self, snapshot: Snapshot) -> None:
        """Records that ``snapshot`` was persisted and restored into the state machine."""
        if self.pending_snapshot is snapshot:
            self.pending_snapshot = None
        self.applied = max(self.applied, snapshot.index)
