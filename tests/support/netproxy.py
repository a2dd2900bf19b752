"""A small TCP proxy for fault injection: forward, freeze (a half-open link), delay.

Used by the integration tests, the detection benchmark (``bench/detection.py``)
and the chaos suite (which runs it as a process inside network namespaces, see
:func:`main`). These machines have no netem: delay and jitter come from here.

Modes, switched at any time from any thread:

- forward (the start, and :meth:`TcpProxy.heal`): bytes pass as they come.
- freeze (:meth:`TcpProxy.freeze`): nothing passes in either direction and
  nothing is closed, so both peers keep an open socket and hear nothing, no
  FIN, no RST: a half-open link as the applications see it. The proxy stops
  *reading* its sockets (it does not read and drop), so each sender's bytes
  pile up in the kernel buffers until the receive window closes and TCP flow
  control pushes back on the sender. At the TCP level this is a peer whose
  process hangs (or a stalled userspace middlebox): the proxy's kernel still
  acknowledges what fits in its buffers, so a sender's TCP_USER_TIMEOUT only
  fires once the window has stayed shut that long. A dead host or a pulled
  cable, which acknowledges nothing, is iptables' job (the chaos suite).
  Connections accepted while frozen get no connection to the target until
  the heal (the kernel completed the client's handshake; nothing more
  happens).
- wedge (:meth:`TcpProxy.wedge`): the connections open now freeze as above,
  while connections accepted later forward as usual: a link whose existing
  TCP connections hang while new ones would work (a NAT entry or a
  middlebox flow that died, the kubelet case of kubernetes/kubernetes#48638).
  :meth:`TcpProxy.heal` unwedges them.
- delay (:meth:`TcpProxy.set_delay`): each chunk read is forwarded
  ``seconds + uniform(0, jitter)`` after it was read, never before an earlier
  chunk of the same direction (the byte stream keeps its order; jitter
  shows as burstiness, never as reordering).

Rules the implementation keeps:

1. When :meth:`TcpProxy.freeze` returns, the proxy reads no byte from any
   socket and hands no byte to any until :meth:`TcpProxy.heal` (after
   :meth:`TcpProxy.wedge`: from any socket of the connections open then). Bytes it had
   read but not forwarded wait in its queue for the heal; bytes it had
   already handed over (to the kernel, or to asyncio's write buffer when the
   receiver was slow) may still arrive.
2. Nothing is lost or reordered, in any mode: a direction's queue is bounded
   (reading of its source pauses above ``_HIGH_WATER`` bytes), never dropped.
3. A FIN is forwarded after the data before it (half-close is kept); a reset
   or a failed connection to the target aborts the other side.
4. :meth:`TcpProxy.close` closes the listener and every connection, stops the
   loop and joins the thread: nothing of the proxy is left behind.

Example::

    with TcpProxy("127.0.0.1:7001") as proxy:
        client = connect(proxy.address)
        proxy.freeze()
        ...
        proxy.heal()
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import random
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["ProxyStatistics", "TcpProxy", "main"]

T = TypeVar("T")

# A direction stops reading its source while this many bytes wait in its queue
# (delayed, frozen or behind a slow receiver), and reads again below _LOW_WATER.
_HIGH_WATER = 256 * 1024
_LOW_WATER = 64 * 1024
# Seconds a call from another thread waits for the proxy's loop to carry it out.
_CALL_TIMEOUT = 10.0


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``) to ``(host, port)``.

    Raises:
        ValueError: when it is not host:port with a port in 0..65535.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{address!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyStatistics:
    """What a proxy has done so far (:meth:`TcpProxy.statistics`)."""

    frozen: bool
    wedged: int  # connections wedged (frozen on their own) now
    delay: float  # seconds added to every chunk (before jitter)
    jitter: float  # seconds, upper bound of the uniform extra delay
    connections: int  # client connections open now
    accepted: int  # client connections accepted since start
    bytes_up: int  # bytes written to the target side (client -> target)
    bytes_down: int  # bytes written to the client side (target -> client)
    queued: int  # bytes read but not yet forwarded, both directions, all connections


class _Side(asyncio.Protocol):
    """One socket of a link: the accepted client's, or the one to the target."""

    def __init__(self, link: _Link, name: str) -> None:
        self.link = link
        self.name = name
        self.transport: asyncio.Transport | None = None
        self.reading = True  # asyncio transports read from the start
        self.eof = False  # the peer sent FIN: never resume reading
        self.closed = False
        self.lost: asyncio.Future[None] = link.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.link.side_made(self)

    def data_received(self, data: bytes) -> None:
        self.link.received(self, data)

    def eof_received(self) -> bool:
        self.eof = True
        self.reading = False
        self.link.eof_from(self)
        return True  # keep the socket open for writing: a half-close, forwarded

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.lost.done():
            self.lost.set_result(None)
        self.link.lost(self, exc)

    def pause_writing(self) -> None:
        self.link.write_paused(self, True)

    def resume_writing(self) -> None:
        self.link.write_paused(self, False)

    def set_reading(self, want: bool) -> None:
        want = want and not self.eof and not self.closed
        if self.transport is None or want == self.reading or self.transport.is_closing():
            return
        self.reading = want
        if want:
            self.transport.resume_reading()
        else:
            self.transport.pause_reading()

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()


class _Direction:
    """Bytes from one side to the other: an ordered queue and the task that writes it."""

    def __init__(self, link: _Link, src: _Side, dst: _Side, *, up: bool) -> None:
        self.link = link
        self.up = up
        self.proxy = link.proxy
        self.src = src
        self.dst = dst
        self.queue: deque[tuple[float, bytes]] = deque()
        self.queued = 0
        self.last_due = 0.0
        self.dst_paused = False
        self.eof = False  # forward a FIN once the queue is empty
        self.finished = False
        # Reading of the source pauses at _HIGH_WATER queued bytes, resumes below _LOW_WATER.
        self.backpressured = False
        self._waiter: asyncio.Future[None] | None = None
        self.task = link.loop.create_task(self._run())

    def push(self, data: bytes) -> None:
        due = max(self.link.loop.time() + self.proxy._chunk_delay(), self.last_due)
        self.last_due = due
        self.queue.append((due, data))
        self.queued += len(data)
        if self.queued >= _HIGH_WATER:
            self.backpressured = True
        self.notify()

    def notify(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _sleep(self, timeout: float | None) -> None:
        loop = self.link.loop
        self._waiter = loop.create_future()
        handle = loop.call_later(timeout, self.notify) if timeout is not None else None
        try:
            await self._waiter
        finally:
            self._waiter = None
            if handle is not None:
                handle.cancel()

    async def _run(self) -> None:
        loop = self.link.loop
        while True:
            dst = self.dst.transport
            ready = dst is not None and not self.dst.closed and not dst.is_closing()
            if self.link.frozen() or not ready or self.dst_paused or not (self.queue or self.eof):
                await self._sleep(None)
                continue
            if not self.queue:  # the source sent FIN and all its data is out
                transport = self.dst.transport
                assert transport is not None
                if transport.can_write_eof():
                    transport.write_eof()
                self.finished = True
                self.link.direction_finished()
                return
            due, data = self.queue[0]
            wait = due - loop.time()
            if wait > 0:
                await self._sleep(wait)
                continue
            # Checked above in this same loop turn: not frozen (rule 1).
            self.queue.popleft()
            self.queued -= len(data)
            if self.queued < _LOW_WATER:
                self.backpressured = False
            assert self.dst.transport is not None
            self.dst.transport.write(data)
            self.proxy._count(self.up, len(data))
            self.link.update_reading()


class _Link:
    """One client connection and its connection to the target."""

    def __init__(self, proxy: TcpProxy) -> None:
        self.proxy = proxy
        self.loop = proxy._loop_or_fail()
        self.client = _Side(self, "client")
        self.server = _Side(self, "target")
        self.up: _Direction | None = None  # client -> target
        self.down: _Direction | None = None  # target -> client
        self.connect_task: asyncio.Task[None] | None = None
        self.closing = False
        self.wedged = False  # frozen on its own (TcpProxy.wedge)

    def frozen(self) -> bool:
        """True while nothing may pass on this link (the proxy frozen, or it wedged)."""
        return self.proxy._frozen or self.wedged

    # --- events from the sides -----------------------------------------------------------

    def side_made(self, side: _Side) -> None:
        if side is self.client:
            self.up = _Direction(self, self.client, self.server, up=True)
            self.down = _Direction(self, self.server, self.client, up=False)
            self.proxy._links.add(self)
            self.proxy._accepted += 1
            if not self.proxy._frozen:
                self.start_connect()
        elif self.closing:  # the client went away while we were connecting
            side.abort()
            return
        else:
            assert self.up is not None
            self.up.notify()
        self.update_reading()

    def received(self, side: _Side, data: bytes) -> None:
        direction = self.up if side is self.client else self.down
        assert direction is not None
        direction.push(data)
        self.update_reading()

    def eof_from(self, side: _Side) -> None:
        direction = self.up if side is self.client else self.down
        assert direction is not None
        direction.eof = True
        direction.notify()

    def write_paused(self, side: _Side, paused: bool) -> None:
        # Writes to `side` are the other direction's: client <- down, target <- up.
        direction = self.down if side is self.client else self.up
        assert direction is not None
        direction.dst_paused = paused
        direction.notify()

    def lost(self, side: _Side, exc: Exception | None) -> None:
        other = self.server if side is self.client else self.client
        if side is self.client:
            self.proxy._links.discard(self)
        if self.closing:
            return
        self.closing = True
        # A reset (or any error) is passed on as one; an orderly close as a close.
        if exc is not None:
            other.abort()
        elif other.transport is not None and not other.closed:
            other.transport.close()
        if self.connect_task is not None:
            self.connect_task.cancel()
        for d in (self.up, self.down):
            if d is not None:
                d.task.cancel()

    def direction_finished(self) -> None:
        if all(d is not None and d.finished for d in (self.up, self.down)):
            for side in (self.client, self.server):
                if side.transport is not None and not side.closed:
                    side.transport.close()

    # --- actions ---------------------------------------------------------------------------

    def start_connect(self) -> None:
        if self.connect_task is None and not self.closing:
            self.connect_task = self.loop.create_task(self._connect())

    async def _connect(self) -> None:
        host, port = self.proxy._target
        try:
            await self.loop.create_connection(lambda: self.server, host, port)
        except OSError:
            # Nothing listens there: the client sees a reset, as it would
            # connecting to the target itself.
            self.client.abort()

    def update_reading(self) -> None:
        frozen = self.frozen()
        assert self.up is not None and self.down is not None
        self.client.set_reading(not frozen and not self.up.backpressured)
        self.server.set_reading(not frozen and not self.down.backpressured)

    def notify(self) -> None:
        for d in (self.up, self.down):
            if d is not None:
                d.notify()

    def abort(self) -> None:
        self.closing = True
        if self.connect_task is not None:
            self.connect_task.cancel()
        for d in (self.up, self.down):
            if d is not None:
                d.task.cancel()
        self.client.abort()
        self.server.abort()


class TcpProxy:
    """A TCP proxy from ``listen`` to ``target`` on its own event loop thread.

    Every method may be called from any thread; a mode change has taken
    effect when the call returns.

    Args:
        target: ``host:port`` to forward to.
        listen: ``host:port`` to listen on (port 0: any free port; see :attr:`address`).

    Raises:
        ValueError: for a malformed address.
    """

    def __init__(self, target: str, listen: str = "127.0.0.1:0") -> None:
        self._target = split_address(target)
        self._listen = split_address(listen)
        self._frozen = False
        self._delay = 0.0
        self._jitter = 0.0
        self._rng = random.Random()
        self._links: set[_Link] = set()
        self._accepted = 0
        self._bytes_up = 0
        self._bytes_down = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._address: str | None = None
        self._lock = threading.Lock()
        self._closed = False

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> TcpProxy:
        """Binds the listener and starts forwarding on a daemon thread; returns self.

        Raises:
            OSError: the listen address cannot be bound.
            RuntimeError: started twice, or after close.
        """
        with self._lock:
            if self._closed or self._thread is not None:
                raise RuntimeError("a TcpProxy starts once")
            loop = asyncio.new_event_loop()
            bound: concurrent.futures.Future[None] = concurrent.futures.Future()
            thread = threading.Thread(
                target=self._thread_main,
                args=(loop, bound),
                name=f"netproxy->{_join_address(*self._target)}",
                daemon=True,
            )
            self._loop, self._thread = loop, thread
            thread.start()
        try:
            bound.result(timeout=_CALL_TIMEOUT)
        except BaseException:
            thread.join(_CALL_TIMEOUT)
            with self._lock:
                self._closed = True
            raise
        return self

    def close(self) -> None:
        """Closes the listener and every connection and stops the thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if threading.current_thread() is thread:
            raise RuntimeError("close() from the proxy's own thread")
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(_CALL_TIMEOUT)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(_CALL_TIMEOUT)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def address(self) -> str:
        """``host:port`` the proxy listens on (after :meth:`start`)."""
        if self._address is None:
            raise RuntimeError("the proxy is not started")
        return self._address

    @property
    def target(self) -> str:
        """``host:port`` the proxy forwards to."""
        return _join_address(*self._target)

    @property
    def connections(self) -> int:
        """Client connections open now."""
        return len(self._links)

    @property
    def frozen(self) -> bool:
        """True between :meth:`freeze` and :meth:`heal`."""
        return self._frozen

    # --- modes -------------------------------------------------------------------------------

    def freeze(self) -> None:
        """Stops forwarding both ways; sockets stay open and nothing is read (half-open link)."""
        self._apply(self._set_frozen, True)

    def heal(self) -> None:
        """Forwards again, without delay (bytes queued meanwhile go first, in order);
        wedged connections too."""

        def heal() -> None:
            self._delay, self._jitter = 0.0, 0.0
            for link in self._links:
                link.wedged = False
            self._set_frozen(False)

        self._apply(heal)

    def wedge(self) -> int:
        """Freezes the connections open now (as :meth:`freeze` does); connections
        accepted later forward as usual. Returns how many were wedged."""

        def wedge() -> int:
            links = list(self._links)
            for link in links:
                link.wedged = True
                link.update_reading()  # stops reading before this returns: rule 1
                link.notify()
            return len(links)

        return self._apply(wedge)

    def set_delay(self, seconds: float, jitter: float = 0.0, seed: int | None = None) -> None:
        """Delays each chunk read from now on by ``seconds + uniform(0, jitter)``.

        Order is kept per direction. Does not unfreeze a frozen proxy.

        Args:
            seconds: fixed delay, >= 0.
            jitter: upper bound of the random extra delay, >= 0.
            seed: seed of the jitter's random numbers (None: unpredictable).

        Raises:
            ValueError: for a negative or non-finite value.
        """
        for name, value in (("seconds", seconds), ("jitter", jitter)):
            if not (value >= 0 and value != float("inf")):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")

        def set_delay() -> None:
            self._delay, self._jitter = float(seconds), float(jitter)
            self._rng = random.Random(seed)

        self._apply(set_delay)

    def statistics(self) -> ProxyStatistics:
        """Counters and mode, as one consistent reading."""

        def read() -> ProxyStatistics:
            return ProxyStatistics(
                frozen=self._frozen,
                wedged=sum(1 for link in self._links if link.wedged),
                delay=self._delay,
                jitter=self._jitter,
                connections=len(self._links),
                accepted=self._accepted,
                bytes_up=self._bytes_up,
                bytes_down=self._bytes_down,
                queued=sum(d.queued for link in self._links for d in (link.up, link.down) if d),
            )

        if self._closed:
            return read()  # nothing changes any more
        return self._apply(read)

    # --- the loop thread ---------------------------------------------------------------------

    def _apply(self, fn: Callable[..., T], *args: object) -> T:
        """Runs ``fn(*args)`` on the proxy's loop and returns its result (directly if not started).

        Raises:
            RuntimeError: after close.
        """
        if self._closed:
            raise RuntimeError("the proxy is closed")
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or threading.current_thread() is thread:
            return fn(*args)
        result: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                result.set_result(fn(*args))
            except BaseException as e:
                result.set_exception(e)

        loop.call_soon_threadsafe(run)
        return result.result(timeout=_CALL_TIMEOUT)

    def _loop_or_fail(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    def _count(self, up: bool, n: int) -> None:
        if up:
            self._bytes_up += n
        else:
            self._bytes_down += n

    def _chunk_delay(self) -> float:
        if self._jitter > 0:
            return self._delay + self._rng.uniform(0, self._jitter)
        return self._delay

    def _set_frozen(self, frozen: bool) -> None:
        self._frozen = frozen
        for link in list(self._links):
            link.update_reading()  # stops (or resumes) reading before this returns: rule 1
            if not frozen:
                link.start_connect()
            link.notify()

    def _thread_main(
        self, loop: asyncio.AbstractEventLoop, bound: concurrent.futures.Future[None]
    ) -> None:
        asyncio.set_event_loop(loop)
        try:
            host, port = self._listen
            try:
                self._server = loop.run_until_complete(
                    loop.create_server(lambda: _Link(self).client, host, port)
                )
            except BaseException as e:
                bound.set_exception(e)
                return
            name = self._server.sockets[0].getsockname()
            self._address = _join_address(name[0], name[1])
            bound.set_result(None)
            loop.run_forever()
        finally:
            try:
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for t in pending:
                    t.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())  # name lookups
            finally:
                loop.close()

    async def _shutdown(self) -> None:
        server = self._server
        if server is not None:
            server.close()
            await server.wait_closed()
        links = list(self._links)
        for link in links:
            link.abort()
        waits: list[asyncio.Future[Any]] = []
        for link in links:
            waits += [s.lost for s in (link.client, link.server) if s.transport is not None]
            waits += [d.task for d in (link.up, link.down) if d is not None]
            if link.connect_task is not None:
                waits.append(link.connect_task)
        if waits:
            await asyncio.wait(waits, timeout=_CALL_TIMEOUT)
        self._links.clear()


# --- the command ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.support.netproxy --listen HOST:PORT --target HOST:PORT``.

    Prints the address it listens on as its first stdout line, then one line
    per mode change (``frozen``, ``wedged N``, ``healed``). SIGUSR1 freezes,
    SIGHUP wedges the connections open now, SIGUSR2 heals, SIGTERM or SIGINT
    closes everything and exits 0.
    """
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.netproxy",
        description="TCP proxy; SIGUSR1 freezes the link (half-open), SIGUSR2 heals it.",
    )
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port (default 127.0.0.1:0)")
    parser.add_argument("--target", required=True, help="host:port to forward to")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds added to each chunk")
    parser.add_argument("--jitter", type=float, default=0.0, help="extra uniform(0, JITTER) s")
    parser.add_argument("--seed", type=int, default=None, help="seed of the jitter")
    args = parser.parse_args(argv)
    try:
        proxy = TcpProxy(args.target, args.listen)
        if args.delay or args.jitter:
            proxy.set_delay(args.delay, args.jitter, args.seed)
    except ValueError as e:
        parser.error(str(e))
    # Block the signals before the loop thread exists, so that it inherits the
    # mask and only sigwait() below ever sees them.
    signals = {signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        proxy.start()
    except OSError as e:
        print(f"netproxy: cannot listen on {args.listen}: {e}", file=sys.stderr)
        return 1
    try:
        print(proxy.address, flush=True)
        while True:
            sig = signal.sigwait(signals)
            if sig == signal.SIGUSR1:
                proxy.freeze()
                print("frozen", flush=True)
            elif sig == signal.SIGUSR2:
                proxy.heal()
                print("healed", flush=True)
            elif sig == signal.SIGHUP:
                print(f"wedged {proxy.wedge()}", flush=True)
            else:
                return 0
    finally:
        proxy.close()


if __name__ == "__main__":
    sys.exit(main())
