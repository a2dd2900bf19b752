"""The blocking client (membership/sync.py) and its loop thread (membership/_loopthread.py), alone.

No cluster: the API's shape against the asyncio client, errors from the loop in
the caller's thread, interrupts, threads started and stopped, the watch's
iterator over a scripted event stream. With a cluster:
tests/integration/test_sync_client.py.
"""

from __future__ import annotations

import _thread
import asyncio
import inspect
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest

import membership
from membership import ClientConfig, MembershipClient
from membership._loopthread import CallbackThread, LoopThread
from membership.shared.errors import ClosedError, InvalidArgument, LocalError, UnavailableError
from membership.sync import MembershipClient as SyncClient
from membership.sync import Watch
from membership.testing.localcluster import free_ports

FAST = ClientConfig(call_timeout=0.3, follow_view=False, collect_status=False)


def _public(obj: object) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


@pytest.fixture
def nowhere() -> list[str]:
    """Three arbiter addresses where nothing listens."""
    return [f"127.0.0.1:{p}" for p in free_ports(3)]


def _ours() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("membership-")}


# --- the API's shape ---------------------------------------------------------------------


def test_sync_client_has_every_public_name_of_the_asyncio_client(nowhere: list[str]) -> None:
    # Class attributes (methods, properties) and instance attributes alike: a
    # name added to the asyncio client and not to the blocking one fails here.
    a = MembershipClient(nowhere, node_id="n1", config=FAST)
    s = SyncClient(nowhere, node_id="n1", config=FAST)
    own = {"closed"}  # the blocking client's additions
    assert _public(s) - own == _public(a)
    assert _public(SyncClient) - own >= _public(MembershipClient)
    assert hasattr(SyncClient, "__enter__") and hasattr(SyncClient, "__exit__")
    s.close()


def test_sync_client_coroutines_become_blocking_methods_with_the_same_signature() -> None:
    for name, member in inspect.getmembers(MembershipClient):
        if name.startswith("_"):
            continue
        mine = inspect.getattr_static(SyncClient, name)
        if inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member):
            assert callable(mine), name
            assert not inspect.iscoroutinefunction(mine), name
            assert not inspect.isasyncgenfunction(mine), name
            ours, theirs = inspect.signature(mine), inspect.signature(member)
            assert ours.parameters == theirs.parameters, name
            if inspect.iscoroutinefunction(member):  # the awaited type is returned
                assert ours.return_annotation == theirs.return_annotation, name
            else:
                assert ours.return_annotation == "Watch", name
        elif isinstance(inspect.getattr_static(MembershipClient, name), property):
            assert isinstance(mine, property), name
            assert mine.__doc__, name
        elif callable(member):
            assert inspect.signature(mine) == inspect.signature(member), name


def test_sync_client_is_exported_as_membership_sync() -> None:
    assert membership.sync.MembershipClient is SyncClient
    assert "sync" in dir(membership)


def test_sync_client_bad_arguments_raise_in_the_caller_before_any_thread(
    nowhere: list[str],
) -> None:
    before = _ours()
    with pytest.raises(InvalidArgument):
        SyncClient(nowhere, node_id="bad id with spaces")
    with pytest.raises(InvalidArgument):
        SyncClient(["not an address"], node_id="n1")
    assert _ours() == before


# --- errors, threads, interrupts -----------------------------------------------------------


def test_sync_client_errors_surface_as_the_asyncio_clients_classes(nowhere: list[str]) -> None:
    watcher = SyncClient(nowhere, config=FAST)
    node = SyncClient(nowhere, node_id="n1", config=FAST, leave_on_exit=False)
    try:
        with pytest.raises(UnavailableError):  # raised on the loop thread, by calls.get_view
            watcher.get_view()
        with pytest.raises(InvalidArgument, match="needs a node_id"):
            watcher.wait_alive(timeout=1)
        node.start()
        with pytest.raises(TimeoutError, match="not ALIVE within"):
            node.wait_alive(timeout=0.3)
        with pytest.raises(InvalidArgument):
            node.report(progress=2.0)
    finally:
        watcher.close()
        node.close()
    with pytest.raises(ClosedError):
        node.wait_alive(timeout=1)
    with pytest.raises(ClosedError):
        node.watch()
    assert node.closed and node.state is membership.MemberState.JOINING  # read without a loop


def test_sync_client_close_stops_its_threads(nowhere: list[str]) -> None:
    events: list[object] = []
    before = _ours()
    client = SyncClient(nowhere, node_id="n1", config=FAST, on_event=events.append)
    client.start()
    assert _ours() - before >= {"membership-loop[n1]", "membership-callbacks[n1]"}
    client.close()
    client.close()  # idempotent
    assert _ours() == before


def test_loop_thread_exception_is_the_same_object_and_the_call_from_the_loop_is_refused() -> None:
    lt = LoopThread("membership-test-loop")
    lt.start()
    boom = UnavailableError("no arbiter")

    async def fail() -> None:
        raise boom

    async def nested() -> None:
        lt.call(fail)  # a blocking call on the loop's own thread

    try:
        with pytest.raises(UnavailableError) as info:
            lt.call(fail)
        assert info.value is boom
        with pytest.raises(LocalError, match="wait for itself"):
            lt.call(nested)
        assert lt.run(threading.current_thread) is lt.thread  # state is read on the loop
    finally:
        lt.stop()
    assert not lt.running and lt.thread is not None and not lt.thread.is_alive()
    assert lt.run(lambda: 7) == 7  # no loop: in the caller's thread
    with pytest.raises(ClosedError):
        lt.call(fail)


def test_loop_thread_interrupt_cancels_the_call_like_asyncio() -> None:
    # _thread.interrupt_main trips SIGINT's handler without a real signal, as a
    # signal delivered to another thread would: the sliced wait runs it.
    lt = LoopThread("membership-test-loop")
    lt.start()
    cancelled = threading.Event()

    async def wait_forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    # Python's own SIGINT handler, whatever an earlier test in this process left
    # (interrupt_main does nothing while SIGINT is ignored or at SIG_DFL).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.2, _thread.interrupt_main)
    timer.start()
    try:
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            lt.call(wait_forever)
        assert time.monotonic() - started < 5
        assert cancelled.is_set()  # cancelled on the loop before the interrupt propagated
    finally:
        timer.cancel()
        lt.stop()
        signal.signal(signal.SIGINT, previous)


def test_loop_thread_refuses_calls_in_a_forked_child() -> None:
    lt = LoopThread("membership-test-loop")
    lt.start()
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                lt.run(lambda: None)
            except ClosedError:
                code = 0
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert lt.run(lambda: 5) == 5  # the parent's loop is untouched
    finally:
        lt.stop()


def test_callback_thread_runs_callbacks_in_order_off_the_caller() -> None:
    seen: list[tuple[int, str]] = []
    gate = threading.Event()

    def callback(i: int) -> None:
        gate.wait(5)  # a slow callback: put() never waits for it
        seen.append((i, threading.current_thread().name))

    cb = CallbackThread(callback, "membership-callbacks[t]")
    cb.start()
    started = time.monotonic()
    for i in range(3):
        cb.put(i)
    assert time.monotonic() - started < 1
    gate.set()
    cb.stop()
    assert seen == [(i, "membership-callbacks[t]") for i in range(3)]
    assert cb.thread is not None and not cb.thread.is_alive()


# --- the watch iterator ----------------------------------------------------------------------


class _Script:
    """An async event source: yields what is fed to it, ends or fails when told."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.yielded = 0
        self.closed = False

    async def events(self) -> AsyncIterator[object]:
        try:
            while True:
                item = await self.queue.get()
                if item is StopAsyncIteration:
                    return
                if isinstance(item, Exception):
                    raise item
                self.yielded += 1
                yield item
        finally:
            self.closed = True


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    lt = LoopThread("membership-test-loop")
    lt.start()
    yield lt
    lt.stop()


def _watch(loop: LoopThread, buffer: int = 1024) -> tuple[Watch, _Script]:
    script = loop.run(_Script)
    return Watch(loop, script.events, buffer=buffer), script  # type: ignore[arg-type]


def _feed(loop: LoopThread, script: _Script, *items: object) -> None:
    for item in items:
        loop.run(script.queue.put_nowait, item)


def test_watch_iterates_in_order_then_raises_the_error_once(loop: LoopThread) -> None:
    watch, script = _watch(loop)
    assert watch.pending() == []  # nothing yet: never blocks
    _feed(loop, script, "e1", "e2", EpochOutOfRangeLike("gone"))
    assert next(watch) == "e1"
    assert next(watch) == "e2"
    with pytest.raises(EpochOutOfRangeLike):
        next(watch)
    with pytest.raises(StopIteration):
        next(watch)
    assert watch.ended


class EpochOutOfRangeLike(membership.RemoteError):
    pass


def test_watch_pending_returns_events_before_the_error(loop: LoopThread) -> None:
    watch, script = _watch(loop)
    _feed(loop, script, "e1", "e2", EpochOutOfRangeLike("gone"))
    deadline = time.monotonic() + 5
    got: list[object] = []
    while len(got) < 2 and time.monotonic() < deadline:
        got += watch.pending()
    assert got == ["e1", "e2"]
    with pytest.raises(EpochOutOfRangeLike):
        while time.monotonic() < deadline:
            watch.pending()
    assert watch.pending() == [] and watch.ended


def test_watch_buffer_stops_reading_until_the_reader_takes(loop: LoopThread) -> None:
    watch, script = _watch(loop, buffer=2)
    _feed(loop, script, *range(6))
    deadline = time.monotonic() + 5
    while not watch._waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    # The pump waits for room: two events held for the reader, the third in its
    # hands, and the source suspended at that yield (it cannot produce more).
    assert watch._waiting and script.yielded == 3
    assert [next(watch) for _ in range(6)] == list(range(6))


def test_watch_ends_when_closed_and_closes_its_source(loop: LoopThread) -> None:
    watch, script = _watch(loop)
    _feed(loop, script, "e1")
    assert next(watch) == "e1"
    closer = threading.Timer(0.2, watch.close)
    closer.start()
    with pytest.raises(StopIteration):  # a reader blocked in next() is released
        next(watch)
    closer.join()
    assert script.closed
