"""Who may do what on a replica: the authorization hook of every servicer.

Every servicer asks its :class:`Authorizer` before it acts, once per call (a
stream is authorized on its first message: its identity cannot change
within it). A method returns ``None`` when the caller may go on, or the
refusal's message, which the servicer sends with PERMISSION_DENIED (or
UNAUTHENTICATED when the caller presented no identity at all).

``AllowAll`` is the ``--insecure`` policy: plaintext, nobody authenticated,
everything allowed. The mutual-TLS policy reads the caller's identity from
its certificate (see :mod:`membership.tls`).
"""

from __future__ import annotations

from typing import Protocol

import grpc

__all__ = ["AllowAll", "Authorizer", "Refusal"]


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
