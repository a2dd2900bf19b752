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

Per call, the interceptor costs nothing it can share: a method's wrapped
handler is built once and kept (the handler gRPC resolves for a method is
the same object call after call). The requests of a stream are checked by a
wrapper of the request iterator, an async generator per call, unless the
method checks them itself (:func:`checks_requests`): a heartbeat stream is
long-lived and there is one per node and replica, so the Heartbeat methods
do, and a stream carries no wrapper (docs/scale.md, "Memory per node").
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

__all__ = ["DecodeRefusal", "Undecodable", "checks_requests", "refuse"]

log = logging.getLogger("arbiter.api")

_F = TypeVar("_F", bound=Callable[..., Any])


class Undecodable:
    """What the wrapped deserializer returns for bytes it refuses (the refusal inside).

    A method marked :func:`checks_requests` gets these among its requests and
    ends its call with :func:`refuse` on the first one.
    """

    __slots__ = ("code", "message")

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = message


# The attribute :func:`checks_requests` sets on a method.
_CHECKS_REQUESTS = "_checks_undecodable_requests"


def checks_requests(method: _F) -> _F:
    """Marks a stream-request servicer method that checks its requests itself.

    The interceptor then hands it gRPC's request iterator as it is, without
    a wrapper per call; the method must end its call with :func:`refuse` on
    a request that is an :class:`Undecodable` (``req.__class__ is
    Undecodable``), before acting on it.
    """
    setattr(method, _CHECKS_REQUESTS, True)
    return method


async def refuse(context: grpc.aio.ServicerContext, bad: Undecodable) -> None:
    """Ends the call with the refusal ``bad`` carries (logged at INFO).

    Raises:
        Exception: grpc.aio's abort, always.
    """
    log.info("request refused from %s: %s", context.peer(), bad.message)
    await context.abort(bad.code, bad.message)


def _tolerant(
    deserialize: Callable[[bytes], Any] | None, limit: int | None
) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def decode(raw: bytes) -> Any:
        if limit is not None and len(raw) > limit:
            return Undecodable(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"max_message_bytes: the message is {len(raw)} bytes, the limit is {limit}",
            )
        try:
            return deserialize(raw)
        except DecodeError as e:
            return Undecodable(
                grpc.StatusCode.INVALID_ARGUMENT, f"request: the message does not decode ({e})"
            )

    return decode


def _checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    async def each() -> AsyncIterator[Any]:
        async for req in requests:
            if isinstance(req, Undecodable):
                await refuse(context, req)
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
        # method -> (the handler gRPC resolved, its wrapped handler): built once per
        # method; bounded by the methods served (an unknown method has no handler)
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        known = self._wrapped.get(method)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = self._wrap(handler, bool(self._exempt) and method.startswith(self._exempt))
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler: grpc.RpcMethodHandler, exempt: bool) -> grpc.RpcMethodHandler:
        """``handler`` with the deserializer that refuses, and its requests checked."""
        decode = _tolerant(handler.request_deserializer, None if exempt else self._limit)
        out = handler.response_serializer
        if handler.unary_unary:
            inner = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if isinstance(request, Undecodable):
                    await refuse(context, request)
                return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(unary_unary, decode, out)
        if handler.unary_stream:
            inner_us = handler.unary_stream
            if inspect.isasyncgenfunction(inner_us):

                async def unary_stream_gen(request: Any, context: Any) -> AsyncIterator[Any]:
                    if isinstance(request, Undecodable):
                        await refuse(context, request)
                    async for item in inner_us(request, context):
                        yield item

                return grpc.unary_stream_rpc_method_handler(unary_stream_gen, decode, out)

            async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if isinstance(request, Undecodable):
                    await refuse(context, request)
                return await inner_us(request, context)  # writes with context.write

            return grpc.unary_stream_rpc_method_handler(unary_stream, decode, out)
        if handler.stream_unary:
            inner_su = handler.stream_unary
            if getattr(inner_su, _CHECKS_REQUESTS, False):
                return grpc.stream_unary_rpc_method_handler(inner_su, decode, out)

            async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                return await inner_su(_checked(requests, context), context)

            return grpc.stream_unary_rpc_method_handler(stream_unary, decode, out)
        inner_ss = handler.stream_stream
        if getattr(inner_ss, _CHECKS_REQUESTS, False):
            return grpc.stream_stream_rpc_method_handler(inner_ss, decode, out)
        if inspect.isasyncgenfunction(inner_ss):

            async def stream_stream_gen(requests: Any, context: Any) -> AsyncIterator[Any]:
                async for item in inner_ss(_checked(requests, context), context):
                    yield item

            return grpc.stream_stream_rpc_method_handler(stream_stream_gen, decode, out)

        async def stream_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            return await inner_ss(_checked(requests, context), context)

        return grpc.stream_stream_rpc_method_handler(stream_stream, decode, out)
