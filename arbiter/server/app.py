"""ArbiterServer: one replica's whole lifecycle, start() to stop(grace)."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import socket
from pathlib import Path

import grpc
from grpc_health.v1 import health

from arbiter.config import ArbiterConfig
from arbiter.core.replica import RestoreError
from arbiter.core.tally import ViewChange
from arbiter.server import metrics, status, surfaces
from arbiter.server.admin import AdminServicer
from arbiter.server.authz import AllowAll, Authorizer, MutualTLS
from arbiter.server.backup import restore_data_dir
from arbiter.server.decoding import DecodeRefusal
from arbiter.server.driver import Driver, ReplicaStatus
from arbiter.server.hub import Hub, HubStatus
from arbiter.server.peers import PeerServicer, PeerTransport
from arbiter.server.security import announce_security, check_replica_cert, reload_tls
from arbiter.server.servicers import MembershipServicer
from arbiter.server.storage import Storage, StorageError
from arbiter.v1 import peer_pb2_grpc
from membership.errors import InvalidArgument
from membership.tls import LoadedTLS, ServerCredentials, channel_credentials
from membership.v1 import membership_pb2_grpc

__all__ = [
    "ArbiterServer",
    "channel_options",
    "check_bindable",
    "check_listen",
    "cluster_identity",
    "parse_peers",
    "server_options",
    "split_host_port",
]

log = logging.getLogger("arbiter")

SERVICE_NAME = surfaces.SERVICE_NAME
# Raft traffic between replicas: held to max_peer_message_bytes only.
PEER_SERVICE = "/arbiter.v1.Peer/"


def server_options(config: ArbiterConfig) -> list[tuple[str, int]]:
    """gRPC server options: message size limit and a keepalive policy that agrees with clients.

    The server pings a connection that brought nothing for ``keepalive_time``
    and closes it when the ping stays unanswered for ``keepalive_timeout``
    (``ping_timeout_ms`` is what gRPC core arms for that; see
    :meth:`membership.config.ClientConfig.channel_options` for every layer,
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


def cluster_identity(cluster: str, peers: dict[str, str], restored_from: str = "") -> str:
    """``name@digest``: the cluster name and a digest of the replica list.

    Stamped on every Raft message; a replica refuses traffic stamped with
    another identity, so replicas given different ``--peers`` lists fail
    loudly instead of forming two groups. A group restored from a backup
    (``--restore``) also digests the backup's sha256 (``restored_from``), so
    it is a new group, the same on each of its replicas
    (arbiter/server/backup.py, rule 4).
    """
    listing = ",".join(f"{k}={v}" for k, v in sorted(peers.items()))
    if restored_from:
        listing += f";restored-from={restored_from}"
    return f"{cluster}@{hashlib.sha256(listing.encode()).hexdigest()[:12]}"


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` (IPv6 hosts in brackets) to ``(host, port)``, the host without brackets.

    Raises:
        InvalidArgument: when it is not host:port with a port in 1..65535.
    """
    from membership.validation import parse_address

    host, _, port = parse_address(address).rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def parse_peers(spec: str) -> dict[str, str]:
    """Parses ``a1=host:port,a2=host:port,...`` into an ordered id -> address map.

    Raises:
        InvalidArgument: for an empty list, a malformed item, a duplicate id,
            or one address given to two replicas (hosts compared without case).
    """
    from membership.validation import parse_address, validate_node_id

    peers: dict[str, str] = {}
    owner: dict[tuple[str, int], str] = {}
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
        host, port = split_host_port(peers[rid])
        key = (host.lower(), port)
        if key in owner:
            raise InvalidArgument(
                f"--peers gives one address, {peers[rid]}, to {owner[key]} and {rid}: "
                "every replica needs its own"
            )
        owner[key] = rid
    if not peers:
        raise InvalidArgument("no peers given")
    return peers


# Listen hosts meaning "every address of this machine".
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def _addresses_of(host: str, port: int) -> set[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return {str(info[4][0]) for info in infos}


def check_listen(replica_id: str, listen: str, peers: dict[str, str]) -> None:
    """Checks that ``--listen`` is this replica's own ``--peers`` address.

    The others reach this replica at its ``--peers`` address only, so a replica
    listening elsewhere is never heard and the group never elects a leader.
    Accepted: the same port, and

    - the same host (without case), or
    - a wildcard listen host (``0.0.0.0``, ``::``, ``[::]``): it listens on
      every address of the machine, and the peer name is not resolved, since
      other machines may resolve it differently (docker-compose.yml listens on
      ``0.0.0.0:7000`` with ``a1=a1:7000``), or
    - two hosts that resolve here to a common address (``localhost`` and
      ``127.0.0.1``).

    Blocks while host names resolve (run it in a thread where that matters).

    Raises:
        InvalidArgument: naming both addresses and how to fix it (a host that
            does not resolve here cannot be checked and is refused too).
    """
    own = peers[replica_id]
    lhost, lport = split_host_port(listen)
    phost, pport = split_host_port(own)
    fix = (
        f"--listen {listen} is not {replica_id}'s own address in --peers ({own}), where the "
        "other replicas look for it; give the same host and port in both, or listen on "
        f"0.0.0.0:{pport}"
    )
    if lport != pport:
        raise InvalidArgument(f"{fix} (the ports differ)")
    if lhost in WILDCARD_HOSTS or lhost.lower() == phost.lower():
        return
    try:
        common = _addresses_of(lhost, lport) & _addresses_of(phost, pport)
    except OSError as e:
        raise InvalidArgument(f"{fix} (cannot resolve a host here: {e})") from None
    if not common:
        raise InvalidArgument(f"{fix} (the hosts resolve to different addresses)")


def check_bindable(listen: str) -> None:
    """Binds ``listen`` with the standard library and lets go, before gRPC tries.

    gRPC logs its own line when a bind fails and reports every failure alike;
    this names the cause. A process may still take the port between this
    check and gRPC's bind; gRPC's error covers that.

    Raises:
        OSError: ``cannot listen on ADDRESS: unknown host``, ``address in use``,
            ``not an address of this machine``, or the system's reason.
        InvalidArgument: a malformed address.
    """
    host, port = split_host_port(listen)
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as e:
        raise OSError(f"cannot listen on {listen}: unknown host {host!r} ({e.strerror})") from None
    reasons = {
        errno.EADDRINUSE: "address in use (another process listens on it)",
        errno.EADDRNOTAVAIL: f"{host} is not an address of this machine",
        errno.EACCES: "permission denied (ports below 1024 need privileges)",
    }
    bound = 0
    failure: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
                sock.bind(sockaddr)
            bound += 1
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                failure = e
                break
            failure = failure or e
    if failure is not None and (bound == 0 or failure.errno == errno.EADDRINUSE):
        why = reasons.get(failure.errno or 0, failure.strerror or str(failure))
        raise OSError(f"cannot listen on {listen}: {why}")


class ArbiterServer:
    """One arbiter replica: gRPC server, Raft transport and the driver loop.

    Args:
        replica_id: this replica's id; must be a key of ``peers``.
        peers: every replica's id -> ``host:port`` (this one included).
        listen: the address to bind, ``host:port``.
        config: the configuration (validated here).
        data_dir: the directory of this replica's durable Raft state (created
            if missing). None keeps it in memory only: a restarted replica
            then comes back empty, which Raft cannot tolerate; for tests.
        tls: this replica's CA, certificate and key (:func:`membership.tls.load`):
            mutual TLS on its port and to its peers, and the
            :class:`arbiter.server.authz.MutualTLS` policy. None is plaintext
            with :class:`arbiter.server.authz.AllowAll` (``--insecure``; the
            command line refuses to start without one or the other).
        restore: a backup file (``membership admin snapshot save``) to start
            a new group from, into an empty ``data_dir``
            (:func:`arbiter.server.backup.restore_data_dir`).

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
        data_dir: Path | None = None,
        tls: LoadedTLS | None = None,
        restore: Path | None = None,
    ) -> None:
        if replica_id not in peers:
            raise InvalidArgument(
                f"--id {replica_id!r} is not in --peers ({', '.join(peers)}); list every replica"
            )
        self.config = (config or ArbiterConfig.lan()).validate()
        if tls is not None:
            check_replica_cert(tls, self.config.cluster, replica_id)
        self.replica_id = replica_id
        self.peers = dict(peers)
        self.listen = listen
        self.data_dir = data_dir
        self.tls = tls
        self.restore = restore
        self._server_credentials = None if tls is None else ServerCredentials(tls)
        self.authz: Authorizer = AllowAll() if tls is None else MutualTLS(self.config.cluster)
        self._storage: Storage | None = None
        self._server: grpc.aio.Server | None = None
        self._stopped = asyncio.Event()
        self._failed = asyncio.Event()
        # Why this replica stopped taking part by itself (None while it is fit).
        self.failure: str | None = None
        self.port = 0
        self.metrics: metrics.MetricsServer | None = None

    def configuration(self) -> dict[str, dict[str, str]]:
        """The arbiter configuration in force: ``{"voters": {id: host:port}, "learners": {}}``.

        The one accessor that metrics and ``Admin.Status`` read: today the
        static ``--peers`` (:attr:`peers`), to repoint once the group changes online.
        """
        return {"voters": dict(self.peers), "learners": {}}

    async def start(self) -> None:
        """Recovers the durable state, binds the port, starts the driver, transport and server.

        Raises:
            OSError: the address cannot be bound (checked before the data
                directory is touched: see :func:`check_bindable`).
            StorageError: the data directory cannot be used (an OSError).
        """
        cfg = self.config
        # The addresses first: a replica that cannot listen creates no data dir.
        check_bindable(self.listen)
        if cfg.metrics_listen:
            check_bindable(cfg.metrics_listen)
        if self.restore is not None and self.data_dir is not None:
            restore_data_dir(
                self.data_dir, self.restore, self.replica_id, cluster=cfg.cluster, peers=self.peers
            )
        storage = Storage.open(
            self.data_dir,
            replica_id=self.replica_id,
            cluster=cfg.cluster,
            arbiters=self.peers,
        )
        try:
            await self._start(cfg, storage)
        except BaseException:
            storage.close()
            raise
        self._storage = storage

    async def _start(self, cfg: ArbiterConfig, storage: Storage) -> None:
        if self.data_dir is None:
            log.warning("arbiter %s: no data dir: raft state is in memory only", self.replica_id)
        # A restored group's identity is in its data dir (backup.py, rule 4).
        identity = storage.get_meta("identity") or cluster_identity(cfg.cluster, self.peers)
        self.identity = identity
        if len(self.peers) < 3:
            log.warning(
                "arbiter %s: a group of %d replica(s) survives no replica failure; run 3 or 5",
                self.replica_id,
                len(self.peers),
            )
        self.transport = PeerTransport(
            self_id=self.replica_id,
            peers=self.peers,
            cluster=identity,
            report_unreachable=lambda p: self.driver.report_unreachable(p),
            channel_options=channel_options(cfg),
            credentials=None if self.tls is None else channel_credentials(self.tls),
        )
        self.hub = Hub(
            view=lambda: self.driver.state.view(),
            history_size=cfg.history_size,
            queue_limit=cfg.subscriber_queue,
        )
        try:
            self.driver = Driver(
                replica_id=self.replica_id,
                replica_ids=list(self.peers),
                config=cfg,
                send=self.transport.send,
                on_change=self._on_change,
                on_quorum=self._on_quorum,
                storage=storage,
                on_reset=self.hub.reset,
                on_fatal=self._fatal,
            )
        except RestoreError as e:
            raise StorageError(f"data dir {self.data_dir}: {e}") from None
        self.api = MembershipServicer(self.driver, self.hub, cluster=identity, authz=self.authz)
        self.health = health.aio.HealthServicer()
        server = grpc.aio.server(
            options=server_options(cfg),
            interceptors=[DecodeRefusal(cfg.max_message_bytes, exempt=PEER_SERVICE)],
        )
        membership_pb2_grpc.add_MembershipServicer_to_server(self.api, server)
        self.admin_api = AdminServicer(
            self.driver, cluster=identity, authz=self.authz, status=lambda: status.describe(self)
        )
        membership_pb2_grpc.add_AdminServicer_to_server(self.admin_api, server)
        self.peer_api = PeerServicer(
            cluster=identity,
            deliver=lambda m: self.driver.on_raft_message(m),
            known=set(self.peers),
            authz=self.authz,
        )
        peer_pb2_grpc.add_PeerServicer_to_server(self.peer_api, server)
        surfaces.add_standard_services(server, self.health)
        try:
            if self._server_credentials is None:
                port = server.add_insecure_port(self.listen)
            else:
                port = server.add_secure_port(self.listen, self._server_credentials.credentials)
        except RuntimeError:
            port = 0
        if port == 0:  # taken since check_bindable, or refused by gRPC alone
            raise OSError(f"cannot listen on {self.listen}: gRPC could not bind it")
        self.port = port
        self.metrics = metrics.serve(self)  # None unless --metrics-listen
        await server.start()
        self._server = server
        await surfaces.set_starting(self.health)
        self.driver.start()
        self.transport.start()
        announce_security(self.replica_id, self.listen, self.tls)
        log.info(
            "arbiter %s listening on %s (peers: %s; %s detector, suspect after %.2fs at the "
            "%.3gs interval, which grows past %d nodes up to %.3gs: D up to %.2fs; data dir %s; "
            "metrics %s)",
            self.replica_id,
            self.listen,
            ", ".join(f"{k}={v}" for k, v in self.peers.items()),
            cfg.detector_kind,
            cfg.suspect_after,
            cfg.heartbeat_interval,
            int(cfg.heartbeat_budget * cfg.heartbeat_interval),
            cfg.max_heartbeat_interval,
            cfg.suspect_after * cfg.max_heartbeat_interval / cfg.heartbeat_interval,
            self.data_dir or "none (in memory)",
            metrics.where(self.metrics),
        )

    def reload_tls(self) -> bool:
        """SIGHUP: re-reads the TLS files for new handshakes (:func:`reload_tls`)."""
        return reload_tls(self, getattr(self, "transport", None))

    def _fatal(self, reason: str) -> None:
        """The driver found this replica unfit to take part: stop serving, say why."""
        self.failure = reason
        self._failed.set()

    async def wait_failed(self) -> str:
        """Returns the reason once this replica has found it must stop (see Driver on_fatal)."""
        await self._failed.wait()
        assert self.failure is not None
        return self.failure

    def _on_change(self, change: ViewChange) -> None:
        self.hub.publish(change)

    def _on_quorum(self, status: ReplicaStatus) -> None:
        self.hub.publish_status(
            HubStatus(in_quorum=status.in_quorum, leader_id=status.leader_id, epoch=status.epoch)
        )
        asyncio.get_running_loop().create_task(
            surfaces.set_quorum(self.health, in_quorum=status.in_quorum)
        )

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown: NOT_SERVING, stop the cores, end every stream, stop the server.

        Args:
            grace: seconds for in-flight calls to finish (default: config.shutdown_grace).
        """
        if self._server is None:
            return
        log.info("arbiter %s stopping", self.replica_id)
        await self.health.enter_graceful_shutdown()
        # The cores stop first: once heartbeat streams are told to go
        # elsewhere, a detector still ticking would suspect every node during
        # the grace below, and with all replicas stopped at once a quorum of
        # them would commit every healthy node DEAD on the way out.
        await self.driver.stop()
        self.api.close()
        self.peer_api.close()
        await self._server.stop(self.config.shutdown_grace if grace is None else grace)
        await self.transport.close()
        d = self.driver
        if d.persists:
            log.info(
                "arbiter %s persisted %d readies, %.2f ms each on average (fsync)",
                self.replica_id,
                d.persists,
                d.persist_seconds / d.persists * 1000,
            )
        if self.metrics is not None:
            await self.metrics.stop()
        if self._storage is not None:
            self._storage.close()  # every Ready was fsynced when saved; this releases the lock
            self._storage = None
        self._server = None
        self._stopped.set()
        log.info("arbiter %s stopped", self.replica_id)

    async def wait_stopped(self) -> None:
        """Returns once :meth:`stop` has finished."""
        await self._stopped.wait()
