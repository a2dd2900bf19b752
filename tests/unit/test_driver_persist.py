"""The driver's persist path: fsync on the writer thread, heartbeats served meanwhile,
and no message out before what it depends on is on disk (the durability rule, docs/architecture.md).

A replica a1 of a group {a1, a2, a3} runs its real driver on the test's loop;
the test plays a2 and a3 by answering a1's messages, and slows a1's disk down
with a write that waits for the test.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from arbiter.config import ArbiterConfig
from arbiter.core.raft import Message, MessageType, Ready
from arbiter.server.consensus.driver import Driver
from arbiter.server.consensus.storage import DB_NAME, Storage

IDS = ["a1", "a2", "a3"]
TIMEOUT = 15.0  # an election timeout is 1 to 2 s; generous for a loaded machine


async def wait_for(pred: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := pred()):
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
    return got


@dataclass
class Disk:
    """a1's storage, with saves that can be held until the test lets them finish."""

    storage: Storage
    path: Path
    hold: bool = False
    held: int = 0  # writes that started waiting for a permit
    permits: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    threads: set[str] = field(default_factory=set)
    fail_next: bool = False

    def install(self) -> None:
        original = self.storage.save

        def save(ready: Ready) -> None:
            self.threads.add(threading.current_thread().name)
            if self.fail_next:
                self.fail_next = False
                raise sqlite3.OperationalError("disk I/O error (injected)")
            if self.hold:
                self.held += 1
                assert self.permits.acquire(timeout=10.0), "the test never released the write"
            original(ready)

        self.storage.save = save  # type: ignore[method-assign]

    def release(self, n: int = 1) -> None:
        """Lets ``n`` held writes go on (now or when they come)."""
        for _ in range(n):
            self.permits.release()

    def durable(self) -> tuple[int, str | None, int]:
        """(term, vote, last index) as on disk, read through a connection of its own."""
        conn = sqlite3.connect(str(self.path / DB_NAME))
        try:
            row = conn.execute("SELECT term, vote FROM hard_state").fetchone()
            last = conn.execute("SELECT COALESCE(MAX(idx), 0) FROM entries").fetchone()[0]
        finally:
            conn.close()
        term, vote = row if row is not None else (0, None)
        return term, vote, last


@dataclass
class Replica:
    driver: Driver
    disk: Disk
    sent: list[Message]
    violations: list[str]


@pytest.fixture
async def a1(tmp_path: Path) -> AsyncIterator[Replica]:
    storage = Storage.open(tmp_path, replica_id="a1", cluster="default", arbiters=IDS)
    disk = Disk(storage, tmp_path)
    disk.install()
    sent: list[Message] = []
    violations: list[str] = []

    def send(msg: Message) -> None:
        # Rule 6, checked against the disk itself as each message leaves.
        term, vote, last = disk.durable()
        if msg.type in (MessageType.VOTE, MessageType.APPEND) and msg.term != term:
            violations.append(f"{msg} sent with durable term {term}")
        if msg.type is MessageType.VOTE and vote != "a1":
            violations.append(f"{msg} sent before the vote for a1 is durable ({vote})")
        if msg.type is MessageType.APPEND and msg.entries and msg.entries[-1].index > last:
            violations.append(f"{msg} sent before its entries are durable (last {last})")
        sent.append(msg)

    driver = Driver(
        replica_id="a1",
        replica_ids=IDS,
        config=ArbiterConfig.local(),
        send=send,
        on_change=lambda change: None,
        on_quorum=lambda status: None,
        storage=storage,
    )
    driver.start()
    try:
        yield Replica(driver, disk, sent, violations)
    finally:
        disk.hold = False
        disk.release(10)
        await driver.stop()
        storage.close()


def _of(r: Replica, type_: MessageType) -> list[Message]:
    return [m for m in r.sent if m.type is type_]


async def _elect(r: Replica) -> None:
    """Answers a1's PreVote and vote requests as a2 and a3 would."""
    pre = await wait_for(lambda: _of(r, MessageType.PRE_VOTE))
    for src in ("a2", "a3"):
        r.driver.on_raft_message(
            Message(type=MessageType.PRE_VOTE_RESP, src=src, dst="a1", term=pre[0].term)
        )
    votes = await wait_for(lambda: _of(r, MessageType.VOTE))
    for src in ("a2", "a3"):
        r.driver.on_raft_message(
            Message(type=MessageType.VOTE_RESP, src=src, dst="a1", term=votes[0].term)
        )


async def test_driver_acks_heartbeats_while_a_ready_is_being_persisted(a1: Replica) -> None:
    a1.disk.hold = True
    pre = await wait_for(lambda: _of(a1, MessageType.PRE_VOTE))
    a1.driver.on_raft_message(
        Message(type=MessageType.PRE_VOTE_RESP, src="a2", dst="a1", term=pre[0].term)
    )
    # a1 is now a candidate: its term and vote are being written, and held.
    await wait_for(lambda: a1.disk.held == 1)
    assert not _of(a1, MessageType.VOTE), "VOTE sent before its term and vote were on disk"
    # The loop is free meanwhile: heartbeats are answered, Raft messages stepped.
    verdicts = [a1.driver.on_heartbeat("n1", 1, {}) for _ in range(3)]
    assert all(v.accepted for v in verdicts)
    a1.driver.on_raft_message(
        Message(type=MessageType.PRE_VOTE_RESP, src="a3", dst="a1", term=pre[0].term)
    )
    a1.disk.release()
    votes = await wait_for(lambda: _of(a1, MessageType.VOTE))
    assert {m.dst for m in votes} == {"a2", "a3"}
    assert a1.disk.threads == {"storage-a1_0"}, a1.disk.threads  # never the loop's thread
    assert a1.violations == []


async def test_driver_sends_nothing_before_it_is_durable_with_writes_held(a1: Replica) -> None:
    async def release_every_write() -> None:
        released = 0

        def another_held() -> bool:
            return a1.disk.held > released

        while True:
            await wait_for(another_held)
            await asyncio.sleep(0.05)  # a slow disk: inputs keep arriving meanwhile
            a1.disk.release()
            released += 1

    a1.disk.hold = True
    releaser = asyncio.get_running_loop().create_task(release_every_write())
    try:
        await _elect(a1)
        appends = await wait_for(lambda: [m for m in _of(a1, MessageType.APPEND) if m.entries])
        assert {m.dst for m in appends} >= {"a2", "a3"}
        # Followers acknowledge the no-op: it commits while writes keep being slow.
        for src in ("a2", "a3"):
            a1.driver.on_raft_message(
                Message(
                    type=MessageType.APPEND_RESP,
                    src=src,
                    dst="a1",
                    term=appends[0].term,
                    index=appends[0].entries[-1].index,
                )
            )
        await wait_for(lambda: a1.driver.raft.status().applied >= appends[0].entries[-1].index)
    finally:
        releaser.cancel()
    assert a1.driver.is_leader
    assert a1.violations == []


async def test_driver_stop_waits_for_the_write_in_flight(a1: Replica) -> None:
    a1.disk.hold = True
    pre = await wait_for(lambda: _of(a1, MessageType.PRE_VOTE))
    a1.driver.on_raft_message(
        Message(type=MessageType.PRE_VOTE_RESP, src="a2", dst="a1", term=pre[0].term)
    )
    await wait_for(lambda: a1.disk.held == 1)
    stopping = asyncio.get_running_loop().create_task(a1.driver.stop())
    await asyncio.sleep(0.2)  # the stimulus: stop() is given time it must not use to finish
    assert not stopping.done(), "stop() returned while a write was in flight"
    a1.disk.release()
    await asyncio.wait_for(stopping, TIMEOUT)
    term, vote, _ = a1.disk.durable()
    assert (term, vote) == (pre[0].term, "a1")  # the write finished before the storage closed
    assert not _of(a1, MessageType.VOTE)  # and its messages never left


async def test_driver_retries_a_failed_write_before_sending(
    a1: Replica, caplog: pytest.LogCaptureFixture
) -> None:
    a1.disk.fail_next = True
    await _elect(a1)
    await wait_for(lambda: a1.driver.is_leader)
    assert "driver turn failed; continuing" in caplog.text
    assert a1.violations == []
