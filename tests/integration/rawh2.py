"""A few HTTP/2 frames by hand (RFC 9113, HPACK literals of RFC 7541): for clients that
break the rules a gRPC client keeps (stream limits, windows), in the bad-input tests.

Only what those tests need: the connection preface, SETTINGS, HEADERS with
literal header fields (no Huffman, no table), DATA carrying gRPC messages,
WINDOW_UPDATE, and a reader thread that collects the server's frames.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field

__all__ = [
    "PREFACE",
    "Frame",
    "FrameReader",
    "data",
    "frame",
    "grpc_request_headers",
    "settings",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
REFUSED_STREAM = 0x7
ENHANCE_YOUR_CALM = 0xB
SETTINGS_INITIAL_WINDOW_SIZE = 0x4


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame: 24-bit length, type, flags, 31-bit stream id, payload."""
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream & 0x7FFFFFFF)
        + payload
    )


def settings(**values: int) -> bytes:
    """A SETTINGS frame; keys are setting ids as ``s<id>`` (``s4=0``: initial window 0)."""
    payload = b"".join(struct.pack(">HI", int(k[1:]), v) for k, v in values.items())
    return frame(SETTINGS, 0, 0, payload)


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """HPACK integer (RFC 7541 section 5.1)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def _literal(name: str, value: str) -> bytes:
    """A literal header field without indexing, with a literal name (section 6.2.2)."""
    n, v = name.encode(), value.encode()
    return b"\x00" + _integer(len(n), 7) + n + _integer(len(v), 7) + v


def grpc_request_headers(stream: int, path: str, end_stream: bool = False) -> bytes:
    """A HEADERS frame opening a gRPC call to ``path`` (``/package.Service/Method``)."""
    block = b"".join(
        _literal(k, v)
        for k, v in (
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        )
    )
    return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream, block)


def data(stream: int, message: bytes, end_stream: bool = False) -> bytes:
    """A DATA frame carrying one gRPC message (uncompressed, length-prefixed)."""
    body = b"\x00" + struct.pack(">I", len(message)) + message
    return frame(DATA, END_STREAM if end_stream else 0, stream, body)


@dataclass(frozen=True)
class Frame:
    kind: int
    flags: int
    stream: int
    payload: bytes


@dataclass
class FrameReader:
    """Reads the server's frames on a thread until the connection ends; answers
    SETTINGS (with ACK) and PING (with its ACK), as any client must."""

    sock: socket.socket
    frames: list[Frame] = field(default_factory=list)
    closed: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _recv(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    def _run(self) -> None:
        try:
            while True:
                head = self._recv(9)
                length = int.from_bytes(head[:3], "big")
                kind, flags = head[3], head[4]
                stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                payload = self._recv(length)
                self.frames.append(Frame(kind, flags, stream, payload))
                if kind == SETTINGS and not flags & ACK:
                    self.sock.sendall(frame(SETTINGS, ACK, 0))
                elif kind == PING and not flags & ACK:
                    self.sock.sendall(frame(PING, ACK, 0, payload))
        except (OSError, ConnectionError):
            pass
        finally:
            self.closed.set()

    def of_kind(self, kind: int) -> list[Frame]:
        return [f for f in list(self.frames) if f.kind == kind]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(5)
