"""A replica that reads heartbeats late suspects nobody for that lateness
(arbiter/server/load/readlag.py; observer rule 6, Lifeguard's local health).

One replica that is its own quorum runs in this process. The test plays a replica
behind on its reads with a test hook that needs no load: the other nodes' heartbeats
carry send times ``QUEUED`` seconds before they are read (as if they had waited that
long in gRPC's buffers), while n1's heartbeats do not arrive at all (its next one is
still in the queue). Then the same silence of n1 with heartbeats read on time: n1 is
suspected, so the first half could have failed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from arbiter.config import ArbiterConfig
from arbiter.server.app import ArbiterServer
from membership.shared.view import MemberState
from membership.testing.localcluster import free_ports
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc
from tests.integration.harness import wait_async

pytestmark = pytest.mark.integration

OTHERS = [f"m{i}" for i in range(8)]
QUEUED = 2.5  # seconds each of the others' heartbeats waited to be read (< the 3 s bound)
SILENCE = 2.0  # seconds n1 is not read: well past D (0.75 s at the local preset)


@pytest.fixture
async def lone_replica() -> AsyncIterator[ArbiterServer]:
    addr = f"127.0.0.1:{free_ports(1)[0]}"
    server = ArbiterServer(
        replica_id="a1", peers={"a1": addr}, listen=addr, config=ArbiterConfig.local()
    )
    await server.start()
    try:
        await wait_async(lambda: server.driver.is_leader, 15, "a leader")
        yield server
    finally:
        await server.stop(grace=0)


def _state(server: ArbiterServer, node_id: str) -> MemberState | None:
    return {m.node_id: m.state for m in server.driver.state.view().members}.get(node_id)


async def test_readlag_a_replica_reading_late_suspects_nobody_for_it(
    lone_replica: ArbiterServer,
) -> None:
    server = lone_replica
    addr = server.listen
    channel = grpc.aio.insecure_channel(addr)
    stub = pb_grpc.MembershipStub(channel)
    calls = {n: stub.Heartbeat() for n in ["n1", *OTHERS]}
    seqs = dict.fromkeys(calls, 0)

    async def beat(node_id: str, queued: float = 0.0) -> None:
        seqs[node_id] += 1
        req = pb.HeartbeatRequest(
            node_id=node_id,
            incarnation=1,
            seq=seqs[node_id],
            send_time_unix=time.time() - queued,
            interval_seconds=0.15,
        )
        await calls[node_id].write(req)
        await calls[node_id].read()

    async def round_of(nodes: list[str], queued: float = 0.0) -> None:
        await asyncio.gather(*(beat(n, queued) for n in nodes))
        await asyncio.sleep(0.1)

    try:
        every = list(calls)
        deadline = time.monotonic() + 15
        while {_state(server, n) for n in every} != {MemberState.ALIVE}:
            assert time.monotonic() < deadline, "nodes not ALIVE within 15 s"
            await round_of(every)
        for _ in range(5):  # heartbeats read on time: each stream's base delay
            await round_of(every)

        # Behind: a backlog read at once (each of the others' queued heartbeats),
        # then the others read QUEUED late; n1's next heartbeat is still queued.
        for _ in range(8):
            await asyncio.gather(*(beat(n, QUEUED) for n in OTHERS))
        assert server.api.read_lag.lateness(time.monotonic()) == pytest.approx(QUEUED, abs=0.2)
        end = time.monotonic() + SILENCE
        while time.monotonic() < end:
            await round_of(OTHERS, QUEUED)
            assert _state(server, "n1") is MemberState.ALIVE
            assert server.driver.observer.suspects() == []
        for _ in range(3):  # read on time again: n1's heartbeat and everyone's
            await round_of(every)
        assert _state(server, "n1") is MemberState.ALIVE

        # The same silence with heartbeats read on time: n1 is suspected (here: DEAD).
        end = time.monotonic() + SILENCE
        while _state(server, "n1") is MemberState.ALIVE:
            assert time.monotonic() < end, "n1 not suspected in a silence read on time"
            await round_of(OTHERS)
        assert server.api.read_lag.lateness(time.monotonic()) < 0.1
    finally:
        for call in calls.values():
            call.cancel()
        await channel.close()
