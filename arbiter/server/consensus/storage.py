"""Durable Raft state of one replica: hard state, log entries and snapshot in SQLite.

The durability rule (docs/architecture.md, "Correctness rules"): term, vote
and log are on disk before a message that depends on them leaves. The driver
calls :meth:`Storage.save` with each Ready before it sends the Ready's
messages (etcd raft's contract: persist, send, apply, advance).

Rules:

1. Durability. One SQLite database per replica in WAL mode with
   ``synchronous=FULL``: every committed transaction is fsynced before
   ``save`` returns. A Ready's snapshot, hard state and entries are written
   in one transaction, so a crash leaves all of them or none.
2. Overwrites. Entries whose index is at or below the last stored one
   replace it and everything after it (delete from there, then insert), as
   Raft truncates a follower's conflicting suffix. A snapshot received from
   the leader replaces the whole log.
3. Checksums. Every entry, the snapshot and the hard state carry a CRC-32
   of their fields. On load, the first entry that is corrupt, missing or
   out of term order ends the log: it and everything after it are deleted
   with a WARNING naming the index; they are never applied (the leader
   sends them again). A corrupt hard state or snapshot refuses to start:
   there is nothing safe to fall back to for a vote. (SQLite's journal
   detects torn writes; the checksums catch bit rot and partial copies.)
4. Compaction. :meth:`Storage.compact` stores a snapshot and deletes the
   entries it covers, in one transaction.
5. Ownership. An exclusive ``flock`` on ``LOCK`` in the data directory, held
   while open, keeps two processes off one directory; the directory also
   records the replica id and cluster it belongs to and refuses any other,
   saying how to proceed: a log written by one replica must never vote or
   count as another's.
5a. Identity and the first configuration. The first open records the
   cluster identity (``name@digest`` of the first ``--peers``, or the one a
   joining replica took from its group) and that first arbiter set; later
   opens read them back (:attr:`Storage.identity`, :attr:`Storage.arbiters`),
   never from the caller: the stored configuration wins over ``--peers``
   after the first start (changes since are in the log and snapshot:
   :mod:`arbiter.server.consensus.stored`). A directory written before the identity
   was recorded gets the one its recorded set implies; one restored from a
   backup records the restored group's ``identity`` and ``restored_from``
   (arbiter/server/ops/backup.py, rule 4).
6. Threads. The driver writes from a thread of its own
   (:mod:`arbiter.server.consensus.writer`) and reads on the event loop; every public
   method holds one lock, so the connection is used by one thread at a time.
7. Entry types and snapshot configurations (Raft membership changes) are
   folded into the ``data`` blobs by :mod:`arbiter.core.raft.codec`: a blob
   written before they existed means what it meant, so no migration.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import sqlite3
import struct
import threading
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from arbiter.core.raft import Entry, HardState, Ready, Snapshot
from arbiter.core.raft.codec import (
    entry_from_payload,
    entry_payload,
    snapshot_from_payload,
    snapshot_payload,
)
from arbiter.errors import ArbiterError

__all__ = ["DurableState", "Storage", "StorageError", "cluster_identity"]

log = logging.getLogger("arbiter.storage")

SCHEMA_VERSION = "1"
DB_NAME = "raft.sqlite3"
LOCK_NAME = "LOCK"

# SQLite's page cache per connection, KiB (default 2,000): the log is appended at its end
# and read whole only at start, so a small one costs few reads (docs/scale.md, memory).
CACHE_KIB = 512

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS hard_state (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    term INTEGER NOT NULL, vote TEXT, commit_index INTEGER NOT NULL, crc INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    idx INTEGER PRIMARY KEY, term INTEGER NOT NULL, data BLOB NOT NULL, crc INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS snapshot (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    idx INTEGER NOT NULL, term INTEGER NOT NULL, data BLOB NOT NULL, crc INTEGER NOT NULL);
"""


class StorageError(ArbiterError, OSError):
    """The data directory cannot be used: in use, not writable, not ours, or corrupt."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DurableState:
    """What :meth:`Storage.load` recovered.

    Attributes:
        hard_state: term, vote and commit (None for a new replica); the
            commit index is capped at the last recovered entry.
        snapshot: the latest snapshot, or None.
        entries: the log after the snapshot, contiguous, checksums verified.
        truncated: how many corrupt or orphaned tail entries were dropped.
    """

    hard_state: HardState | None
    snapshot: Snapshot | None
    entries: tuple[Entry, ...]
    truncated: int = 0

    @property
    def last_index(self) -> int:
        """Index of the last recovered entry (the snapshot's if none)."""
        if self.entries:
            return self.entries[-1].index
        return self.snapshot.index if self.snapshot is not None else 0


def _entry_crc(index: int, term: int, data: bytes) -> int:
    return zlib.crc32(data, zlib.crc32(struct.pack(">QQ", index, term)))


def _hard_state_crc(hs: HardState) -> int:
    return zlib.crc32(f"{hs.term}\0{hs.vote or ''}\0{hs.vote is None}\0{hs.commit}".encode())


class Storage:
    """The durable Raft state of one replica (see the module rules).

    Use :meth:`open`; close with :meth:`close` (or as a context manager).
    Safe to call from several threads (rule 6).
    """

    def __init__(self, conn: sqlite3.Connection, path: Path | None, lock: IO[str] | None) -> None:
        self._conn = conn
        self.path = path
        self._lock = lock
        self._mutex = threading.Lock()  # rule 6
        # The meta rows as claimed (rule 5a), and whether this open created them.
        self._meta: dict[str, str] = {}
        self.first_start = False

    @classmethod
    def open(
        cls,
        data_dir: Path | None,
        *,
        replica_id: str,
        cluster: str,
        arbiters: Mapping[str, str] | Sequence[str],
        identity: str | None = None,
        joined: bool = False,
    ) -> Storage:
        """Opens (creating if needed) the replica's data directory.

        Args:
            data_dir: the directory; None keeps everything in memory (nothing
                survives the process: for tests only).
            replica_id: this replica's id; the directory must belong to it.
            cluster: the cluster name; the directory must belong to it.
            arbiters: the first arbiter set, id -> ``host:port`` (or ids
                only): recorded on the first open, ignored afterwards
                (rule 5a; read :attr:`arbiters` for the recorded one).
            identity: the cluster identity to record on the first open; None
                computes it from ``cluster`` and ``arbiters``
                (:func:`cluster_identity`). Ignored afterwards.
            joined: the first open is of a replica that joins a running group
                (``--join``): recorded, see :attr:`joined`.

        Raises:
            StorageError: the directory cannot be created or written, another
                process holds it, or it belongs to another replica or cluster.
        """
        lock = _lock(data_dir) if data_dir is not None else None
        target = str(data_dir / DB_NAME) if data_dir is not None else ":memory:"
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")  # per connection, in KiB
            if data_dir is not None:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(_SCHEMA)
            storage = cls(conn, data_dir, lock)
            storage._claim(replica_id, cluster, _arbiter_set(arbiters), identity, joined)
        except BaseException as e:
            if conn is not None:
                conn.close()
            if lock is not None:
                lock.close()
            if isinstance(e, sqlite3.Error):
                raise StorageError(f"data dir {data_dir}: cannot use {DB_NAME}: {e}") from None
            raise
        return storage

    def _claim(
        self, replica_id: str, cluster: str, arbiters: str, identity: str | None, joined: bool
    ) -> None:
        """Rules 5 and 5a: records whose directory this is, or checks it is ours.

        ``arbiters`` is the set as recorded: ``a1=host:port,...`` sorted by
        id (``a1,a2,...`` when the caller knows ids only).
        """
        rows = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
        if not rows:
            want = {
                "schema": SCHEMA_VERSION,
                "replica_id": replica_id,
                "cluster": cluster,
                "arbiters": arbiters,
                "identity": identity or _identity_of(cluster, arbiters),
                "joined": "1" if joined else "0",
            }
            with self._tx():
                self._conn.executemany("INSERT INTO meta VALUES (?, ?)", sorted(want.items()))
            self.first_start = True
            self._meta = want
            return
        if rows.get("schema") != SCHEMA_VERSION:
            raise StorageError(f"data dir {self.path}: unknown schema {rows.get('schema')!r}")
        if (rows.get("replica_id"), rows.get("cluster")) != (replica_id, cluster):
            raise StorageError(
                f"data dir {self.path} belongs to replica {rows.get('replica_id')!r} of cluster "
                f"{rows.get('cluster')!r}, not {replica_id!r} of {cluster!r}; give each "
                "replica its own --data-dir"
            )
        missing = {}
        if "arbiters" not in rows:
            missing["arbiters"] = arbiters
        recorded = rows.get("arbiters") or arbiters
        if "identity" not in rows:  # written before rule 5a: the identity its set implies
            missing["identity"] = _identity_of(cluster, recorded)
        if missing:
            with self._tx():
                self._conn.executemany(
                    "INSERT OR REPLACE INTO meta VALUES (?, ?)", sorted(missing.items())
                )
        self._meta = {**rows, **missing}

    @property
    def identity(self) -> str:
        """The cluster identity recorded at the first start (rule 5a)."""
        return self._meta["identity"]

    @property
    def arbiters(self) -> dict[str, str]:
        """The first arbiter set as recorded, id -> ``host:port`` (``""`` for a
        directory that recorded ids only; empty for a replica that joined)."""
        out: dict[str, str] = {}
        for item in filter(None, self._meta["arbiters"].split(",")):
            rid, _, address = item.partition("=")
            out[rid] = address
        return out

    @property
    def joined(self) -> bool:
        """True when the directory was created by ``--join`` (not by a first ``--peers``)."""
        return self._meta.get("joined") == "1"

    def get_meta(self, key: str) -> str | None:
        """A value recorded in the directory's meta table (rule 5), or None."""
        with self._mutex:
            row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def put_meta(self, key: str, value: str) -> None:
        """Records ``key`` in the meta table, fsynced (the identity of a restored group)."""
        with self._mutex, self._tx() as conn:
            conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
            if key in self._meta:  # rule 5a's claimed rows (the restored identity)
                self._meta[key] = value

    def close(self) -> None:
        """Closes the database and releases the lock (idempotent)."""
        with self._mutex:
            self._conn.close()
            if self._lock is not None:
                self._lock.close()  # releases the flock
                self._lock = None

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, fsynced on commit (rule 1)."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # --- writing ---------------------------------------------------------------------

    def save(self, ready: Ready) -> None:
        """Persists a Ready's snapshot, hard state and entries in one transaction (rules 1, 2).

        Call before sending any of the Ready's messages. Does nothing (no
        fsync) when the Ready has nothing to persist. May block for as long
        as the disk takes: the driver calls it on its writer thread.
        """
        if ready.snapshot is None and ready.hard_state is None and not ready.entries:
            return
        with self._mutex, self._tx() as conn:
            if ready.snapshot is not None:
                self._put_snapshot(conn, ready.snapshot)
                conn.execute("DELETE FROM entries")
            if ready.hard_state is not None:
                hs = ready.hard_state
                conn.execute(
                    "INSERT OR REPLACE INTO hard_state VALUES (0, ?, ?, ?, ?)",
                    (hs.term, hs.vote, hs.commit, _hard_state_crc(hs)),
                )
            if ready.entries:
                self._put_entries(conn, ready.entries)

    def compact(self, snapshot: Snapshot) -> None:
        """Stores a snapshot this replica took and deletes the entries it covers (rule 4)."""
        with self._mutex, self._tx() as conn:
            self._put_snapshot(conn, snapshot)
            conn.execute("DELETE FROM entries WHERE idx <= ?", (snapshot.index,))

    @staticmethod
    def _put_snapshot(conn: sqlite3.Connection, s: Snapshot) -> None:
        data = snapshot_payload(s)  # rule 7: the data and the configuration at its index
        conn.execute(
            "INSERT OR REPLACE INTO snapshot VALUES (0, ?, ?, ?, ?)",
            (s.index, s.term, data, _entry_crc(s.index, s.term, data)),
        )

    @staticmethod
    def _put_entries(conn: sqlite3.Connection, entries: Sequence[Entry]) -> None:
        conn.execute("DELETE FROM entries WHERE idx >= ?", (entries[0].index,))
        conn.executemany(
            "INSERT INTO entries VALUES (?, ?, ?, ?)",
            [
                (e.index, e.term, p, _entry_crc(e.index, e.term, p))
                for e, p in ((e, entry_payload(e)) for e in entries)
            ],
        )

    # --- reading ------------------------------------------------------------------

    def load(self) -> DurableState:
        """Reads back everything, verifying checksums (rule 3).

        Raises:
            StorageError: the hard state or the snapshot fails its checksum.
        """
        with self._mutex:
            return self._load()

    def _load(self) -> DurableState:
        conn = self._conn
        snapshot = None
        row = conn.execute("SELECT idx, term, data, crc FROM snapshot").fetchone()
        if row is not None:
            idx, term, data, crc = row
            if _entry_crc(idx, term, data) != crc:
                raise StorageError(
                    f"data dir {self.path}: the snapshot at index {idx} is corrupt (checksum); "
                    "move the directory away to let the replica catch up from its peers"
                )
            snapshot = snapshot_from_payload(idx, term, bytes(data))
        base = snapshot.index if snapshot is not None else 0
        entries, bad = self._verified_entries(base, snapshot.term if snapshot else 0)
        truncated = 0
        if bad is not None:
            truncated = self._truncate(bad)
        hard_state = self._hard_state(base, entries[-1].index if entries else base)
        return DurableState(
            hard_state=hard_state, snapshot=snapshot, entries=tuple(entries), truncated=truncated
        )

    def _verified_entries(self, base: int, base_term: int) -> tuple[list[Entry], int | None]:
        """The valid prefix of the log after ``base``, and where it stopped being valid."""
        entries: list[Entry] = []
        expected, term = base + 1, base_term
        rows = self._conn.execute(
            "SELECT idx, term, data, crc FROM entries WHERE idx > ? ORDER BY idx", (base,)
        )
        for idx, t, data, crc in rows:
            if idx != expected:
                log.warning("raft log: entry %d is missing (found %d next)", expected, idx)
                return entries, expected
            if _entry_crc(idx, t, data) != crc:
                log.warning("raft log: entry %d is corrupt (checksum mismatch)", idx)
                return entries, idx
            if t < term:
                log.warning("raft log: entry %d has term %d below the %d before it", idx, t, term)
                return entries, idx
            entries.append(entry_from_payload(t, idx, bytes(data)))
            expected, term = idx + 1, t
        return entries, None

    def _truncate(self, first_bad: int) -> int:
        with self._tx() as conn:
            n: int = conn.execute("DELETE FROM entries WHERE idx >= ?", (first_bad,)).rowcount
        log.warning(
            "raft log: truncated %d entr%s from index %d on; they are never applied "
            "(the leader sends them again)",
            n,
            "y" if n == 1 else "ies",
            first_bad,
        )
        return n

    def _hard_state(self, base: int, last: int) -> HardState | None:
        row = self._conn.execute("SELECT term, vote, commit_index, crc FROM hard_state").fetchone()
        if row is None:
            return None
        term, vote, commit, crc = row
        hs = HardState(term=term, vote=vote, commit=commit)
        if _hard_state_crc(hs) != crc:
            raise StorageError(
                f"data dir {self.path}: the hard state (term, vote) is corrupt (checksum); "
                "refusing to start, since a lost vote could elect two leaders"
            )
        if commit > last:
            log.warning("raft log: commit index %d beyond the recovered log (%d)", commit, last)
            hs = HardState(term=term, vote=vote, commit=max(base, last))
        return hs

    def statistics(self) -> dict[str, int]:
        """Row counts and the database size in bytes (for status and benchmarks)."""
        conn = self._conn
        with self._mutex:
            n = conn.execute("SELECT COUNT(*), COALESCE(MAX(idx), 0) FROM entries").fetchone()
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            size = conn.execute("PRAGMA page_size").fetchone()[0]
        return {"entries": n[0], "last_index": n[1], "bytes": pages * size}


def _arbiter_set(arbiters: Mapping[str, str] | Sequence[str]) -> str:
    """The arbiter set as recorded: ``a1=host:port,...`` (or ``a1,...``), sorted by id."""
    if isinstance(arbiters, Mapping):
        return ",".join(f"{rid}={arbiters[rid]}" for rid in sorted(arbiters))
    return ",".join(sorted(arbiters))


def cluster_identity(cluster: str, arbiters: Mapping[str, str], restored_from: str = "") -> str:
    """``name@digest``: the cluster name and the first 12 hex digits of the SHA-256
    of the arbiter set (``id=host:port`` pairs sorted by id, comma-joined).

    Computed from the first ``--peers`` at the group's first start and stored
    (rule 5a); stamped on every Raft message and stated in every ack, so
    replicas given different first ``--peers`` lists refuse each other and a
    client refuses replicas of another group (:mod:`membership._arbiters.identity`).
    A group restored from a backup (``--restore``) also digests the backup's
    sha256 (``restored_from``), so it is a new group, the same on each of its
    replicas (arbiter/server/ops/backup.py, rule 4).
    """
    recorded = _arbiter_set(arbiters)
    if restored_from:
        recorded += f";restored-from={restored_from}"
    return _identity_of(cluster, recorded)


def _identity_of(cluster: str, recorded: str) -> str:
    return f"{cluster}@{hashlib.sha256(recorded.encode()).hexdigest()[:12]}"


def _lock(data_dir: Path) -> IO[str]:
    """Creates the directory if needed and takes its lock (rule 5)."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        f = open(data_dir / LOCK_NAME, "a+")  # noqa: SIM115 - held until close()
    except OSError as e:
        raise StorageError(f"data dir {data_dir} is not usable: {e.strerror or e}") from None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise StorageError(
            f"data dir {data_dir} is in use by another arbiter (pid {holder}); "
            "every replica needs its own --data-dir"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f
