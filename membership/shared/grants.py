"""Identities read from certificates, and what each may do (the grants).

A certificate names its holder's rights as SAN URIs of the SPIFFE form
``spiffe://<cluster>/<role>/<name>`` (role ``arbiter``, ``node``, ``admin``
or ``observer``; a node name ending in ``*`` is a prefix pattern). Only URIs
whose trust domain is the replica's cluster grant anything there; several
URIs give the union of their rights. docs/security.md has the table.

:func:`peer_identity` reads the caller's identity from the PEM that gRPC
puts in a call's auth context (``x509_pem_cert``), parsed once per
certificate (an LRU keyed by its bytes): a stream is authorized on its
first message, never per heartbeat. (grpcio 1.85 also puts
``x509_subject_alternative_name`` and ``peer_uri`` there, and
``peer_spiffe_id`` only for a certificate with exactly one URI SAN;
parsing the certificate also gives its serial and expiry, and does not
depend on which of those keys a gRPC version sets.) The replicas' policy built on it is
:class:`arbiter.server.net.authz.MutualTLS`.
"""

from __future__ import annotations

import collections
import datetime
import re
from dataclasses import dataclass
from typing import Any

from cryptography import x509

__all__ = ["Grant", "Identity", "identity_of_pem", "parse_identity", "peer_identity"]

_URI = re.compile(r"^spiffe://([^/]+)/(arbiter|node|admin|observer)/([^/]+)$")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}\*?$")


@dataclass(frozen=True, slots=True)
class Grant:
    """One identity URI of a certificate: ``spiffe://<cluster>/<role>/<name>``.

    Attributes:
        cluster: the trust domain.
        role: ``arbiter``, ``node``, ``admin`` or ``observer``.
        name: the id; for a node, a trailing ``*`` makes it a prefix pattern.
    """

    cluster: str
    role: str
    name: str

    def covers_node(self, node_id: str) -> bool:
        """Whether this is a node grant for ``node_id`` (exactly, or by its prefix)."""
        if self.role != "node":
            return False
        if self.name.endswith("*"):
            return node_id.startswith(self.name[:-1])
        return node_id == self.name

    def __str__(self) -> str:
        return f"spiffe://{self.cluster}/{self.role}/{self.name}"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a certificate names (its SAN URIs of the spiffe scheme, parsed).

    Attributes:
        grants: every identity URI, parsed (those of other schemes or shapes are ignored).
        serial: the certificate's serial number.
        subject: the certificate's subject, for messages.
        not_after: end of validity (UTC).
    """

    grants: tuple[Grant, ...]
    serial: int = 0
    subject: str = ""
    not_after: datetime.datetime | None = None

    def of(self, cluster: str) -> tuple[Grant, ...]:
        """The grants of cluster ``cluster`` (the others give no right there)."""
        return tuple(g for g in self.grants if g.cluster == cluster)

    def may_read(self, cluster: str) -> bool:
        """Any role of the cluster may Subscribe and GetView."""
        return bool(self.of(cluster))

    def may_node(self, cluster: str, node_id: str) -> bool:
        """May Heartbeat and Leave as ``node_id``."""
        return any(g.covers_node(node_id) for g in self.of(cluster))

    def may_replica(self, cluster: str, replica_id: str) -> bool:
        """May send Raft traffic as replica ``replica_id``."""
        return any(g.role == "arbiter" and g.name == replica_id for g in self.of(cluster))

    def may_admin(self, cluster: str) -> bool:
        """May administer the cluster (remove another node)."""
        return any(g.role == "admin" for g in self.of(cluster))

    def may_operate(self, cluster: str) -> bool:
        """May read the replicas' standing (Admin.Status): an admin or an observer."""
        return any(g.role in ("admin", "observer") for g in self.of(cluster))

    def names(self) -> str:
        """The URIs, comma-separated (``(no identity URI)`` when there is none)."""
        return (
            ", ".join(str(g) for g in self.grants) or f"(no identity URI; subject {self.subject})"
        )

    def rights(self, cluster: str) -> str:
        """What this identity may do in ``cluster``, in words (for refusals)."""
        grants = self.of(cluster)
        if not grants:
            others = sorted({g.cluster for g in self.grants})
            where = f"it is of cluster {', '.join(others)}" if others else "it names no identity"
            return f"do nothing in cluster {cluster} ({where})"
        parts = []
        replicas = [g.name for g in grants if g.role == "arbiter"]
        nodes = [g.name for g in grants if g.role == "node"]
        if replicas:
            parts.append("send raft traffic as replica " + ", ".join(replicas))
        if nodes:
            parts.append("heartbeat and leave as node " + ", ".join(nodes))
        if any(g.role == "admin" for g in grants):
            parts.append("administer")
        if any(g.role in ("admin", "observer") for g in grants):
            parts.append("read the view, the replicas' status and the arbiter list")
        else:
            parts.append("read the view")
        return "; ".join(parts)


def parse_identity(cert: x509.Certificate) -> Identity:
    """The :class:`Identity` a certificate names (its spiffe SAN URIs)."""
    grants: list[Grant] = []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    for uri in uris:
        m = _URI.match(uri)
        if m is not None and _NAME.match(m.group(3)):
            if m.group(3).endswith("*") and m.group(2) != "node":
                continue  # only node grants may be patterns
            grants.append(Grant(m.group(1), m.group(2), m.group(3)))
    return Identity(
        grants=tuple(grants),
        serial=cert.serial_number,
        subject=cert.subject.rfc4514_string(),
        not_after=cert.not_valid_after_utc,
    )


# Parsed identities by certificate PEM: a stream's identity is parsed on its
# first message only, and one certificate serves many streams.
_CACHE_LIMIT = 4096
_cache: collections.OrderedDict[bytes, Identity] = collections.OrderedDict()


def identity_of_pem(pem: bytes) -> Identity:
    """The identity of a PEM certificate, parsed once per certificate (LRU of 4096).

    Raises:
        ValueError: not a PEM certificate.
    """
    found = _cache.get(pem)
    if found is not None:
        _cache.move_to_end(pem)
        return found
    identity = parse_identity(x509.load_pem_x509_certificate(pem))
    _cache[pem] = identity
    if len(_cache) > _CACHE_LIMIT:
        _cache.popitem(last=False)
    return identity


def peer_identity(context: Any) -> Identity | None:
    """The identity of the caller of a gRPC call (``grpc.aio.ServicerContext``).

    Returns:
        None when the call came without a verified client certificate
        (plaintext, or TLS without client authentication).
    """
    pems = context.auth_context().get("x509_pem_cert")
    if not pems:
        return None
    try:
        return identity_of_pem(pems[0])
    except ValueError:
        return None
