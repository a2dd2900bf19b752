"""The SDK as users expect it (issue 9): leaving on exit, one cluster checked, watchers
that know when they are blind, a frozen first replica not waited on, future epochs refused.

Replicas run in this process (real gRPC on loopback); frozen links come from the
TCP proxy of tests/support/netproxy.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from arbiter.config import ArbiterConfig
from arbiter.server.app import ArbiterServer
from membership import (
    ClientConfig,
    MembershipClient,
    MemberState,
    ViewChanged,
    ViewEvent,
    ViewSnapshot,
)
from membership._node.session import EndReason, Fenced
from membership.shared.errors import ClusterMismatch, EpochOutOfRange
from membership.shared.view import Disconnected, Reconnected, ViewReset
from membership.testing.localcluster import free_ports
from tests.integration.harness import wait_async
from tests.support.netproxy import TcpProxy

pytestmark = pytest.mark.integration

WATCH = ClientConfig(follow_view=False)


def _addrs(servers: list[ArbiterServer]) -> list[str]:
    return [f"127.0.0.1:{s.port}" for s in servers]


def _state(servers: list[ArbiterServer], node_id: str) -> tuple[int, MemberState] | None:
    """(incarnation, state) of ``node_id`` in the first replica's applied view."""
    m = servers[0].driver.state.member(node_id)
    return None if m is None else (m.incarnation, m.state)


@contextlib.asynccontextmanager
async def _events(client: MembershipClient, **kwargs: object) -> AsyncIterator[list[ViewEvent]]:
    """Collects ``client.watch(**kwargs)`` events in the background."""
    events: list[ViewEvent] = []
    errors: list[BaseException] = []

    async def pump() -> None:
        try:
            async for ev in client.watch(**kwargs):  # type: ignore[arg-type]
                events.append(ev)
        except Exception as e:
            errors.append(e)

    task = asyncio.get_running_loop().create_task(pump())
    try:
        yield events
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert not errors, errors


# --- lifecycle ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["normally", "by an exception", "by cancellation"])
async def test_sdk_leaving_the_context_leaves_the_cluster(
    replicas: list[ArbiterServer], how: str
) -> None:
    entered = asyncio.Event()

    async def member() -> None:
        async with MembershipClient(_addrs(replicas), node_id="n1", config=WATCH) as client:
            await client.wait_alive(timeout=10)
            entered.set()
            if how == "by an exception":
                raise RuntimeError("the training loop crashed")
            if how == "by cancellation":
                await asyncio.Event().wait()

    task = asyncio.get_running_loop().create_task(member())
    await asyncio.wait_for(entered.wait(), 15)
    if how == "by cancellation":
        task.cancel()
    with contextlib.suppress(RuntimeError, asyncio.CancelledError):
        await asyncio.wait_for(task, 15)
    # The leave was answered once applied by the replica that took it; replica
    # 0 may be a follower a Raft round behind: wait for its record to be final.
    await wait_async(
        lambda: (_state(replicas, "n1") or (0, None))[1] in (MemberState.LEFT, MemberState.DEAD),
        10,
        "n1 final on replica 0",
    )
    record = _state(replicas, "n1")
    assert record is not None and record[1] is MemberState.LEFT, record


async def test_sdk_leave_on_exit_false_only_stops(replicas: list[ArbiterServer]) -> None:
    async with MembershipClient(
        _addrs(replicas), node_id="n1", config=WATCH, leave_on_exit=False
    ) as client:
        await client.wait_alive(timeout=10)
    # Not LEFT: the cluster declares the silent node DEAD once a quorum suspects it.
    await wait_async(
        lambda: (_state(replicas, "n1") or (0, None))[1] is MemberState.DEAD, 10, "n1 DEAD"
    )


async def test_sdk_node_that_never_joined_leaves_no_record(replicas: list[ArbiterServer]) -> None:
    # n1 lists one replica of three: it is heard, but one opinion can never
    # admit it (a quorum is 2). Leaving retires its incarnation: no record, no
    # epoch, and its late heartbeats cannot admit it afterwards.
    epoch = replicas[0].driver.state.epoch
    first = _addrs(replicas)[0]
    client = MembershipClient([first], node_id="n1", config=WATCH)
    await client.start()
    try:
        await wait_async(lambda: client.stream_healthy[first], 10, "one ack")
        assert client.state is MemberState.JOINING
        left_at = await client.leave(timeout=5)
    finally:
        await client.close()
    assert client.end_reason is EndReason.LEFT
    assert client.state is MemberState.JOINING  # it never was a member
    assert left_at == epoch
    for s in replicas:
        assert s.driver.state.member("n1") is None
        assert s.driver.state.epoch == epoch
    await wait_async(lambda: replicas[0].driver.state.retired("n1") > 0, 5, "retired")


async def test_sdk_node_short_of_a_quorum_logs_why(
    replicas: list[ArbiterServer], caplog: pytest.LogCaptureFixture
) -> None:
    # Two of the three arbiters it lists never answer: it logs, every few
    # seconds, that it waits for a majority and why each of the others fails.
    dead = [f"127.0.0.1:{p}" for p in free_ports(2)]
    config = ClientConfig(follow_view=False, reachability_log_interval=0.3)
    caplog.set_level(logging.WARNING, logger="membership.client")
    async with MembershipClient(
        [_addrs(replicas)[0], *dead], node_id="n1", config=config, leave_on_exit=False
    ):
        await wait_async(
            lambda: sum("waits for a majority" in r.getMessage() for r in caplog.records) >= 2,
            10,
            "two reachability warnings",
        )
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "1 answered" in text and all(f"{d}: UNAVAILABLE" in text for d in dead), text
    assert "cannot join" in text
    for s in replicas:  # not a heartbeat anywhere before a majority answered
        assert s.driver.observer.tracked() == 0


# --- one cluster -------------------------------------------------------------------------


def _stranger(addr: str) -> ArbiterServer:
    """A one-replica cluster named "other" at ``addr`` (its own identity)."""
    return ArbiterServer(
        replica_id="b1",
        peers={"b1": addr},
        listen=addr,
        config=ArbiterConfig.local(cluster="other"),
    )


@pytest.fixture
async def other_cluster() -> AsyncIterator[ArbiterServer]:
    """A one-replica cluster named "other", started, leading."""
    (port,) = free_ports(1)
    server = _stranger(f"127.0.0.1:{port}")
    await server.start()
    try:
        await wait_async(lambda: server.driver.is_leader, 10, "b1 leads")
        yield server
    finally:
        await server.stop(grace=0)


async def test_sdk_arbiters_of_two_clusters_are_refused_before_any_heartbeat(
    replicas: list[ArbiterServer], other_cluster: ArbiterServer
) -> None:
    mixed = [*_addrs(replicas)[:2], f"127.0.0.1:{other_cluster.port}"]
    client = MembershipClient(mixed, node_id="n1", config=WATCH)
    async with client:
        with pytest.raises(ClusterMismatch) as info:
            await client.wait_alive(timeout=10)
    text = str(info.value)
    assert f"127.0.0.1:{other_cluster.port} in cluster other@" in text
    assert all(a in text for a in mixed[:2]), text
    assert client.ended.is_set() and client.error is info.value
    # It joined neither: no replica of either cluster heard it.
    for s in [*replicas, other_cluster]:
        assert s.driver.observer.tracked() == 0, s.replica_id
    # A watcher given the same list is refused too.
    watcher = MembershipClient(mixed, config=WATCH)
    try:
        with pytest.raises(ClusterMismatch):
            async with asyncio.timeout(10):
                async for _ in watcher.watch():
                    pass
    finally:
        await watcher.close()


async def test_sdk_one_replica_listed_under_two_addresses_is_refused(
    replicas: list[ArbiterServer],
) -> None:
    # 127.0.0.1:P and localhost:P are one replica: counted twice it would give
    # the node a quorum of leases it does not have (fresh-user trial).
    port = replicas[0].port
    twice = [f"127.0.0.1:{port}", f"localhost:{port}", _addrs(replicas)[1]]
    client = MembershipClient(twice, node_id="n1", config=WATCH)
    async with client:
        with pytest.raises(ClusterMismatch) as info:
            await client.wait_alive(timeout=10)
    assert f"are one arbiter ({replicas[0].replica_id})" in str(info.value)
    assert all(s.driver.observer.tracked() == 0 for s in replicas)


async def test_sdk_stranger_coming_up_later_is_refused_and_the_node_keeps_its_cluster(
    replicas: list[ArbiterServer], caplog: pytest.LogCaptureFixture
) -> None:
    # The third address is down at the start; once the node has its cluster
    # (a majority answered), it comes up as another cluster's replica. The
    # node refuses that address, says so, and stays ALIVE and unfenced.
    (port,) = free_ports(1)
    stranger_addr = f"127.0.0.1:{port}"
    listed = [*_addrs(replicas)[:2], stranger_addr]
    caplog.set_level(logging.ERROR, logger="membership")
    async with MembershipClient(listed, node_id="n1", config=WATCH) as node:
        await node.wait_alive(timeout=10)
        await node.wait_fenced(False, timeout=10)
        stranger = _stranger(stranger_addr)
        await stranger.start()
        try:
            await wait_async(
                lambda: any("refused" in r.getMessage() for r in caplog.records), 15, "refused"
            )
            assert node.error is None and not node.ended.is_set()
            assert node.is_member and node.state is MemberState.ALIVE
            assert stranger.driver.observer.tracked() == 0  # it registered nothing there
            text = "\n".join(r.getMessage() for r in caplog.records)
            assert stranger_addr in text and "other@" in text, text
        finally:
            await stranger.stop(grace=0)
    # The leave is committed when it returns; the first replica applies it
    # at its next Raft round: wait for the record to end, then say how.
    await wait_async(
        lambda: (_state(replicas, "n1") or (0, None))[1] in (MemberState.LEFT, MemberState.DEAD),
        10,
        "n1's record ended",
    )
    record = _state(replicas, "n1")
    assert record is not None and record[1] is MemberState.LEFT  # left, never DEAD


async def test_sdk_view_of_two_clusters_is_refused(
    replicas: list[ArbiterServer], other_cluster: ArbiterServer
) -> None:
    # The first listed arbiter answers at once; the others are still checked.
    mixed = [f"127.0.0.1:{other_cluster.port}", *_addrs(replicas)[:2]]
    client = MembershipClient(mixed, config=WATCH)
    try:
        with pytest.raises(ClusterMismatch):
            await client.get_view()
    finally:
        await client.close()


async def test_sdk_expected_cluster_name_is_checked(replicas: list[ArbiterServer]) -> None:
    client = MembershipClient(_addrs(replicas), config=WATCH, cluster="prod")
    await client.start()
    try:
        with pytest.raises(ClusterMismatch, match="not 'prod'"):
            await client.wait_connected(timeout=10)
    finally:
        await client.close()
    ok = MembershipClient(_addrs(replicas), config=WATCH, cluster="default")
    await ok.start()
    try:
        assert (await ok.wait_connected(timeout=10)).startswith("default@")
    finally:
        await ok.close()


# --- watchers ------------------------------------------------------------------------------


async def test_sdk_future_since_epoch_is_refused_or_reset(replicas: list[ArbiterServer]) -> None:
    async with MembershipClient(_addrs(replicas), node_id="n1", config=WATCH) as node:
        await node.wait_alive(timeout=10)
        epoch = replicas[0].driver.state.epoch
        watcher = MembershipClient(_addrs(replicas), config=WATCH)
        try:
            t0 = time.monotonic()
            with pytest.raises(EpochOutOfRange) as info:
                async with asyncio.timeout(15):
                    async for _ in watcher.watch(since_epoch=9999):
                        pass
            assert info.value.since_epoch == 9999 and info.value.cluster_epoch == epoch
            assert time.monotonic() - t0 < 10
            seen: list[ViewEvent] = []
            async with asyncio.timeout(15):
                async for ev in watcher.watch(since_epoch=9999, reset_if_ahead=True):
                    seen.append(ev)
                    if isinstance(ev, ViewSnapshot):
                        break
            resets = [e for e in seen if isinstance(e, ViewReset)]
            assert resets == [ViewReset(since_epoch=9999, cluster_epoch=epoch)]
            assert isinstance(seen[-1], ViewSnapshot) and seen[-1].view.epoch == epoch
            assert seen[-1].epoch == epoch  # as ViewChanged.epoch (issue 25, item 8)
            assert seen.index(resets[0]) < len(seen) - 1
        finally:
            await watcher.close()


@pytest.fixture
def proxies() -> AsyncIterator[list[TcpProxy]]:  # type: ignore[misc]
    made: list[TcpProxy] = []
    try:
        yield made  # type: ignore[misc]
    finally:
        for p in made:
            p.close()


async def test_sdk_frozen_first_replica_does_not_delay_the_first_snapshot(
    replicas: list[ArbiterServer], proxies: list[TcpProxy]
) -> None:
    # The first listed replica accepts connections and never answers.
    proxy = TcpProxy(_addrs(replicas)[0]).start()
    proxies.append(proxy)
    proxy.freeze()
    addrs = [proxy.address, *_addrs(replicas)[1:]]
    watcher = MembershipClient(addrs, config=WATCH)
    try:
        t0 = time.monotonic()
        async with asyncio.timeout(10):
            async for ev in watcher.watch():
                if isinstance(ev, ViewSnapshot):
                    break
        first_snapshot = time.monotonic() - t0
        t0 = time.monotonic()
        info = await watcher.get_view()
        get_view = time.monotonic() - t0
    finally:
        await watcher.close()
    assert first_snapshot < 3.0, first_snapshot
    assert get_view < 3.0 and info.in_quorum, get_view
    print(f"first snapshot after {first_snapshot:.2f}s, get_view after {get_view:.2f}s")


async def test_sdk_watcher_reports_loss_and_return_of_contact(
    replicas: list[ArbiterServer], proxies: list[TcpProxy]
) -> None:
    # The watcher reaches the cluster through one frozen-able link only.
    proxy = TcpProxy(_addrs(replicas)[0]).start()
    proxies.append(proxy)
    watcher = MembershipClient([proxy.address], config=WATCH)
    try:
        async with _events(watcher) as events:
            await wait_async(lambda: any(isinstance(e, ViewSnapshot) for e in events), 10, "snap")
            proxy.freeze()
            t0 = time.monotonic()
            await wait_async(
                lambda: any(isinstance(e, Disconnected) for e in events), 10, "Disconnected"
            )
            lost_after = time.monotonic() - t0
            (lost,) = [e for e in events if isinstance(e, Disconnected)]
            assert lost.silence >= ClientConfig().disconnect_after
            assert lost.epoch == replicas[0].driver.state.epoch
            proxy.heal()
            await wait_async(
                lambda: any(isinstance(e, Reconnected) for e in events), 15, "Reconnected"
            )
            # Nothing else was lost: a change committed now still arrives.
            async with MembershipClient(_addrs(replicas), node_id="n9", config=WATCH) as n9:
                await n9.wait_alive(timeout=10)
                await wait_async(lambda: watcher.view.get("n9") is not None, 10, "n9 seen")
            assert [type(e) for e in events].count(Disconnected) == 1
    finally:
        await watcher.close()
    print(f"loss of contact reported {lost_after:.2f}s after the freeze")


async def _three_replicas(peers: dict[str, str]) -> list[ArbiterServer]:
    servers = [
        ArbiterServer(replica_id=rid, peers=peers, listen=addr, config=ArbiterConfig.local())
        for rid, addr in peers.items()
    ]
    for s in servers:
        await s.start()
    await wait_async(lambda: any(s.driver.is_leader for s in servers), 15, "a leader")
    await wait_async(lambda: all(s.driver.state.instance for s in servers), 10, "an instance")
    return servers


@pytest.mark.parametrize("reset", [False, True], ids=["raises", "resets"])
async def test_sdk_watcher_across_a_cluster_reset_never_merges_two_histories(
    reset: bool,
) -> None:
    # The whole cluster is started again on fresh state (same name, same
    # replicas: the same identity) while a watcher follows it. Its epochs are
    # another history now: it raises EpochOutOfRange, or with reset_if_ahead
    # starts again from a fresh snapshot, and never passes on a change of the
    # new history as if it came after the old one.
    peers = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(free_ports(3))}
    addrs = list(peers.values())
    servers = await _three_replicas(peers)
    old_instance = servers[0].driver.state.instance
    watcher = MembershipClient(addrs, config=WATCH)
    events: list[ViewEvent] = []
    errors: list[BaseException] = []

    async def pump() -> None:
        try:
            async for ev in watcher.watch(reset_if_ahead=reset):
                events.append(ev)
        except EpochOutOfRange as e:
            errors.append(e)

    task = asyncio.get_running_loop().create_task(pump())
    try:
        for n in ("n1", "n2"):
            async with MembershipClient(addrs, node_id=n, config=WATCH) as node:
                await node.wait_alive(timeout=10)
        await wait_async(lambda: watcher.view.epoch >= 4, 10, "the watcher at epoch 4")
        seen_before = len(events)
        for s in servers:
            await s.stop(grace=0)
        servers = await _three_replicas(peers)
        assert servers[0].driver.state.instance != old_instance
        for n in ("m1", "m2", "m3"):  # the new history reaches the old epochs
            async with MembershipClient(addrs, node_id=n, config=WATCH) as node:
                await node.wait_alive(timeout=10)
        if reset:
            await wait_async(
                lambda: any(isinstance(e, ViewSnapshot) for e in events[seen_before:]),
                20,
                "a fresh snapshot",
            )
            after = events[seen_before:]
            resets = [e for e in after if isinstance(e, ViewReset)]
            assert len(resets) == 1, after
            first_snapshot = next(i for i, e in enumerate(after) if isinstance(e, ViewSnapshot))
            assert after.index(resets[0]) < first_snapshot
            # Nothing of the new history before the reset.
            assert not any(isinstance(e, ViewChanged) for e in after[: after.index(resets[0])])
        else:
            await wait_async(lambda: errors, 20, "EpochOutOfRange")
            after = events[seen_before:]
            assert not any(isinstance(e, ViewChanged | ViewSnapshot) for e in after), after
            assert "reset" in str(errors[0]) or "beyond" in str(errors[0])
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await watcher.close()
        for s in servers:
            await s.stop(grace=0)


async def test_sdk_refused_address_is_used_again_once_the_real_replica_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a3 stops; another cluster's replica takes its port for a while (a typo
    # during a rolling restart); a3 comes back on its data dir. The node refused
    # the stranger, then heartbeats to a3 again: it is not left with two
    # arbiters for the rest of its life.
    peers = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(free_ports(3))}

    def replica(rid: str) -> ArbiterServer:
        return ArbiterServer(
            replica_id=rid,
            peers=peers,
            listen=peers[rid],
            config=ArbiterConfig.local(),
            data_dir=tmp_path / rid,
        )

    servers = {rid: replica(rid) for rid in peers}
    for s in servers.values():
        await s.start()
    caplog.set_level(logging.INFO, logger="membership")
    a3 = peers["a3"]
    try:
        await wait_async(lambda: any(s.driver.is_leader for s in servers.values()), 15, "leader")
        config = ClientConfig(follow_view=False, reachability_log_interval=0.5)
        async with MembershipClient(list(peers.values()), node_id="n1", config=config) as node:
            await node.wait_alive(timeout=10)
            await servers["a3"].stop(grace=0)
            stranger = _stranger(a3)
            await stranger.start()
            await wait_async(
                lambda: any("refused" in r.getMessage() for r in caplog.records), 15, "refused"
            )
            await stranger.stop(grace=0)
            servers["a3"] = replica("a3")
            await servers["a3"].start()
            await wait_async(lambda: node.stream_healthy[a3], 15, "heartbeats to a3 again")
            assert node.error is None and node.is_member
            assert servers["a3"].driver.observer.tracked() >= 1
    finally:
        for s in servers.values():
            await s.stop(grace=0)


async def test_sdk_node_across_a_cluster_reset_is_fenced_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The whole cluster started again on fresh state under a running node: its
    # leases and fencing epoch were the old cluster's. It says so, is fenced,
    # and holds the new cluster's leases and epochs afterwards.
    peers = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(free_ports(3))}
    addrs = list(peers.values())
    servers = await _three_replicas(peers)
    caplog.set_level(logging.WARNING, logger="membership")
    fences: list[Fenced] = []
    try:
        async with MembershipClient(
            addrs,
            node_id="n1",
            config=WATCH,
            on_event=lambda e: isinstance(e, Fenced) and fences.append(e),
        ) as node:
            await node.wait_alive(timeout=10)
            await node.wait_fenced(False, timeout=10)
            for s in servers:
                await s.stop(grace=0)
            servers = await _three_replicas(peers)
            await wait_async(
                lambda: any("the cluster was reset" in r.getMessage() for r in caplog.records),
                20,
                "the reset noticed",
            )
            await node.wait_fenced(False, timeout=20)
            assert node.fencing_epoch <= servers[0].driver.state.epoch
            assert any(f.fenced for f in fences)
    finally:
        for s in servers:
            await s.stop(grace=0)
