"""Storage keeps entry types and snapshot configurations (storage.py rule 7, raft/codec.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from arbiter.core.raft import ArbiterConfiguration, Entry, EntryType, HardState, Ready, Snapshot
from arbiter.server.consensus.storage import DB_NAME, Storage

CONF = ArbiterConfiguration(voters={"a1": "h:1", "a2": "h:2"}, learners={"a3": "h:3"}, index=2)


def _open(path: Path) -> Storage:
    return Storage.open(path, replica_id="a1", cluster="test", arbiters=("a1", "a2"))


def test_storage_keeps_config_entries_and_snapshot_configuration(tmp_path: Path) -> None:
    entries = (
        Entry(term=1, index=3, data=b'{"op":"add_learner"}', type=EntryType.CONFIG),
        Entry(term=1, index=4, data=b"\x01 looks like a prefix"),
        Entry(term=1, index=5, data=b'{"v":1}'),
    )
    snap = Snapshot(index=2, term=1, data=b'{"v":1,"state":1}', configuration=CONF)
    hs = HardState(term=1, vote=None, commit=4)
    with _open(tmp_path) as s:
        s.save(Ready(hard_state=hs, entries=(), messages=(), committed_entries=(), snapshot=snap))
        s.save(Ready(hard_state=None, entries=entries, messages=(), committed_entries=()))
    with _open(tmp_path) as s:
        got = s.load()
    assert got.snapshot == snap and got.entries == entries and got.truncated == 0


def test_storage_reads_a_data_dir_written_before_entry_types(tmp_path: Path) -> None:
    # What the previous version wrote: plain data blobs; they mean what they meant.
    plain = Entry(term=1, index=1, data=b'{"v":1,"t":"obs"}')
    with _open(tmp_path) as s:
        s.save(
            Ready(
                hard_state=HardState(term=1, vote=None, commit=1),
                entries=(plain,),
                messages=(),
                committed_entries=(),
            )
        )
    raw = sqlite3.connect(str(tmp_path / DB_NAME))
    assert raw.execute("SELECT data FROM entries").fetchone()[0] == plain.data
    raw.close()
    with _open(tmp_path) as s:
        assert s.load().entries == (plain,)
