"""Who may do what on a replica: the authorization hook of every servicer.

Every servicer asks its :class:`Authorizer` before it acts, once per call (a
stream is authorized on its first message: its identity cannot change
within it). A method returns ``None`` when the caller may go on, or the
refusal's message, which the servicer sends with PERMISSION_DENIED (or
UNAUTHENTICATED when the caller presented no identity at all).

``AllowAll`` is the ``--insecure`` policy: plaintext, nobody authenticated,
everything allowed. The mutual-TLS policy reads the caller's identity from
its certificate (see :mod:`membership.shared.grants`): :class:`MutualTLS`.

Proxied calls (``--ingest-workers``, :mod:`arbiter.server.ingest`): a worker
terminates the caller's TLS and forwards the call over a unix socket in a
0700 directory of the replica's consensus process, with the caller's
verified certificate in the metadata key :data:`PROXIED_CERT_KEY`. Only the
server of that socket reads the key (:class:`ProxiedContext`, built by the
interceptor of :mod:`arbiter.server.ingest.proxy`), and no server with a TCP
port reads it: a client that sends it over TCP gains nothing, since the
policies read the TLS handshake's auth context, never the metadata.
"""

from __future__ import annotations

from typing import Any, Protocol

import grpc

from membership.shared.grants import Identity, peer_identity

__all__ = [
    "PROXIED_CERT_KEY",
    "PROXIED_PEER_KEY",
    "AllowAll",
    "Authorizer",
    "MutualTLS",
    "ProxiedContext",
    "Refusal",
]

# Metadata of a call proxied by an ingest worker: the caller's verified
# certificate (PEM) and its address (for logs). Trusted only as documented above.
PROXIED_CERT_KEY = "x-membership-proxied-cert-bin"
PROXIED_PEER_KEY = "x-membership-proxied-peer"


class ProxiedContext:
    """A call's context as the caller of an ingest worker made it: ``auth_context()``
    gives the certificate the worker verified (empty without one), ``peer()`` the
    caller's address; everything else is the proxied call's own context.

    Args:
        inner: the context of the call on the consensus process's unix socket.
        cert: the caller's certificate, PEM (None: it presented none).
        peer: the caller's address as the worker saw it.
    """

    def __init__(self, inner: Any, cert: bytes | None, peer: str) -> None:
        self._inner = inner
        self._auth: dict[str, list[bytes]] = {} if cert is None else {"x509_pem_cert": [cert]}
        self._peer = peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    def peer(self) -> str:
        return self._peer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Refusal(str):
    """A refusal message; ``code`` is the gRPC status to end the call with."""

    code: grpc.StatusCode = grpc.StatusCode.PERMISSION_DENIED


class Authorizer(Protocol):
    """The questions a servicer asks about the caller of ``context``."""

    def node(self, context: grpc.aio.ServicerContext, node_id: str) -> Refusal | None:
        """May the caller speak for node ``node_id`` (Heartbeat, Leave)?"""

    def replica(self, context: grpc.aio.ServicerContext, replica_id: str) -> Refusal | None:
        """May the caller send Raft traffic as replica ``replica_id``?"""

    def reader(self, context: grpc.aio.ServicerContext) -> Refusal | None:
        """May the caller read the view (Subscribe, GetView)?"""

    def admin(self, context: grpc.aio.ServicerContext) -> Refusal | None:
        """May the caller administer the cluster (remove another node)?"""

    def operator(
        self, context: grpc.aio.ServicerContext, what: str = "read the replicas' status"
    ) -> Refusal | None:
        """May the caller read the replicas' standing (Admin.Status, ListArbiters):
        admin or observer? ``what`` names the read in the refusal."""

    def identity(self, context: grpc.aio.ServicerContext) -> str:
        """Who the caller is, for records such as ``removed_by`` ("" when unknown)."""


class AllowAll:
    """``--insecure``: every caller may do everything (no TLS, no identities)."""

    def node(self, context: grpc.aio.ServicerContext, node_id: str) -> Refusal | None:
        return None

    def replica(self, context: grpc.aio.ServicerContext, replica_id: str) -> Refusal | None:
        return None

    def reader(self, context: grpc.aio.ServicerContext) -> Refusal | None:
        return None

    def admin(self, context: grpc.aio.ServicerContext) -> Refusal | None:
        return None

    def operator(
        self, context: grpc.aio.ServicerContext, what: str = "read the replicas' status"
    ) -> Refusal | None:
        return None

    def identity(self, context: grpc.aio.ServicerContext) -> str:
        return ""  # nobody is authenticated


class MutualTLS:
    """The mutual-TLS policy: rights from the caller's certificate
    (:mod:`membership.shared.grants`).

    The identity is parsed once per certificate (cached by its bytes), and
    each call or stream asks once, so no heartbeat pays for it.

    Args:
        cluster: this replica's cluster name (``--cluster``): the trust
            domain a certificate's URIs must name to grant anything here.
    """

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster

    def _identity(self, context: grpc.aio.ServicerContext) -> Identity | Refusal:
        identity = peer_identity(context)
        if identity is None:
            refusal = Refusal("no client certificate: mutual TLS requires one of this cluster")
            refusal.code = grpc.StatusCode.UNAUTHENTICATED
            return refusal
        return identity

    def identity(self, context: grpc.aio.ServicerContext) -> str:
        """The caller's certificate identities, for records such as ``removed_by`` ("" if none)."""
        identity = peer_identity(context)
        return "" if identity is None else identity.names()

    def _refuse(self, identity: Identity, wanted: str) -> Refusal:
        return Refusal(
            f"certificate {identity.names()} may not {wanted}: it may "
            f"{identity.rights(self.cluster)}"
        )

    def node(self, context: grpc.aio.ServicerContext, node_id: str) -> Refusal | None:
        identity = self._identity(context)
        if isinstance(identity, Refusal):
            return identity
        if identity.may_node(self.cluster, node_id):
            return None
        return self._refuse(identity, f"speak for node {node_id!r}")

    def replica(self, context: grpc.aio.ServicerContext, replica_id: str) -> Refusal | None:
        identity = self._identity(context)
        if isinstance(identity, Refusal):
            return identity
        if identity.may_replica(self.cluster, replica_id):
            return None
        return self._refuse(identity, f"send raft traffic as replica {replica_id!r}")

    def reader(self, context: grpc.aio.ServicerContext) -> Refusal | None:
        identity = self._identity(context)
        if isinstance(identity, Refusal):
            return identity
        if identity.may_read(self.cluster):
            return None
        return self._refuse(identity, f"read the view of cluster {self.cluster}")

    def admin(self, context: grpc.aio.ServicerContext) -> Refusal | None:
        identity = self._identity(context)
        if isinstance(identity, Refusal):
            return identity
        if identity.may_admin(self.cluster):
            return None
        return self._refuse(identity, f"administer cluster {self.cluster}")

    def operator(
        self, context: grpc.aio.ServicerContext, what: str = "read the replicas' status"
    ) -> Refusal | None:
        identity = self._identity(context)
        if isinstance(identity, Refusal):
            return identity
        if identity.may_operate(self.cluster):
            return None
        return self._refuse(identity, f"{what} in cluster {self.cluster}")
