"""The SDK's gRPC channels to the arbiters: one per arbiter for unary calls, fresh ones on demand.

Every channel gets a subchannel pool of its own (``grpc.use_local_subchannel_pool``),
so that it owns its TCP connection: closing it drops that connection, and a
new channel opens a new one. By default gRPC shares connections between
channels with the same target and options, so a retry "on a new channel"
would go out on the very connection that just wedged (bytes stop both ways,
no FIN or RST) until keepalive closes it, many seconds later; that is the
kubelet failure class of kubernetes/kubernetes#48638.

A unary call that runs into its deadline discards the cached channel for that
arbiter for the same reason: the next call connects afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc

from membership.shared import tls
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from membership._config import ClientConfig

__all__ = ["ARBITER_KEY", "Channels", "via_agent"]

ARBITER_KEY = "membership-arbiter"
"""The metadata key naming, on a call to a host agent's socket, the arbiter it is for."""


class _Named:
    """Adds ``membership-arbiter: ADDRESS`` to a call's metadata."""

    def __init__(self, address: str) -> None:
        self._pair = (ARBITER_KEY, address)

    def _details(self, d: Any) -> Any:
        return d._replace(metadata=grpc.aio.Metadata(*(d.metadata or ()), self._pair))


# grpc.aio sorts a channel's interceptors by kind with an if/elif chain: one object
# per kind (their classes are untyped: Any).
class _UnaryUnary(_Named, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, cont: Any, details: Any, request: Any) -> Any:
        return await cont(self._details(details), request)


class _UnaryStream(_Named, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, cont: Any, details: Any, request: Any) -> Any:
        return await cont(self._details(details), request)


class _StreamUnary(_Named, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(self, cont: Any, details: Any, requests: Any) -> Any:
        return await cont(self._details(details), requests)


class _StreamStream(_Named, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(self, cont: Any, details: Any, requests: Any) -> Any:
        return await cont(self._details(details), requests)


def via_agent(address: str) -> list[Any]:
    """The interceptors of a channel to a host agent's socket for the arbiter ``address``."""
    return [k(address) for k in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]


_OWN_CONNECTION = ("grpc.use_local_subchannel_pool", 1)


class Channels:
    """Channels of one client to its arbiters.

    Args:
        options: gRPC channel options for every channel (keepalive, backoff).
        credentials: TLS credentials (:func:`membership.shared.tls.channel_credentials`);
            None for plaintext.
    """

    def __init__(
        self,
        options: Sequence[tuple[str, int]],
        credentials: grpc.ChannelCredentials | None = None,
        via_agent: str = "",
    ) -> None:
        self._options = [*options, _OWN_CONNECTION]
        self._credentials = credentials
        self._via = via_agent
        self.tls: tls.LoadedTLS | None = None
        """The TLS files in use (checked), or None for plaintext."""
        self._cached: dict[str, grpc.aio.Channel] = {}
        self._closed = False

    @classmethod
    def of(cls, config: ClientConfig) -> Channels:
        """Channels with ``config``'s options and transport security: its TLS
        files (or the environment's) loaded and checked, or plaintext when
        ``insecure`` is asked for (:meth:`ClientConfig.transport_security`).

        Raises:
            InvalidArgument: no TLS settings and no insecure (secure by
                default), or files that are missing, not PEM or do not
                match (:func:`membership.shared.tls.load`).
        """
        files = config.transport_security()
        loaded = None if files is None else tls.load(files)
        channels = cls(
            config.channel_options(),
            None if loaded is None else tls.channel_credentials(loaded),
            config.via_agent,
        )
        channels.tls = loaded
        return channels

    def stub(self, address: str) -> pb_grpc.MembershipStub:
        """A stub on the cached channel to ``address`` (created on first use)."""
        ch = self._cached.get(address)
        if ch is None:
            ch = self._channel(address)
            self._cached[address] = ch
        return pb_grpc.MembershipStub(ch)

    def admin(self, address: str) -> pb_grpc.AdminStub:
        """An Admin service stub on the cached channel to ``address``."""
        self.stub(address)
        return pb_grpc.AdminStub(self._cached[address])

    def fresh(self, address: str) -> tuple[grpc.aio.Channel, pb_grpc.MembershipStub]:
        """A new channel to ``address`` with a connection of its own; the caller closes it."""
        ch = self._channel(address)
        return ch, pb_grpc.MembershipStub(ch)

    def _channel(self, address: str) -> grpc.aio.Channel:
        if self._via:
            # every call to the agent's socket names the arbiter it is for (docs/agent.md)
            return grpc.aio.insecure_channel(
                f"unix:{self._via}", options=self._options, interceptors=via_agent(address)
            )
        if self._credentials is None:
            return grpc.aio.insecure_channel(address, options=self._options)
        return grpc.aio.secure_channel(address, self._credentials, options=self._options)

    def discard(self, address: str) -> None:
        """Drops the cached channel to ``address`` (it may sit on a wedged connection)."""
        ch = self._cached.pop(address, None)
        if ch is not None:
            asyncio.get_running_loop().create_task(ch.close(grace=None))

    async def summary(self, address: str, timeout: float) -> pb.GetViewResponse:
        """GetView without members: the arbiter's id, leader, quorum, epoch and cluster.

        Raises:
            grpc.aio.AioRpcError: the call failed (the cached channel is
                discarded after a deadline).
        """
        try:
            resp: pb.GetViewResponse = await self.stub(address).GetView(
                pb.GetViewRequest(summary=True), timeout=timeout
            )
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                self.discard(address)
            raise
        return resp

    async def close(self) -> None:
        """Closes every cached channel (fresh ones are their owners' to close)."""
        self._closed = True
        channels, self._cached = list(self._cached.values()), {}
        for ch in channels:
            with contextlib.suppress(Exception):
                await ch.close(grace=None)
