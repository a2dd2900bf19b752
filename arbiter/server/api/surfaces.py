"""The standard gRPC surfaces of a replica: health per service, and server reflection.

Health (``grpc.health.v1``, grpcio-health-checking), by service name:

* ``""`` (the server as a whole) and ``arbiter.v1.Peer`` (the replicas' Raft
  traffic): SERVING from the start, since the other replicas must reach
  this one to form a quorum at all.
* ``membership.v1.Membership`` and ``membership.v1.Admin``: SERVING only while
  this replica is in a quorum (it has a leader it can reach). Out of one it
  still answers, but decides nothing: no death, admission or removal can
  commit, and the view it serves may be old. A load balancer or Kubernetes
  readiness probe should route clients by these.
* Everything NOT_SERVING once the replica begins a graceful stop.

Reflection (``grpc.reflection.v1alpha``, grpcio-reflection): every service
above can be listed and called by generic tools (grpcurl, grpcui, Postman)
without the protos, which are public anyway. Under mutual TLS a tool needs
a certificate of the cluster CA like any client.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

__all__ = [
    "ADMIN_SERVICE_NAME",
    "PEER_SERVICE_NAME",
    "QUORUM_SERVICES",
    "SERVICE_NAME",
    "add_standard_services",
    "set_quorum",
    "set_starting",
]

SERVICE_NAME = "membership.v1.Membership"
ADMIN_SERVICE_NAME = "membership.v1.Admin"
PEER_SERVICE_NAME = "arbiter.v1.Peer"
# Services whose health follows this replica's quorum (module docstring).
QUORUM_SERVICES = (SERVICE_NAME, ADMIN_SERVICE_NAME)


def add_standard_services(server: grpc.aio.Server, servicer: health.aio.HealthServicer) -> None:
    """Adds the health service (``servicer``) and server reflection to ``server``."""
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    reflection.enable_server_reflection(
        (
            SERVICE_NAME,
            ADMIN_SERVICE_NAME,
            PEER_SERVICE_NAME,
            health.SERVICE_NAME,
            reflection.SERVICE_NAME,
        ),
        server,
    )


async def set_starting(servicer: health.aio.HealthServicer) -> None:
    """The health of a replica that has just started: in no quorum yet."""
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await servicer.set(PEER_SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    await set_quorum(servicer, in_quorum=False)


async def set_quorum(servicer: health.aio.HealthServicer, *, in_quorum: bool) -> None:
    """Sets the services of :data:`QUORUM_SERVICES` SERVING or NOT_SERVING."""
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if in_quorum
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in QUORUM_SERVICES:
        await servicer.set(name, status)
