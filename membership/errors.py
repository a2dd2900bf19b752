"""One exception hierarchy for the SDK, split by who is at fault (h11 style).

``MembershipError`` is the root. ``LocalError`` means the caller did something
wrong (bad argument, call in the wrong state); ``RemoteError`` means the
cluster refused or could not answer. Servers map these to gRPC status codes
only at their edge.
"""

from __future__ import annotations

__all__ = [
    "ClosedError",
    "InvalidArgument",
    "LocalError",
    "MembershipError",
    "NoQuorum",
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


class ClosedError(LocalError):
    """The client was closed (or left) and cannot do this any more."""


class RemoteError(MembershipError):
    """The cluster refused or could not answer."""


class UnavailableError(RemoteError):
    """No arbiter answered in time (all unreachable, or none reachable with quorum)."""


class NoQuorum(UnavailableError):
    """The arbiters reached have no quorum, so nothing can be decided now."""


class RejectedError(RemoteError):
    """An arbiter refused the request (for example leaving an incarnation that is already DEAD)."""
