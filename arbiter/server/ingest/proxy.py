"""Every RPC but Heartbeat that lands on a worker, forwarded to the consensus process.

Rules:

1. Generic: the worker answers any method it does not serve itself with a
   stream-stream handler on raw bytes, and calls the same method on the
   consensus process's unix socket as a stream-stream call on raw bytes
   (on the wire every gRPC method type is a stream of messages each way),
   so Subscribe, GetView, Leave, Admin, Peer (Raft), health and reflection
   all work, and a method neither knows ends with UNIMPLEMENTED there.
2. The call's metadata goes along (not gRPC's own keys, nor the proxied-
   identity keys a client may have sent), with its deadline; a cancelled
   call cancels the forwarded one. The status code, details and trailing
   metadata come back as they are (the SDK follows leader hints in them),
   and so does the initial metadata. A response the caller does not take
   within ``subscriber_write_timeout`` ends the call with RESOURCE_EXHAUSTED
   (limits rule 6), so a caller that never reads holds nothing here.
3. Identity: the worker adds the certificate it verified in the TLS
   handshake (``PROXIED_CERT_KEY``) and the caller's address; the
   consensus process's server, which listens on that unix socket only,
   gives each call a :class:`arbiter.server.net.authz.ProxiedContext` built from
   them (:class:`ProxiedIdentity`), so :mod:`arbiter.server.net.authz` decides
   exactly as if the caller had connected to it.
4. Sizes: the worker holds requests to gRPC's limit (``max_peer_message_bytes``)
   as the replica does; the consensus process's ``DecodeRefusal`` holds the
   public services to ``max_message_bytes``, as without workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from arbiter.server.fanout.hub import NotReading
from arbiter.server.net.authz import PROXIED_CERT_KEY, PROXIED_PEER_KEY, ProxiedContext

__all__ = ["Forwarder", "ProxiedIdentity"]

_DROPPED = {PROXIED_CERT_KEY, PROXIED_PEER_KEY, "user-agent", "te", "content-type"}


def _forwarded(metadata: Any) -> list[tuple[str, Any]]:
    return [
        (k, v)
        for k, v in (metadata or ())
        if k not in _DROPPED and not k.startswith(("grpc-", ":"))
    ]


class Forwarder(grpc.GenericRpcHandler):  # type: ignore[misc]
    """The worker's handler of every method it does not serve (rules 1 to 3).

    Args:
        channel: the channel to the consensus process's unix socket.
        write_timeout: seconds a response may wait for a caller that does not
            read (``subscriber_write_timeout``): then the call ends with
            RESOURCE_EXHAUSTED, as limits rule 6 ends it without workers.
    """

    def __init__(self, channel: grpc.aio.Channel, write_timeout: float = 10.0) -> None:
        self._channel = channel
        self._write_timeout = write_timeout
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._open: set[Any] = set()
        self.closing = False
        self.calls = 0

    def close(self) -> None:
        """Shutdown: every forwarded call ends now with UNAVAILABLE (the worker's
        server then stops with no call left to cancel)."""
        self.closing = True
        for call in list(self._open):
            call.cancel()

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None:
            if len(self._handlers) > 256:  # methods named by clients: keep it bounded
                self._handlers.clear()
            upstream = self._channel.stream_stream(method)
            handler = grpc.stream_stream_rpc_method_handler(self._forward(upstream))
            self._handlers[method] = handler
        return handler

    def _forward(
        self, upstream: Any
    ) -> Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext], Awaitable[None]]:
        async def forward(
            requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
        ) -> None:
            self.calls += 1
            metadata = _forwarded(context.invocation_metadata())
            cert = context.auth_context().get("x509_pem_cert")
            if cert:
                metadata.append((PROXIED_CERT_KEY, cert[0]))
            metadata.append((PROXIED_PEER_KEY, context.peer()))
            if self.closing:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "arbiter shutting down")
            call = upstream(metadata=tuple(metadata), timeout=context.time_remaining())
            self._open.add(call)

            async def pump() -> None:
                with contextlib.suppress(Exception):
                    async for request in requests:
                        await call.write(request)
                    await call.done_writing()

            pumping = asyncio.get_running_loop().create_task(pump())
            try:
                initial = await call.initial_metadata()
                if initial:
                    await context.send_initial_metadata(_forwarded(initial))
                async for response in call:
                    try:
                        async with asyncio.timeout(self._write_timeout):
                            await context.write(response)
                    except TimeoutError:
                        context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
                        context.set_details(str(NotReading(self._write_timeout)))
                        return
                trailing = await call.trailing_metadata()
                if trailing:
                    context.set_trailing_metadata(tuple(_forwarded(trailing)))
            except grpc.aio.AioRpcError as e:
                trailing = _forwarded(e.trailing_metadata())
                await context.abort(e.code(), e.details() or "", tuple(trailing))
            except asyncio.CancelledError:
                if not self.closing:
                    raise
                # close() cancelled the forwarded call: this one ends UNAVAILABLE.
                context.set_code(grpc.StatusCode.UNAVAILABLE)
                context.set_details("arbiter shutting down")
            finally:
                self._open.discard(call)
                pumping.cancel()
                call.cancel()

        return forward


def _proxied(context: Any, metadata: Any) -> ProxiedContext:
    cert: bytes | None = None
    peer = ""
    for key, value in metadata or ():
        if key == PROXIED_CERT_KEY:
            cert = value
        elif key == PROXIED_PEER_KEY:
            peer = value
    return ProxiedContext(context, cert, peer or context.peer())


class ProxiedIdentity(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """The consensus process's interceptor on its unix socket: every call's context
    becomes the caller's as its worker saw it (rule 3). Never on a TCP port."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        md = handler_call_details.invocation_metadata
        args = (handler.request_deserializer, handler.response_serializer)
        if handler.unary_unary:
            uu = handler.unary_unary

            async def unary_unary(request: Any, context: Any) -> Any:
                return await uu(request, _proxied(context, md))

            return grpc.unary_unary_rpc_method_handler(unary_unary, *args)
        if handler.unary_stream:
            us = handler.unary_stream
            if inspect.isasyncgenfunction(us):

                async def unary_stream_gen(request: Any, context: Any) -> AsyncIterator[Any]:
                    async for item in us(request, _proxied(context, md)):
                        yield item

                return grpc.unary_stream_rpc_method_handler(unary_stream_gen, *args)

            async def unary_stream(request: Any, context: Any) -> Any:
                return await us(request, _proxied(context, md))

            return grpc.unary_stream_rpc_method_handler(unary_stream, *args)
        if handler.stream_unary:
            su = handler.stream_unary

            async def stream_unary(requests: Any, context: Any) -> Any:
                return await su(requests, _proxied(context, md))

            return grpc.stream_unary_rpc_method_handler(stream_unary, *args)
        ss = handler.stream_stream
        if inspect.isasyncgenfunction(ss):

            async def stream_stream_gen(requests: Any, context: Any) -> AsyncIterator[Any]:
                async for item in ss(requests, _proxied(context, md)):
                    yield item

            return grpc.stream_stream_rpc_method_handler(stream_stream_gen, *args)

        async def stream_stream(requests: Any, context: Any) -> Any:
            return await ss(requests, _proxied(context, md))

        return grpc.stream_stream_rpc_method_handler(stream_stream, *args)
