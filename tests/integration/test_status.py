"""Live status, explainable deaths and the adaptive interval, over real gRPC on loopback.

Three replicas run in this process; nodes are SDK clients in this process too.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping

import pytest

from arbiter.config import ArbiterConfig
from arbiter.server.app import ArbiterServer
from membership import (
    ClientConfig,
    InvalidArgument,
    MembershipClient,
    MemberState,
    QuorumChanged,
    ViewChanged,
    ViewEvent,
    ViewSnapshot,
)
from membership._node.collector import StatusCollector
from membership._node.session import Fenced, SessionEvent
from membership.shared.view import StatusUpdated
from membership.testing.localcluster import free_ports
from tests.integration.harness import wait_async

pytestmark = pytest.mark.integration


def _addrs(servers: list[ArbiterServer]) -> list[str]:
    return [f"127.0.0.1:{s.port}" for s in servers]


async def _start(config: ArbiterConfig) -> list[ArbiterServer]:
    ports = free_ports(3)
    peers = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    servers = [
        ArbiterServer(replica_id=rid, peers=peers, listen=addr, config=config)
        for rid, addr in peers.items()
    ]
    for s in servers:
        await s.start()
    return servers


class _Events:
    """Collects a watcher's events in a task; ``close`` reaps it."""

    def __init__(self, client: MembershipClient, **kwargs: object) -> None:
        self.items: list[ViewEvent] = []
        self._task = asyncio.get_running_loop().create_task(self._pump(client, kwargs))

    async def _pump(self, client: MembershipClient, kwargs: Mapping[str, object]) -> None:
        async for ev in client.watch(**kwargs):  # type: ignore[arg-type]
            self.items.append(ev)

    def find(self, pred: Callable[[ViewEvent], bool]) -> ViewEvent | None:
        return next((e for e in self.items if pred(e)), None)

    async def close(self) -> None:
        self._task.cancel()
        done, _ = await asyncio.wait({self._task}, timeout=10)
        assert done, "the watch task did not end within 10 s of its cancellation"


@pytest.fixture
async def servers() -> AsyncIterator[list[ArbiterServer]]:
    s = await _start(ArbiterConfig.local())
    try:
        await wait_async(lambda: any(x.driver.is_leader for x in s), 15, "a leader")
        yield s
    finally:
        for x in s:
            await x.stop(grace=0)


async def test_status_reported_by_a_node_reaches_view_and_status_watchers(
    servers: list[ArbiterServer],
) -> None:
    probed = StatusCollector(providers=[lambda: {"load": 1.5, "cpu_utilization": 0.25}])
    probed.start()
    node = MembershipClient(_addrs(servers), node_id="n1", status=probed)
    watcher = MembershipClient(_addrs(servers), config=ClientConfig(follow_view=False))
    plain = MembershipClient(_addrs(servers), config=ClientConfig(follow_view=False))
    events = _Events(watcher, status=True)
    plain_events = _Events(plain)
    try:
        await node.start()
        await node.wait_alive(timeout=10)
        node.report(phase="allreduce", step=1200, loss=0.31)

        def reported(ev: ViewEvent) -> bool:
            return isinstance(ev, StatusUpdated) and any(
                r.node_id == "n1" and r.status.step == 1200 for r in ev.reports
            )

        await wait_async(lambda: events.find(reported), 10, "a status event with step 1200")
        ev = events.find(reported)
        assert isinstance(ev, StatusUpdated)
        (r,) = [r for r in ev.reports if r.node_id == "n1"]
        assert r.incarnation == node.incarnation
        assert (r.status.phase, r.status.load, r.status.cpu_utilization) == ("allreduce", 1.5, 0.25)
        assert dict(r.status.gauges) == {"loss": 0.31}
        assert r.suspected_by == () and 0 <= r.silence < 1.0

        # Never a status before the view it refers to: the snapshot comes first.
        first = next(e for e in events.items if not isinstance(e, QuorumChanged))
        assert isinstance(first, ViewSnapshot)

        info = await watcher.get_view()
        assert info.statuses["n1"].phase == "allreduce"
        assert info.statuses["n1"].step == 1200
        # Status is opt-in: a plain watcher gets view events only.
        await wait_async(lambda: plain_events.items, 10, "the plain watcher's snapshot")
        assert not any(isinstance(e, StatusUpdated) for e in plain_events.items)
        # Coalesced and rate-limited: one report per change, not one per heartbeat.
        count = sum(
            1
            for e in events.items
            if isinstance(e, StatusUpdated)
            for r in e.reports
            if r.node_id == "n1" and r.status.step == 1200
        )
        assert count == 1
    finally:
        await events.close()
        await plain_events.close()
        for c in (node, watcher, plain):
            await c.close()
        probed.close()


async def test_status_probe_that_hangs_does_not_delay_heartbeats(
    servers: list[ArbiterServer],
) -> None:
    release, entered = threading.Event(), threading.Event()

    def hung() -> Mapping[str, float]:
        entered.set()
        release.wait()  # a probe stuck in a driver call, for ever
        return {}

    collector = StatusCollector(providers=[hung], probe_interval=0.05)
    collector.start()
    fenced_again: list[Fenced] = []

    def on_event(ev: SessionEvent) -> None:
        if isinstance(ev, Fenced) and ev.fenced and node.state is MemberState.ALIVE:
            fenced_again.append(ev)

    node = MembershipClient(_addrs(servers), node_id="n1", status=collector, on_event=on_event)
    received: list[float] = []
    leader = servers[0]
    original = leader.driver.heartbeat

    def counting(node_id: str, *args: object, **kw: object) -> object:
        if node_id == "n1":
            received.append(time.monotonic())
        return original(node_id, *args, **kw)  # type: ignore[arg-type]

    leader.driver.heartbeat = counting  # type: ignore[method-assign]
    try:
        await node.start()
        await node.wait_alive(timeout=10)
        await node.wait_fenced(False, timeout=5)
        assert entered.wait(5), "the hung probe never ran"
        window = 20 * node.interval
        start = time.monotonic()
        await wait_async(lambda: time.monotonic() - start >= window, window + 5, "the window")
        got = [t for t in received if t >= start]
        # On time: about one heartbeat per interval (half of them at the very
        # least on a loaded machine); never suspected, never fenced.
        assert len(got) >= 10, f"{len(got)} heartbeats in {window:.1f}s"
        assert fenced_again == []
        for s in servers:
            assert "n1" not in s.driver.local_suspects()
        assert collector.statistics().probes[0].skipped > 0  # it really stayed hung
    finally:
        leader.driver.heartbeat = original  # type: ignore[method-assign]
        release.set()
        await node.close()
        collector.close()


async def test_status_dead_change_carries_the_evidence_of_its_quorum(
    servers: list[ArbiterServer],
) -> None:
    node = MembershipClient(
        _addrs(servers), node_id="n1", config=ClientConfig(collect_status=False)
    )
    watcher = MembershipClient(_addrs(servers), config=ClientConfig(follow_view=False))
    events = _Events(watcher)
    try:
        await node.start()
        await node.wait_alive(timeout=10)
        async with asyncio.timeout(10):
            await node.close()  # silence without a leave: the replicas must suspect it

        def dead(ev: ViewEvent) -> bool:
            return isinstance(ev, ViewChanged) and any(
                c.node_id == "n1" and c.state is MemberState.DEAD for c in ev.changes
            )

        await wait_async(lambda: events.find(dead), 15, "DEAD(n1)")
        ev = events.find(dead)
        assert isinstance(ev, ViewChanged)
        (change,) = [c for c in ev.changes if c.node_id == "n1"]
        cfg = servers[0].config
        assert len(change.evidence) >= 2  # a quorum of the 3 replicas
        assert [e.arbiter_id for e in change.evidence] == sorted(
            e.arbiter_id for e in change.evidence
        )
        for e in change.evidence:
            assert e.detector == "missed"
            assert e.suspicion is not None and e.suspicion >= cfg.missed_heartbeats
            assert e.silence is not None and e.silence >= cfg.suspect_after * 0.99
    finally:
        await events.close()
        async with asyncio.timeout(10):
            await watcher.close()
            await node.close()


async def test_status_interval_grows_with_the_budget_and_nodes_follow_it() -> None:
    # A budget of 10 heartbeats/s with 3 nodes needs 0.3 s: the ladder gives
    # 0.15 x 1.25^4 = 0.366 s; leases and suspicion scale with it.
    cfg = ArbiterConfig.local(heartbeat_budget=10.0)
    servers = await _start(cfg)
    nodes = [MembershipClient(_addrs(servers), node_id=f"n{i}") for i in range(3)]
    try:
        await wait_async(lambda: any(x.driver.is_leader for x in servers), 15, "a leader")
        for n in nodes:
            await n.start()
        for n in nodes:
            await n.wait_alive(timeout=10)
        expected = 0.15 * 1.25**4
        await wait_async(
            lambda: all(abs(n.interval - expected) < 1e-6 for n in nodes),
            10,
            "every node at the suggested interval",
        )
        for n in nodes:
            await n.wait_fenced(False, timeout=10)
        # Stable at the slower cadence for a few detection times: nobody is
        # suspected, every node holds a quorum of leases.
        start = time.monotonic()
        d = cfg.missed_heartbeats * expected
        while time.monotonic() - start < 2 * d:
            for s in servers:
                assert s.driver.local_suspects() == []
            assert not any(n.fenced for n in nodes)
            await asyncio.sleep(0.1)
        view = (await nodes[0].get_view()).view
        assert {m.node_id for m in view.alive()} == {"n0", "n1", "n2"}
    finally:
        for n in nodes:
            await n.close()
        for s in servers:
            await s.stop(grace=0)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "x", True])
async def test_status_watch_with_a_bad_status_interval_raises_at_once(bad: object) -> None:
    client = MembershipClient(["127.0.0.1:1"], config=ClientConfig(follow_view=False))
    try:
        with pytest.raises(InvalidArgument, match="status_interval"):
            async with asyncio.timeout(5):
                await anext(client.watch(status=True, status_interval=bad))  # type: ignore[arg-type]
    finally:
        await client.close()
