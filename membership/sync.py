"""The blocking client, for programs that are not asyncio programs (training scripts).

:class:`MembershipClient` here has the API of :class:`membership.MembershipClient`
with plain calls instead of coroutines; the asyncio client runs inside it, on
an event loop of its own on a daemon thread (:mod:`membership._loopthread`)::

    from membership import ViewChanged
    from membership.sync import MembershipClient

    with MembershipClient(arbiters, node_id="worker-3", labels={"job": "j1"}) as client:
        client.wait_alive(timeout=10)
        with client.watch() as events:
            for step in range(steps):
                train_step()                       # heartbeats go on meanwhile
                for ev in events.pending():        # never blocks
                    if isinstance(ev, ViewChanged):
                        ...

Rules:

1. Same constructor, same names (tests/unit/test_sync_client.py checks them against the asyncio
   client): every coroutine method is a blocking method with the same arguments and return
   value; every property and attribute is a property read (and for ``leave_on_exit`` written) on
   the loop's thread; ``with`` replaces ``async with``; :meth:`MembershipClient.watch` returns a
   :class:`Watch`, a plain iterator; ``ended`` is a :class:`threading.Event`. A name added to
   the asyncio client is one line in the class body below (``_blocking`` for a coroutine,
   ``_on_loop`` for a plain method, ``_forward`` for a property).
2. The loop's thread, ``membership-loop[<node id>]`` (``[watch]`` without a
   node id), starts at the first call that needs it (:meth:`start`, ``with``,
   a wait, a view, a watch) and stops, leaving no thread behind, at
   :meth:`close`, at the end of the ``with`` block, after :meth:`leave`, or at
   interpreter exit (``atexit``), whichever comes first. A client still open
   at interpreter exit is closed as its ``with`` block would close it: it
   leaves the cluster when ``leave_on_exit``. A killed process (SIGKILL, or
   SIGTERM without a Python handler) runs no exit code: the cluster declares
   it DEAD after the detection time.
3. Errors: a call raises what the coroutine raised, the same exception object
   (so the same class of :mod:`membership.shared.errors`, or ``TimeoutError``); a
   call on a closed client raises :class:`~membership.shared.errors.ClosedError`.
4. Interrupts: ``KeyboardInterrupt`` (or any exception a signal handler
   raises) in a thread that waits for a call cancels the call on the loop, as
   a cancellation would in asyncio, and propagates; leaving the ``with`` block
   by it leaves the cluster (LEFT, not DEAD), as ``async with`` does when
   cancelled.
5. Callbacks: ``on_event`` runs on a thread of its own,
   ``membership-callbacks[<node id>]``, one event at a time in order, never on
   the loop's thread: a slow callback delays later callbacks, never a
   heartbeat. It may call the client's methods (``close()`` too).
6. Heartbeats run on the loop's thread. While the calling thread runs Python
   code, CPython hands the GIL to the loop's thread within
   ``sys.getswitchinterval()`` (5 ms) whenever it asks, so heartbeats stay on
   time. A C call that holds the GIL (no ``Py_BEGIN_ALLOW_THREADS``) stops
   every other thread for its whole length: one longer than the lease (0.65 s
   at the defaults) fences the node, one longer than the detection time
   (0.75 s) gets it declared DEAD. CPython has no thread priority to give the
   loop's thread; where such calls happen, run ``membership node`` as a
   separate process and read the node's standing from it
   (docs/blocking-client.md has the figures and the sidecar).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import inspect
import logging
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from membership._aiotools import reap
from membership._client import MembershipClient as AsyncMembershipClient
from membership._client import ViewInfo
from membership._loopthread import WAIT_SLICE, CallbackThread, LoopThread
from membership.shared.errors import ClosedError, MembershipError
from membership.shared.view import ViewEvent

if TYPE_CHECKING:
    from membership._config import ClientConfig
    from membership._node.collector import StatusCollector
    from membership._node.session import EndReason, SessionEvent
    from membership.shared.view import JobRanks, MemberState, View

__all__ = ["WATCH_BUFFER", "MembershipClient", "ViewInfo", "Watch"]

log = logging.getLogger("membership.sync")

P = ParamSpec("P")
R = TypeVar("R")

# Events a Watch holds for its reader at most. When it is full the watch stops
# reading its stream (the asyncio watch does the same when not iterated) and
# goes on from the last epoch once the reader takes events again, with a fresh
# snapshot if the arbiter cannot resume there: never unbounded memory, never a
# gap (the rules of membership/_watch/feed.py).
WATCH_BUFFER = 1024


def _blocking(
    method: Callable[Concatenate[AsyncMembershipClient, P], Awaitable[R]],
) -> Callable[Concatenate[MembershipClient, P], R]:
    """A blocking method that runs the asyncio client's coroutine ``method`` on the loop."""
    name = method.__name__

    @functools.wraps(method)
    def blocking(self: MembershipClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        loop = self._ensure_loop()
        return loop.call(lambda: method(self._client, *args, **kwargs))

    blocking.__module__ = __name__
    blocking.__doc__ = f"Blocks until :meth:`membership.MembershipClient.{name}` returns.\n\n" + (
        inspect.cleandoc(method.__doc__ or "")
    )
    return blocking


def _on_loop(
    method: Callable[Concatenate[AsyncMembershipClient, P], R],
) -> Callable[Concatenate[MembershipClient, P], R]:
    """A method that calls the asyncio client's plain ``method`` on the loop's thread."""

    @functools.wraps(method)
    def on_loop(self: MembershipClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._loop.run(lambda: method(self._client, *args, **kwargs))

    on_loop.__module__ = __name__
    return on_loop


def _forward(name: str, *, settable: bool = False, doc: str | None = None) -> Any:
    """A property that reads (and writes) the asyncio client's ``name`` on the loop's thread."""

    def fget(self: MembershipClient) -> Any:
        return self._loop.run(getattr, self._client, name)

    def fset(self: MembershipClient, value: Any) -> None:
        self._loop.run(setattr, self._client, name, value)

    found = getattr(AsyncMembershipClient, name, None)
    return property(fget, fset if settable else None, doc=doc or getattr(found, "__doc__", None))


def _watching(
    method: Callable[Concatenate[AsyncMembershipClient, P], AsyncIterator[ViewEvent]],
) -> Callable[Concatenate[MembershipClient, P], Watch]:
    """A method that starts the asyncio client's watch ``method`` and returns a :class:`Watch`."""
    name = method.__name__

    @functools.wraps(method)
    def watching(self: MembershipClient, /, *args: P.args, **kwargs: P.kwargs) -> Watch:
        loop = self._ensure_loop()
        return Watch(loop, lambda: method(self._client, *args, **kwargs))

    signature = inspect.signature(method)
    watching.__signature__ = signature.replace(return_annotation="Watch")  # type: ignore[attr-defined]
    watching.__doc__ = (
        f"Starts :meth:`membership.MembershipClient.{name}` on the client's loop and "
        "returns its events as a :class:`membership.sync.Watch` (a blocking iterator, "
        "with ``pending()`` for a loop that must not block).\n\n"
        + inspect.cleandoc(method.__doc__ or "")
    )
    watching.__module__ = __name__
    return watching


class MembershipClient:
    """Blocking SDK entry point: heartbeats, view, watch, leave (see the module rules).

    Args: those of :class:`membership.MembershipClient`, with one difference:
        on_event: called with every session event on the client's callback
            thread (rule 5), not on the event loop.

    Raises:
        InvalidArgument: a malformed address, node id, label, config or TLS
            (checked here, in the caller's thread, before any thread starts).
    """

    def __init__(
        self,
        arbiters: Sequence[str],
        *,
        node_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        incarnation: int | None = None,
        config: ClientConfig | None = None,
        on_event: Callable[[SessionEvent], None] | None = None,
        status: StatusCollector | None = None,
        leave_on_exit: bool = True,
        cluster: str | None = None,
    ) -> None:
        who = node_id if isinstance(node_id, str) else "watch"
        self._callbacks = (
            CallbackThread(on_event, f"membership-callbacks[{who}]") if on_event else None
        )
        # Only the constructor runs here, in the caller's thread: it validates and
        # builds objects, and touches no event loop (asyncio primitives bind to
        # the loop that first waits on them: the loop thread's).
        self._client = AsyncMembershipClient(
            arbiters,
            node_id=node_id,
            labels=labels,
            incarnation=incarnation,
            config=config,
            on_event=self._callbacks.put if self._callbacks else None,
            status=status,
            leave_on_exit=leave_on_exit,
            cluster=cluster,
        )
        self._loop = LoopThread(f"membership-loop[{who}]")
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        self.ended = threading.Event()
        """Set when the session ends (see :attr:`end_reason`) or the client fails."""

    # --- lifecycle (rule 2) ----------------------------------------------------------

    def _ensure_loop(self) -> LoopThread:
        """Starts the loop's thread (and the callbacks') on first use; returns it.

        Raises:
            ClosedError: the client is closed, or this is a forked child.
        """
        with self._lock:
            if self._closed:
                raise ClosedError("client is closed")
            if not self._loop.running:
                self._loop.start()
                if self._callbacks is not None:
                    self._callbacks.start()
                self._loop.create_task(self._mirror_ended, "sync-ended")
                atexit.register(self._at_exit)
        return self._loop

    async def _mirror_ended(self) -> None:
        await self._client.ended.wait()
        self.ended.set()

    def __enter__(self) -> MembershipClient:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Leaves the cluster (when ``leave_on_exit``: LEFT within ``config.leave_timeout``),
        then closes."""
        try:
            if self._loop.running and not self._closed:
                self._loop.call(lambda: self._client.__aexit__(exc_type, exc, tb))
        finally:
            self.close()

    def start(self) -> None:
        """Starts the loop's thread, then the client (discovery, heartbeats, view); returns at once.

        Raises:
            ClosedError: the client was closed.
        """
        self._ensure_loop().call(self._client.start)

    def close(self) -> None:
        """Stops every task and closes every channel (no leave: see :meth:`leave`), then
        stops the loop's thread and the callbacks' thread and joins them. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self._loop.running and not self._loop.on_loop_thread():
                with contextlib.suppress(ClosedError):
                    self._loop.call(self._client.close)
        finally:
            if self._client.ended.is_set():
                self.ended.set()
            self._loop.stop()
            if self._callbacks is not None:
                self._callbacks.stop()
            atexit.unregister(self._at_exit)

    def _at_exit(self) -> None:
        """Rule 2: a client left open at interpreter exit is closed as its ``with`` block would."""
        if os.getpid() != self._pid or self._closed:
            return
        try:
            self.__exit__(None, None, None)
        except Exception:
            log.exception("%s: closing at interpreter exit failed", self._client.node_id)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` began (also after :meth:`leave` and the ``with`` block)."""
        return self._closed

    # --- the asyncio client's surface (rule 1) -----------------------------------------

    wait_connected = _blocking(AsyncMembershipClient.wait_connected)
    wait_fenced = _blocking(AsyncMembershipClient.wait_fenced)
    wait_alive = _blocking(AsyncMembershipClient.wait_alive)
    get_view = _blocking(AsyncMembershipClient.get_view)

    def leave(self, timeout: float = 10.0) -> int:
        """Leaves gracefully (LEFT, never DEAD), then closes the client and stops its threads.

        See :meth:`membership.MembershipClient.leave`.

        Returns:
            The epoch at which the node became LEFT.

        Raises:
            InvalidArgument: on a watch-only client.
            RejectedError: the cluster refused (e.g. the incarnation is already DEAD).
            UnavailableError: no arbiter could commit the leave within ``timeout`` seconds.
            ClosedError: the client was closed.
        """
        epoch = self._ensure_loop().call(lambda: self._client.leave(timeout))
        self.close()
        return epoch

    watch = _watching(AsyncMembershipClient.watch)
    grace = _blocking(AsyncMembershipClient.grace)

    # (mypy cannot match **gauges with a ParamSpec whose self is not positional-only)
    report = _on_loop(AsyncMembershipClient.report)  # type: ignore[arg-type]
    clear = _on_loop(AsyncMembershipClient.clear)
    reachability = _on_loop(AsyncMembershipClient.reachability)

    arbiters: list[str] = _forward("arbiters", doc="Every arbiter's ``host:port``, as given.")
    node_id: str | None = _forward("node_id", doc="This node's id (None: watch only).")
    labels: dict[str, str] = _forward("labels", doc="The static labels sent with heartbeats.")
    config: ClientConfig = _forward("config", doc="The client's configuration (validated).")
    leave_on_exit: bool = _forward(
        "leave_on_exit", settable=True, doc="Leaving the ``with`` block leaves the cluster."
    )
    error: MembershipError | None = _forward(
        "error", doc="Why the client stopped by itself (e.g. ClusterMismatch), else None."
    )
    unreachable: dict[str, str] = _forward("unreachable")
    interval: float = _forward("interval")
    state: MemberState = _forward("state")
    incarnation: int | None = _forward("incarnation")
    end_reason: EndReason | None = _forward("end_reason")
    fenced: bool = _forward("fenced")
    stream_healthy: dict[str, bool] = _forward("stream_healthy")
    healthy: bool = _forward("healthy")
    is_member: bool = _forward("is_member")
    fencing_epoch: int = _forward("fencing_epoch")
    view: View = _forward("view")
    assignment: JobRanks | None = _forward("assignment")
    rank: int | None = _forward("rank")
    world_size: int = _forward("world_size")
    grace_left: float = _forward("grace_left")


class Watch(Iterator[ViewEvent]):
    """The events of one watch, for a thread that is not an event loop.

    Iterate it (each step blocks until an event comes; the iteration ends when
    the client closes), or call :meth:`pending` between units of work (it never
    blocks). A task on the client's loop reads the asyncio watch all the time
    and keeps up to ``WATCH_BUFFER`` events for the reader (see there). The
    watch's error (:class:`~membership.shared.errors.EpochOutOfRange`,
    :class:`~membership.shared.errors.ClusterMismatch`...) is raised to the reader once,
    after the events that came before it. ``with`` closes it.
    """

    def __init__(
        self,
        loop: LoopThread,
        open_: Callable[[], AsyncIterator[ViewEvent]],
        buffer: int = WATCH_BUFFER,
    ) -> None:
        self._loop = loop
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._buffer = buffer
        self._room: asyncio.Event | None = None
        self._waiting = False  # the pump waits for room (set on the loop, read here)
        self._ended = False
        self._held: tuple[str, Any] | None = None
        self._task = loop.create_task(lambda: self._pump(open_), "sync-watch")

    async def _pump(self, open_: Callable[[], AsyncIterator[ViewEvent]]) -> None:
        self._room = asyncio.Event()
        events = open_()
        try:
            async for ev in events:
                while self._queue.qsize() >= self._buffer:
                    self._waiting = True  # before the check: a reader that takes one now wakes us
                    self._room.clear()
                    if self._queue.qsize() < self._buffer:
                        break
                    await self._room.wait()
                self._waiting = False
                self._queue.put(("event", ev))
        except Exception as e:
            self._queue.put(("error", e))
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]
            self._queue.put(("end", None))

    def _took(self) -> None:
        if self._waiting and self._room is not None:
            self._loop.call_soon(self._room.set)

    def _take(self, timeout: float | None) -> tuple[str, Any] | None:
        """The next item (an error :meth:`pending` held back first); None after ``timeout``."""
        held, self._held = self._held, None
        if held is not None:
            return held
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_SLICE if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                if left > 0:
                    got = self._queue.get(timeout=min(left, WAIT_SLICE))
                else:
                    got = self._queue.get_nowait()
            except queue.Empty:
                got = None
            if got is not None:
                self._took()
                return got
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _deliver(self, item: tuple[str, Any]) -> ViewEvent | None:
        """The event of ``item``; None at the end; raises the watch's error."""
        kind, value = item
        if kind == "event":
            return value  # type: ignore[no-any-return]
        self._ended = True
        if kind == "error":
            raise value
        return None

    def __iter__(self) -> Watch:
        return self

    def __next__(self) -> ViewEvent:
        """The next event; blocks until one comes.

        Raises:
            StopIteration: the watch ended (the client or the watch was closed).
            MembershipError: what ended the asyncio watch, once.
        """
        if not self._ended:
            item = self._take(None)
            assert item is not None
            ev = self._deliver(item)
            if ev is not None:
                return ev
        raise StopIteration

    def pending(self) -> list[ViewEvent]:
        """Every event that came since the last call, oldest first; never blocks.

        Raises:
            MembershipError: what ended the asyncio watch, once, by the first
                call that has no event before it to return.
        """
        out: list[ViewEvent] = []
        while not self._ended:
            item = self._take(0.0)
            if item is None:
                break
            if item[0] == "error" and out:
                self._held = item  # the events first; the error with the next call
                break
            ev = self._deliver(item)
            if ev is not None:
                out.append(ev)
        return out

    @property
    def ended(self) -> bool:
        """True once the watch ended and every event was taken."""
        return self._ended

    def close(self) -> None:
        """Stops the watch (its streams end); waits for that. Idempotent."""
        self._ended = True
        if self._loop.running and not self._loop.on_loop_thread():
            with contextlib.suppress(ClosedError):
                self._loop.call(lambda: reap(self._task))

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
