"""Keepalive policy: the SDK's, the replicas' and the server's settings agree (no GOAWAY
too_many_pings: failure class "keepalive policy mismatch" in docs/architecture.md),
and each layer of dead-connection detection does what the code comments say.

The pure tests check the option lists for the shipped defaults and presets,
and the validation rules that keep a user from configuring the two sides
apart. The live tests run real gRPC on loopback with every timing scaled
down (the configs are built without validate(), which would refuse such
short times), through the test proxy where a link must be frozen.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from arbiter.config import ArbiterConfig
from arbiter.server.net.options import channel_options, server_options
from membership._config import ClientConfig
from membership.shared.errors import InvalidArgument
from membership.shared.validation import MIN_KEEPALIVE_TIME, MIN_KEEPALIVE_TIMEOUT
from tests.support.netproxy import TcpProxy

PRESETS = {"lan": ArbiterConfig.lan, "local": ArbiterConfig.local}
# A live test's generous bound on top of the configured times (a loaded 2-core machine).
SLACK = 3.0

KEEPALIVE_TIME = "grpc.keepalive_time_ms"
KEEPALIVE_TIMEOUT = "grpc.keepalive_timeout_ms"
PING_TIMEOUT = "grpc.http2.ping_timeout_ms"
PERMIT_WITHOUT_CALLS = "grpc.keepalive_permit_without_calls"
MAX_PINGS_WITHOUT_DATA = "grpc.http2.max_pings_without_data"
MIN_RECV_PING_INTERVAL = "grpc.http2.min_ping_interval_without_data_ms"
MAX_PING_STRIKES = "grpc.http2.max_ping_strikes"


def _agree(client: dict[str, int], server: dict[str, int]) -> None:
    """Asserts that a client with options ``client`` never earns a too_many_pings GOAWAY."""
    assert client[KEEPALIVE_TIME] >= server[MIN_RECV_PING_INTERVAL]
    assert client[PERMIT_WITHOUT_CALLS] == server[PERMIT_WITHOUT_CALLS] == 1
    # The client may ping without sending data for ever: the server must accept
    # such pings at the client's interval, which the two lines above ensure.
    assert client[MAX_PINGS_WITHOUT_DATA] == server[MAX_PINGS_WITHOUT_DATA] == 0


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize(
    "client_config",
    [ClientConfig(), ClientConfig(keepalive_time=MIN_KEEPALIVE_TIME)],
    ids=["sdk-default", "sdk-fastest"],
)
def test_keepalive_policies_agree(preset: str, client_config: ClientConfig) -> None:
    arbiter = PRESETS[preset]().validate()
    client_config.validate()
    server = dict(server_options(arbiter))
    sdk = dict(client_config.channel_options())
    replica = dict(channel_options(arbiter))
    _agree(sdk, server)  # nodes and subscribers
    _agree(replica, server)  # a replica is a client of the other replicas
    assert server[MAX_PING_STRIKES] == arbiter.max_ping_strikes > 0  # the policy is enforced
    for options in (server, sdk, replica):
        # gRPC core times an unanswered ping out after ping_timeout_ms (60 s
        # unless set), not after keepalive_timeout_ms: both must say the same.
        assert options[PING_TIMEOUT] == options[KEEPALIVE_TIMEOUT] >= MIN_KEEPALIVE_TIMEOUT * 1000


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: ClientConfig(keepalive_time=MIN_KEEPALIVE_TIME - 0.1), "keepalive_time"),
        (lambda: ClientConfig(keepalive_timeout=0.5), "keepalive_timeout"),
        (lambda: ArbiterConfig.lan(min_ping_interval=MIN_KEEPALIVE_TIME + 1), "min_ping_interval"),
        (lambda: ArbiterConfig.local(keepalive_time=3.0, min_ping_interval=2.0), "keepalive_time"),
        (lambda: ArbiterConfig.lan(keepalive_timeout=0.2), "keepalive_timeout"),
        (lambda: ArbiterConfig.lan(max_ping_strikes=-1), "max_ping_strikes"),
    ],
    ids=[
        "sdk-pings-faster-than-arbiters-accept",
        "sdk-tcp-user-timeout-too-short",
        "arbiter-refuses-pings-sdk-may-send",
        "replica-pings-faster-than-replicas-accept",
        "arbiter-tcp-user-timeout-too-short",
        "negative-strikes",
    ],
)
def test_keepalive_validate_refuses_settings_that_disagree(
    make: Callable[[], ClientConfig | ArbiterConfig], field: str
) -> None:
    with pytest.raises(InvalidArgument, match=field):
        make().validate()


def test_keepalive_validate_accepts_the_edges() -> None:
    ClientConfig(keepalive_time=MIN_KEEPALIVE_TIME, keepalive_timeout=MIN_KEEPALIVE_TIMEOUT)
    ArbiterConfig.lan(min_ping_interval=MIN_KEEPALIVE_TIME, keepalive_time=MIN_KEEPALIVE_TIME)
    ArbiterConfig.lan(min_ping_interval=0.5, max_ping_strikes=0).validate()


# --- live: real gRPC on loopback, timings scaled down --------------------------------------


class _Server:
    """A grpc.aio server with the arbiter's options and one method: /t.T/Hold, a
    server stream that sends one message and then nothing (an idle open call)."""

    def __init__(self, config: ArbiterConfig) -> None:
        self.ended = asyncio.Event()  # set when a Hold call ends on the server side

        async def hold(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            try:
                yield b"x"
                await asyncio.Event().wait()
            finally:
                self.ended.set()

        self.server = grpc.aio.server(options=server_options(config))
        handler = grpc.unary_stream_rpc_method_handler(hold)  # bytes in, bytes out
        self.server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("t.T", {"Hold": handler})]
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def _serving(config: ArbiterConfig) -> AsyncIterator[_Server]:
    s = _Server(config)
    await s.server.start()
    try:
        yield s
    finally:
        await s.server.stop(0)


async def _connected(address: str, config: ClientConfig) -> tuple[grpc.aio.Channel, Any]:
    """A channel with the SDK's options and an open Hold call on it (first message read)."""
    channel = grpc.aio.insecure_channel(address, options=config.channel_options())
    call = channel.unary_stream("/t.T/Hold")(b"")
    assert await asyncio.wait_for(call.read(), SLACK) == b"x"
    return channel, call


async def _stays_ready(channel: grpc.aio.Channel, seconds: float) -> bool:
    """True when the channel is READY at every look during ``seconds`` (a bounded window)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if channel.get_state() is not grpc.ChannelConnectivity.READY:
            return False
        await asyncio.sleep(0.02)
    return True


async def _leaves_ready(channel: grpc.aio.Channel, timeout: float) -> float:
    """Seconds until the channel is no longer READY (a closed connection); fails after timeout."""
    t0 = time.monotonic()
    while channel.get_state() is grpc.ChannelConnectivity.READY:
        assert time.monotonic() - t0 < timeout, f"still READY after {timeout}s"
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


# The arbiter side scaled down 20x: accepts pings every 0.2 s, pings idle connections
# every 0.5 s itself, and gives an unanswered ping 0.5 s.
SCALED_ARBITER = ArbiterConfig.local(
    keepalive_time=0.5, keepalive_timeout=0.5, min_ping_interval=0.2
)


async def test_keepalive_agreeing_pings_are_accepted_and_faster_ones_refused() -> None:
    """The server really enforces min_ping_interval (the option name is one gRPC knows),
    and a client pinging no faster than it is never sent away.

    gRPC core clients never ping more often than once a second, whatever
    keepalive_time says, so the refused client here faces a server that wants
    3 s between pings.
    """
    client = ClientConfig(keepalive_time=1.0)
    # One strike tolerated: the third ping sent too early would be refused,
    # and an agreeing client sends three in the window.
    agreeing = ArbiterConfig.local(  # pings nothing itself: only the client's pings count
        keepalive_time=600.0, keepalive_timeout=1.0, min_ping_interval=0.5, max_ping_strikes=1
    )
    disagreeing = dataclasses.replace(agreeing, min_ping_interval=3.0)
    window = 4 * client.keepalive_time

    async def accepted() -> None:
        async with _serving(agreeing) as server:
            with TcpProxy(server.address) as proxy:
                channel, call = await _connected(proxy.address, client)
                before = proxy.statistics().bytes_up
                assert await _stays_ready(channel, window), "an agreeing client was sent away"
                assert proxy.statistics().bytes_up - before >= 3 * 17, "the client sent no pings"
                call.cancel()
                await channel.close()

    async def refused() -> None:
        async with _serving(disagreeing) as server:
            channel, call = await _connected(server.address, client)
            # The third ping within 3 s of the one before earns GOAWAY too_many_pings.
            await _leaves_ready(channel, window + SLACK)
            call.cancel()
            await channel.close()

    await asyncio.gather(accepted(), refused())


async def test_keepalive_frozen_link_is_closed_on_both_sides() -> None:
    """A half-open link (frozen proxy, kernels still acknowledging) is closed by the
    HTTP/2 ping on the client and on the server within keepalive_time + keepalive_timeout
    (without ping_timeout_ms it would take gRPC's default of 60 s more)."""
    client = ClientConfig(keepalive_time=0.5, keepalive_timeout=0.5)
    bound = client.keepalive_time + client.keepalive_timeout + SLACK
    async with _serving(SCALED_ARBITER) as server:
        with TcpProxy(server.address) as proxy:
            channel, call = await _connected(proxy.address, client)
            await asyncio.sleep(0.3)  # any ping in flight is answered: the freeze starts clean
            proxy.freeze()
            t0 = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await asyncio.wait_for(call.read(), bound)
            client_seconds = time.monotonic() - t0
            assert err.value.code() is grpc.StatusCode.UNAVAILABLE
            await asyncio.wait_for(server.ended.wait(), bound)
            server_seconds = time.monotonic() - t0
            print(f"frozen link closed: client {client_seconds:.2f}s, server {server_seconds:.2f}s")
            await channel.close()


def _tcp_sockets() -> list[socket.socket]:
    """Duplicates of this process's TCP sockets (to read their options); caller closes them."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
            if s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6):
                found.append(s)
            else:
                s.close()
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_USER_TIMEOUT is Linux's")
async def test_keepalive_sockets_get_tcp_user_timeout_but_no_so_keepalive() -> None:
    """What gRPC core does at the TCP level, on both ends of a connection with our options."""
    arbiter = ArbiterConfig.lan()
    client = ClientConfig()
    async with _serving(arbiter) as server:
        channel, call = await _connected(server.address, client)
        sockets = _tcp_sockets()
        try:
            ends = []
            for s in sockets:
                with contextlib.suppress(OSError):  # a listener has no peer
                    if server.port in (s.getsockname()[1], s.getpeername()[1]):
                        ends.append(s)
            assert len(ends) == 2, "expected the client's and the server's end"
            for s in ends:
                user_timeout = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
                assert user_timeout == int(client.keepalive_timeout * 1000)
                assert user_timeout == int(arbiter.keepalive_timeout * 1000)
                assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
        finally:
            for s in sockets:
                s.close()
        call.cancel()
        await channel.close()
