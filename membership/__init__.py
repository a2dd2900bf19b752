"""Client SDK of the membership service: heartbeats, the committed view, fencing.

The public names are listed in ``__all__``; everything else may change.
Each is imported from its module on first use (PEP 562 ``__getattr__``), so
that ``import membership.view``, which the arbiter's sans-I/O core does,
loads neither the client (asyncio, grpc) nor the status collector (threads,
logging, psutil).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

__all__ = [
    "ClientConfig",
    "ClosedError",
    "ClusterMismatch",
    "Degradation",
    "Disconnected",
    "EndReason",
    "EpochOutOfRange",
    "Evicted",
    "Evidence",
    "Fenced",
    "GpuStatus",
    "GraceWindow",
    "InvalidArgument",
    "JobRanks",
    "LocalError",
    "Member",
    "MemberChange",
    "MemberState",
    "MembershipClient",
    "MembershipError",
    "NoQuorum",
    "NodeStatus",
    "PermissionDenied",
    "QuorumChanged",
    "Reconnected",
    "RejectedError",
    "Rejoined",
    "RemoteError",
    "SessionEvent",
    "StateChanged",
    "StatusCollector",
    "StatusReport",
    "StatusUpdated",
    "Superseded",
    "UnavailableError",
    "View",
    "ViewChanged",
    "ViewEvent",
    "ViewInfo",
    "ViewReset",
    "ViewSnapshot",
    "sync",
]

# The module each public name is imported from on first use.
_SOURCES = {
    "ClientConfig": "membership.config",
    "ClosedError": "membership.errors",
    "ClusterMismatch": "membership.errors",
    "Degradation": "membership.view",
    "Disconnected": "membership.view",
    "EndReason": "membership.session",
    "EpochOutOfRange": "membership.errors",
    "Evicted": "membership.session",
    "Evidence": "membership.view",
    "Fenced": "membership.session",
    "GpuStatus": "membership.status",
    "GraceWindow": "membership.graces",
    "JobRanks": "membership.view",
    "InvalidArgument": "membership.errors",
    "LocalError": "membership.errors",
    "Member": "membership.view",
    "MemberChange": "membership.view",
    "MemberState": "membership.view",
    "MembershipClient": "membership.client",
    "MembershipError": "membership.errors",
    "NoQuorum": "membership.errors",
    "PermissionDenied": "membership.errors",
    "NodeStatus": "membership.status",
    "QuorumChanged": "membership.view",
    "Reconnected": "membership.view",
    "RejectedError": "membership.errors",
    "Rejoined": "membership.session",
    "RemoteError": "membership.errors",
    "SessionEvent": "membership.session",
    "StateChanged": "membership.session",
    "StatusCollector": "membership.collector",
    "StatusReport": "membership.view",
    "StatusUpdated": "membership.view",
    "Superseded": "membership.session",
    "UnavailableError": "membership.errors",
    "View": "membership.view",
    "ViewChanged": "membership.view",
    "ViewEvent": "membership.view",
    "ViewInfo": "membership.client",
    "ViewReset": "membership.view",
    "ViewSnapshot": "membership.view",
}

# Public submodules, imported on first use like the names: ``membership.sync``
# (the blocking client) works after a plain ``import membership``.
_SUBMODULES = frozenset({"sync"})

if TYPE_CHECKING:
    from membership import sync
    from membership.client import MembershipClient, ViewInfo
    from membership.collector import StatusCollector
    from membership.config import ClientConfig
    from membership.errors import (
        ClosedError,
        ClusterMismatch,
        EpochOutOfRange,
        InvalidArgument,
        LocalError,
        MembershipError,
        NoQuorum,
        PermissionDenied,
        RejectedError,
        RemoteError,
        UnavailableError,
    )
    from membership.graces import GraceWindow
    from membership.session import (
        EndReason,
        Evicted,
        Fenced,
        Rejoined,
        SessionEvent,
        StateChanged,
        Superseded,
    )
    from membership.status import GpuStatus, NodeStatus
    from membership.view import (
        Degradation,
        Disconnected,
        Evidence,
        JobRanks,
        Member,
        MemberChange,
        MemberState,
        QuorumChanged,
        Reconnected,
        StatusReport,
        StatusUpdated,
        View,
        ViewChanged,
        ViewEvent,
        ViewReset,
        ViewSnapshot,
    )

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
    if name in _SUBMODULES:
        return import_module(f"membership.{name}")  # the import binds it in globals()
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'membership' has no attribute {name!r}")
    value = getattr(import_module(source), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
