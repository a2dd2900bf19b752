"""Requests that are too big or do not decode end their call with a status, on every RPC.

gRPC takes in messages up to ``max_peer_message_bytes`` (the replicas' Raft
traffic needs that much); every other service's requests are held to
``max_message_bytes`` here, on their raw bytes, before they are decoded:
RESOURCE_EXHAUSTED "max_message_bytes: ...".

grpcio decodes a request before (unary) or while (streams) the handler runs;
a message that is not the request type raises there, and the call ends with
UNKNOWN ("Unexpected DecodeError") and an ERROR traceback in the replica's
log, one per message: a client of another language sending a wrong type, or
anyone sending junk, would look like a crash and could fill the log.
:class:`DecodeRefusal` wraps every method's deserializer so that such a
message ends its call with INVALID_ARGUMENT naming the type expected, logged
at INFO, before the handler sees it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

__all__ = ["DecodeRefusal"]

log = logging.getLogger("arbiter.api")


class _Undecodable:
    """What the wrapped deserializer returns for bytes it refuses (the refusal inside)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = message


def _tolerant(
    deserialize: Callable[[bytes], Any] | None, limit: int | None
) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def decode(raw: bytes) -> Any:
        if limit is not None and len(raw) > limit:
            return _Undecodable(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"max_message_bytes: the message is {len(raw)} bytes, the limit is {limit}",
            )
        try:
            return deserialize(raw)
        except DecodeError as e:
            return _Undecodable(
                grpc.StatusCode.INVALID_ARGUMENT, f"request: the message does not decode ({e})"
            )

    return decode


async def _refuse(context: grpc.aio.ServicerContext, bad: _Undecodable) -> None:
    log.info("request refused from %s: %s", context.peer(), bad.message)
    await context.abort(bad.code, bad.message)


def _checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    async def each() -> AsyncIterator[Any]:
        async for req in requests:
            if isinstance(req, _Undecodable):
                await _refuse(context, req)
            yield req

    return each()


class DecodeRefusal(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Server interceptor: requests too big or undecodable end their call (module docstring).

    Args:
        limit: bytes a request may have (``max_message_bytes``).
        exempt: method path prefix held to gRPC's own limit only (the Raft service).
    """

    def __init__(self, limit: int, exempt: str = "") -> None:
        self._limit = limit
        self._exempt = exempt

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        exempt = bool(self._exempt) and handler_call_details.method.startswith(self._exempt)
        decode = _tolerant(handler.request_deserializer, None if exempt else self._limit)
        out = handler.response_serializer
        if handler.unary_unary:
            inner = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if isinstance(request, _Undecodable):
                    await _refuse(context, request)
                return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(unary_unary, decode, out)
        if handler.unary_stream:
            inner_us = handler.unary_stream
            if inspect.isasyncgenfunction(inner_us):

                async def unary_stream_gen(request: Any, context: Any) -> AsyncIterator[Any]:
                    if isinstance(request, _Undecodable):
                        await _refuse(context, request)
                    async for item in inner_us(request, context):
                        yield item

                return grpc.unary_stream_rpc_method_handler(unary_stream_gen, decode, out)

            async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if isinstance(request, _Undecodable):
                    await _refuse(context, request)
                return await inner_us(request, context)  # writes with context.write

            return grpc.unary_stream_rpc_method_handler(unary_stream, decode, out)
        if handler.stream_unary:
            inner_su = handler.stream_unary

            async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                return await inner_su(_checked(requests, context), context)

            return grpc.stream_unary_rpc_method_handler(stream_unary, decode, out)
        inner_ss = handler.stream_stream
        if inspect.isasyncgenfunction(inner_ss):

            async def stream_stream_gen(requests: Any, context: Any) -> AsyncIterator[Any]:
                async for item in inner_ss(_checked(requests, context), context):
                    yield item

            return grpc.stream_stream_rpc_method_handler(stream_stream_gen, decode, out)

        async def stream_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            return await inner_ss(_checked(requests, context), context)

        return grpc.stream_stream_rpc_method_handler(stream_stream, decode, out)
