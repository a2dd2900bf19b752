"""Small asyncio helpers shared by the SDK's shells."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

__all__ = ["reap"]

log = logging.getLogger("membership")
# A library leaves logging to the application: nothing of the SDK's reaches
# stderr through logging's last-resort handler unless the application (or the
# membership command) configures logging.
log.addHandler(logging.NullHandler())


async def reap(task: asyncio.Future[Any]) -> None:
    """Cancels ``task`` and waits until it has finished, whatever its outcome.

    Unlike ``suppress(CancelledError): await task``, this never swallows a
    cancellation of the *calling* task, so a supervisor being shut down
    cannot be kept alive by the child it is cleaning up. It cancels again
    until the task ends: Python 3.11's ``asyncio.wait_for`` (in grpc or in
    user code) can swallow a cancellation that races with its result.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
    if not task.cancelled() and task.exception() is not None:
        log.debug("task ended with %r", task.exception())
