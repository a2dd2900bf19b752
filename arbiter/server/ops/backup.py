"""Backup and restore of the tally: the Admin service's ``SaveSnapshot`` and ``--restore``.

As etcd's ``snapshot save`` / ``snapshot restore``: a backup is the tally's
canonical snapshot (:mod:`arbiter.core.tally_snapshot`) at one log index,
and a restore starts a NEW arbiter group from it, with the same members and
epoch and a new cluster identity. The file's layout is
:mod:`membership.shared.snapshot_file`.

Rules:

1. Who answers. ``SaveSnapshot`` needs an administrator
   (:meth:`Authorizer.admin`: under mutual TLS an ``admin`` certificate) and
   is answered by the leader only, with a read index (Raft thesis, Ongaro
   2014, section 6.4): the leader notes its commit index at the request,
   then waits until it has applied an entry of its own term (its first
   entry, a no-op, so everything committed by earlier leaders is applied)
   and at least that commit index, while it is in a quorum (CheckQuorum:
   it heard from a majority within the last election timeout). The state it
   then serializes, in one turn of the event loop, is the one at its
   applied index, whose term it records. A follower answers
   FAILED_PRECONDITION naming the leader it knows, also in the trailing
   metadata ``membership-not-leader`` (the client asks the others); no
   leader in a quorum, or no catch-up within three election timeouts, is
   UNAVAILABLE.
2. The stream: the first chunk carries the info (cluster name, identity,
   index, term, epoch, members, the answering replica, size), every chunk up
   to ``CHUNK_BYTES`` of data, the last one the data's sha256.
3. Restore (:func:`restore_data_dir`) writes a data directory that starts
   the new group: the file's snapshot at its index and term as the Raft
   snapshot, a hard state of that term with no vote and that commit index,
   and no log entries. The data must decode as a tally snapshot of exactly
   the arbiter ids in ``--peers`` (their addresses may differ: a group
   moved to new machines), and the file's cluster name must be
   ``--cluster``. The snapshot's instance id is cleared, so the new group's
   first leader commits a new one (tally rule 10): watchers of the old group
   never resume into the new group's history. Every replica of the new group
   is started with ``--restore`` of the same file and writes the same bytes.
4. The new identity is :func:`arbiter.server.consensus.storage.cluster_identity` of the
   cluster name, the ``--peers`` list and the file's sha256, so every replica
   restored from one file with one ``--peers`` list states the same identity,
   and a group restored from another file (or the old group) another one.
   It is stored in the data dir (meta ``identity``, with ``restored_from``,
   the file's sha256) and read from there at every start.
5. Only an empty or missing data directory is restored into: the database
   is built in ``.restoring`` inside it and renamed into place last, in one
   step, so a crash leaves either no database (and a ``.restoring`` that the
   next restore removes) or the whole restored one. The directory itself is
   kept, not replaced: systemd's ``StateDirectory=`` (with ``DynamicUser=``
   a symlink into a folder the service cannot write) and a volume's mount
   point cannot be renamed by the replica. A data
   directory that was restored from the same file (same sha256) is a
   restart, not a restore: ``--restore`` is then ignored with an INFO line
   (an unchanged systemd unit or StatefulSet can keep the flag). Any other
   non-empty directory is refused.
6. After a restore, every member restored ALIVE has not been heard by the new
   group: the replicas start with the restart grace (observer rule 5), then
   suspect and commit DEAD whoever has not come back. Running nodes do not
   follow: their SDK pinned the old group's identity (membership/_arbiters/identity.py)
   and refuses the new one, so it reports fenced; restart them (a restarted
   node asks the identity afresh and rejoins). A node never counts leases
   from two groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

import grpc

from arbiter.core.raft import ArbiterConfiguration, HardState, Ready, Snapshot
from arbiter.core.tally_snapshot import SnapshotDecodeError, decode, encode
from arbiter.server.api.replies import cluster_mismatch, deny
from arbiter.server.consensus.driver import Driver
from arbiter.server.consensus.storage import DB_NAME, Storage, StorageError, cluster_identity
from arbiter.server.net.authz import Authorizer
from membership.shared.snapshot_file import SnapshotFile, SnapshotFileError, read
from membership.v1 import membership_pb2 as pb

__all__ = [
    "CHUNK_BYTES",
    "NOT_LEADER",
    "RestoreRefused",
    "check_restore",
    "restore_data_dir",
    "restored_identity",
    "stream_snapshot",
]

log = logging.getLogger("arbiter.backup")

# Bytes of snapshot data per streamed chunk (well under every message limit).
CHUNK_BYTES = 64 * 1024
# Trailing metadata of a follower's refusal: the leader it knows ("" for none).
NOT_LEADER = "membership-not-leader"
# The folder inside the data dir where a restore builds the database (rule 5).
STAGING = ".restoring"
# Seconds between two looks at the applied index while catching up (rule 1).
_POLL = 0.01


class RestoreRefused(StorageError):
    """``--restore`` cannot be done: a bad file, or a data dir that is not empty (rules 3, 5)."""


async def stream_snapshot(
    driver: Driver,
    request: pb.SaveSnapshotRequest,
    context: grpc.aio.ServicerContext,
    *,
    cluster: str,
    authz: Authorizer,
) -> AsyncIterator[pb.SnapshotChunk]:
    """The chunks of a consistent snapshot of this leader's tally (rules 1 and 2).

    Args:
        driver: the replica's driver.
        request: the caller's request (its expected cluster identity, if any).
        context: the call's context (aborted with the statuses of rule 1).
        cluster: this replica's identity, ``name@digest``.
        authz: who may administer.
    """
    await deny(context, authz.admin(context), logging.WARNING)
    me = driver.replica_id
    mismatch = cluster_mismatch(cluster, me, request.cluster, "administrator")
    if mismatch is not None:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, mismatch)
    st = driver.raft.status()
    if not driver.is_leader:
        known = f"the leader is {st.leader}" if st.leader else "no leader is known"
        context.set_trailing_metadata(((NOT_LEADER, st.leader or ""),))
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"arbiter {me} is not the leader ({known}); a snapshot is saved from the leader",
        )
    read_index = st.commit
    deadline = time.monotonic() + driver.config.election_timeout * 3
    while True:
        st = driver.raft.status()
        if not driver.is_leader or not driver.raft.in_quorum(time.monotonic()):
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"arbiter {me} lost its quorum or leadership"
            )
        if driver.applied_term == st.term and st.applied >= read_index:
            break
        if time.monotonic() > deadline:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"arbiter {me} did not apply index {read_index} of term {st.term} in time",
            )
        await asyncio.sleep(_POLL)
    # One synchronous stretch: the state, its index and term belong together.
    state = driver.state
    data = state.to_bytes()
    info = pb.SnapshotInfo(
        cluster=driver.config.cluster,
        identity=cluster,
        index=state.applied_index,
        term=driver.applied_term,
        epoch=state.epoch,
        members=len(state.view().members),
        arbiter=me,
        size=len(data),
    )
    log.info(
        "snapshot at index %d (term %d, epoch %d, %d bytes) streamed to %s",
        info.index,
        info.term,
        info.epoch,
        info.size,
        authz.identity(context) or context.peer(),
    )
    snap = SnapshotFile(
        cluster=info.cluster,
        identity=cluster,
        index=info.index,
        term=info.term,
        epoch=info.epoch,
        members=info.members,
        saved_from=me,
        data=data,
    )
    pieces = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
    for i, piece in enumerate(pieces):
        yield pb.SnapshotChunk(
            info=info if i == 0 else None,
            data=piece,
            sha256=snap.sha256 if i == len(pieces) - 1 else "",
        )


def restored_identity(cluster: str, peers: dict[str, str], snapshot: SnapshotFile) -> str:
    """The identity of a group restored from ``snapshot`` with ``peers`` (rule 4)."""
    return cluster_identity(cluster, peers, restored_from=snapshot.sha256)


def check_restore(
    path: Path, *, cluster: str, replica_ids: Sequence[str]
) -> tuple[SnapshotFile, bytes]:
    """Reads the backup and checks it fits the new group (rule 3).

    Returns:
        The file and the tally snapshot to start from (its instance cleared).

    Raises:
        RestoreRefused: unreadable, damaged, another cluster's, or of other arbiter ids.
    """
    try:
        snap = read(path)
    except (OSError, SnapshotFileError) as e:
        raise RestoreRefused(f"--restore {path}: {getattr(e, 'strerror', None) or e}") from None
    if snap.cluster != cluster:
        raise RestoreRefused(
            f"--restore {path} is a snapshot of cluster {snap.cluster!r}, not {cluster!r}: "
            f"give --cluster {snap.cluster}"
        )
    try:
        image = decode(snap.data)
    except SnapshotDecodeError as e:
        raise RestoreRefused(f"--restore {path}: {e}") from None
    saved = tuple(image.configuration.voters)
    if saved != tuple(sorted(replica_ids)):
        raise RestoreRefused(
            f"--restore {path} was saved by arbiters {', '.join(saved)}, but --peers "
            f"lists {', '.join(sorted(replica_ids))}: restore with the same replica ids "
            "(their addresses may change)"
        )
    # The new group's first configuration is --peers (ids here, addresses from the
    # data dir's first arbiter set: arbiter/core/restore.py); the backup's learners go.
    first = ArbiterConfiguration.initial(dict.fromkeys(saved, ""))
    observations = tuple(o for o in image.observations if o[1] in first)
    return snap, encode(replace(image, configuration=first, observations=observations, instance=""))


def restore_data_dir(
    data_dir: Path,
    path: Path,
    replica_id: str,
    *,
    cluster: str,
    peers: dict[str, str],
) -> str:
    """Makes ``data_dir`` the start of a new group restored from the backup ``path``.

    Args:
        data_dir: the replica's data directory: missing, empty, or restored
            from this very file before (rule 5).
        path: the backup file.
        replica_id: this replica's id.
        cluster: the cluster name (must be the file's).
        peers: every replica of the new group, id -> ``host:port``.

    Returns:
        The new group's cluster identity (rule 4).

    Raises:
        RestoreRefused: rules 3 and 5.
        StorageError: the directory cannot be written.
    """
    snap, data = check_restore(path, cluster=cluster, replica_ids=list(peers))
    identity = restored_identity(cluster, peers, snap)
    staging = data_dir / STAGING
    if data_dir.exists() and any(p.name != STAGING for p in data_dir.iterdir()):
        done = None
        if (data_dir / DB_NAME).exists():
            with (
                contextlib.suppress(StorageError),  # another group's: refused below
                Storage.open(
                    data_dir, replica_id=replica_id, cluster=cluster, arbiters=peers
                ) as storage,
            ):
                done = storage.get_meta("restored_from")
        if done == snap.sha256:
            log.info(
                "%s: data dir %s was restored from %s already: starting from it (--restore "
                "ignored)",
                replica_id,
                data_dir,
                path,
            )
            return identity
        raise RestoreRefused(
            f"--restore needs an empty --data-dir, and {data_dir} is not empty (it holds "
            "another group's state): move it away first"
        )
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.rmtree(staging, ignore_errors=True)  # a restore cut short before
        with Storage.open(staging, replica_id=replica_id, cluster=cluster, arbiters=peers) as st:
            st.save(
                Ready(
                    hard_state=HardState(term=snap.term, vote=None, commit=snap.index),
                    entries=(),
                    messages=(),
                    committed_entries=(),
                    snapshot=Snapshot(index=snap.index, term=snap.term, data=data),
                )
            )
            st.put_meta("identity", identity)
            st.put_meta("restored_from", snap.sha256)
        # One self-contained file (its WAL checkpointed into it), renamed in one step.
        db = sqlite3.connect(staging / DB_NAME)
        try:
            db.execute("PRAGMA journal_mode=DELETE")
        finally:
            db.close()
        (staging / DB_NAME).rename(data_dir / DB_NAME)
        _fsync_dir(data_dir)
    except OSError as e:
        raise StorageError(f"--restore into {data_dir}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.warning(
        "%s: restored from %s: a NEW group %s at epoch %d with %d members (log index %d, "
        "term %d; saved from %s of %s)",
        replica_id,
        path,
        identity,
        snap.epoch,
        snap.members,
        snap.index,
        snap.term,
        snap.saved_from,
        snap.identity,
    )
    return identity


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
