"""Client SDK of the membership service: heartbeats, the committed view, fencing.

The public names are listed in ``__all__`` (the asyncio client, the config,
the errors, the view and its events, the status types); ``membership.sync`` is
the blocking client, ``membership.testing`` runs real clusters on one machine,
``membership.cli`` is the ``membership`` command. Everything else is private
(``_node``, ``_watch``, ``_arbiters``, ``_client``...) or shared with the arbiter
(``membership.shared``, ``membership.v1``) and may change.

Each public name is imported from its module on first use (PEP 562
``__getattr__``), so that ``import membership.shared.view``, which the
arbiter's sans-I/O core does, loads neither the client (asyncio, grpc) nor
the status collector (threads, logging, psutil).

Modules that users may have imported from before the SDK was split into
packages keep their old paths (:data:`_MOVED`): ``import membership.view``
gives the module ``membership.shared.view`` itself, with a DeprecationWarning
naming the new path.
"""

import importlib.abc
import importlib.machinery
import sys
import warnings
from importlib import import_module
from types import ModuleType
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
    "ClientConfig": "membership._config",
    "ClosedError": "membership.shared.errors",
    "ClusterMismatch": "membership.shared.errors",
    "Degradation": "membership.shared.view",
    "Disconnected": "membership.shared.view",
    "EndReason": "membership._node.session",
    "EpochOutOfRange": "membership.shared.errors",
    "Evicted": "membership._node.session",
    "Evidence": "membership.shared.view",
    "Fenced": "membership._node.session",
    "GpuStatus": "membership.shared.status",
    "GraceWindow": "membership._node.graces",
    "JobRanks": "membership.shared.view",
    "InvalidArgument": "membership.shared.errors",
    "LocalError": "membership.shared.errors",
    "Member": "membership.shared.view",
    "MemberChange": "membership.shared.view",
    "MemberState": "membership.shared.view",
    "MembershipClient": "membership._client",
    "MembershipError": "membership.shared.errors",
    "NoQuorum": "membership.shared.errors",
    "PermissionDenied": "membership.shared.errors",
    "NodeStatus": "membership.shared.status",
    "QuorumChanged": "membership.shared.view",
    "Reconnected": "membership.shared.view",
    "RejectedError": "membership.shared.errors",
    "Rejoined": "membership._node.session",
    "RemoteError": "membership.shared.errors",
    "SessionEvent": "membership._node.session",
    "StateChanged": "membership._node.session",
    "StatusCollector": "membership._node.collector",
    "StatusReport": "membership.shared.view",
    "StatusUpdated": "membership.shared.view",
    "Superseded": "membership._node.session",
    "UnavailableError": "membership.shared.errors",
    "View": "membership.shared.view",
    "ViewChanged": "membership.shared.view",
    "ViewEvent": "membership.shared.view",
    "ViewInfo": "membership._client",
    "ViewReset": "membership.shared.view",
    "ViewSnapshot": "membership.shared.view",
}

# Public submodules, imported on first use like the names: ``membership.sync``
# (the blocking client) works after a plain ``import membership``.
_SUBMODULES = frozenset({"sync"})

if TYPE_CHECKING:
    from membership import sync
    from membership._client import MembershipClient, ViewInfo
    from membership._config import ClientConfig
    from membership._node.collector import StatusCollector
    from membership._node.graces import GraceWindow
    from membership._node.session import (
        EndReason,
        Evicted,
        Fenced,
        Rejoined,
        SessionEvent,
        StateChanged,
        Superseded,
    )
    from membership.shared.errors import (
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
    from membership.shared.status import GpuStatus, NodeStatus
    from membership.shared.view import (
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


# Old module path -> where it lives now. Every module a public name came from,
# and every one the docs named, before the split into packages.
_MOVED = {
    "membership.admin": "membership.cli.admin.remove",
    "membership.client": "membership._client",
    "membership.collector": "membership._node.collector",
    "membership.config": "membership._config",
    "membership.errors": "membership.shared.errors",
    "membership.graces": "membership._node.graces",
    "membership.localcluster": "membership.testing.localcluster",
    "membership.logfmt": "membership.shared.logfmt",
    "membership.session": "membership._node.session",
    "membership.status": "membership.shared.status",
    "membership.view": "membership.shared.view",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old path of :data:`_MOVED` as the module it names now (the same
    object: its classes, and anything patched on it, are the same).

    Last on ``sys.meta_path``: it answers only names that no file provides.
    """

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = _MOVED[spec.name]
        if new in _SOURCES.values():
            advice = "; import its public names from 'membership'"
        elif new.startswith("membership.testing."):
            advice = "; import its public names from 'membership.testing'"
        else:
            advice = ""
        warnings.warn(f"{spec.name} has moved to {new}{advice}", DeprecationWarning, stacklevel=2)
        module = import_module(new)
        self._spec = module.__spec__  # the import system sets the alias's; put it back
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())
