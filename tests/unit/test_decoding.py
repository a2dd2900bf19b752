"""arbiter/server/api/decoding.py: undecodable requests end their call with a status, a
method's handler is wrapped once, and a method that checks its requests itself gets
gRPC's request iterator as it is (no wrapper per stream: memory per node)."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from arbiter.server.api.decoding import DecodeRefusal, Undecodable, checks_requests, refuse
from membership.v1 import membership_pb2 as pb

SERVICE = "test.Echo"


class _Echo:
    """Two stream-stream methods echoing the request's seq: one plain, one that checks
    its requests itself; each records what request iterator it was handed."""

    def __init__(self) -> None:
        self.iterators: dict[str, Any] = {}

    async def plain(
        self, requests: AsyncIterator[pb.HeartbeatRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.HeartbeatAck]:
        self.iterators["plain"] = requests
        async for req in requests:
            yield pb.HeartbeatAck(seq=req.seq)

    @checks_requests
    async def checked(
        self, requests: AsyncIterator[pb.HeartbeatRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.HeartbeatAck]:
        self.iterators["checked"] = requests
        async for req in requests:
            if req.__class__ is Undecodable:  # type: ignore[comparison-overlap]
                await refuse(context, req)
            yield pb.HeartbeatAck(seq=req.seq)


def _handler(method: Any) -> grpc.RpcMethodHandler:
    return grpc.stream_stream_rpc_method_handler(
        method,
        request_deserializer=pb.HeartbeatRequest.FromString,
        response_serializer=pb.HeartbeatAck.SerializeToString,
    )


@pytest.fixture
async def echo() -> AsyncIterator[tuple[_Echo, grpc.aio.Channel]]:
    servicer = _Echo()
    server = grpc.aio.server(interceptors=[DecodeRefusal(limit=200)])
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE, {"Plain": _handler(servicer.plain), "Checked": _handler(servicer.checked)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield servicer, channel
    finally:
        await channel.close()
        await server.stop(0)


async def _call(channel: grpc.aio.Channel, method: str, *payloads: bytes) -> list[int]:
    """Sends raw request bytes on one stream; returns the acks' seqs."""
    call = channel.stream_stream(
        f"/{SERVICE}/{method}",
        request_serializer=lambda b: b,
        response_deserializer=pb.HeartbeatAck.FromString,
    )(iter(payloads), timeout=10)
    return [ack.seq async for ack in call]


def _beat(seq: int, **fields: Any) -> bytes:
    return pb.HeartbeatRequest(node_id="n1", incarnation=1, seq=seq, **fields).SerializeToString()


@pytest.mark.parametrize("method", ["Plain", "Checked"])
@pytest.mark.parametrize(
    ("bad", "code", "message"),
    [
        (b"\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, "request: the message does not decode"),
        (_beat(2, cluster="x" * 300), grpc.StatusCode.RESOURCE_EXHAUSTED, "max_message_bytes:"),
    ],
)
async def test_decoding_a_refused_request_ends_its_stream_with_a_status(
    echo: tuple[_Echo, grpc.aio.Channel],
    method: str,
    bad: bytes,
    code: grpc.StatusCode,
    message: str,
) -> None:
    _, channel = echo
    assert await _call(channel, method, _beat(1), _beat(2)) == [1, 2]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _call(channel, method, _beat(1), bad, _beat(3))
    assert info.value.code() == code
    assert (info.value.details() or "").startswith(message)


async def test_decoding_a_method_that_checks_its_requests_gets_no_wrapper(
    echo: tuple[_Echo, grpc.aio.Channel],
) -> None:
    servicer, channel = echo
    await _call(channel, "Plain", _beat(1))
    await _call(channel, "Checked", _beat(1))
    assert inspect.isasyncgen(servicer.iterators["plain"])  # decoding's wrapper
    assert not inspect.isasyncgen(servicer.iterators["checked"])  # gRPC's own


async def test_decoding_wraps_a_methods_handler_once() -> None:
    servicer = _Echo()
    plain, other = _handler(servicer.plain), _handler(servicer.plain)
    resolved = {"/s/A": plain}

    async def continuation(details: Any) -> grpc.RpcMethodHandler | None:
        return resolved.get(details.method)

    def details(method: str) -> Any:
        return type("Details", (), {"method": method, "invocation_metadata": ()})()

    refusal = DecodeRefusal(limit=100)
    first = await refusal.intercept_service(continuation, details("/s/A"))
    assert first is not plain and first.request_deserializer is not plain.request_deserializer
    assert await refusal.intercept_service(continuation, details("/s/A")) is first
    resolved["/s/A"] = other  # another handler for the method: wrapped anew
    again = await refusal.intercept_service(continuation, details("/s/A"))
    assert again is not first
    assert await refusal.intercept_service(continuation, details("/s/B")) is None
