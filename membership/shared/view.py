"""The membership view and its events: plain frozen data, shared by client and arbiter.

A *view* is the set of members the cluster has agreed on, numbered by an *epoch*
that grows by one for every committed log entry that changes it. Every replica
applies the same entries in the same order, so every replica and every
subscriber sees the same view at the same epoch (the tally's rules:
``arbiter/core/tally.py``; docs/architecture.md, "Correctness rules").

Members keep their record after they die or leave (state DEAD or LEFT): the
record is what stops an old incarnation of a node from coming back.

The ALIVE members that share a ``job`` label have ranks ``0..world_size - 1``
in that job (:class:`JobRanks`), decided by the replicated state machine
(``arbiter/core/ranks.py``), so every replica and subscriber holds the same
ranks at the same epoch: a rank changes only in an entry that changes the
view, and :attr:`JobRanks.epoch` is that entry's epoch, the fencing token for
"re-form the process group exactly once per assignment".
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from membership.shared.status import NodeStatus

__all__ = [
    "DEGRADED_CAUSES",
    "Degradation",
    "Disconnected",
    "Evidence",
    "JobRanks",
    "Member",
    "MemberChange",
    "MemberState",
    "ProgressMarker",
    "QuorumChanged",
    "Reconnected",
    "StatusReport",
    "StatusUpdated",
    "View",
    "ViewChanged",
    "ViewEvent",
    "ViewReset",
    "ViewSnapshot",
    "evidence_json",
]


class MemberState(enum.Enum):
    """State of one member in a committed view.

    JOINING is never stored in a view: a node heard by fewer than a quorum of
    replicas is not yet a member. It exists so that a node can be told where
    it stands before it is admitted.
    """

    JOINING = "JOINING"
    ALIVE = "ALIVE"
    DEAD = "DEAD"
    LEFT = "LEFT"

    @property
    def is_final(self) -> bool:
        """True for DEAD and LEFT: no later observation revives that incarnation."""
        return self in (MemberState.DEAD, MemberState.LEFT)


def _frozen_labels(labels: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(sorted((labels or {}).items())))


JOB_LABEL = "job"
"""The label whose value names a member's job: ranks are per job (``arbiter/core/ranks.py``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRanks:
    """The rank assignment of one job, as committed at ``epoch``.

    Attributes:
        job: the ``job`` label's value.
        epoch: the epoch of the entry that made this assignment (the last one
            that changed a member of the job): the fencing token with which a
            process group of exactly these members and ranks is formed.
        ranks: node_id -> rank, dense ``0..world_size - 1``; empty once the
            job has no ALIVE member left.
    """

    job: str
    epoch: int
    ranks: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not isinstance(self.ranks, MappingProxyType):
            object.__setattr__(self, "ranks", MappingProxyType(dict(self.ranks)))

    @property
    def world_size(self) -> int:
        """How many members the job has (its ranks are ``0..world_size - 1``)."""
        return len(self.ranks)

    def __hash__(self) -> int:
        return hash((self.job, self.epoch, len(self.ranks)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """One node as the committed view has it.

    Attributes:
        node_id: the node's stable name.
        incarnation: which life of the node this record is about; a restart
            uses a higher one.
        state: ALIVE, DEAD or LEFT.
        labels: static key/value labels the node announced when it joined.
        epoch: the epoch at which the member entered its current state.
        rank: its rank in its job (the ``job`` label) while ALIVE; None
            without a job, or when not ALIVE. The job's world size is
            ``view.job(member.job).world_size`` (:meth:`View.world_size`): kept
            once per job, so that a join or death in a job of N members does
            not rewrite N member records.
    """

    node_id: str
    incarnation: int
    state: MemberState
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    epoch: int = 0
    rank: int | None = None

    @property
    def job(self) -> str:
        """The member's ``job`` label ("" without one): the group its rank is in."""
        return self.labels.get(JOB_LABEL, "")

    def __post_init__(self) -> None:
        if not isinstance(self.labels, MappingProxyType):
            object.__setattr__(self, "labels", _frozen_labels(self.labels))

    def __hash__(self) -> int:
        return hash((self.node_id, self.incarnation, self.state, self.epoch))


@dataclass(frozen=True, slots=True, kw_only=True)
class View:
    """A committed membership view.

    Attributes:
        epoch: number of the view; 0 is the empty view before any change.
        members: every node with a record, sorted by node_id (ALIVE, DEAD
            and LEFT alike; filter with :meth:`alive`).
        jobs: the rank assignment of every job with an ALIVE member, sorted
            by job (each of its members also carries its ``rank``).
    """

    epoch: int = 0
    members: tuple[Member, ...] = ()
    jobs: tuple[JobRanks, ...] = ()

    def job(self, name: str) -> JobRanks | None:
        """The rank assignment of job ``name``, or None when it has no ALIVE member."""
        for j in self.jobs:
            if j.job == name:
                return j
        return None

    def world_size(self, node_id: str) -> int:
        """How many ALIVE members the job of member ``node_id`` has (0 without a rank)."""
        m = self.get(node_id)
        j = None if m is None or m.rank is None else self.job(m.job)
        return 0 if j is None else j.world_size

    def get(self, node_id: str) -> Member | None:
        """Returns the member named ``node_id``, or None."""
        for m in self.members:
            if m.node_id == node_id:
                return m
        return None

    def alive(self) -> tuple[Member, ...]:
        """The members whose state is ALIVE."""
        return tuple(m for m in self.members if m.state is MemberState.ALIVE)

    def with_changes(
        self, epoch: int, changes: tuple[MemberChange, ...], ranks: tuple[JobRanks, ...] = ()
    ) -> View:
        """Returns the view after applying ``changes`` and the jobs' new ``ranks``
        committed at ``epoch`` (a :class:`ViewChanged`'s fields)."""
        by_id = {m.node_id: m for m in self.members}
        for c in changes:
            if c.forgotten:  # the record's retention passed: it leaves the view
                by_id.pop(c.node_id, None)
                continue
            old = by_id.get(c.node_id)
            labels = c.labels if c.labels else (old.labels if old is not None else {})
            by_id[c.node_id] = Member(
                node_id=c.node_id,
                incarnation=c.incarnation,
                state=c.state,
                labels=labels,
                epoch=epoch,
            )
        jobs = {j.job: j for j in self.jobs}
        for j in ranks:
            for node_id, rank in j.ranks.items():
                m = by_id.get(node_id)  # absent from a view folded without its snapshot
                if m is not None and m.rank != rank:  # rewritten only when it moved (or is new)
                    by_id[node_id] = replace(m, rank=rank)
            if j.ranks:
                jobs[j.job] = j
            else:
                jobs.pop(j.job, None)
        members = tuple(by_id[k] for k in sorted(by_id))
        return View(epoch=epoch, members=members, jobs=tuple(jobs[k] for k in sorted(jobs)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """One replica's committed suspicion of a node: why a DEAD was decided.

    Attributes:
        arbiter_id: the replica that suspected the node.
        silence: seconds since that replica had last heard the node when its
            failure detector suspected it (None if not recorded).
        suspicion: the detector's suspicion level at that moment: phi for the
            phi accrual detector, missed heartbeat intervals for the
            missed-count detector (None if not recorded).
        detector: ``"phi"`` or ``"missed"`` ("" if not recorded).
    """

    arbiter_id: str
    silence: float | None = None
    suspicion: float | None = None
    detector: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberChange:
    """One member entering a new state at some epoch.

    ``labels`` is filled when the member becomes ALIVE and may be empty otherwise.
    ``evidence`` is filled when the member becomes DEAD because a quorum of
    replicas suspected it: one :class:`Evidence` per suspecting replica of
    that quorum, sorted by replica id (empty for other changes, such as the
    retirement of an incarnation replaced by a newer one). ``removed_by`` is
    set when the member became LEFT because an administrator removed it (the
    Admin service): who asked; "" for a node that left by itself, and for
    every other change. ``forgotten`` is set when a DEAD or LEFT record is
    removed from the view because its retention passed (bounded history,
    README "Bounded history"): ``state`` and ``incarnation`` are those of the
    record removed, and the view no longer lists the member; the cluster still
    refuses that incarnation and every lower one.
    """

    node_id: str
    incarnation: int
    state: MemberState
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    evidence: tuple[Evidence, ...] = ()
    removed_by: str = ""
    forgotten: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.labels, MappingProxyType):
            object.__setattr__(self, "labels", _frozen_labels(self.labels))

    def __hash__(self) -> int:
        return hash((self.node_id, self.incarnation, self.state))


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewSnapshot:
    """Event: the whole view at ``view.epoch``; later changes follow from there.

    Also sent after a resume point that is no longer retained, or after the
    subscriber fell behind: the snapshot replaces whatever the subscriber had.
    ``instance`` is the cluster's instance id the view belongs to ("" before
    the cluster has one): pass it with the epoch to resume later
    (``watch(since_epoch=..., instance=...)``), so that a cluster reset since
    is noticed even where the epoch exists again.
    """

    view: View
    arbiter_id: str = ""
    instance: str = ""

    @property
    def epoch(self) -> int:
        """The snapshot's epoch (``view.epoch``), as :attr:`ViewChanged.epoch` gives a
        change's: code that follows events reads ``event.epoch`` from either."""
        return self.view.epoch


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewChanged:
    """Event: one committed entry changed the view; its epoch is ``epoch``.

    ``ranks`` holds the new assignment of every job the entry changed (a
    member joined, died, left or restarted in it, or ranks moved): the moment
    to re-form that job's process group, with ``epoch`` as its fencing token.
    An entry may change ranks only (``changes`` empty): the cluster's rules
    were upgraded to ranks (``arbiter/core/ranks.py``, rule 6).
    """

    epoch: int
    changes: tuple[MemberChange, ...]
    arbiter_id: str = ""
    ranks: tuple[JobRanks, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class QuorumChanged:
    """Event: the serving replica gained or lost its quorum (a leader it can reach)."""

    in_quorum: bool
    arbiter_id: str
    leader_id: str | None = None
    epoch: int = 0


# Why a replica marks a node DEGRADED (Degradation.cause): its heartbeat jitter
# far above the other nodes', its training step rate far below the median of
# its job's other members, or the application's own health flag.
DEGRADED_CAUSES = ("jitter", "step_rate", "unhealthy")


@dataclass(frozen=True, slots=True, kw_only=True)
class Degradation:
    """One reason a replica marks a node DEGRADED: it heartbeats, but is unhealthy.

    DEGRADED is status, as SUSPECT is: never a view change, never a death
    (README "Degraded nodes"; the rules: ``arbiter/core/degraded.py``).

    Attributes:
        cause: one of :data:`DEGRADED_CAUSES` (a newer arbiter may add others).
        reason: in words, with the figures, e.g. ``"heartbeat jitter 0.180s,
            12.0x the median 0.015s of 4 other nodes"``.
    """

    cause: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusReport:
    """One node's latest live status as the serving replica heard it (never a view change).

    Attributes:
        node_id: the node.
        incarnation: the incarnation that reported it.
        status: what it reported (load, GPU use, phase, step, gauges...).
        suspected_by: replicas whose committed observation of the node is
            SUSPECT (fewer than a quorum: a quorum makes it DEAD).
        silence: seconds since the serving replica last heard the node.
        grace: seconds left of the node's committed grace window, as the
            serving replica holds it (0.0: none; ``arbiter/core/grace.py``):
            the replicas do not suspect the node meanwhile.
        grace_reason: the reason the node gave for its grace window ("" if none).
        degraded: the serving replica's DEGRADED marks (empty: not degraded).
        suspicion: the serving replica's failure detector's suspicion level of
            the node when the report was made (phi for detector ``"phi"``,
            missed heartbeat intervals for ``"missed"``); None when unknown.
        detector: the kind of that detector ("" when unknown).
    """

    node_id: str
    incarnation: int
    status: NodeStatus
    suspected_by: tuple[str, ...] = ()
    silence: float = 0.0
    grace: float = 0.0
    grace_reason: str = ""
    degraded: tuple[Degradation, ...] = ()
    suspicion: float | None = None
    detector: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusUpdated:
    """Event (only when asked for): nodes whose status or suspicions changed, coalesced."""

    reports: tuple[StatusReport, ...]
    arbiter_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Disconnected:
    """Event: the watcher has heard nothing from an arbiter in a quorum for ``silence``
    seconds; its view (at ``epoch``) may be stale until :class:`Reconnected`.

    Reported once per loss of contact, after ``ClientConfig.disconnect_after``
    seconds without any message (change, progress marker, quorum status) from
    an arbiter that is in a quorum. The watcher keeps trying every arbiter.

    Attributes:
        epoch: the last epoch the watcher holds.
        silence: seconds since the last message from an arbiter in a quorum
            (since the watch started, if it never had contact).
        arbiter_id: the arbiter that served it last ("" if none did).
        reason: why, in words (the last failure seen).
    """

    epoch: int
    silence: float
    arbiter_id: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconnected:
    """Event: contact is back after a :class:`Disconnected`; events resume from ``epoch``.

    Attributes:
        epoch: the last epoch the watcher holds (the changes after it follow).
        arbiter_id: the arbiter now serving the watcher.
        silence: seconds the contact was lost for.
    """

    epoch: int
    arbiter_id: str
    silence: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewReset:
    """Event: the epoch the watcher resumed from does not exist in this cluster (it was
    reset, or the epoch is another cluster's); a fresh :class:`ViewSnapshot` follows.

    Only with ``watch(..., reset_if_ahead=True)``; otherwise the watch raises
    :class:`membership.shared.errors.EpochOutOfRange`.

    Attributes:
        since_epoch: the epoch the watcher asked to resume after.
        cluster_epoch: the cluster's epoch, as the refusing arbiter had it.
    """

    since_epoch: int
    cluster_epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressMarker:
    """A replica's progress marker on an idle subscription (never yielded by ``watch``).

    Attributes:
        epoch: the replica's applied epoch.
        in_quorum: whether the replica is in a quorum.
        interval: seconds until the next marker on an idle stream (0: unknown).
        arbiter_id: the replica.
    """

    epoch: int
    in_quorum: bool
    interval: float = 0.0
    arbiter_id: str = ""


ViewEvent = (
    ViewSnapshot
    | ViewChanged
    | QuorumChanged
    | StatusUpdated
    | Disconnected
    | Reconnected
    | ViewReset
)


def evidence_json(e: Evidence) -> dict[str, object]:
    """One replica's evidence as JSON: ``arbiter``, ``silence_seconds``, ``suspicion``,
    ``detector`` (the shape of ``watch --json`` and of the arbiter's JSON log lines)."""
    return {
        "arbiter": e.arbiter_id,
        "silence_seconds": e.silence,
        "suspicion": e.suspicion,
        "detector": e.detector or None,
    }
