"""Leave and eviction rules on real processes (plaintext, ``--insecure``).

A Leave ends only the life the cluster records ALIVE, or the one a node is
joining with (tally rule 5): one for an id nobody heard, or above the
recorded incarnation, changes nothing and commits nothing. Removing another
node is ``membership admin remove`` (tally rule 5a): the node becomes LEFT,
logs an ERROR, gets an ``Evicted`` event and a CLI node exits 3.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import time
from typing import Any

import grpc
import pytest

from arbiter.server.app import ArbiterServer
from arbiter.server.net.authz import Refusal
from arbiter.server.ops.admin import AdminServicer
from membership import EndReason, Evicted, MembershipClient, MemberState, SessionEvent
from membership._config import ClientConfig
from membership.cli.admin.remove import remove_node
from membership.shared.errors import RejectedError
from membership.testing.localcluster import node_args
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc
from tests.integration.harness import ProcCluster, changes, run_cli, wait_until

pytestmark = pytest.mark.integration


def _alive_incarnation(node: Any, node_id: str) -> int:
    """Waits until a CLI node prints that it is ALIVE; returns its incarnation."""
    pattern = rf"{node_id}: incarnation (\d+) is ALIVE"
    found = wait_until(
        lambda: [m for line in node.lines() if (m := re.match(pattern, line))],
        20,
        f"{node_id} ALIVE",
    )
    return int(found[-1][1])


def _views(cluster: ProcCluster) -> dict[str, dict[str, Any]]:
    """Every replica's own applied view (``view --json`` against each one)."""
    views = {}
    for rid in cluster.arbiters:
        v = cluster.view(rid)
        assert v is not None, f"{rid} did not answer"
        views[rid] = v
    return views


def _member(view: dict[str, Any], node_id: str) -> dict[str, Any] | None:
    return next((m for m in view["members"] if m["node_id"] == node_id), None)


async def _leave(address: str, node_id: str, incarnation: int) -> tuple[grpc.StatusCode, str]:
    """A raw Leave from a client that is not the node; (status code, details)."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            resp = await pb_grpc.MembershipStub(channel).Leave(
                pb.LeaveRequest(node_id=node_id, incarnation=incarnation), timeout=10
            )
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details() or ""
    return grpc.StatusCode.OK, f"epoch={resp.epoch} joined={resp.joined}"


def test_leave_for_a_ghost_or_above_the_record_changes_nothing(cluster: ProcCluster) -> None:
    cluster.start_arbiters(3)
    wait_until(cluster.leader, 20, "a leader")
    node = cluster.start_node("n1", "--no-status-probes")
    k = _alive_incarnation(node, "n1")
    wait_until(
        lambda: all(
            (_member(v, "n1") or {}).get("state") == "ALIVE" for v in _views(cluster).values()
        ),
        10,
        "every replica to record n1 ALIVE",
    )
    before = _views(cluster)
    epoch = before["a1"]["epoch"]
    assert {v["epoch"] for v in before.values()} == {epoch}

    async def refusals() -> list[tuple[grpc.StatusCode, str]]:
        out = []
        for address in cluster.addresses:  # the leader and the followers alike
            out.append(await _leave(address, "ghost", 1))
            out.append(await _leave(address, "n1", k + 1))
            out.append(await _leave(address, "n1", k - 1))
        return out

    answers = asyncio.run(refusals())
    for i in range(0, len(answers), 3):
        ghost, above, below = answers[i : i + 3]
        assert ghost[0] is grpc.StatusCode.NOT_FOUND, ghost
        assert "ghost is unknown to the cluster" in ghost[1], ghost
        assert above[0] is grpc.StatusCode.FAILED_PRECONDITION, above
        assert f"records n1 ALIVE at incarnation {k}" in above[1], above
        assert below[0] is grpc.StatusCode.FAILED_PRECONDITION, below
        assert f"stale incarnation {k - 1}" in below[1], below
    # Nothing committed: no epoch, no record for the ghost, n1 untouched and
    # still running (the old bug: a Leave at k+1 made n1 DEAD at k, then LEFT).
    after = _views(cluster)
    for rid, view in after.items():
        assert view["epoch"] == epoch, (rid, view)
        assert _member(view, "ghost") is None, (rid, view)
        n1 = _member(view, "n1")
        assert n1 is not None and (n1["state"], n1["incarnation"]) == ("ALIVE", k), (rid, n1)
    assert node.alive()
    # Its own leave still works: LEFT at k, exit 0.
    node.signal(signal.SIGTERM)
    assert node.popen.wait(15) == 0, node.stderr()
    assert f"n1: LEFT at epoch {epoch + 1}" in node.lines()


def test_leave_of_the_incarnation_being_joined_retires_it(cluster: ProcCluster) -> None:
    cluster.start_arbiters(3)
    wait_until(cluster.leader, 20, "a leader")
    first = cluster.addresses[0]
    # n2 heartbeats one replica of three: heard, never a member (a quorum is 2).
    node = cluster.spawn(
        "n2",
        *node_args("n2", [first], "--no-status-probes", "--incarnation", "7"),
        log_level="debug",
    )
    # An ack means a1's detector took the heartbeat: a1 hears n2 at 7.
    wait_until(lambda: f"heartbeat stream to {first} is up" in node.stderr(), 20, "an ack")
    epoch = _views(cluster)["a1"]["epoch"]

    async def above() -> tuple[grpc.StatusCode, str]:
        # a2 learns that a1 hears n2 once a1's observation is committed and applied,
        # a Raft round after the ack; until then it rightly answers NOT_FOUND ("no
        # arbiter heard it"), committing nothing. (The views read above used to
        # take two seconds of CLI starts, which hid that round.)
        deadline = time.monotonic() + 10
        while True:
            code, details = await _leave(cluster.addresses[1], "n2", 8)
            if code is not grpc.StatusCode.NOT_FOUND or time.monotonic() > deadline:
                return code, details
            await asyncio.sleep(0.05)

    # Above the joining incarnation: refused, nothing committed.
    code, details = asyncio.run(above())
    assert code is grpc.StatusCode.FAILED_PRECONDITION, (code, details)
    assert "incarnation 8 of n2 is neither recorded nor joining" in details
    node.signal(signal.SIGTERM)
    assert node.popen.wait(15) == 0, node.stderr()
    assert "n2: left before it joined the view (no record kept)" in node.lines(), node.stdout()

    async def again() -> list[tuple[grpc.StatusCode, str]]:
        return [await _leave(a, "n2", 7) for a in cluster.addresses]

    # Retired everywhere: a repeat is accepted by every replica, changing nothing.
    for code, details in asyncio.run(again()):
        assert code is grpc.StatusCode.OK and "joined=False" in details, (code, details)
    for rid, view in _views(cluster).items():
        assert view["epoch"] == epoch and _member(view, "n2") is None, (rid, view)


def test_admin_remove_makes_a_live_node_left_and_the_cli_node_exits_three(
    cluster: ProcCluster,
) -> None:
    cluster.start_arbiters(3)
    wait_until(cluster.leader, 20, "a leader")
    watch = cluster.start_watch("w", "a2")
    # n1's admission must come as a change, not inside the watcher's snapshot.
    wait_until(
        lambda: any(ev["type"] == "snapshot" for ev in watch.json_lines()),
        20,
        "the watcher's snapshot",
    )
    node = cluster.start_node("n1", "--no-status-probes")  # rejoins when DEAD, by default
    k = _alive_incarnation(node, "n1")
    r = run_cli("admin", "remove", "n1", "--arbiters", cluster.arbiter_list())
    assert r.returncode == 0, r.stderr
    m = re.fullmatch(rf"n1 removed: incarnation {k} is LEFT at epoch (\d+) \(by (.+)\)\n", r.stdout)
    assert m is not None, r.stdout
    epoch, by = int(m[1]), m[2]
    assert by.startswith("unauthenticated client ipv"), by  # --insecure: nobody is known
    # The node is told, says so loudly, and stops without rejoining.
    assert node.popen.wait(15) == 3, node.stderr()
    err = node.stderr()
    assert re.search(rf"ERROR .*n1 incarnation {k} was removed from the cluster", err), err
    assert (
        "n1 was removed from the cluster: it is LEFT without having asked"
        in (err.strip().splitlines()[-1])
    )
    assert f"n1: incarnation {k} removed from the cluster (LEFT without asking); stopping" in (
        node.lines()
    )
    # Committed like any view change, with who removed it.
    left = wait_until(
        lambda: [c for c in changes(watch, "n1") if c["state"] == "LEFT"], 10, "the LEFT change"
    )
    assert (left[0]["epoch"], left[0]["incarnation"], left[0]["removed_by"]) == (epoch, k, by)

    # Every replica applies it; one the watcher is not on may be a Raft round behind.
    def final_everywhere() -> dict[str, dict[str, Any]] | None:
        views = _views(cluster)
        final = all(
            (n := _member(v, "n1")) is not None and n["state"] in ("LEFT", "DEAD")
            for v in views.values()
        )
        return views if final else None

    for rid, view in wait_until(final_everywhere, 10, "n1 final on every replica").items():
        n1 = _member(view, "n1")
        assert n1 is not None and (n1["state"], n1["incarnation"]) == ("LEFT", k), (rid, n1)
    # Removing it again, or a node the cluster never had: exit 1, one line.
    for target, code, text in [
        ("n1", "FAILED_PRECONDITION", f"n1 is already LEFT at incarnation {k}"),
        ("ghost", "NOT_FOUND", "ghost is not a member: the cluster has no record of it"),
    ]:
        r = run_cli("admin", "remove", target, "--arbiters", cluster.arbiter_list())
        assert r.returncode == 1, (target, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert lines[0].startswith(f"membership admin remove: error: {code}: "), lines[0]
        assert text in lines[0], lines[0]
    assert [c["state"] for c in changes(watch, "n1")] == ["ALIVE", "LEFT"]


def test_admin_remove_gives_the_sdk_an_evicted_event(
    cluster: ProcCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.start_arbiters(3)
    wait_until(cluster.leader, 20, "a leader")
    events: list[SessionEvent] = []

    async def run() -> None:
        config = ClientConfig(follow_view=False, collect_status=False)
        async with MembershipClient(
            cluster.addresses, node_id="n3", config=config, on_event=events.append
        ) as client:
            await client.wait_alive(timeout=20)
            incarnation = client.incarnation
            removal = await remove_node(cluster.addresses, "n3", incarnation=incarnation)
            assert (removal.node_id, removal.incarnation) == ("n3", incarnation)
            await asyncio.wait_for(client.ended.wait(), 15)
            assert client.end_reason is EndReason.REMOVED
            assert client.state is MemberState.LEFT
            evicted = [e for e in events if isinstance(e, Evicted)]
            assert evicted == [
                Evicted(incarnation=incarnation, state=MemberState.LEFT, rejoining=False)
            ]
            # Its own leave has nothing left to do: the session ended removed.
            with pytest.raises(RejectedError, match="session ended"):
                await client.leave(timeout=5)
            # A removal at an incarnation the cluster does not record is refused.
            with pytest.raises(RejectedError, match="FAILED_PRECONDITION"):
                await remove_node(cluster.addresses, "n3", incarnation=incarnation + 1)

    with caplog.at_level(logging.ERROR, logger="membership"):
        asyncio.run(run())
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any("n3 incarnation" in r.getMessage() and "removed" in r.getMessage() for r in errors)


class _NotAdmin:
    """An authorizer that refuses every administrative call (as mutual TLS does for a
    node certificate)."""

    def node(self, context: Any, node_id: str) -> Refusal | None:
        return None

    def replica(self, context: Any, replica_id: str) -> Refusal | None:
        return None

    def reader(self, context: Any) -> Refusal | None:
        return None

    def admin(self, context: Any) -> Refusal | None:
        return Refusal("spiffe://test/node/n1 may not administer: it may heartbeat as n1")

    def identity(self, context: Any) -> str:
        return "spiffe://test/node/n1"


async def test_admin_remove_refused_by_the_authorizer_is_permission_denied(
    replicas: list[ArbiterServer],
) -> None:
    driver = replicas[0].driver
    server = grpc.aio.server()
    pb_grpc.add_AdminServicer_to_server(AdminServicer(driver, authz=_NotAdmin()), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        commit = driver.status()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await pb_grpc.AdminStub(channel).RemoveNode(
                    pb.RemoveNodeRequest(node_id="n1"), timeout=5
                )
        assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "may not administer" in (info.value.details() or "")
        assert driver.status().epoch == commit.epoch  # nothing proposed
        # Through the real service (AllowAll, --insecure): the same node is
        # simply not a member.
        with pytest.raises(RejectedError, match="NOT_FOUND: arbiter a1: n1 is not a member"):
            await remove_node([replicas[0].listen], "n1", timeout=5)
    finally:
        await server.stop(grace=None)
