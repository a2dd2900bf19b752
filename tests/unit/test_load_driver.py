"""A replica made late by a lateness source (its ingest backlog) blames itself, not the
nodes (observer rule 6, Lifeguard's local health), and suspects a really dead node once
it is on time again.

A single-replica group (its own quorum) runs its real driver on the test's loop; the
test feeds heartbeats to it directly and plays the ingest: while it reports a backlog
(``add_lateness_source``), n1's heartbeats wait in it, and n2 has died for real.
"""

from __future__ import annotations

import asyncio
import time

from arbiter.server.consensus.driver import Driver
from membership.shared.view import MemberState
from tests.unit.driver_harness import CONFIG, member_state, wait_for
from tests.unit.driver_harness import a1 as a1  # the fixture


async def test_load_late_replica_suspects_nobody_then_suspects_the_dead_node(a1: Driver) -> None:
    backlog_since: list[float] = []  # set: the ingest holds every heartbeat since then
    a1.add_lateness_source(lambda now: now - backlog_since[0] if backlog_since else 0.0)
    alive = {"n1", "n2"}

    async def nodes() -> None:
        while True:
            if not backlog_since:
                for n in sorted(alive):
                    a1.on_heartbeat(n, 1, {})
            await asyncio.sleep(CONFIG.heartbeat_interval)

    beats = asyncio.get_running_loop().create_task(nodes())
    try:
        await wait_for(
            lambda: a1.is_leader and {member_state(a1, n) for n in alive} == {MemberState.ALIVE}
        )
        backlog_since.append(time.monotonic())
        alive.discard("n2")  # n2 dies now; n1's heartbeats queue in the backlog
        # Late for three times D: longer than any lease and any detector timeout.
        end = time.monotonic() + 3 * CONFIG.suspect_after
        while time.monotonic() < end:
            assert a1.local_suspects() == [], "suspected a node for the replica's own lateness"
            assert {member_state(a1, n) for n in ("n1", "n2")} == {MemberState.ALIVE}
            await asyncio.sleep(0.01)
        # The backlog drains: n1's queued heartbeat reaches the detector, then its beats flow.
        a1.on_heartbeat("n1", 1, {})
        backlog_since.clear()
        await wait_for(lambda: member_state(a1, "n2") is MemberState.DEAD)
        assert member_state(a1, "n1") is MemberState.ALIVE and "n1" not in a1.local_suspects()
    finally:
        beats.cancel()
