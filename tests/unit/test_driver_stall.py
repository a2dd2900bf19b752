"""A replica whose own loop stalled blames itself, not the nodes (Lifeguard's local health).

A single-replica group (its own quorum) runs its real driver on the test's
loop; a node heartbeats to it directly. The loop is then blocked for longer
than the suspicion time D, and the node's next heartbeat is delivered just
after the loop is back, as gRPC hands over what queued up meanwhile. A
replica that ticked its detector first would suspect the node, and being the
quorum, commit it DEAD.
"""

from __future__ import annotations

import asyncio
import time

from arbiter.server.consensus.driver import Driver
from membership.shared.view import MemberState
from tests.unit.driver_harness import CONFIG, member_state, wait_for
from tests.unit.driver_harness import a1 as a1  # the fixture


async def test_driver_after_its_own_stall_hears_queued_heartbeats_before_suspecting(
    a1: Driver,
) -> None:
    beating = asyncio.Event()
    beating.set()

    async def node() -> None:
        while True:
            await beating.wait()
            a1.on_heartbeat("n1", 1, {})
            await asyncio.sleep(CONFIG.heartbeat_interval)

    heartbeats = asyncio.get_running_loop().create_task(node())
    try:
        await wait_for(lambda: a1.is_leader and member_state(a1, "n1") is MemberState.ALIVE)
        beating.clear()  # from here on, heartbeats arrive only as gRPC would hand them over
        a1.on_heartbeat("n1", 1, {})
        time.sleep(CONFIG.suspect_after + 0.3)  # the stall: the whole loop is deaf
        # What queued up during the stall reaches the servicer a moment later,
        # then the node's heartbeats flow again.
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, a1.on_heartbeat, "n1", 1, {})
        loop.call_later(0.03, beating.set)
        # Watched for three intervals: long enough for the detector to tick,
        # and for a suspicion to be proposed and committed by this quorum of one.
        end = time.monotonic() + 3 * CONFIG.heartbeat_interval
        while time.monotonic() < end:
            assert "n1" not in a1.local_suspects(), "suspected n1 for the replica's own stall"
            await asyncio.sleep(0.01)
    finally:
        heartbeats.cancel()
    assert member_state(a1, "n1") is MemberState.ALIVE


async def test_driver_still_suspects_a_node_that_stays_silent_after_its_stall(
    a1: Driver,
) -> None:
    async def node() -> None:
        while True:
            a1.on_heartbeat("n1", 1, {})
            await asyncio.sleep(CONFIG.heartbeat_interval)

    heartbeats = asyncio.get_running_loop().create_task(node())
    try:
        await wait_for(lambda: a1.is_leader and member_state(a1, "n1") is MemberState.ALIVE)
    finally:
        heartbeats.cancel()
    a1.on_heartbeat("n1", 1, {})
    time.sleep(CONFIG.suspect_after + 0.3)  # a stall, and the node is really gone
    t0 = time.monotonic()
    await wait_for(lambda: member_state(a1, "n1") is MemberState.DEAD)
    # Suspected once the replica has listened for one more interval.
    assert time.monotonic() - t0 >= CONFIG.heartbeat_interval * 0.9
