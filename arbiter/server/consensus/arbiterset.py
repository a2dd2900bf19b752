"""The arbiter configuration in force as the shell sees it, and on the wire.

One seam between the shell and the core's Raft membership changes
(:class:`arbiter.core.replica.Replica`'s ``configuration``): everything in
``arbiter/server`` that needs the arbiter set (the transport, the peer
servicer, the acks, the Admin service) reads it through :func:`in_force`,
and writes it on the wire with :func:`to_protos`.

Rules:

1. The configuration in force is the latest one in the log (appended, not
   necessarily committed), as Raft's single-server changes require
   (Ongaro 2014, section 4.1: "a server always uses the latest
   configuration in its log, regardless of whether the entry is
   committed"). The transport and the peer servicer follow it, so a learner
   added by an entry is sent the log at once.
2. ``config_index`` is the log index of the entry that made the
   configuration (0 = the group's first one). Acks, QuorumStatus, Progress
   and GetView carry it with the set; clients follow the highest they saw
   (membership/_node/session.py rule 9).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from membership.v1 import membership_pb2 as pb

if TYPE_CHECKING:
    from arbiter.core.replica import Replica

__all__ = ["ArbiterSet", "in_force", "to_protos"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ArbiterSet:
    """A configuration of the arbiter group.

    Attributes:
        voters: replica id -> ``host:port`` of the replicas that vote and count
            in every quorum.
        learners: replica id -> ``host:port`` of the replicas that receive the
            log and count in nothing.
        index: log index of the entry that made it (0 = the first one).
    """

    voters: Mapping[str, str]
    learners: Mapping[str, str] = field(default_factory=dict)
    index: int = 0

    @property
    def members(self) -> dict[str, str]:
        """Voters and learners, id -> ``host:port``."""
        return {**self.voters, **self.learners}

    def role(self, replica_id: str) -> str | None:
        """``"voter"``, ``"learner"`` or None (not in this configuration)."""
        if replica_id in self.voters:
            return "voter"
        if replica_id in self.learners:
            return "learner"
        return None

    @classmethod
    def of(cls, configuration: Any) -> ArbiterSet:
        """From the core's configuration (``voters``, ``learners``, ``index``)."""
        return cls(
            voters=dict(configuration.voters),
            learners=dict(configuration.learners),
            index=int(configuration.index),
        )


def in_force(replica: Replica, first: Mapping[str, str]) -> ArbiterSet:
    """The configuration in force at ``replica`` (rule 1).

    Args:
        replica: the core replica.
        first: the arbiter set to report while the replica knows none yet (a
            replica that joins, before the leader's snapshot): the group's as
            the joining replica learned it.
    """
    conf = ArbiterSet.of(replica.configuration)
    if not conf.voters and first:
        return ArbiterSet(voters=dict(first))
    return conf


def to_protos(arbiters: ArbiterSet) -> list[pb.Arbiter]:
    """The wire form: voters then learners, each sorted by id."""
    return [
        pb.Arbiter(id=rid, address=arbiters.voters[rid], voter=True)
        for rid in sorted(arbiters.voters)
    ] + [
        pb.Arbiter(id=rid, address=arbiters.learners[rid], voter=False)
        for rid in sorted(arbiters.learners)
    ]
