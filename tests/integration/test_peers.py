"""The replica-to-replica transport never gives up on a peer (in-process, real gRPC)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from arbiter.core.raft import Message, MessageType
from arbiter.server.consensus.peers import PeerServicer, PeerTransport
from arbiter.v1 import peer_pb2_grpc
from membership.testing.localcluster import free_ports
from tests.integration.harness import wait_async

pytestmark = pytest.mark.integration


async def test_peers_sender_survives_a_failing_unreachable_hint() -> None:
    (port,) = free_ports(1)
    addr = f"127.0.0.1:{port}"
    hints: list[str] = []

    def report(peer: str) -> None:
        hints.append(peer)
        raise RuntimeError("a bug in the hint handler")

    transport = PeerTransport(
        self_id="a1",
        peers={"a1": "127.0.0.1:1", "a2": addr},
        cluster="c@x",
        report_unreachable=report,
        channel_options=[("grpc.initial_reconnect_backoff_ms", 50)],
    )
    got: list[Message] = []
    server = grpc.aio.server()
    peer_pb2_grpc.add_PeerServicer_to_server(
        PeerServicer(cluster="c@x", deliver=got.append, known={"a1", "a2"}), server
    )
    transport.start()
    try:
        # a2 is down: sending fails, the hint handler raises, the sender must live on.
        transport.send(Message(type=MessageType.HEARTBEAT, src="a1", dst="a2", term=1))
        await wait_async(lambda: len(hints) >= 2, 10, "the sender to retry after the failure")
        server.add_insecure_port(addr)
        await server.start()

        async def keep_sending() -> None:  # Raft re-sends heartbeats; so does this producer
            for term in range(2, 1000):
                transport.send(Message(type=MessageType.HEARTBEAT, src="a1", dst="a2", term=term))
                await asyncio.sleep(0.1)

        producer = asyncio.get_running_loop().create_task(keep_sending())
        try:
            await wait_async(lambda: bool(got), 10, "a message to reach a2 once it is up")
        finally:
            producer.cancel()
        assert got[-1].src == "a1" and got[-1].type is MessageType.HEARTBEAT
    finally:
        await transport.close()
        await server.stop(0)


async def test_peers_first_message_after_reconnect_is_not_lost() -> None:
    # While a peer is down every attempt opens (and loses) a stream; gRPC may
    # keep pulling from the request iterators of those dead streams. The first
    # message queued once the peer is back must still reach it (it used to be
    # taken by a dead stream's reader: elections stalled for seconds).
    (port,) = free_ports(1)
    addr = f"127.0.0.1:{port}"
    hints: list[str] = []
    transport = PeerTransport(
        self_id="a1",
        peers={"a1": "127.0.0.1:1", "a2": addr},
        cluster="c@x",
        report_unreachable=hints.append,
        channel_options=[("grpc.initial_reconnect_backoff_ms", 50)],
    )
    got: list[Message] = []
    server = grpc.aio.server()
    peer_pb2_grpc.add_PeerServicer_to_server(
        PeerServicer(cluster="c@x", deliver=got.append, known={"a1", "a2"}), server
    )
    transport.start()
    try:
        for term in range(1, 4):  # messages while a2 is down: attempts fail and pile up
            transport.send(Message(type=MessageType.HEARTBEAT, src="a1", dst="a2", term=term))
            await wait_async(lambda t=term: len(hints) >= t, 10, "a failed attempt")
        server.add_insecure_port(addr)
        await server.start()
        transport.send(Message(type=MessageType.PRE_VOTE, src="a1", dst="a2", term=9))
        await wait_async(lambda: any(m.term == 9 for m in got), 10, "the one message sent")
    finally:
        await transport.close()
        await server.stop(0)
