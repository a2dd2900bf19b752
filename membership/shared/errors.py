"""One exception hierarchy for the SDK, split by who is at fault (h11 style).

``MembershipError`` is the root. ``LocalError`` means the caller did something
wrong (bad argument, call in the wrong state); ``RemoteError`` means the
cluster refused or could not answer. Servers map these to gRPC status codes
only at their edge.
"""

from __future__ import annotations

__all__ = [
    "ClosedError",
    "ClusterMismatch",
    "EpochOutOfRange",
    "InvalidArgument",
    "LocalError",
    "MembershipError",
    "NoQuorum",
    "PermissionDenied",
    "RejectedError",
    "RemoteError",
    "UnavailableError",
]


class MembershipError(Exception):
    """Root of every error this package raises on purpose."""


class LocalError(MembershipError):
    """The caller's fault: fix the call."""


class InvalidArgument(LocalError, ValueError):
    """An argument (node id, label, address, configuration value) is malformed."""


class ClusterMismatch(InvalidArgument):
    """The arbiters given belong to different clusters (or not to the one asked for).

    Attributes:
        identities: arbiter address -> the cluster identity (``name@digest``)
            it reported, for every arbiter heard so far.
    """

    def __init__(self, message: str, identities: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.identities = dict(identities or {})


class PermissionDenied(InvalidArgument):
    """The arbiters refused this client's certificate for what it asked (PERMISSION_DENIED:
    a node certificate that does not name this node id, say); the message names the
    certificate and what it may do (docs/security.md)."""


class ClosedError(LocalError):
    """The client was closed (or left) and cannot do this any more."""


class RemoteError(MembershipError):
    """The cluster refused or could not answer."""


class UnavailableError(RemoteError):
    """No arbiter answered in time (all unreachable, or none reachable with quorum)."""


class NoQuorum(UnavailableError):
    """The arbiters reached have no quorum, so nothing can be decided now."""


class EpochOutOfRange(RemoteError):
    """A watch asked to resume after an epoch the cluster never reached.

    Typically the cluster was reset (new data dirs) since the epoch was
    saved, or the epoch belongs to another cluster. Resume from 0 (a fresh
    snapshot), or pass ``reset_if_ahead=True`` to :meth:`MembershipClient.watch`.

    Attributes:
        since_epoch: the epoch asked for.
        cluster_epoch: the cluster's epoch as the refusing arbiter had it.
    """

    def __init__(self, message: str, *, since_epoch: int, cluster_epoch: int) -> None:
        super().__init__(message)
        self.since_epoch = since_epoch
        self.cluster_epoch = cluster_epoch


class RejectedError(RemoteError):
    """An arbiter refused the request (for example leaving an incarnation that is already DEAD)."""
