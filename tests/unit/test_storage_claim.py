"""A data dir belongs to one arbiter set, addresses included (storage rule 5)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from arbiter.server.storage import DB_NAME, Storage, StorageError

SET = {"a1": "10.0.0.1:7000", "a2": "10.0.0.2:7000", "a3": "10.0.0.3:7000"}


def _open(path: Path, arbiters: dict[str, str] | tuple[str, ...]) -> Storage:
    return Storage.open(path, replica_id="a1", cluster="test", arbiters=arbiters)


def _recorded(path: Path) -> str:
    with sqlite3.connect(path / DB_NAME) as conn:
        return str(conn.execute("SELECT value FROM meta WHERE key = 'arbiters'").fetchone()[0])


def test_storage_claim_records_id_address_pairs_sorted_by_id(tmp_path: Path) -> None:
    _open(tmp_path, dict(reversed(SET.items()))).close()
    assert _recorded(tmp_path) == "a1=10.0.0.1:7000,a2=10.0.0.2:7000,a3=10.0.0.3:7000"
    _open(tmp_path, SET).close()  # the same set, in any order


@pytest.mark.parametrize(
    "other",
    [
        {**SET, "a3": "10.0.0.9:7000"},  # one address moved
        {"a1": SET["a1"], "a2": SET["a2"]},  # a replica fewer
        {**SET, "a4": "10.0.0.4:7000"},  # a replica more
    ],
)
def test_storage_claim_refuses_another_arbiter_set_and_says_how_to_proceed(
    tmp_path: Path, other: dict[str, str]
) -> None:
    _open(tmp_path, SET).close()
    with pytest.raises(StorageError) as e:
        _open(tmp_path, other)
    message = str(e.value)
    assert f"was written by arbiters {_recorded(tmp_path)}, but --peers lists" in message
    assert "give the same --peers as before" in message and "fresh --data-dir" in message
    _open(tmp_path, SET).close()  # refused without harm: the record is unchanged


def test_storage_claim_dir_that_recorded_ids_only_gets_the_addresses(tmp_path: Path) -> None:
    _open(tmp_path, ("a1", "a2", "a3")).close()  # as written before addresses were recorded
    assert _recorded(tmp_path) == "a1,a2,a3"
    _open(tmp_path, SET).close()
    assert _recorded(tmp_path) == "a1=10.0.0.1:7000,a2=10.0.0.2:7000,a3=10.0.0.3:7000"
    with pytest.raises(StorageError):
        _open(tmp_path, {**SET, "a2": "10.0.0.8:7000"})


def test_storage_claim_ids_only_dir_with_other_ids_is_refused(tmp_path: Path) -> None:
    _open(tmp_path, ("a1", "a2", "a3")).close()
    with pytest.raises(StorageError, match="was written by arbiters a1,a2,a3"):
        _open(tmp_path, {"a1": SET["a1"], "a2": SET["a2"]})
    assert _recorded(tmp_path) == "a1,a2,a3"


def test_storage_claim_ids_only_caller_checks_ids_against_recorded_pairs(tmp_path: Path) -> None:
    _open(tmp_path, SET).close()
    _open(tmp_path, ("a3", "a2", "a1")).close()
    assert _recorded(tmp_path).startswith("a1=")  # not downgraded
    with pytest.raises(StorageError):
        _open(tmp_path, ("a1", "a2"))
