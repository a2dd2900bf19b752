"""``interval_seconds`` on the wire, against the default configuration: the bounds that
docs/protocol.md (Heartbeat rule 3, the limits table) states are the ones enforced.

From ``heartbeat_interval`` (0.15 s) to the interval ceiling, the load cap at
``max_nodes`` (``0.6 x 1.25^8`` = 3.5762786865234375 s at 10,000 nodes), the
longest interval an ack ever suggests. So 1.0 s, which a node of a
5,000-node cluster is told (1.118 s), is accepted and its lease scaled; just
above the ceiling, or below ``heartbeat_interval``, is INVALID_ARGUMENT with a
message naming the bounds. Both servers of heartbeat streams are held to it:
the in-process servicer (three replicas in this process) and an ingest worker
(``membership arbiter --ingest-workers 1`` processes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from arbiter.config import ArbiterConfig
from arbiter.server.app import ArbiterServer
from membership.testing.localcluster import free_ports
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc
from tests.integration.harness import ProcCluster, wait_async, wait_until

pytestmark = pytest.mark.integration

DEFAULTS = ArbiterConfig.lan()
CEILING = 0.6 * 1.25**8  # 3.5762786865234375 s: the load cap at 10,000 nodes
ABOVE = math.nextafter(CEILING, math.inf)
BOUNDS = "outside [0.15, 3.5762786865234375] seconds"


def test_interval_bounds_the_defaults_are_the_documented_ones() -> None:
    assert (DEFAULTS.heartbeat_interval, DEFAULTS.interval_ceiling) == (0.15, CEILING)
    assert DEFAULTS.max_heartbeat_interval == 0.6 < 1.0 < CEILING


async def _until_leased(
    addresses: list[str], node_id: str, interval: float, timeout: float = 30.0
) -> dict[str, list[pb.HeartbeatAck]]:
    """One stream to every replica declaring ``interval`` seconds, one heartbeat in
    flight (slow start) every 0.15 s, until every replica has acked with a lease.

    Returns:
        Each replica's acks, in order (the last one leased).

    Raises:
        AssertionError: a replica ended its stream (with its status).
    """
    acks: dict[str, list[pb.HeartbeatAck]] = {a: [] for a in addresses}
    leased: set[str] = set()
    done = asyncio.Event()
    incarnation = time.time_ns() // 1000

    async def stream(address: str) -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            call = pb_grpc.MembershipStub(channel).Heartbeat()
            seq = 0
            while not done.is_set():
                seq += 1
                await call.write(
                    pb.HeartbeatRequest(
                        node_id=node_id, incarnation=incarnation, seq=seq, interval_seconds=interval
                    )
                )
                ack = await call.read()
                if ack is grpc.aio.EOF:
                    raise AssertionError(
                        f"{address} ended the stream: {await call.code()} {await call.details()}"
                    )
                assert isinstance(ack, pb.HeartbeatAck) and ack.seq == seq
                acks[address].append(ack)
                if ack.lease_seconds > 0:
                    leased.add(address)
                    if len(leased) == len(addresses):
                        done.set()
                try:  # the node's pace; the stream stays as long as another is not leased
                    await asyncio.wait_for(done.wait(), 0.15)
                except TimeoutError:
                    pass
            await call.done_writing()

    async with asyncio.timeout(timeout):
        await asyncio.gather(*(stream(a) for a in addresses))
    return acks


async def _refusal(address: str, interval: float) -> tuple[grpc.StatusCode, str]:
    """The status a replica ends a stream with whose first heartbeat declares ``interval``."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = pb_grpc.MembershipStub(channel).Heartbeat()
        request = pb.HeartbeatRequest(
            node_id="bounds", incarnation=1, seq=1, interval_seconds=interval
        )
        try:
            await call.write(request)
            assert await call.read() is grpc.aio.EOF, f"{interval} s was acked"
        except grpc.aio.AioRpcError:
            pass  # the status below says why
        return await call.code(), await call.details()


async def _check_the_bounds(addresses: list[str], config: ArbiterConfig) -> None:
    """What docs/protocol.md says, on ``addresses``: 1.0 s accepted with the lease scaled,
    the ceiling itself accepted, just above it and below heartbeat_interval refused."""
    acks = await _until_leased(addresses, "one-second", 1.0)
    scaled = config.lease * 1.0 / config.heartbeat_interval  # 5.0 s: D at 1.0 s
    for address, received in acks.items():
        assert received[-1].lease_seconds == pytest.approx(scaled), address
        assert all(0 < a.next_interval_seconds <= CEILING for a in received), address
    acks = await _until_leased(addresses, "at-the-ceiling", CEILING)
    for address, received in acks.items():
        assert received[-1].lease_seconds == pytest.approx(config.max_lease), address
    for interval, bound in ((ABOVE, "interval ceiling"), (0.1, "heartbeat_interval 0.15 s")):
        code, details = await _refusal(addresses[0], interval)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (interval, details)
        assert details.startswith(f"interval_seconds: got {interval!r}, {BOUNDS}"), details
        assert bound in details and "max_nodes 10000 (--max-nodes)" in details, details


@pytest.fixture
async def defaults() -> AsyncIterator[list[ArbiterServer]]:
    """Three replicas in this process at the lan defaults (real gRPC on loopback), the
    heartbeats in the servicer (no workers) and shedding as the local preset's
    (this machine's shared cores): neither moves the interval bounds."""
    config = dataclasses.replace(
        DEFAULTS, ingest_workers=0, shed_utilisation=1.0, shed_lateness=2.0
    ).validate()
    assert config.interval_ceiling == DEFAULTS.interval_ceiling
    ports = free_ports(3)
    peers = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    servers = [
        ArbiterServer(replica_id=rid, peers=peers, listen=addr, config=config)
        for rid, addr in peers.items()
    ]
    for s in servers:
        await s.start()
    try:
        await wait_async(lambda: any(s.driver.is_leader for s in servers), 15, "a leader")
        yield servers
    finally:
        for s in servers:
            await s.stop(grace=0)


async def test_interval_bounds_servicer_accepts_one_second_and_refuses_past_the_bounds(
    defaults: list[ArbiterServer],
) -> None:
    await _check_the_bounds([f"127.0.0.1:{s.port}" for s in defaults], DEFAULTS)


async def test_interval_bounds_ingest_worker_accepts_one_second_and_refuses_past_the_bounds(
    cluster: ProcCluster,
) -> None:
    cluster.arbiter_args = ("--ingest-workers", "1")  # the lan preset otherwise
    cluster.start_arbiters(3)
    wait_until(cluster.leader, 60, "a leader among the replicas")
    await _check_the_bounds(cluster.addresses, DEFAULTS)
    for rid in cluster.arbiters:  # the streams were a worker's, not the consensus process's
        log = cluster.procs[rid].stderr()
        assert re.search(r"ingest worker 0 \(pid \d+\) serves its first heartbeat", log), rid
