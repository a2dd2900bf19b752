"""The backup file of ``membership admin snapshot save``: its layout, atomic write and checks.

A backup holds the tally's canonical snapshot (the bytes of
``arbiter/core/tally_snapshot.py``, which this module treats as opaque JSON)
and what it is of. The arbiter reads the same file for ``membership arbiter
--restore`` (:mod:`arbiter.server.ops.backup`), so the layout lives here, below
both sides.

Rules:

1. Layout, version 1: one header line of JSON (sorted keys, no spaces),
   ``{"cluster", "epoch", "format": "membership-snapshot", "identity",
   "index", "members", "saved_at", "saved_from", "sha256", "size", "term",
   "version": 1}``, a newline, then exactly ``size`` bytes of data. ``sha256``
   is the hex digest of the data; ``saved_at`` is wall-clock seconds since
   the Unix epoch (informational).
2. Checks on reading (:func:`read`): the header parses and has every key with
   its type; the data has ``size`` bytes and the digest in the header; the
   data is a JSON object whose ``epoch`` and ``applied_index`` are the
   header's ``epoch`` and ``index`` and whose ``members`` count is the
   header's. A file that fails any of them raises
   :class:`SnapshotFileError` naming the check. (The term is in the header
   only; the arbiter decodes the data in full before restoring.)
3. Writing (:func:`write`) is atomic: a temporary file in the target's
   folder, created with mode 0600 (the view names every node and its
   labels), written, fsynced, then renamed over the target; the folder is
   fsynced after. An existing target is refused unless ``force``; without
   ``force`` the rename is a ``link`` that fails if the target appeared
   meanwhile, so two saves never overwrite each other.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from membership.shared.errors import MembershipError

__all__ = ["FORMAT", "VERSION", "SnapshotFile", "SnapshotFileError", "read", "write"]

FORMAT = "membership-snapshot"
VERSION = 1
# Header key -> type (rule 1).
_HEADER = {
    "cluster": str,
    "epoch": int,
    "format": str,
    "identity": str,
    "index": int,
    "members": int,
    "saved_at": float,
    "saved_from": str,
    "sha256": str,
    "size": int,
    "term": int,
    "version": int,
}


class SnapshotFileError(MembershipError, ValueError):
    """The file is not a backup this module could have written, or it is damaged (rule 2)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotFile:
    """One backup: the tally's snapshot bytes and what they are of.

    Attributes:
        cluster: the cluster name (``--cluster``).
        identity: the cluster identity of the group it was saved from, ``name@digest``.
        index: log index of the last entry the snapshot holds.
        term: Raft term of that entry.
        epoch: view epoch at that index.
        members: number of member records (ALIVE, DEAD, LEFT).
        saved_from: the replica that answered (the leader then).
        saved_at: wall-clock seconds since the Unix epoch when it was saved.
        data: the tally's canonical snapshot bytes.
    """

    cluster: str
    identity: str
    index: int
    term: int
    epoch: int
    members: int
    saved_from: str
    data: bytes
    saved_at: float = 0.0

    @property
    def sha256(self) -> str:
        """Hex sha256 of :attr:`data`."""
        return hashlib.sha256(self.data).hexdigest()

    def header(self) -> dict[str, Any]:
        """The header line's fields (rule 1)."""
        return {
            "cluster": self.cluster,
            "epoch": self.epoch,
            "format": FORMAT,
            "identity": self.identity,
            "index": self.index,
            "members": self.members,
            "saved_at": float(self.saved_at),
            "saved_from": self.saved_from,
            "sha256": self.sha256,
            "size": len(self.data),
            "term": self.term,
            "version": VERSION,
        }

    def to_bytes(self) -> bytes:
        """The whole file (rule 1)."""
        head = json.dumps(self.header(), sort_keys=True, separators=(",", ":")).encode()
        return head + b"\n" + self.data


def parse(raw: bytes, name: str = "snapshot") -> SnapshotFile:
    """The backup in ``raw`` (a whole file), checked (rule 2).

    Raises:
        SnapshotFileError: naming the first check that fails.
    """
    head, sep, data = raw.partition(b"\n")
    try:
        header = json.loads(head) if sep else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise SnapshotFileError(f"{name} is not a membership snapshot file (no header)")
    if header.get("version") != VERSION:
        raise SnapshotFileError(f"{name}: unknown snapshot version {header.get('version')!r}")
    for key, kind in _HEADER.items():
        value: Any = header.get(key)
        ok = isinstance(value, (int, float) if kind is float else kind)
        if not ok or isinstance(value, bool) or (kind is int and value < 0):
            raise SnapshotFileError(f"{name}: header field {key!r} is missing or invalid")
    if len(data) != header["size"]:
        raise SnapshotFileError(
            f"{name}: truncated or padded: {len(data)} bytes of data, the header says "
            f"{header['size']}"
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != header["sha256"]:
        raise SnapshotFileError(
            f"{name}: checksum mismatch: the data's sha256 is {digest}, the header says "
            f"{header['sha256']} (the file is damaged)"
        )
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("members"), list):
        raise SnapshotFileError(f"{name}: the data is not a tally snapshot")
    seen = (body.get("epoch"), body.get("applied_index"), len(body["members"]))
    said = (header["epoch"], header["index"], header["members"])
    if seen != said:
        raise SnapshotFileError(
            f"{name}: the data holds epoch {seen[0]}, index {seen[1]}, {seen[2]} members; "
            f"the header says epoch {said[0]}, index {said[1]}, {said[2]} members"
        )
    return SnapshotFile(
        cluster=header["cluster"],
        identity=header["identity"],
        index=header["index"],
        term=header["term"],
        epoch=header["epoch"],
        members=header["members"],
        saved_from=header["saved_from"],
        saved_at=float(header["saved_at"]),
        data=data,
    )


def read(path: Path) -> SnapshotFile:
    """Reads and checks the backup at ``path`` (rule 2).

    Raises:
        SnapshotFileError: it is damaged or not a backup.
        OSError: it cannot be read (missing, permissions).
    """
    return parse(Path(path).read_bytes(), str(path))


def write(path: Path, snapshot: SnapshotFile, *, force: bool = False) -> None:
    """Writes ``snapshot`` to ``path`` atomically, mode 0600 (rule 3).

    Raises:
        FileExistsError: ``path`` exists and ``force`` is False.
        OSError: the folder cannot be written.
    """
    path = Path(path)
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists (give --force to replace it)")
    folder = path.parent if str(path.parent) else Path(".")
    tmp = folder / f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(snapshot.to_bytes())
            f.flush()
            os.fsync(f.fileno())
        if force:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # fails if the target appeared since the check
            except FileExistsError:
                raise FileExistsError(f"{path} exists (give --force to replace it)") from None
            os.unlink(tmp)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
