"""Storage writes on a thread of their own, so that the event loop never waits on fsync.

A replica's event loop acks every node's heartbeats; a commit with
``synchronous=FULL`` waits for the disk, which under write load elsewhere on
the machine (dirty pages of other processes flushed first, ext4 ordered mode)
takes hundreds of milliseconds. Run on the loop, that is a deaf replica: nodes
lose its acks and with them its lease. The writer moves the wait off the loop
and keeps the durability rule (docs/architecture.md) with the driver's help:

1. One thread, one write at a time, in submission order (a single-worker
   executor): the SQLite connection is only ever used by one thread at a
   time, and a Ready's entries land after the previous Ready's.
2. The driver awaits each write before it sends the Ready's messages and
   calls ``advance``: term, vote and log are durable before any message that
   depends on them leaves. Heartbeats, Raft messages and proposals that
   arrive meanwhile are stepped into the core, which keeps them for the next
   Ready (etcd raft's contract: inputs between ``Ready`` and ``Advance`` wait).
3. A write that fails raises from the await; nothing was committed (the
   transaction rolled back), the Ready is not advanced and is handed out
   again by the next turn.
4. :meth:`DiskWriter.drain` returns once every write submitted before it is
   done, whoever awaited it: a stopping replica closes its storage only after.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from arbiter.core.raft import Ready, Snapshot
from arbiter.server.consensus.storage import Storage

__all__ = ["DiskWriter"]


class DiskWriter:
    """Runs :class:`Storage` writes on one dedicated thread (see the module rules).

    Args:
        storage: the replica's storage (its connection must allow use from
            another thread, as :meth:`Storage.open` opens it).
        name: names the thread (``storage-<name>``).
    """

    def __init__(self, storage: Storage, *, name: str) -> None:
        self._storage = storage
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"storage-{name}")
        self._closed = False

    async def save(self, ready: Ready) -> float:
        """Persists ``ready`` (:meth:`Storage.save`) on the writer thread.

        Returns:
            Seconds the write took on the thread (the fsync included).

        Raises:
            sqlite3.Error or OSError: the write failed (rule 3).
        """
        return await self._run(lambda: self._storage.save(ready))

    async def compact(self, snapshot: Snapshot) -> float:
        """Stores a snapshot and drops the entries it covers (:meth:`Storage.compact`).

        Returns:
            Seconds the write took on the thread.
        """
        return await self._run(lambda: self._storage.compact(snapshot))

    async def drain(self) -> None:
        """Waits until every write submitted so far is done (rule 4); at once after close."""
        if not self._closed:
            await self._run(lambda: None)

    def close(self) -> None:
        """Lets the thread end once its queue is empty (call after :meth:`drain`; idempotent).

        Later writes raise RuntimeError.
        """
        self._closed = True
        self._executor.shutdown(wait=False)

    async def _run(self, write: Callable[[], None]) -> float:
        def timed() -> float:
            t0 = time.perf_counter()
            write()
            return time.perf_counter() - t0

        return await asyncio.get_running_loop().run_in_executor(self._executor, timed)
