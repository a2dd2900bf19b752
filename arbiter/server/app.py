"""ArbiterServer: one replica's whole lifecycle, start() to stop(grace)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health

from arbiter.config import ArbiterConfig
from arbiter.core.replica import RestoreError
from arbiter.core.tally import ViewChange
from arbiter.server.api import surfaces
from arbiter.server.api.decoding import DecodeRefusal
from arbiter.server.api.servicers import MembershipServicer
from arbiter.server.consensus.arbiterset import ArbiterSet
from arbiter.server.consensus.driver import Driver, ReplicaStatus
from arbiter.server.consensus.peers import PeerServicer, PeerTransport
from arbiter.server.consensus.storage import DB_NAME, Storage, StorageError
from arbiter.server.consensus.stored import first_configuration, warn_if_peers_differ
from arbiter.server.fanout.frames import add_membership_service
from arbiter.server.fanout.hub import Hub, HubStatus
from arbiter.server.net.addresses import check_bindable, check_listen, split_host_port
from arbiter.server.net.authz import AllowAll, Authorizer, MutualTLS
from arbiter.server.net.options import channel_options, server_options
from arbiter.server.net.security import announce_security, check_replica_cert
from arbiter.server.ops import metrics, status
from arbiter.server.ops.admin import AdminServicer
from arbiter.server.ops.admin_arbiters import ArbiterAdmin
from arbiter.server.ops.backup import restore_data_dir
from arbiter.server.ops.joining import ask_group
from arbiter.server.ops.reconfig import Reconfiguration
from arbiter.v1 import peer_pb2_grpc
from arbiter.workers import ingest_worker_count
from membership.shared.errors import InvalidArgument
from membership.shared.tls import LoadedTLS, ServerCredentials, channel_credentials
from membership.v1 import membership_pb2_grpc

if TYPE_CHECKING:
    from arbiter.server.ingest.pool import IngestPool

__all__ = ["ArbiterServer"]

log = logging.getLogger("arbiter")

SERVICE_NAME = surfaces.SERVICE_NAME
# Raft traffic between replicas: held to max_peer_message_bytes only.
PEER_SERVICE = "/arbiter.v1.Peer/"


class ArbiterServer:
    """One arbiter replica: gRPC server, Raft transport and the driver loop.

    Args:
        replica_id: this replica's id; must be a key of ``peers``.
        peers: every replica's id -> ``host:port`` (this one included): the
            group's first configuration, used at a first start only (the
            stored configuration wins after it: :mod:`arbiter.server.consensus.stored`).
        listen: the address to bind, ``host:port``.
        config: the configuration (validated here).
        data_dir: the directory of this replica's durable Raft state (created
            if missing). None keeps it in memory only: a restarted replica
            then comes back empty, which Raft cannot tolerate; for tests.
        tls: this replica's CA, certificate and key (:func:`membership.shared.tls.load`):
            mutual TLS on its port and to its peers, and the
            :class:`arbiter.server.net.authz.MutualTLS` policy. None is plaintext
            with :class:`arbiter.server.net.authz.AllowAll` (``--insecure``; the
            command line refuses to start without one or the other).
        join: ``--join``'s replicas of a running group, ``host:port``; empty
            for a replica of a new group (:mod:`arbiter.server.ops.joining`).
        restore: a backup file (``membership admin snapshot save``) to start
            a new group from, into an empty ``data_dir``
            (:func:`arbiter.server.ops.backup.restore_data_dir`).

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
        join: list[str] | None = None,
        restore: Path | None = None,
    ) -> None:
        self.join = list(join or [])
        self.restore = restore
        if not self.join and replica_id not in peers:
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
        self._server_credentials = None if tls is None else ServerCredentials(tls)
        self.authz: Authorizer = AllowAll() if tls is None else MutualTLS(self.config.cluster)
        self._storage: Storage | None = None
        self._server: grpc.aio.Server | None = None
        self._stopped = asyncio.Event()
        self._failed = asyncio.Event()
        # Set when this replica was removed from the group (exits 0, not a failure).
        self.removed: str | None = None
        self._told_removed: set[str] = set()  # peers that say it was (peers.py)
        self.identity = ""
        # Why this replica stopped taking part by itself (None while it is fit).
        self.failure: str | None = None
        self.port = 0
        self.metrics: metrics.MetricsServer | None = None
        self.ingest: IngestPool | None = None  # --ingest-workers K >= 1 (arbiter/server/ingest)

    def configuration(self) -> dict[str, dict[str, str]]:
        """The arbiter configuration in force: ``{"voters": {id: host:port}, "learners": {..}}``.

        The one accessor that metrics and ``Admin.Status`` read
        (:mod:`arbiter.server.ops.reconfig`); the first ``--peers`` before start.
        """
        reconfig = getattr(self, "reconfig", None)
        if reconfig is None:
            return {"voters": dict(self.peers), "learners": {}}
        current = reconfig.current
        return {"voters": dict(current.voters), "learners": dict(current.learners)}

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
        group = None
        if self.join and (self.data_dir is None or not (self.data_dir / DB_NAME).exists()):
            group = await ask_group(
                self.replica_id,
                self.listen,
                self.join,
                None if self.tls is None else channel_credentials(self.tls),
            )
            members = group.arbiters.members
            await asyncio.to_thread(check_listen, self.replica_id, self.listen, members)
            self.peers = members
        storage = Storage.open(
            self.data_dir,
            replica_id=self.replica_id,
            cluster=cfg.cluster,
            arbiters=self.peers,
            identity=None if group is None else group.identity,
            joined=group is not None,
        )
        try:
            given = self.peers
            self.peers = first_configuration(storage, self.replica_id, given)
            self.identity = storage.identity
            await self._start(cfg, storage, given)
            if self.join and not storage.first_start:
                log.info(
                    "arbiter %s: --join with a data dir that holds state: restarting "
                    "from the stored configuration",
                    self.replica_id,
                )
        except BaseException:
            storage.close()
            raise
        self._storage = storage

    async def _start(self, cfg: ArbiterConfig, storage: Storage, given: dict[str, str]) -> None:
        if self.data_dir is None:
            log.warning("arbiter %s: no data dir: raft state is in memory only", self.replica_id)
        identity = self.identity
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
            removed_by=self._removed_by,
        )
        self.hub = Hub(
            view=lambda: self.driver.state.view(),
            history_size=cfg.history_size,
            queue_limit=cfg.subscriber_queue,
            progress_interval=cfg.progress_interval,
            write_timeout=cfg.subscriber_write_timeout,
        )
        try:
            self.driver = Driver(
                replica_id=self.replica_id,
                replica_ids=self.peers,
                config=cfg,
                send=self.transport.send,
                on_change=self._on_change,
                on_quorum=self._on_quorum,
                storage=storage,
                on_reset=self.hub.reset,
                on_fatal=self._fatal,
                join=storage.joined,
            )
        except RestoreError as e:
            raise StorageError(f"data dir {self.data_dir}: {e}") from None
        self.api = MembershipServicer(self.driver, self.hub, cluster=identity, authz=self.authz)
        self.driver.add_lateness_source(self.api.read_lag.lateness, backlog=False)  # readlag 3
        self.health = health.aio.HealthServicer()
        interceptors: list[grpc.aio.ServerInterceptor] = [
            DecodeRefusal(cfg.max_message_bytes, exempt=PEER_SERVICE)
        ]
        options = server_options(cfg)
        workers = ingest_worker_count(cfg.ingest_workers)  # auto: the cores (arbiter/workers.py)
        if workers:  # the workers take --listen; this process a unix socket
            from arbiter.server.ingest.pool import IngestPool
            from arbiter.server.ingest.proxy import ProxiedIdentity

            self.ingest = IngestPool(self, workers)
            interceptors.insert(0, ProxiedIdentity())
            options = [o for o in options if o[0] != "grpc.max_concurrent_streams"]
        server = grpc.aio.server(options=options, interceptors=interceptors)
        add_membership_service(self.api, server)  # Subscribe writes bytes (frames.py)
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
        self.reconfig = Reconfiguration(
            self.driver,
            self.peers,
            on_change=self._on_configuration,
            on_removed=self._removed,
            joining=storage.joined and storage.first_start,
        )
        self.driver.after_turn = self.reconfig.refresh
        if not storage.first_start:  # before the port serves anything (stored.py rules 2, 3)
            if not self.join:  # a --join replica's configuration is the group's, --peers or not
                warn_if_peers_differ(
                    self.replica_id,
                    given,
                    self.reconfig.current.members,
                    self.reconfig.current.index,
                )
            await self._check_own_address()
        self.api.arbiters = lambda: self.reconfig.current
        self.admin_api.arbiters = ArbiterAdmin(
            self.reconfig, self.replica_id, identity, self.authz, cfg.election_timeout * 5
        )
        self.transport.set_peers(self.reconfig.peers)
        self.peer_api.known = set(self.reconfig.peers)
        surfaces.add_standard_services(server, self.health)
        try:
            if self.ingest is not None:
                self.ingest.bind(server)  # ingest/pool.py rule 1 (--listen checked free above)
                port = split_host_port(self.listen)[1]
            elif self._server_credentials is None:
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
        if self.ingest is not None:
            try:  # every worker serves --listen before this replica does (a failure: OSError)
                await self.ingest.start()
            except BaseException:
                await self.driver.stop()
                await server.stop(0)
                self._server = None
                raise
        self.transport.start()
        announce_security(self.replica_id, self.listen, self.tls)
        log.info(
            "arbiter %s listening on %s (arbiters in force: %s; %s detector, suspect after "
            "%.2fs at the %.3gs interval, which grows past %d nodes up to %.3gs: D up to %.2fs; "
            "data dir %s; metrics %s)",
            self.replica_id,
            self.listen,
            ", ".join(f"{k}={v}" for k, v in self.reconfig.current.members.items()),
            cfg.detector_kind,
            cfg.suspect_after,
            cfg.heartbeat_interval,
            int(cfg.heartbeat_budget * cfg.heartbeat_interval),
            cfg.max_heartbeat_interval,
            cfg.suspect_after * cfg.max_heartbeat_interval / cfg.heartbeat_interval,
            self.data_dir or "none (in memory)",
            metrics.where(self.metrics),
        )

    async def _check_own_address(self) -> None:
        """stored.py rule 3: ``--listen`` must be this replica's address in force."""
        members = self.reconfig.current.members
        if self.replica_id not in members:
            return
        try:
            await asyncio.to_thread(check_listen, self.replica_id, self.listen, members)
        except InvalidArgument as e:
            raise StorageError(
                f"{e} (the stored configuration at log index {self.reconfig.current.index} "
                "wins over --peers; listen at the stored address, or replace this replica: "
                "README, 'Replacing an arbiter')"
            ) from None

    def _removed_by(self, peer: str) -> None:
        """peers.py: ``peer`` says this replica was removed; a majority of voters stops it."""
        self._told_removed.add(peer)
        voters = set(self.reconfig.current.voters) - {self.replica_id}
        if not self.reconfig.removed and len(self._told_removed & voters) > len(voters) // 2:
            self.reconfig.removed = True
            log.warning(
                "%s: told by %s that this replica was removed from the arbiter group: stopping",
                self.replica_id,
                ", ".join(sorted(self._told_removed)),
            )
            self._removed(self.reconfig.current)

    def _on_configuration(self, arbiters: ArbiterSet) -> None:
        """reconfig.py rule 1: the transport, the peer servicer and subscribers follow."""
        peers = self.reconfig.peers
        self.peer_api.removed |= set(self.peer_api.known) - set(peers)
        self.peer_api.removed -= set(peers)
        self.transport.set_peers(peers)
        self.peer_api.known = set(peers)
        self._on_quorum(self.driver.status())

    def _removed(self, arbiters: ArbiterSet) -> None:
        """reconfig.py rule 2: removed from the group: stop (the command exits 0)."""
        self.removed = (
            f"arbiter {self.replica_id} was removed from the group at log index "
            f"{arbiters.index}; its data dir can be deleted"
        )
        self._failed.set()

    def reload_tls(self) -> bool:
        """SIGHUP: re-reads the TLS files; new handshakes, on the replica's port, to its
        peers and in its ingest workers, use them; connections and streams open now stay up.

        A file that is missing or bad, or a certificate that is not this
        replica's (:func:`~arbiter.server.net.security.check_replica_cert`), is
        logged as an ERROR and changes nothing.

        Returns:
            Whether the new files are in use (False also without TLS).
        """
        transport = getattr(self, "transport", None)
        creds: ServerCredentials | None = self._server_credentials
        if creds is None:
            log.warning("arbiter %s: no TLS files to reload (--insecure)", self.replica_id)
            return False
        try:
            loaded = creds.reload(
                lambda new: check_replica_cert(new, self.config.cluster, self.replica_id)
            )
        except InvalidArgument as e:
            log.error(
                "arbiter %s: TLS reload failed, keeping the old files: %s", self.replica_id, e
            )
            return False
        self.tls = loaded
        if transport is not None:  # else: not started yet; it starts with the new files
            transport.set_credentials(channel_credentials(loaded))
        log.info(
            "arbiter %s: TLS files reloaded: %s, certificate %x, until %s",
            self.replica_id,
            loaded.identity.names(),
            loaded.identity.serial,
            loaded.identity.not_after,
        )
        if self.ingest is not None:
            self.ingest.reload_tls()
        return True

    def _fatal(self, reason: str) -> None:
        """The driver found this replica unfit to take part: stop serving, say why."""
        self.failure = reason
        self._failed.set()

    async def wait_failed(self) -> str:
        """Returns the reason once this replica has found it must stop (see Driver on_fatal),
        or was removed from the group (:attr:`removed`)."""
        await self._failed.wait()
        reason = self.failure or self.removed
        assert reason is not None
        return reason

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
        self.peer_api.close()  # before the workers stop: the Raft streams they proxy end here
        if self.ingest is not None:
            await self.ingest.stop()  # their streams end with UNAVAILABLE, as close() does here
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
