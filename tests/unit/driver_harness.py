"""A single-replica group's real driver on the test's loop, for the local-health tests.

Shared by tests/unit/test_driver_stall.py and tests/unit/test_load_driver.py: the
replica is its own quorum, so what its detector decides is committed at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from arbiter.config import ArbiterConfig
from arbiter.server.consensus.driver import Driver
from arbiter.server.consensus.storage import Storage
from membership.shared.view import MemberState

CONFIG = ArbiterConfig.local()
TIMEOUT = 15.0


async def wait_for(pred: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    """``pred()`` once it is truthy, polled every 10 ms; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (got := pred()):
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
    return got


@pytest.fixture
async def a1(tmp_path: Path) -> AsyncIterator[Driver]:
    """Replica a1, alone in its group, running (stopped and closed afterwards)."""
    storage = Storage.open(tmp_path, replica_id="a1", cluster="default", arbiters=["a1"])
    driver = Driver(
        replica_id="a1",
        replica_ids=["a1"],
        config=CONFIG,
        send=lambda msg: None,
        on_change=lambda change: None,
        on_quorum=lambda status: None,
        storage=storage,
    )
    driver.start()
    try:
        yield driver
    finally:
        await driver.stop()
        storage.close()


def member_state(driver: Driver, node_id: str) -> MemberState | None:
    """The state of ``node_id`` in the replica's applied view (None: not in it)."""
    return {m.node_id: m.state for m in driver.state.view().members}.get(node_id)
