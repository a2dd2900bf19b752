"""Bad input gets a gRPC status with a message, and never disturbs the other nodes.

Three replicas run in this process (real gRPC on loopback); a well-behaved
node keeps heartbeating through the SDK while raw streams misbehave.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from arbiter.server.app import ArbiterServer
from membership import MembershipClient, MemberState
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc
from tests.integration.harness import wait_async

pytestmark = pytest.mark.integration


@pytest.fixture
async def good_node(replicas: list[ArbiterServer]) -> AsyncIterator[MembershipClient]:
    client = MembershipClient([f"127.0.0.1:{s.port}" for s in replicas], node_id="good")
    async with client:
        await client.wait_alive(timeout=10)
        for s in replicas:  # admitted on every replica, not only the first to answer
            await wait_async(
                lambda s=s: (
                    (m := s.driver.state.member("good")) is not None
                    and m.state is MemberState.ALIVE
                ),
                10,
                f"{s.replica_id} to apply the admission",
            )
        yield client


def _heartbeat(node_id: str = "bad", **kw: object) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(node_id=node_id, incarnation=1, seq=1, **kw)  # type: ignore[arg-type]


async def _stream_error(addr: str, *requests: pb.HeartbeatRequest) -> tuple[grpc.StatusCode, str]:
    """Sends ``requests`` on one heartbeat stream; returns the status the server ended it with."""
    async with grpc.aio.insecure_channel(addr) as ch:
        call = pb_grpc.MembershipStub(ch).Heartbeat()
        try:
            # Lockstep (write, then read its ack) so that the server's status
            # reaches a read rather than a write into a closed call.
            for r in requests:
                await call.write(r)
                if await call.read() is grpc.aio.EOF:
                    break
        except grpc.aio.AioRpcError:
            pass  # the status below says why
        code = await call.code()
        assert code != grpc.StatusCode.OK, "the stream was not refused"
        return code, await call.details()


BAD_HEARTBEATS = [
    pytest.param(_heartbeat(""), "node_id is empty", id="empty-id"),
    pytest.param(_heartbeat("x" * 129), "the limit is MAX_NODE_ID = 128", id="long-id"),
    pytest.param(_heartbeat("bad id!"), "characters other than", id="bad-chars"),
    pytest.param(
        pb.HeartbeatRequest(node_id="ok", incarnation=0, seq=1),
        "incarnation",
        id="zero-incarnation",
    ),
    pytest.param(_heartbeat(labels={"rack": "x" * 300}), "MAX_LABEL_VALUE = 256", id="long-label"),
    pytest.param(
        _heartbeat(labels={f"k{i}": "v" for i in range(40)}), "40 labels", id="too-many-labels"
    ),
    pytest.param(_heartbeat(labels={"bad key": "v"}), "label key", id="bad-label-key"),
    pytest.param(_heartbeat(status=pb.NodeStatus(phase="p" * 100)), "phase", id="long-phase"),
]


@pytest.mark.parametrize(("request_", "message"), BAD_HEARTBEATS)
async def test_bad_input_heartbeat_invalid_argument_with_message(
    replicas: list[ArbiterServer],
    good_node: MembershipClient,
    request_: pb.HeartbeatRequest,
    message: str,
) -> None:
    code, details = await _stream_error(f"127.0.0.1:{replicas[0].port}", request_)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in details
    assert good_node.state is MemberState.ALIVE


async def test_bad_input_node_id_change_within_stream_refused(
    replicas: list[ArbiterServer],
    good_node: MembershipClient,
) -> None:
    code, details = await _stream_error(
        f"127.0.0.1:{replicas[0].port}", _heartbeat("x1"), _heartbeat("x2")
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "changed" in details


async def test_bad_input_oversized_message_refused(
    replicas: list[ArbiterServer],
    good_node: MembershipClient,
) -> None:
    big = _heartbeat(status=pb.NodeStatus(gauges={f"g{i}": 1.0 for i in range(6000)}))
    code, details = await _stream_error(f"127.0.0.1:{replicas[0].port}", big)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details.startswith("max_message_bytes: the message is "), details
    assert details.endswith("bytes, the limit is 65536"), details
    async with grpc.aio.insecure_channel(f"127.0.0.1:{replicas[0].port}") as ch:
        stub = pb_grpc.MembershipStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Leave(pb.LeaveRequest(node_id="x" * 70_000, incarnation=1), timeout=5)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (info.value.details() or "").startswith("max_message_bytes:")
    assert good_node.state is MemberState.ALIVE


async def test_bad_input_raft_entries_beyond_the_client_limit_replicate(
    replicas: list[ArbiterServer],
) -> None:
    """Raft traffic is held to max_peer_message_bytes, not the clients' 64 KiB: a
    replica that hears 1,000 new nodes at once proposes one 100 KB batch."""
    leader = next(s for s in replicas if s.driver.is_leader)
    term = leader.driver.status().term
    ids = [f"node-{i:04d}" for i in range(1000)]
    for node_id in ids:
        leader.driver.on_heartbeat(node_id, 1_733_000_000_000, {"rack": "r1", "zone": "z1"})
    for s in replicas:
        await wait_async(
            lambda s=s: all(
                s.driver.state.observation(leader.replica_id, n) is not None for n in ids
            ),
            15,
            f"{s.replica_id} to apply the batch",
        )
    # Replicated as it was proposed: no broken stream, no election meanwhile (a
    # refused append breaks the leader's stream, the followers hear nothing and
    # elect; the batch gets through only after elections, if at all).
    assert leader.driver.is_leader and leader.driver.status().term == term


async def test_bad_input_heartbeat_flood_is_cut_and_others_unharmed(
    replicas: list[ArbiterServer],
    good_node: MembershipClient,
) -> None:
    addr = f"127.0.0.1:{replicas[0].port}"
    flood = [pb.HeartbeatRequest(node_id="flood", incarnation=1, seq=i) for i in range(1, 400)]
    code, details = await _stream_error(addr, *flood)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "heartbeats per second" in details
    # the well-behaved node is still ALIVE everywhere and was never suspected
    for s in replicas:
        member = s.driver.state.member("good")
        assert member is not None and member.state is MemberState.ALIVE
        assert s.driver.state.suspected_by("good") == ()
    assert not good_node.fenced


async def test_bad_input_leave_unknown_incarnation_is_failed_precondition(
    replicas: list[ArbiterServer],
    good_node: MembershipClient,
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{replicas[1].port}") as ch:
        stub = pb_grpc.MembershipStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Leave(pb.LeaveRequest(node_id="good", incarnation=1), timeout=5)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Leave(pb.LeaveRequest(node_id="", incarnation=1), timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert good_node.state is MemberState.ALIVE


async def test_bad_input_sdk_leave_gives_left(
    replicas: list[ArbiterServer],
    good_node: MembershipClient,
) -> None:
    epoch = await good_node.leave(timeout=5)
    for s in replicas:
        await wait_async(lambda s=s: s.driver.state.epoch >= epoch, 5, "the leave applied")
        member = s.driver.state.member("good")
        assert member is not None and member.state is MemberState.LEFT
