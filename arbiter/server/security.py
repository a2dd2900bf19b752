"""A replica's transport security: its own certificate checked, its plaintext announced.

The TLS plumbing itself (files, credentials, reload) is :mod:`membership.tls`;
who may do what is :mod:`arbiter.server.authz`.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import TYPE_CHECKING, Any

from membership.errors import InvalidArgument
from membership.tls import LoadedTLS, ServerCredentials, channel_credentials
from membership.validation import parse_address

if TYPE_CHECKING:
    from arbiter.server.peers import PeerTransport

__all__ = ["announce_security", "check_replica_cert", "is_loopback", "reload_tls"]

log = logging.getLogger("arbiter")


def check_replica_cert(loaded: LoadedTLS, cluster: str, replica_id: str) -> None:
    """Checks that a replica's own certificate is ``spiffe://<cluster>/arbiter/<id>``
    with serverAuth: the others accept its Raft traffic, clients its port.

    Raises:
        InvalidArgument: naming the certificate, what it names and what is needed.
    """
    ident = loaded.identity
    if not ident.may_replica(cluster, replica_id) or not loaded.server:
        raise InvalidArgument(
            f"--tls-cert {loaded.files.cert} names {ident.names()}"
            f"{'' if loaded.server else ' without serverAuth'}: replica {replica_id} of cluster "
            f"{cluster} needs an arbiter certificate for spiffe://{cluster}/arbiter/{replica_id} "
            f"(membership certs init DIR --cluster {cluster} --arbiters {replica_id},...)"
        )


def is_loopback(listen: str) -> bool:
    """Whether ``listen`` binds loopback addresses only (``localhost``, 127.0.0.0/8, ``::1``).

    A host name other than ``localhost`` is not resolved: it counts as not loopback.
    """
    host = parse_address(listen).rpartition(":")[0].removeprefix("[").removesuffix("]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def announce_security(replica_id: str, listen: str, tls: LoadedTLS | None) -> None:
    """Logs the replica's security at start-up: its identity under TLS, or a
    WARNING when it serves plaintext on an address that is not loopback."""
    if tls is None and not is_loopback(listen):
        log.warning(
            "arbiter %s listens on %s in plaintext (--insecure): anyone who reaches that "
            "port can heartbeat, leave or evict as any node, and take part in Raft",
            replica_id,
            listen,
        )
    elif tls is not None:
        log.info(
            "arbiter %s: mutual TLS as %s (certificate %x, until %s)",
            replica_id,
            tls.identity.names(),
            tls.identity.serial,
            tls.identity.not_after,
        )


def reload_tls(server: Any, transport: PeerTransport | None) -> bool:
    """Re-reads an :class:`arbiter.server.app.ArbiterServer`'s TLS files (SIGHUP): new
    handshakes, on its port and to its peers (``transport``), use them; connections
    and streams open now stay up.

    A file that is missing or bad, or a certificate that is not this
    replica's (:func:`check_replica_cert`), is logged as an ERROR and changes nothing.

    Returns:
        Whether the new files are in use (False also without TLS).
    """
    creds: ServerCredentials | None = server._server_credentials
    if creds is None:
        log.warning("arbiter %s: no TLS files to reload (--insecure)", server.replica_id)
        return False
    try:
        loaded = creds.reload(
            lambda new: check_replica_cert(new, server.config.cluster, server.replica_id)
        )
    except InvalidArgument as e:
        log.error("arbiter %s: TLS reload failed, keeping the old files: %s", server.replica_id, e)
        return False
    server.tls = loaded
    if transport is not None:  # else: not started yet; it starts with the new files
        transport.set_credentials(channel_credentials(loaded))
    log.info(
        "arbiter %s: TLS files reloaded: %s, certificate %x, until %s",
        server.replica_id,
        loaded.identity.names(),
        loaded.identity.serial,
        loaded.identity.not_after,
    )
    return True
