"""Bytes for storage and the wire: an entry's type and a snapshot's configuration.

The data directory (one ``data`` blob per entry and per snapshot) and the
peer protocol (``RaftEntry.data``, the snapshot's chunked bytes) were laid
out before entries had a type and snapshots a configuration. Rather than a
new column and new fields, both are folded into those blobs, in a way that
leaves every blob written before unchanged in meaning (no migration: an
old data directory reads as it did):

1. Entry payload: a NORMAL entry whose data does not start with byte 0x00
   or 0x01 is stored as its data (every command the tally writes is JSON,
   the no-op is empty); any other NORMAL entry gets a 0x00 prefix; a CONFIG
   entry gets a 0x01 prefix.
2. Snapshot payload: a snapshot with a configuration is ``b"\\x01CONF"``, the
   configuration's JSON length as 4 big-endian bytes, that JSON (sorted
   keys, no spaces), then the data; without one (or for data starting with
   0x00/0x01, prefixed 0x00) it is stored as before.
"""

from __future__ import annotations

import json
import struct

from arbiter.core.raft.configuration import ArbiterConfiguration
from arbiter.core.raft.errors import InvalidInput
from arbiter.core.raft.messages import Entry, EntryType, Snapshot

__all__ = ["entry_from_payload", "entry_payload", "snapshot_from_payload", "snapshot_payload"]

_ESCAPE, _CONFIG = b"\x00", b"\x01"
_SNAP_MAGIC = b"\x01CONF"


def entry_payload(entry: Entry) -> bytes:
    """The bytes to store or send for ``entry`` (rule 1)."""
    if entry.type is EntryType.CONFIG:
        return _CONFIG + entry.data
    if entry.data[:1] in (_ESCAPE, _CONFIG):
        return _ESCAPE + entry.data
    return entry.data


def entry_from_payload(term: int, index: int, payload: bytes) -> Entry:
    """The entry stored or sent as ``payload`` by :func:`entry_payload`."""
    payload = bytes(payload)
    head = payload[:1]
    if head == _CONFIG:
        return Entry(term=term, index=index, data=payload[1:], type=EntryType.CONFIG)
    if head == _ESCAPE:
        return Entry(term=term, index=index, data=payload[1:])
    return Entry(term=term, index=index, data=payload)


def snapshot_payload(snapshot: Snapshot) -> bytes:
    """The bytes to store or send for ``snapshot``'s data and configuration (rule 2)."""
    conf = snapshot.configuration
    if conf is None:
        if snapshot.data[:1] in (_ESCAPE, _CONFIG):
            return _ESCAPE + snapshot.data
        return snapshot.data
    body = json.dumps(conf.to_json(), sort_keys=True, separators=(",", ":")).encode()
    return _SNAP_MAGIC + struct.pack(">I", len(body)) + body + snapshot.data


def snapshot_from_payload(index: int, term: int, payload: bytes) -> Snapshot:
    """The snapshot stored or sent as ``payload`` by :func:`snapshot_payload`.

    Raises:
        InvalidInput: a configuration header that does not decode.
    """
    payload = bytes(payload)
    if payload.startswith(_SNAP_MAGIC):
        at = len(_SNAP_MAGIC)
        try:
            (n,) = struct.unpack(">I", payload[at : at + 4])
            conf = ArbiterConfiguration.from_json(json.loads(payload[at + 4 : at + 4 + n]))
        except (struct.error, ValueError) as e:
            raise InvalidInput(f"snapshot at {index}: bad configuration header: {e}") from None
        return Snapshot(index=index, term=term, data=payload[at + 4 + n :], configuration=conf)
    if payload[:1] == _ESCAPE:
        payload = payload[1:]
    return Snapshot(index=index, term=term, data=payload)
