"""Signals while a ``membership`` command runs: the first ends it as its normal end
does, a second exits at once (:mod:`membership.cli.commands` rule 2).

:class:`Interrupt` holds the handlers of SIGINT, SIGTERM and SIGHUP;
:meth:`Interrupt.race` is how a command waits for anything so that a signal ends
the wait; :class:`Interrupted` is raised where the program is when a signal comes
before the event loop is attached.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

__all__ = ["Interrupt", "Interrupted"]

T = TypeVar("T")

# SIGHUP too: a node whose terminal closes, or that an operator signals as
# replicas are signalled to reload their certificates, stops gracefully (it
# leaves) instead of dying at once and being declared DEAD. ``arbiter``
# replaces the SIGHUP handler with its reload of the TLS files.
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(Exception):
    """The command was cut short by signal :attr:`signum`."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupt:
    """SIGINT, SIGTERM and SIGHUP while a command runs (rule 3).

    The first signal sets :attr:`stop` once the event loop is attached (before
    that, the handler raises :class:`Interrupted` where the program is). A
    second one calls the ``on_force`` callbacks (the demo kills its children
    there) and exits at once with 128 + its number. Handlers are plain
    ``signal.signal`` ones, so they also run while the loop is busy in
    blocking code.
    """

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.signum: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._force: list[Callable[[], None]] = []
        self._saved: dict[int, Any] = {}

    def install(self) -> None:
        """Installs the handlers (main thread only; elsewhere it does nothing)."""
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._saved[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        """Restores the handlers found by :meth:`install`."""
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()

    def on_force(self, fn: Callable[[], None]) -> None:
        """Registers ``fn`` to run before a second signal exits the process."""
        self._force.append(fn)

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            self._exit_now(signum)
        self.signum = signum
        if self._loop is None:
            raise Interrupted(signum)
        self._loop.call_soon_threadsafe(self.stop.set)

    def _exit_now(self, signum: int) -> NoReturn:
        for fn in reversed(self._force):
            with contextlib.suppress(Exception):
                fn()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(128 + signum)

    async def run(self, coro: Awaitable[T]) -> T:
        """Runs ``coro`` with this interrupt attached to the running loop."""
        self._loop = asyncio.get_running_loop()
        if self.signum is not None:
            self.stop.set()
        try:
            return await coro
        finally:
            self._loop = None

    async def race(self, aw: Awaitable[T]) -> tuple[bool, T | None]:
        """Awaits ``aw`` unless :attr:`stop` is set first (then ``aw`` is cancelled).

        Returns:
            ``(True, result)``, or ``(False, None)`` when stopped.
        """
        task = asyncio.ensure_future(aw)
        stopper = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if task.cancelled():
            return False, None
        return True, task.result()
