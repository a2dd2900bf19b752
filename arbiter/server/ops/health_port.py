"""A plaintext port that serves the gRPC health service only (``--health-listen``).

Kubernetes' native ``grpc:`` probe speaks plaintext gRPC and cannot present a
client certificate, while a replica's port requires mutual TLS. This port
answers ``grpc.health.v1.Health`` (Check and Watch) from the very servicer of
the replica's main port (:mod:`arbiter.server.api.surfaces`: ``""`` SERVING from
the start, ``membership.v1.Membership`` and ``membership.v1.Admin`` SERVING
only in a quorum, everything NOT_SERVING once the replica stops) and nothing
else: no view, no member, no reflection, nothing that changes state. That
is what it exposes to whoever reaches it (etcd's plaintext ``/health`` on
``--listen-metrics-urls`` is the same trade); bind it to loopback where no
probe needs it from outside, to the pod address in Kubernetes.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from arbiter.server.net.addresses import check_bindable

__all__ = ["start_health_port"]


async def start_health_port(listen: str, servicer: health.aio.HealthServicer) -> grpc.aio.Server:
    """Binds ``listen`` (``host:port``) and serves ``servicer`` there in plaintext.

    Returns:
        The started server; the caller stops it (``await server.stop(0)``).

    Raises:
        OSError: the address cannot be bound (see :func:`check_bindable`).
    """
    check_bindable(listen)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    if server.add_insecure_port(listen) == 0:
        raise OSError(f"cannot listen on {listen} (--health-listen): gRPC could not bind it")
    await server.start()
    return server
