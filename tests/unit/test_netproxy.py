"""The fault-injection TCP proxy (tests/support/netproxy.py) against local servers.

Waits are bounded (socket timeouts, polled conditions). Where a test shows that
something does NOT arrive, it waits the short window ABSENT_WINDOW and no more.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.netproxy import TcpProxy, split_address

ROOT = Path(__file__).resolve().parents[2]
# How long a test waits to show that bytes do not pass (a bound, not a condition).
ABSENT_WINDOW = 0.3
# Upper bound for anything that must happen (a loaded 2-core machine is slow).
TIMEOUT = 10.0


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with contextlib.suppress(OSError):
            while data := self.request.recv(65536):
                self.request.sendall(data)
            # The client half-closed: answer with our own FIN after the echo.
            self.request.shutdown(socket.SHUT_WR)


class _EchoServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = False
    block_on_close = True  # server_close() joins every handler thread


@pytest.fixture
def echo() -> Iterator[str]:
    """A local echo server (one thread per connection); its address."""
    server = _EchoServer(("127.0.0.1", 0), _EchoHandler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="echo", daemon=True
    )
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A bare listening socket: the test accepts the proxy's connection itself."""
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(TIMEOUT)
    try:
        yield sock
    finally:
        sock.close()


def _addr(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


def _connect(address: str) -> socket.socket:
    sock = socket.create_connection(split_address(address), timeout=TIMEOUT)
    sock.settimeout(TIMEOUT)
    return sock


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise AssertionError(f"EOF after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _nothing_arrives(sock: socket.socket) -> bool:
    """True when ``sock`` receives nothing (no data, no EOF) within ABSENT_WINDOW."""
    sock.settimeout(ABSENT_WINDOW)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(TIMEOUT)
    return False


def _wait(pred: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {TIMEOUT}s waiting for {what}")
        time.sleep(0.01)


def _socket_inodes() -> set[str]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:"):
                inodes.add(target)
    return inodes


def _proxy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("netproxy")]


def test_netproxy_forwards_both_ways(echo: str) -> None:
    with TcpProxy(echo) as proxy, _connect(proxy.address) as client:
        host, port = split_address(proxy.address)
        assert host == "127.0.0.1" and port > 0
        for size in (1, 1000, 300_000):
            payload = os.urandom(size)
            client.sendall(payload)
            assert _recv_exactly(client, size) == payload
        assert proxy.connections == 1
        stats = proxy.statistics()
        assert stats.bytes_up == stats.bytes_down == 301_001
        assert (stats.accepted, stats.frozen, stats.queued) == (1, False, 0)


def test_netproxy_forwards_half_close(echo: str) -> None:
    with TcpProxy(echo) as proxy, _connect(proxy.address) as client:
        client.sendall(b"last words")
        client.shutdown(socket.SHUT_WR)  # FIN through the proxy; the echo answers with its own
        received = b""
        while chunk := client.recv(100):
            received += chunk
        assert received == b"last words"
        _wait(lambda: proxy.connections == 0, "the proxy to drop the closed connection")


def test_netproxy_freeze_blocks_both_ways_and_heal_resumes(listener: socket.socket) -> None:
    with TcpProxy(_addr(listener)) as proxy, _connect(proxy.address) as client:
        server, _ = listener.accept()
        with server:
            server.settimeout(TIMEOUT)
            client.sendall(b"ping")
            assert _recv_exactly(server, 4) == b"ping"

            proxy.freeze()
            assert proxy.frozen
            client.sendall(b"up")
            server.sendall(b"down")
            assert _nothing_arrives(server), "bytes passed client -> target while frozen"
            assert _nothing_arrives(client), "bytes passed target -> client while frozen"
            assert proxy.connections == 1  # the link is half-open, not closed

            proxy.heal()
            assert _recv_exactly(server, 2) == b"up"
            assert _recv_exactly(client, 4) == b"down"


def test_netproxy_wedge_freezes_open_connections_while_new_ones_forward(
    listener: socket.socket,
) -> None:
    with TcpProxy(_addr(listener)) as proxy, _connect(proxy.address) as old:
        old_server, _ = listener.accept()
        with old_server:
            old_server.settimeout(TIMEOUT)
            old.sendall(b"ping")
            assert _recv_exactly(old_server, 4) == b"ping"

            assert proxy.wedge() == 1
            assert not proxy.frozen and proxy.statistics().wedged == 1
            old.sendall(b"up")
            old_server.sendall(b"down")
            # A connection made after the wedge goes through at once...
            with _connect(proxy.address) as new:
                new_server, _ = listener.accept()
                with new_server:
                    new_server.settimeout(TIMEOUT)
                    new.sendall(b"fresh")
                    assert _recv_exactly(new_server, 5) == b"fresh"
                    new_server.sendall(b"back")
                    assert _recv_exactly(new, 4) == b"back"
                    # ...while the old one stays silent both ways, open.
                    assert _nothing_arrives(old_server), "bytes passed on a wedged connection"
                    assert _nothing_arrives(old), "bytes passed on a wedged connection"
                    assert proxy.statistics().wedged == 1 and proxy.connections == 2

            proxy.heal()
            assert _recv_exactly(old_server, 2) == b"up"
            assert _recv_exactly(old, 4) == b"down"
            assert proxy.statistics().wedged == 0


def test_netproxy_frozen_stops_reading_so_the_sender_is_pushed_back(
    listener: socket.socket,
) -> None:
    """A frozen proxy reads nothing: the sender's buffers fill, and nothing is lost."""
    with TcpProxy(_addr(listener)) as proxy, _connect(proxy.address) as client:
        server, _ = listener.accept()
        with server:
            proxy.freeze()
            client.setblocking(False)
            sent = hashlib.sha256()
            total = 0
            block = os.urandom(64 * 1024)
            while True:  # until the kernel refuses more: flow control pushes back
                try:
                    n = client.send(block)
                except BlockingIOError:
                    break
                sent.update(block[:n])
                total += n
                assert total < 256 * 1024 * 1024, "a frozen proxy kept reading"
            assert proxy.statistics().queued <= 256 * 1024  # at most what it read before
            assert _nothing_arrives(server)

            proxy.heal()
            client.setblocking(True)
            received = hashlib.sha256()
            got = 0
            server.settimeout(TIMEOUT)
            while got < total:
                chunk = server.recv(1 << 20)
                assert chunk, "EOF before all bytes arrived"
                received.update(chunk)
                got += len(chunk)
            assert got == total and received.digest() == sent.digest()


def test_netproxy_connection_accepted_while_frozen_reaches_target_after_heal(
    listener: socket.socket,
) -> None:
    with TcpProxy(_addr(listener)) as proxy:
        proxy.freeze()
        with _connect(proxy.address) as client:  # the kernel completes the handshake
            client.sendall(b"early")
            listener.settimeout(ABSENT_WINDOW)
            with pytest.raises(TimeoutError):
                listener.accept()  # no connection to the target while frozen
            _wait(lambda: proxy.connections == 1, "the proxy to accept the client")
            proxy.heal()
            listener.settimeout(TIMEOUT)
            server, _ = listener.accept()
            with server:
                server.settimeout(TIMEOUT)
                assert _recv_exactly(server, 5) == b"early"


def test_netproxy_delay_delays_each_direction_and_keeps_order(echo: str) -> None:
    delay = 0.2
    with TcpProxy(echo) as proxy, _connect(proxy.address) as client:
        proxy.set_delay(delay, jitter=0.05, seed=7)
        assert (proxy.statistics().delay, proxy.statistics().jitter) == (delay, 0.05)
        t0 = time.monotonic()
        client.sendall(b"x")
        assert _recv_exactly(client, 1) == b"x"
        assert time.monotonic() - t0 >= 2 * delay  # delayed up, then down (lower bound only)

        # Many small writes with jitter: they come back in order, all of them.
        messages = [f"<{i}>".encode() for i in range(100)]
        for m in messages:
            client.sendall(m)
        expected = b"".join(messages)
        assert _recv_exactly(client, len(expected)) == expected

        proxy.heal()  # back to normal mode: no delay
        assert proxy.statistics().delay == 0


def test_netproxy_set_delay_refuses_negative() -> None:
    proxy = TcpProxy("127.0.0.1:1")
    with pytest.raises(ValueError):
        proxy.set_delay(-1)
    with pytest.raises(ValueError):
        proxy.set_delay(0.1, jitter=float("nan"))


def test_netproxy_target_down_resets_the_client(listener: socket.socket) -> None:
    dead = _addr(listener)
    listener.close()  # nothing listens there any more
    with TcpProxy(dead) as proxy, _connect(proxy.address) as client:
        with contextlib.suppress(ConnectionResetError):
            assert client.recv(1) == b""
        _wait(lambda: proxy.connections == 0, "the proxy to drop the client")


def test_netproxy_mode_switches_from_many_threads_lose_nothing(echo: str) -> None:
    with TcpProxy(echo) as proxy, _connect(proxy.address) as client:
        payload = os.urandom(200_000)
        stop = threading.Event()

        def toggle() -> None:
            while not stop.is_set():
                proxy.freeze()
                proxy.set_delay(0.001)
                proxy.heal()

        togglers = [threading.Thread(target=toggle) for _ in range(4)]
        for t in togglers:
            t.start()
        try:
            client.sendall(payload)
            stop.set()
        finally:
            stop.set()
            for t in togglers:
                t.join(TIMEOUT)
        proxy.heal()
        assert _recv_exactly(client, len(payload)) == payload


def test_netproxy_close_leaves_no_thread_or_socket(echo: str) -> None:
    sockets_before = _socket_inodes()
    proxy = TcpProxy(echo).start()
    address = proxy.address
    assert len(_proxy_threads()) == 1
    a = _connect(address)
    a.sendall(b"hi")
    assert _recv_exactly(a, 2) == b"hi"
    proxy.freeze()
    b = _connect(address)  # one more, accepted while frozen
    _wait(lambda: proxy.connections == 2, "two connections")

    proxy.close()
    proxy.close()  # idempotent

    assert _proxy_threads() == []
    assert proxy.connections == 0
    for client in (a, b):  # the proxy's end is gone: EOF or reset, no hang
        with contextlib.suppress(ConnectionResetError):
            assert client.recv(1) == b""
        client.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(split_address(address), timeout=TIMEOUT).close()
    # Every socket the proxy opened (listener, both ends of every link, the
    # loop's self-pipe) is closed; the echo server's ends close as they see it.
    _wait(lambda: _socket_inodes() <= sockets_before, "every socket to be closed")
    with pytest.raises(RuntimeError):
        proxy.freeze()


def test_netproxy_command_switches_mode_on_signals(listener: socket.socket) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.netproxy", "--target", _addr(listener)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        split_address(address)
        with _connect(address) as client:
            server, _ = listener.accept()
            with server:
                server.settimeout(TIMEOUT)
                client.sendall(b"a")
                assert _recv_exactly(server, 1) == b"a"
                proc.send_signal(signal.SIGUSR1)
                assert proc.stdout.readline().strip() == "frozen"
                client.sendall(b"b")
                assert _nothing_arrives(server)
                proc.send_signal(signal.SIGUSR2)
                assert proc.stdout.readline().strip() == "healed"
                assert _recv_exactly(server, 1) == b"b"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
