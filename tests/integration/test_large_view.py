"""A view larger than gRPC's default 4 MiB message limit still reaches clients.

A snapshot and a GetView answer are one message holding the whole view; at
the replicas' default limits (5,000 nodes with 4 KiB of labels each) that is
tens of MiB, so the SDK accepts messages up to ``MAX_RECEIVE_BYTES``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from arbiter.config import ArbiterConfig
from arbiter.server.app import ArbiterServer
from membership import MembershipClient, ViewSnapshot
from membership.testing.localcluster import free_ports
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc
from tests.integration.harness import wait_async

pytestmark = pytest.mark.integration

NODES = 1100
# 15 labels of 250 characters: under the 4,096-byte cap, about 3.9 KiB a node,
# so 1,100 nodes make a view of about 4.3 MB, over gRPC's default 4 MiB.
LABELS = {f"k{i:02d}": "v" * 250 for i in range(15)}


@pytest.fixture
async def lone_replica() -> AsyncIterator[ArbiterServer]:
    """One replica that is its own quorum: every node it hears joins the view."""
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


async def _one_heartbeat(stub: pb_grpc.MembershipStub, node_id: str) -> None:
    call = stub.Heartbeat()
    await call.write(pb.HeartbeatRequest(node_id=node_id, incarnation=1, seq=1, labels=LABELS))
    assert await call.read() is not grpc.aio.EOF
    # Ended cleanly, so that the stream's slot is free before the next batch
    # (a replica allows max_concurrent_streams, 100, per connection).
    await call.done_writing()
    assert await call.code() == grpc.StatusCode.OK


async def test_a_view_over_4_mib_reaches_get_view_and_watch(lone_replica: ArbiterServer) -> None:
    addr = f"127.0.0.1:{lone_replica.port}"
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pb_grpc.MembershipStub(channel)
        for start in range(0, NODES, 50):
            await asyncio.gather(*(_one_heartbeat(stub, f"n{i}") for i in range(start, start + 50)))
        # Heard once each: every node joins (and, silent, is then DEAD: still in the view).
        await wait_async(
            lambda: len(lone_replica.driver.state.view().members) == NODES, 60, "every node joined"
        )
        size = pb.GetViewResponse(
            view=pb.View(
                members=[
                    pb.Member(node_id=m.node_id, labels=m.labels)
                    for m in lone_replica.driver.state.view().members
                ]
            )
        ).ByteSize()
        assert size > 4 * 1024 * 1024, size  # the point of the test: over the default limit

    client = MembershipClient([addr])
    try:
        info = await client.get_view()
        assert len(info.view.members) == NODES
        async with asyncio.timeout(30):
            async for event in client.watch():
                if isinstance(event, ViewSnapshot):
                    assert len(event.view.members) == NODES
                    break
    finally:
        await client.close()
