"""gRPC options of a replica: its server's, and its channels to the other replicas.

Both sides of the keepalive contract (failure class "keepalive policy mismatch",
docs/architecture.md): the server never refuses a ping that a client may send,
and a replica never pings faster than the others accept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from arbiter.config import ArbiterConfig

__all__ = ["channel_options", "server_options"]


def server_options(config: ArbiterConfig) -> list[tuple[str, int]]:
    """gRPC server options: message size limit and a keepalive policy that agrees with clients.

    The server pings a connection that brought nothing for ``keepalive_time``
    and closes it when the ping stays unanswered for ``keepalive_timeout``
    (``ping_timeout_ms`` is what gRPC core arms for that; see
    :meth:`membership._config.ClientConfig.channel_options` for every layer,
    TCP_USER_TIMEOUT included, which the server's sockets get as well). It
    accepts client pings as often as every ``min_ping_interval``, on
    connections with or without calls, which is never faster than any
    client pings (``MIN_KEEPALIVE_TIME``, checked on both sides), so no
    too_many_pings (failure class "keepalive policy mismatch",
    docs/architecture.md).
    """
    keepalive_timeout_ms = int(config.keepalive_timeout * 1000)
    return [
        ("grpc.max_receive_message_length", config.max_peer_message_bytes),
        ("grpc.max_concurrent_streams", config.max_concurrent_streams),
        ("grpc.keepalive_time_ms", int(config.keepalive_time * 1000)),
        ("grpc.keepalive_timeout_ms", keepalive_timeout_ms),
        ("grpc.http2.ping_timeout_ms", keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS. (The name
        # once used here, "...min_recv_ping_interval...", is no gRPC argument:
        # it was ignored, and the server enforced its 5 minute default.)
        ("grpc.http2.min_ping_interval_without_data_ms", int(config.min_ping_interval * 1000)),
        ("grpc.http2.max_ping_strikes", config.max_ping_strikes),
        ("grpc.so_reuseport", 0),
    ]


def channel_options(config: ArbiterConfig) -> list[tuple[str, int]]:
    """gRPC options for replica-to-replica channels (keepalive as the safety net).

    A replica is a client of the others' servers: it pings at
    ``keepalive_time`` (>= ``MIN_KEEPALIVE_TIME`` >= every replica's
    ``min_ping_interval``, checked by :meth:`ArbiterConfig.validate`). Raft
    traffic every ``raft_heartbeat_interval`` keeps a healthy link from
    needing pings at all; Raft notices a dead peer by its own timers.
    """
    keepalive_timeout_ms = int(config.keepalive_timeout * 1000)
    return [
        ("grpc.keepalive_time_ms", int(config.keepalive_time * 1000)),
        ("grpc.keepalive_timeout_ms", keepalive_timeout_ms),
        ("grpc.http2.ping_timeout_ms", keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]
