"""Client SDK of the membership service: heartbeats, the committed view, fencing.

The public names are listed in ``__all__``; everything else may change.
The client (and with it grpc) is imported on first use, so that the
arbiter's sans-I/O core can use :mod:`membership.view` without pulling in I/O.
"""

from typing import TYPE_CHECKING, Any

from membership.config import ClientConfig
from membership.errors import (
    ClosedError,
    InvalidArgument,
    LocalError,
    MembershipError,
    NoQuorum,
    RejectedError,
    RemoteError,
    UnavailableError,
)
from membership.session import Fenced, Rejoined, SessionEvent, StateChanged
from membership.status import NodeStatus, StatusCollector
from membership.view import (
    Evidence,
    Member,
    MemberChange,
    MemberState,
    QuorumChanged,
    StatusReport,
    StatusUpdated,
    View,
    ViewChanged,
    ViewEvent,
    ViewSnapshot,
)

__all__ = [
    "ClientConfig",
    "ClosedError",
    "Evidence",
    "Fenced",
    "InvalidArgument",
    "LocalError",
    "Member",
    "MemberChange",
    "MemberState",
    "MembershipClient",
    "MembershipError",
    "NoQuorum",
    "NodeStatus",
    "QuorumChanged",
    "RejectedError",
    "Rejoined",
    "RemoteError",
    "SessionEvent",
    "StateChanged",
    "StatusCollector",
    "StatusReport",
    "StatusUpdated",
    "UnavailableError",
    "View",
    "ViewChanged",
    "ViewEvent",
    "ViewInfo",
    "ViewSnapshot",
]

if TYPE_CHECKING:
    from membership.client import MembershipClient, ViewInfo

    __version__: str


def _version() -> str:
    """The installed distribution's version (``0+unknown`` when run from a source tree
    that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("grpc-membership")
    except PackageNotFoundError:
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return _version()
    if name in ("MembershipClient", "ViewInfo"):
        from membership import client

        return getattr(client, name)
    raise AttributeError(f"module 'membership' has no attribute {name!r}")
