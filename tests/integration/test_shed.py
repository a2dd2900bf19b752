"""A loaded replica sheds new nodes with RESOURCE_EXHAUSTED and a retry hint; the SDK waits
that long and joins once the load is gone (arbiter/server/api/shedding.py, heartbeats rule 5).

One replica that is its own quorum runs in this process; the test plays its load with a
load source (``LoadMonitor.add_source``), so nothing here depends on the machine's speed.
A replica made late by a test hook (its loop-lag monitor reporting the loop late for
much of the last 2 s) sheds on that backlog alone, its CPU time low (monitor.py rule 4).
The same through an ingest worker (``ingest_workers=1``): the consensus process decides,
the worker ends the stream with the same status and hint (ingest/pool.py rule 3).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import urllib.request
from collections.abc import AsyncIterator

import grpc
import pytest

from arbiter.config import ArbiterConfig
from arbiter.server.api.shedding import PUSHBACK_KEY, Shed, check_shedding
from arbiter.server.app import ArbiterServer
from arbiter.server.consensus.driver import Driver
from membership import MembershipClient
from membership.shared.view import MemberState
from membership.testing.localcluster import free_ports
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc
from tests.integration.harness import wait_async

pytestmark = pytest.mark.integration

RETRY_AFTER = 0.5  # seconds: hints of 500 to 999 ms
BACKLOG = 0.1  # seconds of lasting loop lag from which the replica sheds (the lan preset's)


@pytest.fixture
async def lone_replica() -> AsyncIterator[ArbiterServer]:
    addr = f"127.0.0.1:{free_ports(1)[0]}"
    config = ArbiterConfig.local(
        shed_retry_after=RETRY_AFTER, shed_utilisation=0.9, shed_lateness=BACKLOG
    )
    server = ArbiterServer(replica_id="a1", peers={"a1": addr}, listen=addr, config=config)
    await server.start()
    try:
        await wait_async(lambda: server.driver.is_leader, 15, "a leader")
        yield server
    finally:
        await server.stop(grace=0)


async def _first_ack(
    stub: pb_grpc.MembershipStub, node_id: str
) -> tuple[grpc.aio.StreamStreamCall, pb.HeartbeatAck]:
    """A new stream for ``node_id`` with its first heartbeat, and that heartbeat's ack."""
    call = stub.Heartbeat()
    await call.write(pb.HeartbeatRequest(node_id=node_id, incarnation=1, seq=1))
    return call, await call.read()


def _member(server: ArbiterServer, node_id: str) -> MemberState | None:
    return {m.node_id: m.state for m in server.driver.state.view().members}.get(node_id)


async def test_shed_new_nodes_get_the_status_and_hint_known_ones_go_on_sdk_waits(
    lone_replica: ArbiterServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = lone_replica.driver
    addr = f"127.0.0.1:{lone_replica.port}"
    busy = [0.0]
    driver.load.add_source(lambda now: busy[0])
    sheds: list[tuple[str, float, int]] = []  # (node, when, hint ms) of every refusal

    def recording(drv: Driver, node_id: str, now: float) -> None:
        try:
            check_shedding(drv, node_id, now)
        except Shed as e:
            sheds.append((node_id, time.monotonic(), e.pushback_ms))
            raise

    monkeypatch.setattr("arbiter.server.api.servicers.check_shedding", recording)

    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pb_grpc.MembershipStub(channel)
        known, ack = await _first_ack(stub, "n0")  # a node the replica knows
        assert ack.seq == 1
        await wait_async(lambda: _member(lone_replica, "n0") is MemberState.ALIVE, 10, "n0")

        busy[0] = 1.0
        driver.load.sample()  # the next sample would say so within a second
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await _first_ack(stub, "n1")
        assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (e.value.details() or "").startswith("shedding: arbiter a1 is loaded")
        hints = dict(e.value.trailing_metadata() or ())
        assert 500 <= int(hints[PUSHBACK_KEY]) < 1000
        # Streams of known nodes are served on: a new one of n0's, and the old one.
        again, ack = await _first_ack(stub, "n0")
        assert ack.state == pb.MEMBER_STATE_ALIVE
        await known.write(pb.HeartbeatRequest(node_id="n0", incarnation=1, seq=2))
        assert (await known.read()).seq == 2
        for call in (known, again):
            await call.done_writing()

    # The SDK: refused, it waits at least the hint each time, then joins once load is gone.
    sheds.clear()
    client = MembershipClient([addr], node_id="n2", leave_on_exit=False)
    await client.start()
    try:
        await wait_async(lambda: len([s for s in sheds if s[0] == "n2"]) >= 3, 15, "3 refusals")
        mine = [s for s in sheds if s[0] == "n2"]
        for (_, t0, hint), (_, t1, _) in itertools.pairwise(mine):
            assert t1 - t0 >= hint / 1000 - 0.02, (t1 - t0, hint)
        assert _member(lone_replica, "n2") is None
        busy[0] = 0.0
        driver.load.sample()
        await wait_async(lambda: _member(lone_replica, "n2") is MemberState.ALIVE, 15, "n2 joins")
    finally:
        await client.close()


async def test_shed_a_replica_late_at_every_wake_up_sheds_new_nodes_serves_known_ones(
    lone_replica: ArbiterServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = lone_replica.driver
    lag = [0.0]
    # The hook: the loop-lag monitor reports the loop late for much of the last 2 s
    # (tests/unit/test_looplag.py starves a loop that much for real; its CPU time
    # stays low: a starved loop waits for a CPU).
    monkeypatch.setattr(driver.lag_monitor, "mean_lateness", lambda now: lag[0])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{lone_replica.port}") as channel:
        stub = pb_grpc.MembershipStub(channel)
        known, ack = await _first_ack(stub, "n0")
        await wait_async(lambda: _member(lone_replica, "n0") is MemberState.ALIVE, 10, "n0")

        lag[0] = 0.25
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await _first_ack(stub, "n1")
        assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        details = e.value.details() or ""
        assert details.startswith("shedding: arbiter a1 is loaded"), details
        assert "backlog 0.250s, shed_lateness 0.1s" in details
        hints = dict(e.value.trailing_metadata() or ())
        assert 500 <= int(hints[PUSHBACK_KEY]) < 1000
        assert driver.load.cpu <= 0.9 and driver.load.shed == 1  # the backlog, not the CPU
        # The known node is served on, on its old stream and on a new one.
        await known.write(pb.HeartbeatRequest(node_id="n0", incarnation=1, seq=2))
        assert (await known.read()).state == pb.MEMBER_STATE_ALIVE
        again, ack = await _first_ack(stub, "n0")
        assert ack.state == pb.MEMBER_STATE_ALIVE

        lag[0] = 0.0  # on time again: n1 is taken
        joined, ack = await _first_ack(stub, "n1")
        assert ack.seq == 1
        for call in (known, again, joined):
            await call.done_writing()


@pytest.fixture
async def replica_with_a_worker() -> AsyncIterator[ArbiterServer]:
    """The lone replica, its heartbeats in one ingest worker (arbiter/server/ingest)."""
    port, metrics = free_ports(2)
    addr = f"127.0.0.1:{port}"
    config = ArbiterConfig.local(
        shed_retry_after=RETRY_AFTER,
        shed_utilisation=0.9,
        ingest_workers=1,
        metrics_listen=f"127.0.0.1:{metrics}",
    )
    server = ArbiterServer(replica_id="a1", peers={"a1": addr}, listen=addr, config=config)
    await server.start()
    try:
        await wait_async(lambda: server.driver.is_leader, 15, "a leader")
        yield server
    finally:
        await server.stop(grace=0)


async def test_shed_through_an_ingest_worker_same_status_and_hint_and_its_load_counts(
    replica_with_a_worker: ArbiterServer,
) -> None:
    server = replica_with_a_worker
    driver, pool = server.driver, server.ingest
    assert pool is not None
    busy = [0.0]
    driver.load.add_source(lambda now: busy[0])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = pb_grpc.MembershipStub(channel)
        known, ack = await _first_ack(stub, "n0")
        assert ack.seq == 1
        await wait_async(lambda: _member(server, "n0") is MemberState.ALIVE, 10, "n0")

        busy[0] = 1.0
        driver.load.sample()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await _first_ack(stub, "n1")  # decided in the consensus process, ended by the worker
        assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (e.value.details() or "").startswith("shedding: arbiter a1 is loaded")
        hints = dict(e.value.trailing_metadata() or ())
        assert 500 <= int(hints[PUSHBACK_KEY]) < 1000
        assert driver.load.shed == 1 and _member(server, "n1") is None
        # A known node's new stream and its old one are served on, through the worker.
        again, ack = await _first_ack(stub, "n0")
        assert ack.state == pb.MEMBER_STATE_ALIVE
        await known.write(pb.HeartbeatRequest(node_id="n0", incarnation=1, seq=2))
        assert (await known.read()).seq == 2
        busy[0] = 0.0
        driver.load.sample()
        joined, ack = await _first_ack(stub, "n1")  # the load gone, n1 is taken
        assert ack.seq == 1
        for call in (known, again, joined):
            await call.done_writing()
    # The worker's own loop is measured there and reported in its batches (pool rule 3):
    # the consensus process's load is at least the worker's.
    await wait_async(lambda: pool.statistics()[0].utilisation > 0, 10, "the worker's load")
    assert driver.load.sample() >= pool.utilisation() > 0
    # Per-worker figures on /metrics, and the inter-arrival histogram fed from the worker's
    # batches (n0's stream sent two heartbeats: one interval).
    assert server.metrics is not None
    url = f"http://127.0.0.1:{server.metrics.port}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    assert 'membership_ingest_workers{arbiter="a1"} 1.0' in text
    (line,) = [
        x for x in text.splitlines() if x.startswith("membership_ingest_worker_heartbeats_total")
    ]
    assert 'worker="0"' in line and float(line.split()[-1]) >= 4
    (line,) = [
        x
        for x in text.splitlines()
        if x.startswith("membership_heartbeat_interarrival_seconds_count")
    ]
    assert float(line.split()[-1]) >= 1
