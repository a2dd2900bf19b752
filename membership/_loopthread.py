"""An event loop on a thread of its own, and a thread for callbacks: the blocking client's engine.

:class:`LoopThread` runs one event loop on a daemon thread, so that a
program that is not an asyncio program (a training script) can drive the
asyncio SDK with plain calls; :mod:`membership.sync` is built on it.
:class:`CallbackThread` runs the application's callbacks away from that loop.

Rules:

1. One loop per :class:`LoopThread`, run by one daemon thread (named, so that
   ``py-spy dump`` and ``threading.enumerate()`` say whose it is), from
   :meth:`LoopThread.start` to :meth:`LoopThread.stop`. ``stop`` cancels every
   task still on the loop and waits for them to finish, shuts down the async
   generators, closes the loop and joins the thread (``asyncio.Runner`` does
   the cleanup, as ``asyncio.run`` would).
2. :meth:`LoopThread.call` runs a coroutine on the loop and waits for it in
   the calling thread; its result, or its exception (the same object, so the
   same class), comes back as is. The wait is sliced (``WAIT_SLICE``), so a
   signal handler of the main thread (Ctrl-C's ``KeyboardInterrupt``) runs
   within a slice even when the kernel delivered the signal to another thread.
3. A ``BaseException`` raised in the caller while it waits (``KeyboardInterrupt``,
   or ``SystemExit`` from a signal handler) cancels the coroutine on the loop,
   waits up to ``cancel_grace`` seconds for it to finish its cancellation, and
   is re-raised: what cancelling an awaiting task does in asyncio.
4. :meth:`LoopThread.run` runs a plain function on the loop and waits the same
   way (the SDK's state is the loop's: reading it from another thread could
   see a dict in mid-change). While no loop runs (before ``start``, after
   ``stop``) the function runs in the caller's thread: nothing else touches
   the state then.
5. A blocking call made on the loop thread itself would wait for itself for
   ever: :meth:`LoopThread.call` refuses it (``LocalError``); :meth:`run`
   calls the function directly there.
6. The threads started here block the asynchronous signals the application
   may handle (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM), and
   so do the threads they start (gRPC's), so that the kernel delivers these
   to the main thread, where Python runs its handlers.
7. A forked child has the client's memory but not its threads: every call
   there raises :class:`~membership.shared.errors.ClosedError` at once instead of
   waiting for a thread that does not exist.
8. :class:`CallbackThread` calls one function with each item put, in order, on
   a daemon thread of its own; :meth:`CallbackThread.put` never blocks (the
   loop puts, and must never wait for the application). An exception in the
   callback is logged and the thread goes on.

There is no way to give the loop thread priority over the main thread in
CPython: the interpreter has one lock (the GIL) and no notion of thread
priority; a thread that wants it asks the holder to drop it, which a thread
running Python code does every ``sys.getswitchinterval()`` seconds (5 ms by
default), and a C call that does not release it never does (docs/blocking-client.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from membership.shared.errors import ClosedError, LocalError

__all__ = ["WAIT_SLICE", "CallbackThread", "LoopThread"]

log = logging.getLogger("membership.sync")

T = TypeVar("T")

# Seconds a waiting caller sleeps at most before it lets Python run pending
# signal handlers (rule 2). Short enough for Ctrl-C to feel immediate, long
# enough to cost nothing (4 wake-ups a second of a thread that waits anyway).
WAIT_SLICE = 0.25

# Rule 6: the signals an application handles in its main thread.
_BLOCKED = frozenset(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")
    if hasattr(signal, name)
)


def _block_signals() -> None:
    """Rule 6, for the calling thread (and every thread it starts later)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)


class LoopThread:
    """An asyncio event loop on a daemon thread (see the module rules).

    Args:
        name: the thread's name.
        cancel_grace: seconds an interrupted :meth:`call` waits for the
            cancelled coroutine to finish (rule 3).
    """

    def __init__(self, name: str, *, cancel_grace: float = 5.0) -> None:
        self.name = name
        self.cancel_grace = cancel_grace
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        """True from :meth:`start` until :meth:`stop`, in the process that started it."""
        return self._loop is not None and os.getpid() == self._pid

    @property
    def thread(self) -> threading.Thread | None:
        """The loop's thread (None before :meth:`start`)."""
        return self._thread

    def on_loop_thread(self) -> bool:
        """True when called from the loop's own thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def start(self) -> None:
        """Starts the thread and its loop; returns once the loop runs. A second call does nothing.

        Raises:
            ClosedError: after :meth:`stop`, or in a forked child (rule 7).
        """
        with self._lock:
            self._check_process()
            if self._thread is not None:
                if self._loop is None:
                    raise ClosedError(f"{self.name} was stopped")
                return
            ready = threading.Event()
            self._thread = threading.Thread(
                target=self._main, args=(ready,), name=self.name, daemon=True
            )
            self._thread.start()
            ready.wait()
            if self._loop is None:
                raise ClosedError(f"{self.name} could not start its event loop")

    def _main(self, ready: threading.Event) -> None:
        _block_signals()
        try:
            with asyncio.Runner() as runner:  # rule 1: cancels what is left, closes the loop
                self._loop = runner.get_loop()
                self._stop = asyncio.Event()
                ready.set()
                runner.run(self._stop.wait())
        finally:
            self._loop = None
            ready.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancels every task on the loop, closes it and joins the thread (rule 1). Idempotent.

        Args:
            timeout: seconds to wait for the thread (a task that will not
                finish its cancellation keeps it; it is a daemon).
        """
        with self._lock:
            loop, stop, thread = self._loop, self._stop, self._thread
        if loop is None or stop is None or thread is None or os.getpid() != self._pid:
            return
        if threading.current_thread() is thread:
            loop.call_soon(stop.set)  # the thread ends when this turn returns
            return
        with contextlib.suppress(RuntimeError):  # closed meanwhile
            loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("%s did not stop within %gs; left as a daemon thread", self.name, timeout)

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise ClosedError(
                f"this client belongs to process {self._pid}; a forked child must make its own"
            )

    def _require(self) -> asyncio.AbstractEventLoop:
        self._check_process()
        loop = self._loop
        if loop is None:
            raise ClosedError(
                "the client is closed" if self._thread else "the client was not started"
            )
        return loop

    def call(self, factory: Callable[[], Awaitable[T]]) -> T:
        """Runs ``factory()`` (it makes the awaitable, on the loop) and waits for it (rules 2, 3).

        Returns:
            What the awaitable returned.

        Raises:
            ClosedError: the loop is not running, or was stopped before the
                awaitable finished.
            LocalError: called on the loop's own thread (rule 5).
            BaseException: whatever the awaitable raised, as it is.
        """
        loop = self._require()
        if self.on_loop_thread():
            raise LocalError(
                "a blocking call on the client's own event loop thread would wait for itself"
            )
        done = threading.Event()
        box: dict[str, asyncio.Future[T]] = {}

        def begin() -> None:
            task: asyncio.Future[T]
            try:
                task = asyncio.ensure_future(factory())
            except BaseException as e:
                task = loop.create_future()
                task.set_exception(e)
            box["task"] = task
            task.add_done_callback(lambda _: done.set())

        def cancel() -> None:
            box["task"].cancel()

        try:
            loop.call_soon_threadsafe(begin)
        except RuntimeError:  # stopped between the check and now
            raise ClosedError("the client is closed") from None
        try:
            while not done.wait(WAIT_SLICE):
                if self._loop is None and not done.is_set():
                    raise ClosedError("the client was closed during the call")
        except BaseException:
            # Rule 3: the caller was interrupted; cancel the work as asyncio would.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(cancel)
            done.wait(self.cancel_grace)
            raise
        task = box["task"]
        if task.cancelled():
            raise ClosedError("the client was closed during the call")
        exc = task.exception()
        if exc is not None:
            raise exc
        return task.result()

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Runs ``fn(*args, **kwargs)`` on the loop and returns its result (rule 4).

        Raises:
            ClosedError: in a forked child (rule 7).
            BaseException: whatever ``fn`` raised, as it is.
        """
        self._check_process()
        loop = self._loop
        if loop is None or self.on_loop_thread():
            return fn(*args, **kwargs)
        done = threading.Event()
        outcome: list[Any] = []

        def work() -> None:
            try:
                outcome.append((True, fn(*args, **kwargs)))
            except BaseException as e:
                outcome.append((False, e))
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(work)
        except RuntimeError:  # the loop closed meanwhile: nothing else touches the state
            return fn(*args, **kwargs)
        while not done.wait(WAIT_SLICE):
            if self._loop is None and not done.is_set():
                return fn(*args, **kwargs)
        ok, value = outcome[0]
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    def create_task(self, factory: Callable[[], Awaitable[T]], name: str) -> asyncio.Task[T]:
        """Starts ``factory()`` as a task on the loop, without waiting for it to finish.

        Returns:
            The task (cancel it on the loop: :meth:`call` with
            :func:`membership._aiotools.reap`, or :meth:`call_soon`).

        Raises:
            ClosedError: the loop is not running.
        """
        loop = self._require()
        try:
            return self.run(lambda: loop.create_task(_as_coroutine(factory()), name=name))
        except RuntimeError:  # the loop closed meanwhile
            raise ClosedError("the client is closed") from None

    def call_soon(self, fn: Callable[[], Any]) -> bool:
        """Schedules ``fn()`` on the loop without waiting; False when no loop runs."""
        loop = self._loop
        if loop is None or os.getpid() != self._pid:
            return False
        try:
            loop.call_soon_threadsafe(fn)
        except RuntimeError:
            return False
        return True


async def _as_coroutine(aw: Awaitable[T]) -> T:
    return await aw


_STOP = object()


class CallbackThread:
    """Calls ``fn(item)`` for every item put, in order, on a daemon thread (rule 8).

    Args:
        fn: the application's callback.
        name: the thread's name.
    """

    def __init__(self, fn: Callable[[Any], None], name: str) -> None:
        self._fn = fn
        self.name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    @property
    def thread(self) -> threading.Thread | None:
        """The callbacks' thread (None before :meth:`start`)."""
        return self._thread

    def start(self) -> None:
        """Starts the thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
            self._thread.start()

    def put(self, item: Any) -> None:
        """Queues ``item`` for the callback; never blocks."""
        self._queue.put(item)

    def _main(self) -> None:
        _block_signals()
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                self._fn(item)
            except Exception:
                log.exception("on_event callback failed")

    def stop(self, timeout: float = 5.0) -> None:
        """Runs the callbacks already queued, then ends the thread and joins it.

        A callback still running after ``timeout`` seconds keeps its thread (a
        daemon); so does a call from the callback itself, which ends the thread
        once it returns.
        """
        thread = self._thread
        if thread is None:
            return
        self._queue.put(_STOP)
        if threading.current_thread() is thread or not thread.is_alive():
            return
        thread.join(timeout)
        if thread.is_alive():
            log.warning(
                "%s: a callback still runs %gs after close(); left as a daemon thread",
                self.name,
                timeout,
            )
