"""A replica's transport security: its own certificate checked, its plaintext announced.

The TLS plumbing itself (files, credentials, reload) is :mod:`membership.shared.tls`;
who may do what is :mod:`arbiter.server.net.authz`.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import TYPE_CHECKING

from membership.shared.errors import InvalidArgument
from membership.shared.tls import LoadedTLS
from membership.shared.validation import parse_address

if TYPE_CHECKING:
    pass

__all__ = ["announce_security", "check_replica_cert", "is_loopback"]

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
            f"{loaded.files.said('cert')} names {ident.names()}"
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
