"""Subscribers: failover between replicas with contiguous epochs, health service, graceful stop.

Three replicas run in this process (real gRPC on loopback).
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from arbiter.server.app import ArbiterServer
from membership import (
    ClientConfig,
    MembershipClient,
    MemberState,
    ViewChanged,
    ViewEvent,
    ViewSnapshot,
)
from tests.integration.harness import wait_async

pytestmark = pytest.mark.integration


def _addrs(servers: list[ArbiterServer], first: int = 0) -> list[str]:
    order = [servers[first], *(s for i, s in enumerate(servers) if i != first)]
    return [f"127.0.0.1:{s.port}" for s in order]


async def test_watch_fails_over_and_resumes_without_gap_or_duplicate(
    replicas: list[ArbiterServer],
) -> None:
    # The watcher starts on a follower, so that stopping it leaves a quorum.
    follower = next(i for i, s in enumerate(replicas) if not s.driver.is_leader)
    watcher = MembershipClient(_addrs(replicas, first=follower))
    events: list[ViewEvent] = []

    async def pump() -> None:
        async for ev in watcher.watch():
            events.append(ev)

    task = asyncio.get_running_loop().create_task(pump())
    nodes = [MembershipClient(_addrs(replicas), node_id=f"n{i}") for i in range(3)]
    try:
        for n in nodes[:2]:
            await n.start()
            await n.wait_alive(timeout=10)
        await wait_async(lambda: _alive(events) == {"n0", "n1"}, 10, "watcher sees n0, n1")
        served_by = {e.arbiter_id for e in events if isinstance(e, ViewChanged | ViewSnapshot)}
        assert served_by == {replicas[follower].replica_id}

        await replicas[follower].stop(grace=0)  # the watcher's replica goes away
        await nodes[2].start()
        await nodes[2].wait_alive(timeout=10)
        await nodes[0].leave(timeout=5)
        await wait_async(lambda: _alive(events) == {"n1", "n2"}, 15, "watcher catches up")

        epochs = [e.epoch for e in events if isinstance(e, ViewChanged)]
        snapshots = [e for e in events if isinstance(e, ViewSnapshot)]
        assert len(snapshots) == 1  # resumed by epoch, not re-snapshotted
        first = snapshots[0].view.epoch
        assert epochs == list(range(first + 1, first + 1 + len(epochs))), epochs
        later = {
            e.arbiter_id
            for e in events[events.index(snapshots[0]) + 1 :]
            if isinstance(e, ViewChanged)
        }
        assert replicas[follower].replica_id not in later or len(later) > 1
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for n in nodes:
            await n.close()
        await watcher.close()


def _alive(events: list[ViewEvent]) -> set[str]:
    alive: set[str] = set()
    for e in events:
        if isinstance(e, ViewSnapshot):
            alive = {m.node_id for m in e.view.alive()}
        elif isinstance(e, ViewChanged):
            for c in e.changes:
                (alive.add if c.state is MemberState.ALIVE else alive.discard)(c.node_id)
    return alive


async def test_watch_client_view_follows_committed_view(replicas: list[ArbiterServer]) -> None:
    async with MembershipClient(_addrs(replicas), node_id="me", labels={"rack": "r7"}) as me:
        member = await me.wait_alive(timeout=10)
        assert member.incarnation == me.incarnation
        await wait_async(lambda: me.view.get("me") is not None, 10, "client.view to show me")
        m = me.view.get("me")
        assert m is not None and m.state is MemberState.ALIVE and dict(m.labels) == {"rack": "r7"}
        assert me.view.epoch == replicas[0].driver.state.epoch or me.view.epoch > 0
        await wait_async(lambda: not me.fenced, 5, "a quorum of leases")
        await wait_async(lambda: me.healthy, 5, "streams to a quorum")
        assert me.is_member
        assert me.fencing_epoch >= m.epoch


async def test_health_serving_and_graceful_stop(replicas: list[ArbiterServer]) -> None:
    target = replicas[0]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        await wait_async(lambda: target.driver.status().in_quorum, 10, "quorum")

        async def status(service: str) -> int:
            resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
            return int(resp.status)

        assert await status("") == health_pb2.HealthCheckResponse.SERVING
        # the membership service is SERVING only while this replica is in a quorum
        for _ in range(100):
            if await status("membership.v1.Membership") == health_pb2.HealthCheckResponse.SERVING:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("membership service never SERVING")
        # The Admin service follows the quorum too; the replicas' Raft service
        # is up regardless (the others must reach it to form one).
        assert await status("membership.v1.Admin") == health_pb2.HealthCheckResponse.SERVING
        assert await status("arbiter.v1.Peer") == health_pb2.HealthCheckResponse.SERVING

        # An open subscription does not keep the replica from stopping.
        watcher = MembershipClient(
            [f"127.0.0.1:{target.port}"], config=ClientConfig(follow_view=False)
        )
        stream = watcher.watch()
        try:
            first = await asyncio.wait_for(anext(stream), 5)
            while not isinstance(first, ViewSnapshot):  # a quorum event may come first
                first = await asyncio.wait_for(anext(stream), 5)
            await asyncio.wait_for(target.stop(grace=1), 10)
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
        finally:
            await asyncio.wait_for(stream.aclose(), 5)
            await asyncio.wait_for(watcher.close(), 5)


async def test_reflection_lists_every_service(replicas: list[ArbiterServer]) -> None:
    # grpcurl and other generic tools discover the services without the protos.
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{replicas[0].port}") as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        call = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        names = set()
        async for resp in call:
            names = {s.name for s in resp.list_services_response.service}
            break
        assert {
            "membership.v1.Membership",
            "membership.v1.Admin",
            "arbiter.v1.Peer",
            "grpc.health.v1.Health",
        } <= names, names
        # The descriptors are served too: a tool can build requests from them.
        call = stub.ServerReflectionInfo(
            iter(
                [
                    reflection_pb2.ServerReflectionRequest(
                        file_containing_symbol="membership.v1.Admin"
                    )
                ]
            ),
            timeout=5,
        )
        async for resp in call:
            assert resp.file_descriptor_response.file_descriptor_proto, resp
            break
