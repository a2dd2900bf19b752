"""The private channel between a replica's consensus process and an ingest worker.

One ``socket.socketpair()`` per worker, made by the consensus process before
it spawns the worker and inherited by it alone (``pass_fds``): no path in the
file system, nothing another process can connect to.

Rules:

1. A frame is a 4-byte big-endian length, then that many bytes of
   :mod:`marshal` data: a tuple whose first item is the frame's kind (a str),
   of str, bytes, int, float, bool, None, tuples and dicts only (never pickle:
   no object is built from the bytes but those). marshal is not meant for
   data from someone else; here both ends are this program, and the socket
   is reachable by these two processes only. A frame over
   :data:`MAX_FRAME` bytes, or one that does not decode to such a tuple,
   raises :class:`FrameError` and the channel is closed.
2. Kinds, and their items after the kind (``->`` worker to consensus process):

   - ``SETUP`` (``<-``, first frame): a dict of the worker's settings.
   - ``HELLO`` (``->``, once serving): worker index, pid, send time.
   - ``FAILED`` (``->``): why the worker cannot serve (its port could not be bound).
   - ``BATCH`` (``->``): batch id, send time (monotonic seconds, one clock
     for every process of the machine), the heartbeats (tuples of
     :data:`ENTRY`'s fields), the stream tokens closed since the last
     batch, the counts (heartbeats read, acks written, streams open)
     since the last batch, and the worker's load (its loop's utilisation and
     time on a CPU, 0 to 1: :class:`arbiter.server.load.monitor.LoadMonitor` on the
     worker's loop, latest sample), then its heartbeats' inter-arrival
     histogram since the last batch (``(bucket counts, sum of seconds)`` on
     :data:`arbiter.server.consensus.counters.INTERARRIVAL_BUCKETS`, or None: none),
     then the worker's own lateness at the send time (seconds:
     :mod:`arbiter.server.ingest.lateness` rule 1).
   - ``VERDICTS`` (``<-``): batch id, one verdict per heartbeat in order
     (``(accepted, state, incarnation, lease, grace, grace_id)``: the grace
     window of arbiter/core/grace_windows.py rule 3, or a refusal
     ``(message, pushback_ms)``: the stream is ended with RESOURCE_EXHAUSTED,
     that message and, when ``pushback_ms`` > 0, the trailing metadata
     ``grpc-retry-pushback-ms``: max_nodes, or shedding), then the replica's
     status (:data:`STATUS`'s fields).
   - ``STOP`` (``<-``): graceful shutdown. ``RELOAD_TLS`` (``<-``): re-read the
     TLS files (SIGHUP).
"""

from __future__ import annotations

import asyncio
import marshal
import struct
from typing import Any

__all__ = [
    "BATCH",
    "ENTRY",
    "FAILED",
    "HELLO",
    "MAX_FRAME",
    "RELOAD_TLS",
    "SETUP",
    "STATUS",
    "STOP",
    "VERDICTS",
    "FrameDecoder",
    "FrameError",
    "encode",
    "read_frame",
]

SETUP = "setup"
HELLO = "hello"
FAILED = "failed"
BATCH = "batch"
VERDICTS = "verdicts"
STOP = "stop"
RELOAD_TLS = "tls"

# A heartbeat in a BATCH: labels and status are None when unchanged on the stream.
ENTRY = ("token", "node_id", "incarnation", "labels", "interval", "first", "status")
# The replica's status in a VERDICTS frame; arbiters is None when the worker
# already has the configuration of that index.
STATUS = (
    "epoch",
    "in_quorum",
    "leader_id",
    "interval",
    "instance",
    "config_index",
    "arbiters",
)

_HEADER = struct.Struct(">I")
# Bytes of one frame at most: a batch of 256 heartbeats with statuses and
# labels at their limits (64 KiB a request) stays well under it.
MAX_FRAME = 64 * 1024 * 1024


class FrameError(Exception):
    """A frame that breaks rule 1: the channel is closed."""


def encode(*items: Any) -> bytes:
    """One frame of ``items`` (rule 1): the kind first.

    Raises:
        ValueError: an item marshal cannot encode.
        FrameError: the frame would be over MAX_FRAME bytes.
    """
    body = marshal.dumps(items)
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes, over {MAX_FRAME}")
    return _HEADER.pack(len(body)) + body


def _decode(body: bytes) -> tuple[Any, ...]:
    try:
        msg = marshal.loads(body)
    except (EOFError, ValueError, TypeError) as e:
        raise FrameError(f"frame does not decode: {e}") from None
    if type(msg) is not tuple or not msg or type(msg[0]) is not str:
        raise FrameError(f"frame is not a tuple led by its kind: {type(msg).__name__}")
    return msg


async def read_frame(reader: asyncio.StreamReader) -> tuple[Any, ...]:
    """The next frame from ``reader``.

    Raises:
        asyncio.IncompleteReadError: the other end closed the channel.
        FrameError: rule 1 broken.
    """
    (n,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if n > MAX_FRAME:
        raise FrameError(f"frame of {n} bytes announced, over {MAX_FRAME}")
    return _decode(await reader.readexactly(n))


class FrameDecoder:
    """Frames out of a byte stream fed in pieces (for blocking sockets and tests)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        """Adds ``data``; returns the frames now complete, in order.

        Raises:
            FrameError: rule 1 broken.
        """
        self._buf += data
        out = []
        while len(self._buf) >= _HEADER.size:
            (n,) = _HEADER.unpack_from(self._buf)
            if n > MAX_FRAME:
                raise FrameError(f"frame of {n} bytes announced, over {MAX_FRAME}")
            if len(self._buf) < _HEADER.size + n:
                break
            out.append(_decode(bytes(self._buf[_HEADER.size : _HEADER.size + n])))
            del self._buf[: _HEADER.size + n]
        return out
