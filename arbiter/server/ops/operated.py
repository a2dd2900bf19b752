"""What the operating surfaces read of a running replica: metrics and ``Admin.Status``.

A protocol, so that :mod:`arbiter.server.ops.metrics` and
:mod:`arbiter.server.ops.status` need not import the server that starts them
(:class:`arbiter.server.app.ArbiterServer` has all of it).
"""

from __future__ import annotations

from typing import Protocol

from arbiter.config import ArbiterConfig
from arbiter.server.consensus.driver import Driver
from arbiter.server.fanout.degradation import DegradedMarks

__all__ = ["OperatedReplica", "ServedStreams"]


class ServedStreams(Protocol):
    """The public API's stream counts (:class:`arbiter.server.api.servicers.MembershipServicer`)."""

    @property
    def subscriptions(self) -> int:
        """Watch streams open."""
        ...

    @property
    def heartbeat_streams(self) -> int:
        """Heartbeat streams open."""
        ...

    @property
    def degraded(self) -> DegradedMarks:
        """The replica's DEGRADED marks of its nodes."""
        ...


class OperatedReplica(Protocol):
    """One running replica as its metrics and its status read it."""

    @property
    def replica_id(self) -> str:
        """This replica's id."""
        ...

    @property
    def config(self) -> ArbiterConfig:
        """Its validated configuration."""
        ...

    @property
    def identity(self) -> str:
        """The cluster identity it states (``name@digest``)."""
        ...

    @property
    def driver(self) -> Driver:
        """The loop that drives its core."""
        ...

    @property
    def api(self) -> ServedStreams:
        """Its public API servicer."""
        ...

    def configuration(self) -> dict[str, dict[str, str]]:
        """The arbiter configuration in force: ``{"voters": {...}, "learners": {...}}``."""
        ...
