"""ArbiterServer: one replica's whole lifecycle, start() to stop(grace)."""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from arbiter.config import ArbiterConfig
from arbiter.core.state import ViewChange
from arbiter.server.driver import Driver, ReplicaStatus
from arbiter.server.hub import Hub, HubStatus
from arbiter.server.peers import PeerServicer, PeerTransport
from arbiter.server.servicers import MembershipServicer
from arbiter.v1 import peer_pb2_grpc
from membership.errors import InvalidArgument
from membership.v1 import membership_pb2_grpc

__all__ = ["ArbiterServer", "channel_options", "server_options"]

log = logging.getLogger("arbiter")

SERVICE_NAME = "membership.v1.Membership"


def server_options(config: ArbiterConfig) -> list[tuple[str, int]]:
    """gRPC server options: message size limit and a keepalive policy that agrees with clients.

    The server pings idle connections every ``keepalive_time`` and accepts
    client pings as often as every ``min_ping_interval`` (which must not
    exceed any client's keepalive time, or clients get too_many_pings, C05).
    """
    return [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.keepalive_time_ms", int(config.keepalive_time * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", int(config.min_ping_interval * 1000)),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.so_reuseport", 0),
    ]


def channel_options(config: ArbiterConfig) -> list[tuple[str, int]]:
    """gRPC options for replica-to-replica channels (keepalive as the safety net)."""
    return [
        ("grpc.keepalive_time_ms", int(config.min_ping_interval * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


def parse_peers(spec: str) -> dict[str, str]:
    """Parses ``a1=host:port,a2=host:port,...`` into an ordered id -> address map.

    Raises:
        InvalidArgument: for an empty list, a malformed item or a duplicate id.
    """
    from membership.validation import parse_address, validate_node_id

    peers: dict[str, str] = {}
    for item in (p.strip() for p in spec.split(",")):
        if not item:
            continue
        rid, sep, addr = item.partition("=")
        if not sep:
            raise InvalidArgument(f"peer {item!r} is not id=host:port")
        try:
            validate_node_id(rid)
        except InvalidArgument as e:
            raise InvalidArgument(f"peer id: {e}") from None
        if rid in peers:
            raise InvalidArgument(f"peer id {rid!r} appears twice")
        peers[rid] = parse_address(addr)
    if not peers:
        raise InvalidArgument("no peers given")
    return peers


class ArbiterServer:
    """One arbiter replica: gRPC server, Raft transport and the driver loop.

    Args:
        replica_id: this replica's id; must be a key of ``peers``.
        peers: every replica's id -> ``host:port`` (this one included).
        listen: the address to bind, ``host:port``.
        config: the configuration (validated here).

    Raises:
        InvalidArgument: when the id is not among the peers or the config is invalid.
    """

    def __init__(
        self,
        *,
        replica_id: str,
        peers: dict[str, str],
        listen: str,
        config: ArbiterConfig | None = None,
    ) -> None:
        if replica_id not in peers:
            raise InvalidArgument(
                f"--id {replica_id!r} is not in --peers ({', '.join(peers)}); list every replica"
            )
        self.config = (config or ArbiterConfig.lan()).validate()
        self.replica_id = replica_id
        self.peers = dict(peers)
        self.listen = listen
        self._server: grpc.aio.Server | None = None
        self._stopped = asyncio.Event()
        self.port = 0

    async def start(self) -> None:
        """Binds the port, starts the driver, the transport and the server.

        Raises:
            OSError: when the address cannot be bound.
        """
        cfg = self.config
        self.transport = PeerTransport(
            self_id=self.replica_id,
            peers=self.peers,
            cluster=cfg.cluster,
            report_unreachable=lambda p: self.driver.report_unreachable(p),
            channel_options=channel_options(cfg),
        )
        self.hub = Hub(
            view=lambda: self.driver.state.view(),
            history_size=cfg.history_size,
            queue_limit=cfg.subscriber_queue,
        )
        self.driver = Driver(
            replica_id=self.replica_id,
            replica_ids=list(self.peers),
            config=cfg,
            send=self.transport.send,
            on_change=self._on_change,
            on_quorum=self._on_quorum,
        )
        self.api = MembershipServicer(self.driver, self.hub)
        self.health = health.aio.HealthServicer()
        server = grpc.aio.server(options=server_options(cfg))
        membership_pb2_grpc.add_MembershipServicer_to_server(self.api, server)
        peer_pb2_grpc.add_PeerServicer_to_server(
            PeerServicer(
                cluster=cfg.cluster,
                deliver=lambda m: self.driver.on_raft_message(m),
                known=set(self.peers),
            ),
            server,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        port = server.add_insecure_port(self.listen)
        if port == 0:
            raise OSError(f"cannot listen on {self.listen}")
        self.port = port
        await server.start()
        self._server = server
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.driver.start()
        self.transport.start()
        log.info(
            "arbiter %s listening on %s (peers: %s; suspect after %.2fs)",
            self.replica_id,
            self.listen,
            ", ".join(f"{k}={v}" for k, v in self.peers.items()),
            cfg.suspect_after,
        )

    def _on_change(self, change: ViewChange) -> None:
        self.hub.publish(change)

    def _on_quorum(self, status: ReplicaStatus) -> None:
        self.hub.publish_status(
            HubStatus(in_quorum=status.in_quorum, leader_id=status.leader_id, epoch=status.epoch)
        )
        serving = (
            health_pb2.HealthCheckResponse.SERVING
            if status.in_quorum
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        asyncio.get_running_loop().create_task(self.health.set(SERVICE_NAME, serving))

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown: NOT_SERVING, end every stream, stop the server, stop the cores.

        Args:
            grace: seconds for in-flight calls to finish (default: config.shutdown_grace).
        """
        if self._server is None:
            return
        log.info("arbiter %s stopping", self.replica_id)
        await self.health.enter_graceful_shutdown()
        self.api.close()
        await self._server.stop(self.config.shutdown_grace if grace is None else grace)
        await self.transport.close()
        await self.driver.stop()
        self._server = None
        self._stopped.set()
        log.info("arbiter %s stopped", self.replica_id)

    async def wait_stopped(self) -> None:
        """Returns once :meth:`stop` has finished."""
        await self._stopped.wait()
