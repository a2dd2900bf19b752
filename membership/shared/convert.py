"""Conversions between the wire types (membership.v1) and the SDK's frozen dataclasses."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from membership.shared.view import (
    Degradation,
    Evidence,
    JobRanks,
    Member,
    MemberChange,
    MemberState,
    ProgressMarker,
    QuorumChanged,
    StatusReport,
    StatusUpdated,
    View,
    ViewChanged,
    ViewEvent,
    ViewSnapshot,
)
from membership.v1 import membership_pb2 as pb

if TYPE_CHECKING:
    from membership.shared.status import GpuStatus, NodeStatus

__all__ = [
    "change_to_pb",
    "changes_from_pb",
    "degraded_from_pb",
    "event_from_pb",
    "evidence_from_pb",
    "gpu_figures",
    "jobs_from_pb",
    "jobs_to_pb",
    "member_from_pb",
    "member_to_pb",
    "state_from_pb",
    "state_to_pb",
    "status_from_pb",
    "status_numbers",
    "status_to_pb",
    "view_from_pb",
]

_TO_PB = {
    MemberState.JOINING: pb.MEMBER_STATE_JOINING,
    MemberState.ALIVE: pb.MEMBER_STATE_ALIVE,
    MemberState.DEAD: pb.MEMBER_STATE_DEAD,
    MemberState.LEFT: pb.MEMBER_STATE_LEFT,
}
_FROM_PB = {v: k for k, v in _TO_PB.items()}


def state_to_pb(state: MemberState) -> pb.MemberState.ValueType:
    """MemberState -> wire enum."""
    return _TO_PB[state]


def state_from_pb(value: int) -> MemberState:
    """Wire enum -> MemberState.

    Raises:
        ValueError: for UNSPECIFIED or an unknown value.
    """
    try:
        return _FROM_PB[value]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"unknown member state {value}") from None


def member_to_pb(
    member: Member, suspected_by: Iterable[str] = (), world_size: int = 0
) -> pb.Member:
    """Member -> wire Member (with the replicas currently suspecting it, and its job's
    world size when it has a rank)."""
    msg = pb.Member(
        node_id=member.node_id,
        incarnation=member.incarnation,
        state=state_to_pb(member.state),
        labels=dict(member.labels),
        epoch=member.epoch,
        suspected_by=list(suspected_by),
        world_size=world_size if member.rank is not None else 0,
    )
    if member.rank is not None:
        msg.rank = member.rank
    return msg


def member_from_pb(m: pb.Member) -> Member:
    """Wire Member -> Member."""
    return Member(
        node_id=m.node_id,
        incarnation=m.incarnation,
        state=state_from_pb(m.state),
        labels=dict(m.labels),
        epoch=m.epoch,
        rank=m.rank if m.HasField("rank") else None,
    )


def jobs_to_pb(jobs: Iterable[JobRanks]) -> list[pb.JobRanks]:
    """JobRanks -> wire JobRanks."""
    return [
        pb.JobRanks(job=j.job, epoch=j.epoch, ranks=dict(j.ranks), world_size=j.world_size)
        for j in jobs
    ]


def jobs_from_pb(jobs: Iterable[pb.JobRanks]) -> tuple[JobRanks, ...]:
    """Wire JobRanks -> JobRanks (in the wire's order: sorted by job)."""
    return tuple(JobRanks(job=j.job, epoch=j.epoch, ranks=dict(j.ranks)) for j in jobs)


def view_from_pb(v: pb.View) -> View:
    """Wire View -> View (members sorted by node id, jobs by job)."""
    members = sorted((member_from_pb(m) for m in v.members), key=lambda m: m.node_id)
    jobs = sorted(jobs_from_pb(v.jobs), key=lambda j: j.job)
    return View(epoch=v.epoch, members=tuple(members), jobs=tuple(jobs))


def change_to_pb(change: MemberChange) -> pb.MemberChange:
    """MemberChange -> wire MemberChange (with its evidence; unknown values are 0 / "")."""
    return pb.MemberChange(
        node_id=change.node_id,
        incarnation=change.incarnation,
        state=state_to_pb(change.state),
        labels=dict(change.labels),
        evidence=[
            pb.Evidence(
                arbiter_id=e.arbiter_id,
                silence_seconds=e.silence or 0.0,
                suspicion=e.suspicion or 0.0,
                detector=e.detector,
            )
            for e in change.evidence
        ],
        removed_by=change.removed_by,
        forgotten=change.forgotten,
    )


def changes_from_pb(changes: Iterable[pb.MemberChange]) -> tuple[MemberChange, ...]:
    """Wire MemberChanges -> MemberChanges (with their evidence)."""
    return tuple(
        MemberChange(
            node_id=c.node_id,
            incarnation=c.incarnation,
            state=state_from_pb(c.state),
            labels=dict(c.labels),
            evidence=tuple(evidence_from_pb(e) for e in c.evidence),
            removed_by=c.removed_by,
            forgotten=c.forgotten,
        )
        for c in changes
    )


def evidence_from_pb(e: pb.Evidence) -> Evidence:
    """Wire Evidence -> Evidence (an unrecorded value, 0 with no detector, becomes None)."""
    known = bool(e.detector)
    return Evidence(
        arbiter_id=e.arbiter_id,
        silence=e.silence_seconds if known or e.silence_seconds else None,
        suspicion=e.suspicion if known or e.suspicion else None,
        detector=e.detector,
    )


# NodeStatus fields carried as proto3 optional scalars.
_STATUS_NUMBERS = (
    "load",
    "cpu_utilization",
    "memory_utilization",
    "gpu_utilization",
    "gpu_memory_utilization",
    "progress",
)
# GpuStatus fields carried as proto3 optional scalars: (wire name, SDK name).
_GPU_NUMBERS = (
    ("utilization", "utilization"),
    ("memory_utilization", "memory_utilization"),
    ("memory_used_bytes", "memory_used"),
    ("memory_total_bytes", "memory_total"),
)


def _gpu_to_pb(gpu: GpuStatus) -> pb.GpuStatus:
    msg = pb.GpuStatus(index=gpu.index, lost=gpu.lost, error=gpu.error)
    for wire, name in _GPU_NUMBERS:
        value = getattr(gpu, name)
        if value is not None:
            setattr(msg, wire, value)
    return msg


def status_to_pb(status: NodeStatus) -> pb.NodeStatus:
    """NodeStatus -> wire NodeStatus (absent fields stay unset)."""
    msg = pb.NodeStatus(gauges=dict(status.gauges or {}))
    for name in _STATUS_NUMBERS:
        value = getattr(status, name)
        if value is not None:
            setattr(msg, name, float(value))
    if status.phase is not None:
        msg.phase = status.phase
    if status.step is not None:
        msg.step = int(status.step)
    if status.healthy is not None:
        msg.healthy = status.healthy
    if status.health_reason:
        msg.health_reason = status.health_reason
    if status.rtt is not None:
        msg.rtt_seconds = float(status.rtt)
    if status.gpus:
        msg.gpus.extend(_gpu_to_pb(g) for g in status.gpus)
    return msg


def status_numbers(msg: pb.NodeStatus) -> dict[str, float]:
    """The numeric fields present in a wire NodeStatus, by name (for validation)."""
    out = {n: float(getattr(msg, n)) for n in _STATUS_NUMBERS if msg.HasField(n)}  # type: ignore[arg-type]
    if msg.HasField("step"):
        out["step"] = float(msg.step)
    if msg.HasField("rtt_seconds"):
        out["rtt_seconds"] = msg.rtt_seconds
    return out


def gpu_figures(msg: pb.NodeStatus) -> list[tuple[int, str, dict[str, float]]]:
    """``(index, error, numbers present)`` of each GPU of a wire NodeStatus (for
    :func:`membership.shared.validation.validate_gpus`)."""
    return [
        (
            g.index,
            g.error,
            {w: float(getattr(g, w)) for w, _ in _GPU_NUMBERS if g.HasField(w)},  # type: ignore[arg-type]
        )
        for g in msg.gpus
    ]


def _gpu_from_pb(g: pb.GpuStatus) -> GpuStatus:
    from membership.shared.status import GpuStatus

    values = {name: getattr(g, wire) for wire, name in _GPU_NUMBERS if g.HasField(wire)}  # type: ignore[arg-type]
    return GpuStatus(index=g.index, lost=g.lost, error=g.error, **values)


def status_from_pb(msg: pb.NodeStatus) -> NodeStatus:
    """Wire NodeStatus -> NodeStatus (unset fields are None)."""
    from membership.shared.status import NodeStatus

    return NodeStatus(
        load=msg.load if msg.HasField("load") else None,
        cpu_utilization=msg.cpu_utilization if msg.HasField("cpu_utilization") else None,
        memory_utilization=msg.memory_utilization if msg.HasField("memory_utilization") else None,
        gpu_utilization=msg.gpu_utilization if msg.HasField("gpu_utilization") else None,
        gpu_memory_utilization=(
            msg.gpu_memory_utilization if msg.HasField("gpu_memory_utilization") else None
        ),
        phase=msg.phase if msg.HasField("phase") else None,
        step=msg.step if msg.HasField("step") else None,
        progress=msg.progress if msg.HasField("progress") else None,
        gauges=dict(msg.gauges),
        healthy=msg.healthy if msg.HasField("healthy") else None,
        health_reason=msg.health_reason or None,
        rtt=msg.rtt_seconds if msg.HasField("rtt_seconds") else None,
        gpus=tuple(_gpu_from_pb(g) for g in msg.gpus),
    )


def degraded_from_pb(marks: Iterable[pb.Degradation]) -> tuple[Degradation, ...]:
    """Wire DEGRADED marks -> SDK :class:`Degradation` tuple."""
    return tuple(Degradation(cause=d.cause, reason=d.reason) for d in marks)


def event_from_pb(ev: pb.MembershipEvent) -> ViewEvent | ProgressMarker | None:
    """Wire event -> SDK event (a progress marker too); None for an empty or unknown one."""
    kind = ev.WhichOneof("event")
    if kind == "snapshot":
        return ViewSnapshot(
            view=view_from_pb(ev.snapshot.view), arbiter_id=ev.arbiter_id, instance=ev.instance
        )
    if kind == "change":
        return ViewChanged(
            epoch=ev.change.epoch,
            changes=changes_from_pb(ev.change.changes),
            arbiter_id=ev.arbiter_id,
            ranks=jobs_from_pb(ev.change.ranks),
        )
    if kind == "quorum":
        return QuorumChanged(
            in_quorum=ev.quorum.in_quorum,
            arbiter_id=ev.arbiter_id,
            leader_id=ev.quorum.leader_id or None,
            epoch=ev.quorum.epoch,
        )
    if kind == "progress":
        return ProgressMarker(
            epoch=ev.progress.epoch,
            in_quorum=ev.progress.in_quorum,
            interval=ev.progress.progress_interval_seconds,
            arbiter_id=ev.arbiter_id,
        )
    if kind == "status":
        return StatusUpdated(
            reports=tuple(
                StatusReport(
                    node_id=r.node_id,
                    incarnation=r.incarnation,
                    status=status_from_pb(r.status),
                    suspected_by=tuple(r.suspected_by),
                    silence=r.silence_seconds,
                    grace=r.grace_seconds,
                    grace_reason=r.grace_reason,
                    degraded=degraded_from_pb(r.degraded),
                    suspicion=r.suspicion if r.detector else None,
                    detector=r.detector,
                )
                for r in ev.status.nodes
            ),
            arbiter_id=ev.arbiter_id,
        )
    return None
