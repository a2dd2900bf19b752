"""SQLite storage of the Raft state: round trip, overwrites, checksums, compaction, locking."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from arbiter.core.raft import Entry, HardState, Ready, Snapshot
from arbiter.server.consensus.storage import CACHE_KIB, DB_NAME, Storage, StorageError


def _entries(lo: int, hi: int, term: int = 1) -> tuple[Entry, ...]:
    return tuple(Entry(term=term, index=i, data=f"e{i}t{term}".encode()) for i in range(lo, hi + 1))


def _ready(
    hs: HardState | None = None,
    entries: tuple[Entry, ...] = (),
    snapshot: Snapshot | None = None,
) -> Ready:
    return Ready(
        hard_state=hs, entries=entries, messages=(), committed_entries=(), snapshot=snapshot
    )


def _open(path: Path, replica_id: str = "a1", arbiters: tuple[str, ...] = ("a1", "a2")) -> Storage:
    return Storage.open(path, replica_id=replica_id, cluster="test", arbiters=arbiters)


def _raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(str(path / DB_NAME), isolation_level=None)


def test_storage_round_trip_and_reload_after_restart(tmp_path: Path) -> None:
    hs = HardState(term=2, vote="a2", commit=3)
    with _open(tmp_path) as s:
        assert s.load().hard_state is None and s.load().entries == ()
        s.save(_ready(HardState(term=1, vote="a1", commit=0), _entries(1, 2)))
        s.save(_ready(hs, _entries(3, 5, term=2)))
        got = s.load()
    assert got.hard_state == hs
    assert got.entries == _entries(1, 2) + _entries(3, 5, term=2)
    with _open(tmp_path) as s:  # a restarted process sees the same
        again = s.load()
    assert (again.hard_state, again.entries, again.snapshot, again.truncated) == (
        hs,
        got.entries,
        None,
        0,
    )


def test_storage_conflicting_entries_overwrite_the_tail(tmp_path: Path) -> None:
    with _open(tmp_path) as s:
        s.save(_ready(HardState(term=1, vote=None, commit=2), _entries(1, 6)))
        s.save(_ready(HardState(term=3, vote=None, commit=2), _entries(3, 4, term=3)))
        got = s.load()
    assert got.entries == _entries(1, 2) + _entries(3, 4, term=3)  # 5 and 6 are gone


def test_storage_leader_snapshot_replaces_the_log(tmp_path: Path) -> None:
    snap = Snapshot(index=10, term=2, data=b"state@10")
    with _open(tmp_path) as s:
        s.save(_ready(HardState(term=1, vote=None, commit=3), _entries(1, 4)))
        s.save(_ready(HardState(term=2, vote=None, commit=10), _entries(11, 12, term=2), snap))
        got = s.load()
    assert got.snapshot == snap
    assert got.entries == _entries(11, 12, term=2)
    assert got.last_index == 12


def test_storage_compact_deletes_entries_up_to_the_snapshot(tmp_path: Path) -> None:
    with _open(tmp_path) as s:
        s.save(_ready(HardState(term=1, vote=None, commit=8), _entries(1, 8)))
        s.compact(Snapshot(index=5, term=1, data=b"state@5"))
        assert s.statistics()["entries"] == 3
    with _open(tmp_path) as s:
        got = s.load()
    assert got.snapshot == Snapshot(index=5, term=1, data=b"state@5")
    assert got.entries == _entries(6, 8)
    assert got.hard_state is not None and got.hard_state.commit == 8


@pytest.mark.parametrize(
    ("damage", "first_bad"),
    [
        ("UPDATE entries SET data = x'00' WHERE idx = 4", 4),
        ("UPDATE entries SET term = 9 WHERE idx = 5", 5),
        ("DELETE FROM entries WHERE idx = 3", 3),
    ],
    ids=["corrupt-data", "corrupt-term", "gap"],
)
def test_storage_corrupt_or_missing_tail_is_truncated_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str, first_bad: int
) -> None:
    with _open(tmp_path) as s:
        s.save(_ready(HardState(term=1, vote="a1", commit=6), _entries(1, 6)))
    with _raw(tmp_path) as raw:
        raw.execute(damage)
    raw.close()
    with caplog.at_level(logging.WARNING, logger="arbiter.storage"), _open(tmp_path) as s:
        got = s.load()
    assert got.entries == _entries(1, first_bad - 1)
    assert got.truncated == 6 - first_bad + (0 if damage.startswith("DELETE") else 1)
    assert got.hard_state == HardState(term=1, vote="a1", commit=first_bad - 1)  # capped
    text = caplog.text
    assert f"entry {first_bad} is" in text and f"from index {first_bad}" in text
    caplog.clear()
    with _open(tmp_path) as s:  # the truncation itself was durable
        assert s.load().entries == _entries(1, first_bad - 1)
    assert "truncated" not in caplog.text


@pytest.mark.parametrize(
    "damage",
    ["UPDATE hard_state SET vote = 'a3'", "UPDATE snapshot SET data = x'00'"],
    ids=["hard-state", "snapshot"],
)
def test_storage_corrupt_hard_state_or_snapshot_refuses_to_load(
    tmp_path: Path, damage: str
) -> None:
    with _open(tmp_path) as s:
        s.save(_ready(HardState(term=1, vote="a2", commit=2), _entries(1, 3)))
        s.compact(Snapshot(index=2, term=1, data=b"state@2"))
    with _raw(tmp_path) as raw:
        raw.execute(damage)
    raw.close()
    with _open(tmp_path) as s, pytest.raises(StorageError, match="corrupt"):
        s.load()


def test_storage_second_opener_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    first = _open(tmp_path)
    with pytest.raises(StorageError, match=rf"in use by another arbiter \(pid {os.getpid()}\)"):
        _open(tmp_path)
    first.close()
    _open(tmp_path).close()


def test_storage_directory_of_another_replica_is_refused(tmp_path: Path) -> None:
    _open(tmp_path, "a1").close()
    with pytest.raises(StorageError, match="belongs to replica 'a1'"):
        _open(tmp_path, "a2")
    _open(tmp_path, "a1").close()  # the failed attempt released the lock


def test_storage_directory_keeps_its_first_arbiter_set_whatever_is_given_later(
    tmp_path: Path,
) -> None:
    _open(tmp_path, arbiters=("a1", "a2", "a3")).close()
    with _open(tmp_path, arbiters=("a2", "a1")) as again:  # rule 5a: the stored set wins
        assert list(again.arbiters) == ["a1", "a2", "a3"] and not again.first_start


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_storage_unwritable_directory_is_a_clear_error(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(StorageError, match="not usable"):
            _open(tmp_path / "sub")
    finally:
        tmp_path.chmod(0o700)


def test_storage_data_dir_under_a_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StorageError, match=r"data dir .*file/sub is not usable"):
        _open(tmp_path / "file" / "sub")


def test_storage_in_memory_needs_no_directory() -> None:
    with Storage.open(None, replica_id="a1", cluster="test", arbiters=["a1"]) as s:
        s.save(_ready(HardState(term=1, vote=None, commit=0), _entries(1, 2)))
        assert s.load().entries == _entries(1, 2)


@pytest.mark.parametrize("where", ["created", "reopened", "in-memory"])
def test_storage_page_cache_is_bounded_on_every_open(tmp_path: Path, where: str) -> None:
    # SQLite's cache_size is per connection, so every open sets it, not only a new database.
    if where == "reopened":
        _open(tmp_path).close()
    path = None if where == "in-memory" else tmp_path
    with Storage.open(path, replica_id="a1", cluster="test", arbiters=["a1", "a2"]) as s:
        assert s._conn.execute("PRAGMA cache_size").fetchone()[0] == -CACHE_KIB


def test_storage_empty_ready_writes_nothing(tmp_path: Path) -> None:
    with _open(tmp_path) as s:
        s.save(_ready())
        assert s.load().hard_state is None


def test_storage_writer_thread_saves_while_the_loop_thread_reads(tmp_path: Path) -> None:
    # The driver's shape (rule 6): a writer thread saves, the event loop reads statistics.
    with _open(tmp_path) as s:
        errors: list[BaseException] = []

        def write() -> None:
            try:
                for i in range(1, 101):
                    s.save(_ready(HardState(term=1, vote="a1", commit=i - 1), _entries(i, i)))
            except BaseException as e:  # reported below, not lost in the thread
                errors.append(e)

        writer = threading.Thread(target=write)
        writer.start()
        seen = []
        while writer.is_alive():
            seen.append(s.statistics()["last_index"])
        writer.join()
        assert errors == []
        assert seen == sorted(seen)  # each read saw whole transactions, in order
        assert s.load().entries == _entries(1, 100)
    with _open(tmp_path) as s:
        assert s.load().entries == _entries(1, 100)
