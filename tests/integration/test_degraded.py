"""DEGRADED over real gRPC on loopback: each of its three causes, seen in view, watch
--status and the metrics, and never a view change.

Three replicas run in this process, with short DEGRADED windows. Nodes n1, n2,
n3 of job j1 are SDK clients: n3 steps ten times slower than the others, n2
says it is unhealthy. A fourth node, ``jit``, is a raw heartbeat stream whose
gaps alternate 0.05 s and 0.9 s (D is 1.5 s here, so it is never suspected).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import urllib.request
from collections.abc import AsyncIterator

import grpc
import pytest

from arbiter.config import ArbiterConfig
from arbiter.server.app import ArbiterServer
from membership import ClientConfig, MembershipClient, MemberState, StatusUpdated
from membership.testing.localcluster import free_ports
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc
from tests.integration.harness import wait_async
from tests.integration.test_status import _Events

pytestmark = pytest.mark.integration

# D = 0.15 s x 10 = 1.5 s: the jittery node's 0.9 s gaps stay well inside it.
CONFIG = ArbiterConfig.local(
    missed_heartbeats=10.0,
    degraded_min_samples=10,
    degraded_step_window=2.0,
    degraded_min_steps=5,
)


@pytest.fixture
async def servers() -> AsyncIterator[list[ArbiterServer]]:
    ports = free_ports(4)
    peers = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports[:3])}
    metrics = dataclasses.replace(CONFIG, metrics_listen=f"127.0.0.1:{ports[3]}")
    servers = [
        ArbiterServer(
            replica_id=rid, peers=peers, listen=addr, config=metrics if rid == "a1" else CONFIG
        )
        for rid, addr in peers.items()
    ]
    try:
        for s in servers:
            await s.start()
        await wait_async(lambda: any(s.driver.is_leader for s in servers), 15, "a leader")
        yield servers
    finally:
        for s in servers:
            await s.stop(grace=0)


async def _jittery(address: str) -> None:
    """Node ``jit``: heartbeats with gaps of 0.05 s and 0.9 s in turn, until cancelled."""

    async def requests() -> AsyncIterator[pb.HeartbeatRequest]:
        seq = 0
        while True:
            seq += 1
            yield pb.HeartbeatRequest(node_id="jit", incarnation=1, seq=seq)
            # The node's own cadence (what is under test), not a wait for a condition.
            await asyncio.sleep(0.05 if seq % 2 else 0.9)

    async with grpc.aio.insecure_channel(address) as channel:
        async for _ in pb_grpc.MembershipStub(channel).Heartbeat(requests()):
            pass


async def _steps(nodes: dict[str, MembershipClient]) -> None:
    """n1 and n2 step 20 times a second, n3 twice, until cancelled."""
    step = dict.fromkeys(nodes, 0)
    tick = 0
    while True:
        tick += 1
        for name, node in nodes.items():
            if name != "n3" or tick % 10 == 0:
                step[name] += 1
                node.report(step=step[name], phase="train")
        await asyncio.sleep(0.05)


def _metric(address: str, reason: str) -> float:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(
        rf'^membership_degraded_nodes\{{arbiter="a1",reason="{reason}"\}} (\S+)$', text, re.M
    )
    return float(m.group(1)) if m else -1.0


async def test_degraded_from_jitter_step_rate_and_health_flag_never_changes_the_view(
    servers: list[ArbiterServer],
) -> None:
    addrs = [f"127.0.0.1:{s.port}" for s in servers]
    cfg = ClientConfig(collect_status=False)
    nodes = {
        n: MembershipClient(addrs, node_id=n, labels={"job": "j1"}, config=cfg)
        for n in ("n1", "n2", "n3")
    }
    watcher = MembershipClient(addrs, config=ClientConfig(follow_view=False))
    tasks: list[asyncio.Task[None]] = []
    events = _Events(watcher, status=True)
    try:
        for node in nodes.values():
            await node.start()
        tasks += [asyncio.create_task(_jittery(a)) for a in addrs]
        for node in nodes.values():
            await node.wait_alive(timeout=15)

        async def members() -> dict[str, MemberState]:
            info = await watcher.get_view()
            return {m.node_id: m.state for m in info.view.members}

        alive = dict.fromkeys(("jit", "n1", "n2", "n3"), MemberState.ALIVE)
        for _ in range(300):
            if await members() == alive:
                break
            await asyncio.sleep(0.05)
        assert await members() == alive
        epoch = (await watcher.get_view()).view.epoch
        tasks.append(asyncio.create_task(_steps(nodes)))
        nodes["n2"].report(healthy=False, reason="ECC errors on GPU 3")

        expected = {"jit": "jitter", "n3": "step_rate", "n2": "unhealthy"}

        def marked(node_id: str, cause: str) -> bool:
            return any(
                isinstance(e, StatusUpdated)
                and any(
                    r.node_id == node_id and cause in {d.cause for d in r.degraded}
                    for r in e.reports
                )
                for e in events.items
            )

        for node_id, cause in expected.items():
            await wait_async(lambda n=node_id, c=cause: marked(n, c), 40, f"{node_id} {cause}")

        # view: the marks with their reasons, the detector's readings.
        info = await watcher.get_view()
        causes = {n: {d.cause for d in marks} for n, marks in info.degraded.items()}
        for node_id, cause in expected.items():
            assert cause in causes.get(node_id, set()), (node_id, info.degraded)
        reasons = {d.cause: d.reason for marks in info.degraded.values() for d in marks}
        assert reasons["unhealthy"] == "ECC errors on GPU 3"
        assert "job j1" in reasons["step_rate"] and "heartbeat jitter" in reasons["jitter"]
        assert not causes.get("n1", set()) & {"step_rate", "unhealthy"}
        assert info.liveness["n1"].detector == "missed"
        assert info.liveness["n1"].suspicion is not None and info.liveness["n1"].suspicion < 10

        # metrics: the serving replica a1 counts them by reason.
        metrics = f"127.0.0.1:{servers[0].metrics.port}"
        for cause in expected.values():
            for _ in range(200):
                if await asyncio.to_thread(_metric, metrics, cause) >= 1:
                    break
                await asyncio.sleep(0.1)
            assert await asyncio.to_thread(_metric, metrics, cause) >= 1, cause

        # Status, never a view change: the epoch has not moved, all ALIVE, none suspected.
        after = await watcher.get_view()
        assert after.view.epoch == epoch
        assert {m.node_id: m.state for m in after.view.members} == alive
        assert after.suspected_by == {}

        # The application says it is well again: the mark goes.
        nodes["n2"].report(healthy=True)

        def cleared() -> bool:
            last = [
                r
                for e in events.items
                if isinstance(e, StatusUpdated)
                for r in e.reports
                if r.node_id == "n2"
            ]
            return bool(last) and "unhealthy" not in {d.cause for d in last[-1].degraded}

        await wait_async(cleared, 20, "n2's unhealthy mark to go")
        assert (await watcher.get_view()).view.epoch == epoch
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        await events.close()
        for c in (*nodes.values(), watcher):
            await c.close()
