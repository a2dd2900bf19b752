"""A data dir records its cluster identity and first arbiter set (storage rules 5, 5a)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from arbiter.server.consensus.storage import DB_NAME, Storage, StorageError, cluster_identity

SET = {"a1": "10.0.0.1:7000", "a2": "10.0.0.2:7000", "a3": "10.0.0.3:7000"}


def _open(path: Path, arbiters: dict[str, str] | tuple[str, ...], **kw: object) -> Storage:
    return Storage.open(path, replica_id="a1", cluster="test", arbiters=arbiters, **kw)  # type: ignore[arg-type]


def _meta(path: Path) -> dict[str, str]:
    with sqlite3.connect(path / DB_NAME) as conn:
        return dict(conn.execute("SELECT key, value FROM meta").fetchall())


def test_storage_claim_records_id_address_pairs_sorted_by_id_and_the_identity(
    tmp_path: Path,
) -> None:
    with _open(tmp_path, dict(reversed(SET.items()))) as s:
        assert s.first_start and s.identity == cluster_identity("test", SET)
    meta = _meta(tmp_path)
    assert meta["arbiters"] == "a1=10.0.0.1:7000,a2=10.0.0.2:7000,a3=10.0.0.3:7000"
    assert meta["identity"] == cluster_identity("test", SET) and meta["joined"] == "0"


@pytest.mark.parametrize(
    "other",
    [
        {**SET, "a3": "10.0.0.9:7000"},  # one address moved
        {"a1": SET["a1"], "a2": SET["a2"]},  # a replica fewer
        {**SET, "a4": "10.0.0.4:7000"},  # a replica more
    ],
)
def test_storage_claim_later_opens_keep_the_stored_set_and_identity(
    tmp_path: Path, other: dict[str, str]
) -> None:
    _open(tmp_path, SET).close()
    with _open(tmp_path, other) as s:  # rule 5a: the stored configuration wins
        assert not s.first_start
        assert s.arbiters == SET and s.identity == cluster_identity("test", SET)
    assert _meta(tmp_path)["arbiters"] == "a1=10.0.0.1:7000,a2=10.0.0.2:7000,a3=10.0.0.3:7000"


def test_storage_claim_a_joining_replica_records_the_group_identity(tmp_path: Path) -> None:
    with _open(tmp_path, {}, identity="test@0123456789ab", joined=True) as s:
        assert s.identity == "test@0123456789ab" and s.joined and s.arbiters == {}
    with _open(tmp_path, SET) as s:  # later: the recorded one, not one computed from a list
        assert s.identity == "test@0123456789ab" and s.joined


def test_storage_claim_dir_written_before_the_identity_gets_the_one_its_set_implies(
    tmp_path: Path,
) -> None:
    _open(tmp_path, SET).close()
    with sqlite3.connect(tmp_path / DB_NAME) as conn:  # as written before rule 5a
        conn.execute("DELETE FROM meta WHERE key IN ('identity', 'joined')")
    with _open(tmp_path, {"a1": SET["a1"]}) as s:
        assert s.identity == cluster_identity("test", SET)
    assert _meta(tmp_path)["identity"] == cluster_identity("test", SET)


def test_storage_claim_dir_of_another_cluster_is_refused(tmp_path: Path) -> None:
    _open(tmp_path, SET).close()
    with pytest.raises(StorageError, match="belongs to replica 'a1' of cluster 'test'"):
        Storage.open(tmp_path, replica_id="a1", cluster="other", arbiters=SET)
