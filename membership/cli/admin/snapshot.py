"""Backups: :func:`save_snapshot`, ``membership admin snapshot save`` and ``... status``.

``save`` asks the Admin service's ``SaveSnapshot`` of the arbiters given,
one at a time in that order: the leader answers (with a read index,
arbiter/server/ops/backup.py rule 1); a follower's refusal names the leader in
its trailing metadata and the next address is asked; an arbiter that cannot
answer (UNAVAILABLE, a deadline) is skipped. When none answers it tries
again every quarter second until the timeout
(:func:`membership.cli.admin.remove.ask_in_rounds`). The stream's size
and sha256 are checked before anything is written, and the file is written
atomically, mode 0600 (:mod:`membership.shared.snapshot_file`, rule 3).

``status`` reads a backup and prints what it holds, like ``etcdutl snapshot
status``: epoch, members, log index and term, and whether the checksum and
the header agree with the data (exit 1 otherwise).

Restoring is the arbiter's: ``membership arbiter ... --restore FILE``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

import grpc

from membership._arbiters.transport import Channels
from membership._config import ClientConfig
from membership.cli.admin.remove import ask_in_rounds
from membership.shared import snapshot_file, tls
from membership.shared.errors import InvalidArgument, RejectedError, UnavailableError
from membership.shared.exits import EXIT_OK, CliError
from membership.shared.interrupt import Interrupt, Interrupted
from membership.shared.validation import parse_address
from membership.v1 import membership_pb2 as pb

__all__ = ["admin_snapshot_save", "admin_snapshot_status", "save_snapshot"]

# The trailing metadata of a follower's refusal (arbiter/server/ops/backup.py).
_NOT_LEADER = "membership-not-leader"


async def _fetch(stub: object, timeout: float) -> snapshot_file.SnapshotFile:
    """One ``SaveSnapshot`` call, its chunks joined and checked."""
    call = stub.SaveSnapshot(pb.SaveSnapshotRequest(), timeout=timeout)  # type: ignore[attr-defined]
    info: pb.SnapshotInfo | None = None
    parts: list[bytes] = []
    digest = ""
    async for chunk in call:
        if chunk.HasField("info"):
            info = chunk.info
        parts.append(chunk.data)
        digest = chunk.sha256 or digest
    data = b"".join(parts)
    if info is None or len(data) != info.size or hashlib.sha256(data).hexdigest() != digest:
        raise UnavailableError("the snapshot stream was incomplete or its sha256 did not match")
    return snapshot_file.SnapshotFile(
        cluster=info.cluster,
        identity=info.identity,
        index=int(info.index),
        term=int(info.term),
        epoch=int(info.epoch),
        members=int(info.members),
        saved_from=info.arbiter,
        saved_at=time.time(),
        data=data,
    )


async def save_snapshot(
    arbiters: Sequence[str],
    path: Path,
    *,
    force: bool = False,
    timeout: float = 10.0,
    config: ClientConfig | None = None,
) -> snapshot_file.SnapshotFile:
    """Saves a consistent snapshot of the cluster's view to ``path`` (module docstring).

    Args:
        arbiters: arbiter addresses ``host:port``, asked in this order.
        path: the file to write (mode 0600, atomically).
        force: replace ``path`` if it exists.
        timeout: seconds for the whole call.
        config: the client configuration (TLS files: an admin certificate
            under mutual TLS; or ``insecure``).

    Returns:
        The snapshot written.

    Raises:
        InvalidArgument: a malformed address, or no TLS settings and no ``insecure``.
        FileExistsError: ``path`` exists and not ``force`` (checked first, and again
            when the file is put in place).
        RejectedError: ``PERMISSION_DENIED`` (not an administrator) or another refusal.
        UnavailableError: no leader answered within ``timeout``.
        OSError: the file cannot be written.
    """
    addrs = [parse_address(a) for a in arbiters]
    if not addrs:
        raise InvalidArgument("no arbiter address given")
    path = Path(path)
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists (give --force to replace it)")
    config = (config or ClientConfig()).validate()
    channels = Channels.of(config)

    async def one(addr: str, left: float) -> snapshot_file.SnapshotFile:
        snap = await _fetch(channels.admin(addr), min(left, config.call_timeout * 10))
        snapshot_file.parse(snap.to_bytes(), str(path))  # the checks of status, first
        snapshot_file.write(path, snap, force=force)
        return snap

    try:
        return await ask_in_rounds(
            addrs, timeout, one, what="leader could save a snapshot", redirect=_follower
        )
    finally:
        await channels.close()


def _follower(e: grpc.aio.AioRpcError) -> tuple[str, str | None] | None:
    """A follower's refusal (its trailing metadata says so): ask the next address."""
    if _NOT_LEADER in dict(e.trailing_metadata() or ()):
        return f"{e.code().name} {e.details()}", None
    return None


def _describe(path: Path, snap: snapshot_file.SnapshotFile) -> dict[str, object]:
    saved = datetime.datetime.fromtimestamp(snap.saved_at, tz=datetime.UTC)
    return {
        "file": str(path),
        "valid": True,
        "sha256": snap.sha256,
        "cluster": snap.cluster,
        "identity": snap.identity,
        "epoch": snap.epoch,
        "members": snap.members,
        "index": snap.index,
        "term": snap.term,
        "size": len(snap.data),
        "saved_from": snap.saved_from,
        "saved_at": saved.isoformat(timespec="seconds").replace("+00:00", "Z"),
    }


def _print(fields: dict[str, object], as_json: bool) -> None:
    if as_json:
        print(json.dumps(fields, sort_keys=True), flush=True)
        return
    for key, value in fields.items():
        print(f"{key}: {str(value).lower() if isinstance(value, bool) else value}", flush=True)


async def admin_snapshot_save(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """``membership admin snapshot save FILE``: prints what was saved; exit 0.

    Raises:
        CliError: the file exists (without ``--force``), the cluster refused, no
            leader answered, or the file could not be written (exit 1, one line).
        Interrupted: a signal came first.
    """
    try:
        done, snap = await interrupt.race(
            save_snapshot(
                args.arbiters,
                args.file,
                force=args.force,
                timeout=args.timeout,
                config=ClientConfig(follow_view=False, **tls.config_fields(args)),
            )
        )
    except (RejectedError, UnavailableError, snapshot_file.SnapshotFileError) as e:
        raise CliError(str(e)) from None
    except OSError as e:  # FileExistsError included
        raise CliError(str(e) if e.strerror is None else f"{args.file}: {e.strerror}") from None
    if not done or snap is None:
        assert interrupt.signum is not None
        raise Interrupted(interrupt.signum)
    fields = _describe(args.file, snap)
    if not args.json:
        print(
            f"snapshot saved to {args.file}: epoch {snap.epoch}, {snap.members} members, index "
            f"{snap.index} (term {snap.term}) from {snap.saved_from}, sha256 {snap.sha256}",
            flush=True,
        )
    else:
        _print(fields, True)
    return EXIT_OK


def admin_snapshot_status(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """``membership admin snapshot status FILE``: prints what the backup holds; exit 0.

    Raises:
        CliError: the file cannot be read, is not a backup, or is damaged (exit 1).
    """
    try:
        snap = snapshot_file.read(args.file)
    except snapshot_file.SnapshotFileError as e:
        raise CliError(f"invalid snapshot: {e}") from None
    except OSError as e:
        raise CliError(f"{args.file}: {e.strerror or e}") from None
    _print(_describe(args.file, snap), args.json)
    return EXIT_OK
