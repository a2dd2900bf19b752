"""The arbiter group's configuration: voters and learners, with their addresses.

Membership changes follow Ongaro's single-server approach ("Consensus:
Bridging Theory and Practice", PhD thesis, Stanford, 2014, §4.1-4.2) with a
non-voting learner phase for catch-up (thesis §4.2.1; etcd raft's learners
and ``ConfChange``). A change adds or removes one server at a time, so the
majorities of any two consecutive configurations intersect and the group
never needs joint consensus.

Rules:

1. A configuration is voters + learners, each a replica id mapped to its
   ``host:port`` address, disjoint, with at least one voter (except
   :data:`EMPTY`, the configuration of a replica started to join, which knows
   none yet). ``index`` is the log index of the entry that made it (0: the
   initial configuration given by the shell at first start).
2. Operations (:class:`ConfChangeOp`): ADD_LEARNER (a new id at an address no
   member uses), PROMOTE (a learner becomes a voter), REMOVE (a voter or a
   learner leaves; never the last voter). :meth:`ArbiterConfiguration.apply`
   refuses anything else with :class:`~arbiter.core.raft.errors.InvalidInput`.
3. A configuration-change entry (``EntryType.CONFIG``) carries the whole
   resulting configuration plus the change that made it, encoded by
   :func:`encode_change` as canonical JSON (sorted keys, no spaces), so a
   replica learns the configuration in force from the last such entry in its
   log without replaying earlier ones, and a replica that joins learns every
   address from the first one it receives.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from arbiter.core.raft.errors import InvalidInput

__all__ = [
    "EMPTY",
    "ArbiterConfiguration",
    "ConfChange",
    "ConfChangeOp",
    "decode_change",
    "encode_change",
]


class ConfChangeOp(enum.Enum):
    """The single-server changes (rule 2); the value is the shell's ``op`` string."""

    ADD_LEARNER = "add_learner"
    PROMOTE = "promote"
    REMOVE = "remove"


def _frozen(m: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(sorted(m.items())))


@dataclass(frozen=True, slots=True, kw_only=True)
class ArbiterConfiguration:
    """The arbiter group's membership as of one log index (rule 1).

    Attributes:
        voters: replica id -> ``"host:port"`` of every voting replica; they
            elect the leader and count towards commit, CheckQuorum and the
            tally's quorum.
        learners: replica id -> ``"host:port"`` of every non-voting replica;
            they receive the log and snapshots but never vote, campaign or count.
        index: the log index of the configuration-change entry that made it;
            0 for the initial configuration (or :data:`EMPTY`).

    Both mappings are read-only and sorted by id. An address may be ``""``
    when the shell did not give one (a group started before addresses were
    replicated). Instances compare by value and are hashable by ``index``.

    Raises:
        InvalidInput: an empty id, an id both voter and learner, or a
            configuration with learners but no voter.
    """

    voters: Mapping[str, str] = field(default_factory=dict)
    learners: Mapping[str, str] = field(default_factory=dict)
    index: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "voters", _frozen(self.voters))
        object.__setattr__(self, "learners", _frozen(self.learners))
        ids = [*self.voters, *self.learners]
        if not all(isinstance(i, str) and i for i in ids):
            raise InvalidInput(f"replica ids must be non-empty strings, got {ids!r}")
        if len(set(ids)) != len(ids):
            raise InvalidInput(f"a replica is both voter and learner: {ids!r}")
        if self.learners and not self.voters:
            raise InvalidInput("a configuration with learners needs at least one voter")
        if type(self.index) is not int or self.index < 0:
            raise InvalidInput(f"configuration index must be an int >= 0, got {self.index!r}")

    def __hash__(self) -> int:
        return hash((self.index, tuple(self.voters), tuple(self.learners)))

    @classmethod
    def initial(cls, voters: Mapping[str, str]) -> ArbiterConfiguration:
        """The configuration of a group at first start: these voters, index 0."""
        return cls(voters=voters, learners={}, index=0)

    @property
    def ids(self) -> tuple[str, ...]:
        """Every member id, voters and learners, sorted."""
        return tuple(sorted([*self.voters, *self.learners]))

    @property
    def quorum(self) -> int:
        """A strict majority of the voters (``len(voters) // 2 + 1``); 0 without voters."""
        return len(self.voters) // 2 + 1 if self.voters else 0

    def is_voter(self, replica_id: str) -> bool:
        """True if ``replica_id`` votes in this configuration."""
        return replica_id in self.voters

    def __contains__(self, replica_id: object) -> bool:
        return replica_id in self.voters or replica_id in self.learners

    def address(self, replica_id: str) -> str | None:
        """The address of a member, or None for an id that is not one."""
        return self.voters.get(replica_id, self.learners.get(replica_id))

    def apply(self, change: ConfChange, index: int) -> ArbiterConfiguration:
        """The configuration after ``change``, made by the entry at ``index`` (rule 2).

        Raises:
            InvalidInput: adding an id that is a member (or an empty
                address, or one a member uses), promoting an id that is not a
                learner, removing an id that is not a member or the last voter.
        """
        rid, voters, learners = change.replica_id, dict(self.voters), dict(self.learners)
        if change.op is ConfChangeOp.ADD_LEARNER:
            if rid in self:
                raise InvalidInput(f"{rid!r} is already a member of the arbiter group")
            if not change.address:
                raise InvalidInput(f"adding {rid!r} needs its address (host:port)")
            users = [i for i in self.ids if self.address(i) == change.address]
            if users:
                raise InvalidInput(f"address {change.address} is in use by {users[0]!r}")
            learners[rid] = change.address
        elif change.op is ConfChangeOp.PROMOTE:
            if rid not in self.learners:
                what = "a voter already" if rid in self.voters else "not a member"
                raise InvalidInput(f"cannot promote {rid!r}: it is {what}, not a learner")
            voters[rid] = learners.pop(rid)
        else:
            if rid not in self:
                raise InvalidInput(f"cannot remove {rid!r}: not a member of the arbiter group")
            if list(self.voters) == [rid]:
                raise InvalidInput(f"cannot remove {rid!r}: it is the last voter")
            voters.pop(rid, None)
            learners.pop(rid, None)
        return ArbiterConfiguration(voters=voters, learners=learners, index=index)

    def at(self, index: int) -> ArbiterConfiguration:
        """This configuration as made by the entry at ``index`` (same members)."""
        return ArbiterConfiguration(voters=self.voters, learners=self.learners, index=index)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able form ``{"voters": {...}, "learners": {...}, "index": i}``."""
        return {"voters": dict(self.voters), "learners": dict(self.learners), "index": self.index}

    @classmethod
    def from_json(cls, value: Any) -> ArbiterConfiguration:
        """Inverse of :meth:`to_json`.

        Raises:
            InvalidInput: not that shape, or an invalid configuration.
        """
        if not isinstance(value, dict) or set(value) != {"voters", "learners", "index"}:
            raise InvalidInput(f"not a configuration: {value!r}")
        for k in ("voters", "learners"):
            m = value[k]
            if not isinstance(m, dict) or not all(isinstance(a, str) for a in m.values()):
                raise InvalidInput(f"configuration {k} must map ids to addresses, got {m!r}")
        return cls(voters=value["voters"], learners=value["learners"], index=value["index"])

    def __repr__(self) -> str:
        v = ",".join(self.voters)
        learners = ",".join(self.learners)
        return f"ArbiterConfiguration(voters=[{v}], learners=[{learners}], index={self.index})"


EMPTY = ArbiterConfiguration()
"""The configuration of a replica started to join (``join=True``): no member known yet."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfChange:
    """One single-server change (rule 2), as proposed.

    Attributes:
        op: what to do.
        replica_id: the replica it concerns.
        address: ``host:port`` of a replica being added; ``""`` otherwise.
    """

    op: ConfChangeOp
    replica_id: str
    address: str = ""


def encode_change(change: ConfChange, result: ArbiterConfiguration) -> bytes:
    """The data of a CONFIG entry: the change and the configuration it makes (rule 3).

    ``result.index`` is not stored: it is the entry's own index.
    """
    body = {
        "v": 1,
        "op": change.op.value,
        "id": change.replica_id,
        "address": change.address,
        "voters": dict(result.voters),
        "learners": dict(result.learners),
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def decode_change(data: bytes, index: int) -> tuple[ConfChange, ArbiterConfiguration]:
    """Inverse of :func:`encode_change` for the CONFIG entry at ``index``.

    Raises:
        InvalidInput: the bytes are not a configuration change of version 1.
    """
    try:
        body = json.loads(bytes(data).decode("utf-8"))
        if not isinstance(body, dict) or body.get("v") != 1:
            raise ValueError("not a version 1 configuration change")
        change = ConfChange(
            op=ConfChangeOp(body["op"]), replica_id=str(body["id"]), address=str(body["address"])
        )
        conf = ArbiterConfiguration.from_json(
            {"voters": body["voters"], "learners": body["learners"], "index": index}
        )
    except InvalidInput:
        raise
    except (ValueError, TypeError, KeyError) as e:
        raise InvalidInput(f"configuration entry {index}: {e!r}") from None
    return change, conf
