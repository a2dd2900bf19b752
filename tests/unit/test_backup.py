"""Unit tests of the backup file (membership/shared/snapshot_file.py) and of --restore's data dir
(arbiter/server/ops/backup.py, rules 3 to 5)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from arbiter.core.commands import Bootstrap, Observation, ObserveBatch, Opinion, encode
from arbiter.core.replica import restore_state
from arbiter.core.tally import MembershipState
from arbiter.server.consensus.storage import Storage, cluster_identity
from arbiter.server.ops.backup import RestoreRefused, restore_data_dir
from membership.shared import snapshot_file
from membership.shared.snapshot_file import SnapshotFile, SnapshotFileError
from membership.shared.view import MemberState

IDS = ("a1", "a2", "a3")
PEERS = {"a1": "127.0.0.1:7001", "a2": "127.0.0.1:7002", "a3": "127.0.0.1:7003"}


def _state() -> MembershipState:
    """A tally at index 4: an instance id, n1 and n2 ALIVE (epoch 2)."""
    state = MembershipState(IDS)
    state.apply(1, encode(Bootstrap(instance="01d1")))
    for i, rid in enumerate(("a1", "a2"), start=2):
        obs = tuple(
            Observation(node_id=n, incarnation=7, opinion=Opinion.ALIVE, seq=1) for n in ("n1",)
        )
        state.apply(i, encode(ObserveBatch(replica_id=rid, observations=obs)))
    obs2 = (Observation(node_id="n2", incarnation=3, opinion=Opinion.ALIVE, seq=2),)
    state.apply(4, encode(ObserveBatch(replica_id="a1", observations=obs2)))
    state.apply(5, encode(ObserveBatch(replica_id="a3", observations=obs2)))
    return state


def _snap(state: MembershipState | None = None) -> SnapshotFile:
    state = state or _state()
    return SnapshotFile(
        cluster="default",
        identity=cluster_identity("default", PEERS),
        index=state.applied_index,
        term=4,
        epoch=state.epoch,
        members=len(state.view().members),
        saved_from="a1",
        saved_at=1.0e9,
        data=state.to_bytes(),
    )


def test_snapshot_file_round_trip_mode_0600_atomic(tmp_path: Path) -> None:
    snap = _snap()
    assert (snap.epoch, snap.members) == (2, 2)
    target = tmp_path / "backup.snap"
    snapshot_file.write(target, snap)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup.snap"]  # no temp file left
    assert snapshot_file.read(target) == snap


def test_snapshot_file_existing_target_needs_force(tmp_path: Path) -> None:
    target = tmp_path / "backup.snap"
    target.write_bytes(b"keep me")
    with pytest.raises(FileExistsError, match="--force"):
        snapshot_file.write(target, _snap())
    assert target.read_bytes() == b"keep me"
    snapshot_file.write(target, _snap(), force=True)
    assert snapshot_file.read(target).index == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup.snap"]


def _rehashed(raw: bytes, **header: object) -> bytes:
    """``raw`` with header fields replaced (the checksum still matches the data)."""
    head, _, data = raw.partition(b"\n")
    fields = {**json.loads(head), **header}
    return json.dumps(fields, sort_keys=True).encode() + b"\n" + data


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]), "checksum mismatch"),
        (lambda raw: raw[:-10], "truncated"),
        (lambda raw: raw + b"x", "truncated or padded"),
        (lambda raw: b"garbage\n" + raw, "not a membership snapshot"),
        (lambda raw: _rehashed(raw, version=2), "unknown snapshot version"),
        (lambda raw: _rehashed(raw, epoch=9), "header says epoch 9"),
        (lambda raw: _rehashed(raw, members=True), "'members' is missing or invalid"),
        (lambda raw: _rehashed(raw, index=-1), "'index' is missing or invalid"),
    ],
)
def test_snapshot_file_damage_is_refused_naming_the_check(damage: object, message: str) -> None:
    raw = _snap().to_bytes()
    with pytest.raises(SnapshotFileError, match=message):
        snapshot_file.parse(damage(raw))  # type: ignore[operator]


def _restore(data_dir: Path, backup: Path, peers: dict[str, str] = PEERS, **kw: str) -> str:
    return restore_data_dir(
        data_dir, backup, "a1", cluster=kw.get("cluster", "default"), peers=peers
    )


def test_restore_writes_a_new_group_same_members_and_epoch_new_instance(tmp_path: Path) -> None:
    backup = tmp_path / "b.snap"
    snap = _snap()
    snapshot_file.write(backup, snap)
    identity = _restore(tmp_path / "a1.data", backup)
    with Storage.open(
        tmp_path / "a1.data", replica_id="a1", cluster="default", arbiters=PEERS
    ) as st:
        durable = st.load()
        assert st.get_meta("identity") == identity
        assert st.get_meta("restored_from") == snap.sha256
    assert durable.snapshot is not None and not durable.entries
    assert (durable.snapshot.index, durable.snapshot.term) == (5, 4)
    assert durable.hard_state is not None
    assert (durable.hard_state.term, durable.hard_state.vote, durable.hard_state.commit) == (
        4,
        None,
        5,
    )
    restored = restore_state(durable.snapshot, IDS)
    original = _state()
    assert restored.epoch == original.epoch
    assert restored.view().members == original.view().members
    assert all(m.state is MemberState.ALIVE for m in restored.view().members)
    assert restored.instance == ""  # the new group's first leader commits a new one
    assert identity != snap.identity


def test_restore_identity_is_the_same_for_one_file_and_peers_and_differs_otherwise(
    tmp_path: Path,
) -> None:
    one, two = tmp_path / "one.snap", tmp_path / "two.snap"
    snapshot_file.write(one, _snap())
    snapshot_file.write(two, _later())
    moved = {**PEERS, "a3": "127.0.0.1:7099"}
    ids = [
        _restore(tmp_path / "d1", one),
        _restore(tmp_path / "d2", one),
        _restore(tmp_path / "d3", two),
        _restore(tmp_path / "d4", one, moved),
    ]
    assert ids[0] == ids[1]
    assert len({ids[0], ids[2], ids[3], cluster_identity("default", PEERS)}) == 4
    assert all(i.startswith("default@") for i in ids)


def _later() -> SnapshotFile:
    """A backup of a later state than :func:`_snap`'s (n3 heard at index 6)."""
    later = _state()
    obs = (Observation(node_id="n3", incarnation=1, opinion=Opinion.ALIVE, seq=3),)
    later.apply(6, encode(ObserveBatch(replica_id="a2", observations=obs)))
    return _snap(later)


def test_restore_refuses_a_non_empty_data_dir_but_restarts_one_restored_from_the_same_file(
    tmp_path: Path,
) -> None:
    one, two = tmp_path / "one.snap", tmp_path / "two.snap"
    snapshot_file.write(one, _snap())
    snapshot_file.write(two, _later())
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "stray").write_text("x")
    with pytest.raises(RestoreRefused, match="needs an empty --data-dir"):
        _restore(busy, one)
    assert sorted(p.name for p in busy.iterdir()) == ["stray"]
    done = tmp_path / "done"
    first = _restore(done, one)
    assert _restore(done, one) == first  # the same file again: a restart, nothing rewritten
    with pytest.raises(RestoreRefused, match="not empty"):
        _restore(done, two)
    old = tmp_path / "old"
    Storage.open(old, replica_id="a1", cluster="default", arbiters=PEERS).close()
    with pytest.raises(RestoreRefused, match="another group's state"):
        _restore(old, one)
    assert not (done / ".restoring").exists()


def test_restore_keeps_an_existing_empty_dir_in_place_and_clears_a_cut_short_restore(
    tmp_path: Path,
) -> None:
    # systemd's StateDirectory= with DynamicUser= is a symlink to a folder the
    # service cannot rename: the restore fills it instead of replacing it.
    backup = tmp_path / "b.snap"
    snapshot_file.write(backup, _snap())
    real = tmp_path / "private" / "state"
    (real / ".restoring").mkdir(parents=True)  # left by a restore cut short
    (real / ".restoring" / "raft.sqlite3").write_bytes(b"half")
    link = tmp_path / "state"
    link.symlink_to(real)
    identity = _restore(link, backup)
    assert link.is_symlink()
    assert sorted(p.name for p in real.iterdir()) == ["raft.sqlite3"]
    with Storage.open(link, replica_id="a1", cluster="default", arbiters=PEERS) as st:
        assert st.get_meta("identity") == identity
        durable = st.load()
    assert durable.snapshot is not None and durable.snapshot.index == 5


@pytest.mark.parametrize(
    ("peers", "cluster", "message"),
    [
        ({"a1": "h:1", "a2": "h:2", "b3": "h:3"}, "default", "same replica ids"),
        (PEERS, "prod", "give --cluster default"),
    ],
)
def test_restore_refuses_other_arbiter_ids_or_cluster(
    tmp_path: Path, peers: dict[str, str], cluster: str, message: str
) -> None:
    backup = tmp_path / "b.snap"
    snapshot_file.write(backup, _snap())
    with pytest.raises(RestoreRefused, match=message):
        _restore(tmp_path / "d", backup, peers, cluster=cluster)
    assert not (tmp_path / "d").exists()


def test_restore_refuses_a_damaged_or_missing_file(tmp_path: Path) -> None:
    backup = tmp_path / "b.snap"
    raw = _snap().to_bytes()
    backup.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    with pytest.raises(RestoreRefused, match="checksum mismatch"):
        _restore(tmp_path / "d", backup)
    with pytest.raises(RestoreRefused, match="No such file"):
        _restore(tmp_path / "d", tmp_path / "missing.snap")
    assert not (tmp_path / "d").exists()
