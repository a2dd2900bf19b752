"""How the ``membership`` command prints views, events and statuses (text and JSON).

Pure functions from the SDK's data (:mod:`membership.shared.view`,
:mod:`membership._node.session`, :class:`membership.shared.status.NodeStatus`) to strings
or JSON-ready dicts; no I/O. The CLI prints them; the benchmarks and the
chaos suite reuse them, so that what they parse is what users see.

JSON shapes (``watch --json``, one object per line):

- ``{"type": "snapshot", "epoch", "members": [member...], "arbiter",
  "instance"}`` (the cluster's instance id, for ``watch --instance``), a
  member being ``{"node_id", "incarnation", "state", "labels", "epoch"}``,
  plus ``"rank"`` and ``"world_size"`` for an ALIVE member of a job (its
  ``job`` label); then one ``ranks`` line per job, as below, with the epoch
  of its assignment;
- ``{"type": "change", "epoch", "node_id", "incarnation", "state", "labels",
  "arbiter"}``, plus ``"evidence": [{"arbiter", "silence_seconds",
  "suspicion", "detector"}]`` for a DEAD decided by a quorum, and
  ``"removed_by"`` for a LEFT an administrator decided (``admin remove``),
  and ``"forgotten": true`` when the DEAD or LEFT record leaves the view
  (bounded history: its retention passed);
- ``{"type": "ranks", "epoch", "job", "world_size", "ranks": {node_id: rank},
  "arbiter"}`` whenever a job's assignment changes (after the change lines of
  its epoch; ``arbiter/core/ranks.py``): the epoch is the fencing token of the
  job's process group; a job whose last member went has world size 0;
- ``{"type": "quorum", "in_quorum", "arbiter", "leader"}``;
- ``{"type": "status", "node_id", "incarnation", "status": {...},
  "suspected_by", "silence_seconds", "degraded": [{"cause", "reason"}],
  "suspicion", "detector", "arbiter"}`` (``degraded`` empty when the node is
  not DEGRADED; ``suspicion`` null when the replica does not track it); the
  status object holds the fields present of ``load``, ``cpu_utilization``,
  ``memory_utilization``, ``gpu_utilization``, ``gpu_memory_utilization``,
  ``phase``, ``step``, ``progress``, ``healthy``, ``health_reason``,
  ``rtt_seconds``, ``gauges`` and ``gpus`` (``[{"index", "utilization",
  "memory_utilization", "memory_used_bytes", "memory_total_bytes", "lost",
  "error"}]``, the figures present), plus ``"grace_seconds"``
  and ``"grace_reason"`` while the node is in a grace window;
- ``{"type": "disconnected", "epoch", "silence_seconds", "arbiter", "reason"}``,
  ``{"type": "reconnected", "epoch", "silence_seconds", "arbiter"}``;
- ``{"type": "reset", "since_epoch", "cluster_epoch"}``;
- any other event of the SDK: ``{"type": <its class name in snake_case>,
  <its fields>...}``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from membership._node.session import (
    Evicted,
    Fenced,
    Rejoined,
    SessionEvent,
    StateChanged,
    Superseded,
)
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
    StatusUpdated,
    View,
    ViewChanged,
    ViewReset,
    ViewSnapshot,
    evidence_json,
)

if TYPE_CHECKING:
    from membership.shared.status import GpuStatus, NodeStatus

__all__ = [
    "degraded_json",
    "degraded_text",
    "event_lines",
    "member_json",
    "ranks_json",
    "session_event_line",
    "status_json",
    "status_text",
    "view_json",
    "view_text",
]

_STATUS_FIELDS = (
    "load",
    "cpu_utilization",
    "memory_utilization",
    "gpu_utilization",
    "gpu_memory_utilization",
    "phase",
    "step",
    "progress",
    "healthy",
    "health_reason",
)


def member_json(m: Member, view: View | None = None) -> dict[str, Any]:
    """A member as ``{"node_id", "incarnation", "state", "labels", "epoch"}``, with
    ``"rank"`` and ``"world_size"`` (its job's in ``view``) when it has a rank."""
    d: dict[str, Any] = {
        "node_id": m.node_id,
        "incarnation": m.incarnation,
        "state": m.state.value,
        "labels": dict(m.labels),
        "epoch": m.epoch,
    }
    if m.rank is not None:
        d["rank"], d["world_size"] = m.rank, view.world_size(m.node_id) if view else 0
    return d


def status_json(status: NodeStatus) -> dict[str, Any]:
    """A node status as a JSON object: only the fields that are present."""
    d: dict[str, Any] = {}
    for name in _STATUS_FIELDS:
        value = getattr(status, name)
        if value is not None:
            d[name] = value
    if status.rtt is not None:
        d["rtt_seconds"] = status.rtt
    if status.gauges:
        d["gauges"] = dict(status.gauges)
    if status.gpus:
        d["gpus"] = [_gpu_json(g) for g in status.gpus]
    return d


def _gpu_json(gpu: GpuStatus) -> dict[str, Any]:
    d: dict[str, Any] = {"index": gpu.index}
    for key, value in (
        ("utilization", gpu.utilization),
        ("memory_utilization", gpu.memory_utilization),
        ("memory_used_bytes", gpu.memory_used),
        ("memory_total_bytes", gpu.memory_total),
    ):
        if value is not None:
            d[key] = value
    d["lost"] = gpu.lost
    if gpu.error:
        d["error"] = gpu.error
    return d


def _gpu_text(gpu: GpuStatus) -> str:
    if gpu.lost:
        return f"gpu{gpu.index} LOST ({gpu.error})"
    parts = [f"gpu{gpu.index}"]
    if gpu.utilization is not None:
        parts.append(f"{gpu.utilization:.0%}")
    if gpu.memory_utilization is not None:
        parts.append(f"mem {gpu.memory_utilization:.0%}")
    if gpu.error:
        parts.append(f"({gpu.error})")
    return " ".join(parts)


def degraded_json(marks: tuple[Degradation, ...]) -> list[dict[str, str]]:
    """DEGRADED marks as ``[{"cause", "reason"}]``."""
    return [{"cause": m.cause, "reason": m.reason} for m in marks]


def degraded_text(marks: tuple[Degradation, ...]) -> str:
    """DEGRADED marks in words, ``"  DEGRADED (jitter: ...; unhealthy: ...)"``; "" for none."""
    if not marks:
        return ""
    return "  DEGRADED (" + "; ".join(f"{m.cause}: {m.reason}" for m in marks) + ")"


def status_text(status: NodeStatus) -> str:
    """A node status in one short line, e.g. ``load 0.52 cpu 12% mem 40% phase allreduce``."""
    parts = []
    if status.load is not None:
        parts.append(f"load {status.load:.2f}")
    for label, value in (
        ("cpu", status.cpu_utilization),
        ("mem", status.memory_utilization),
        ("gpu", status.gpu_utilization),
        ("gpu-mem", status.gpu_memory_utilization),
        ("progress", status.progress),
    ):
        if value is not None:
            parts.append(f"{label} {value:.0%}")
    if status.phase is not None:
        parts.append(f"phase {status.phase}")
    if status.step is not None:
        parts.append(f"step {status.step}")
    if status.rtt is not None:
        parts.append(f"rtt {status.rtt * 1000:.1f}ms")
    if len(status.gpus) > 1 or any(g.lost or g.error for g in status.gpus):
        parts.extend(_gpu_text(g) for g in status.gpus)
    if status.healthy is not None:
        parts.append("healthy" if status.healthy else "UNHEALTHY")
    parts.extend(f"{k}={v:g}" for k, v in sorted(status.gauges.items()))
    return " ".join(parts) or "(no status)"


def _evidence_text(evidence: tuple[Evidence, ...]) -> str:
    parts = []
    for e in evidence:
        what = e.arbiter_id
        if e.silence is not None:
            what += f" after {e.silence:.2f}s silent"
        if e.suspicion is not None:
            unit = "phi" if e.detector == "phi" else "missed"
            what += f" ({unit} {e.suspicion:.1f})"
        parts.append(what)
    return "; suspected by " + ", ".join(parts) if parts else ""


def _change_json(ev: ViewChanged, c: MemberChange) -> dict[str, Any]:
    d: dict[str, Any] = {
        "type": "change",
        "epoch": ev.epoch,
        "node_id": c.node_id,
        "incarnation": c.incarnation,
        "state": c.state.value,
        "labels": dict(c.labels),
        "arbiter": ev.arbiter_id,
    }
    if c.evidence:
        d["evidence"] = [evidence_json(e) for e in c.evidence]
    if c.removed_by:
        d["removed_by"] = c.removed_by
    if c.forgotten:
        d["forgotten"] = True
    return d


def _plain(value: Any) -> Any:
    """A dataclass field as JSON-ready data (enums by value, mappings as dicts)."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list | set | frozenset):
        return [_plain(v) for v in value]
    return value


def _type_name(ev: object) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(ev).__name__).lower()


def _other_lines(ev: object, as_json: bool) -> list[str]:
    """An event this module has no shape for: its class name and fields."""
    fields = _plain(ev) if dataclasses.is_dataclass(ev) else {}
    if as_json:
        return [json.dumps({"type": _type_name(ev), **fields}, default=str)]
    detail = " ".join(f"{k}={v}" for k, v in fields.items())
    return [f"{_type_name(ev).replace('_', ' ')}: {detail}".rstrip(": ")]


def _contact_lines(ev: object, as_json: bool) -> list[str] | None:
    """Disconnected, Reconnected and ViewReset (None for any other event)."""
    if isinstance(ev, Disconnected):
        if as_json:
            d = {
                "type": "disconnected",
                "epoch": ev.epoch,
                "silence_seconds": ev.silence,
                "arbiter": ev.arbiter_id or None,
                "reason": ev.reason,
            }
            return [json.dumps(d)]
        return [
            f"disconnected: nothing from an arbiter in a quorum for {ev.silence:.1f}s "
            f"(view at epoch {ev.epoch} may be stale; {ev.reason})"
        ]
    if isinstance(ev, Reconnected):
        if as_json:
            d = {
                "type": "reconnected",
                "epoch": ev.epoch,
                "silence_seconds": ev.silence,
                "arbiter": ev.arbiter_id,
            }
            return [json.dumps(d)]
        return [f"reconnected to {ev.arbiter_id} after {ev.silence:.1f}s (at epoch {ev.epoch})"]
    if isinstance(ev, ViewReset):
        if as_json:
            d = {"type": "reset", "since_epoch": ev.since_epoch, "cluster_epoch": ev.cluster_epoch}
            return [json.dumps(d)]
        return [
            f"reset: epoch {ev.since_epoch} is beyond the cluster's ({ev.cluster_epoch}); "
            "a fresh snapshot follows"
        ]
    return None


def event_lines(ev: object, as_json: bool) -> list[str]:
    """Renders one watch event as output lines (one per member change or status report).

    Args:
        ev: a :data:`membership.shared.view.ViewEvent` (or another event the SDK yields).
        as_json: one JSON object per line (shapes in the module docstring), else text.

    Returns:
        The lines, without newlines (an event with nothing to show gives none).
    """
    contact = _contact_lines(ev, as_json)
    if contact is not None:
        return contact
    if isinstance(ev, StatusUpdated):
        if as_json:
            return [
                json.dumps(
                    {
                        "type": "status",
                        "node_id": r.node_id,
                        "incarnation": r.incarnation,
                        "status": status_json(r.status),
                        "suspected_by": list(r.suspected_by),
                        "silence_seconds": r.silence,
                        "degraded": degraded_json(r.degraded),
                        "suspicion": r.suspicion,
                        "detector": r.detector or None,
                        "arbiter": ev.arbiter_id,
                        **grace_json(r.grace, r.grace_reason),
                    }
                )
                for r in ev.reports
            ]
        return [
            f"status {r.node_id} (incarnation {r.incarnation}): {status_text(r.status)}"
            + (f"  SUSPECT by {','.join(r.suspected_by)}" if r.suspected_by else "")
            + degraded_text(r.degraded)
            + grace_text(r.grace, r.grace_reason)
            for r in ev.reports
        ]
    if isinstance(ev, ViewSnapshot):
        ranks = ranks_lines(ev.view.jobs, ev.arbiter_id, as_json)
        if as_json:
            snapshot = {
                "type": "snapshot",
                "epoch": ev.view.epoch,
                "members": [member_json(m, ev.view) for m in ev.view.members],
                "arbiter": ev.arbiter_id,
                "instance": ev.instance,
            }
            return [json.dumps(snapshot), *ranks]
        members = ", ".join(f"{m.node_id}={m.state.value}" for m in ev.view.members) or "(empty)"
        return [f"epoch {ev.view.epoch}  snapshot from {ev.arbiter_id}: {members}", *ranks]
    if isinstance(ev, ViewChanged):
        if as_json:
            lines = [json.dumps(_change_json(ev, c)) for c in ev.changes]
            return lines + ranks_lines(ev.ranks, ev.arbiter_id, True)
        return [
            f"epoch {ev.epoch}  {c.node_id} (incarnation {c.incarnation}) {c.state.value}"
            + _evidence_text(c.evidence)
            + (f"; removed by {c.removed_by}" if c.removed_by else "")
            + ("; forgotten (bounded history)" if c.forgotten else "")
            for c in ev.changes
        ] + ranks_lines(ev.ranks, ev.arbiter_id, False)
    if isinstance(ev, QuorumChanged):
        if as_json:
            return [
                json.dumps(
                    {
                        "type": "quorum",
                        "in_quorum": ev.in_quorum,
                        "arbiter": ev.arbiter_id,
                        "leader": ev.leader_id,
                    }
                )
            ]
        word = "regained" if ev.in_quorum else "lost"
        return [f"arbiter {ev.arbiter_id} {word} its quorum (leader: {ev.leader_id or 'none'})"]
    return _other_lines(ev, as_json)


def session_event_line(
    node_id: str, ev: SessionEvent, leaving: bool = False, taken_over: bool = False
) -> str | None:
    """How ``membership node`` prints a session event (None for an event it does not print).

    ``leaving``: the node is leaving (``n1: leaving`` was printed): a join that commits
    meanwhile (``is ALIVE``, ``unfenced``) is not printed, only where the leave ends.
    ``taken_over``: the session ended by a takeover (``end_reason`` SUPERSEDED): its
    incarnation's end (``is DEAD``) is said by the ``taken over`` line that follows.

    Lines: ``n1: incarnation 7 is ALIVE``, ``n1: fenced (fencing epoch 5)``,
    ``n1: unfenced (...)``, ``n1: incarnation 7 taken over by 8; stopping``,
    ``n1: incarnation 7 over (DEAD); rejoining as 8``,
    ``n1: incarnation 7 declared DEAD by the cluster without asking; rejoining``,
    ``n1: incarnation 7 removed from the cluster (LEFT without asking); stopping``.
    """
    if isinstance(ev, Evicted):
        if ev.state is MemberState.LEFT:
            return (
                f"{node_id}: incarnation {ev.incarnation} removed from the cluster "
                "(LEFT without asking); stopping"
            )
        then = "rejoining" if ev.rejoining else "stopping (no rejoin)"
        return (
            f"{node_id}: incarnation {ev.incarnation} declared DEAD by the cluster "
            f"without asking; {then}"
        )
    if leaving and (
        (isinstance(ev, StateChanged) and ev.state in (MemberState.JOINING, MemberState.ALIVE))
        or (isinstance(ev, Fenced) and not ev.fenced)
    ):
        return None  # superseded by the leave under way
    if taken_over and isinstance(ev, StateChanged) and ev.state is MemberState.DEAD:
        return None  # "taken over by 8; stopping" says it, next
    if isinstance(ev, StateChanged):
        return f"{node_id}: incarnation {ev.incarnation} is {ev.state.value}"
    if isinstance(ev, Fenced):
        word = "fenced" if ev.fenced else "unfenced"
        return f"{node_id}: {word} (fencing epoch {ev.epoch})"
    if isinstance(ev, Superseded):
        return f"{node_id}: incarnation {ev.incarnation} taken over by {ev.by}; stopping"
    if isinstance(ev, Rejoined):
        return (
            f"{node_id}: incarnation {ev.old_incarnation} over ({ev.reason}); "
            f"rejoining as {ev.new_incarnation}"
        )
    return None


def view_json(info: Any) -> dict[str, Any]:
    """The ``view --json`` object of a :class:`membership.ViewInfo`.

    Returns:
        ``{"epoch", "leader", "in_quorum", "arbiter", "cluster", "instance",
        "local_suspects", "members": [member + "suspected_by", "degraded"
        (+ "status", "silence_seconds", "suspicion", "detector", and
        "grace_seconds" and "grace_reason" in a grace window)], "jobs": [{"job",
        "epoch", "world_size", "ranks"}]}``: the arbiter's DEGRADED marks
        ``[{"cause", "reason"}]`` (empty: not degraded) and, for an ALIVE member
        it hears, its status, the seconds since it heard it and its detector's
        suspicion level; members of a job carry ``"rank"`` and ``"world_size"``.
    """
    members = []
    graces = getattr(info, "graces", {})
    for m in info.view.members:
        d = member_json(m, info.view)
        d["suspected_by"] = list(info.suspected_by.get(m.node_id, ()))
        d["degraded"] = degraded_json(info.degraded.get(m.node_id, ()))
        status = info.statuses.get(m.node_id)
        if status is not None:
            d["status"] = status_json(status)
        d.update(grace_json(*graces.get(m.node_id, (0.0, ""))))
        live = info.liveness.get(m.node_id)
        if live is not None:
            d["silence_seconds"] = live.silence
            d["suspicion"] = live.suspicion
            d["detector"] = live.detector or None
        members.append(d)
    return {
        "epoch": info.view.epoch,
        "leader": info.leader_id,
        "in_quorum": info.in_quorum,
        "arbiter": info.arbiter_id,
        "cluster": info.cluster,
        "instance": info.instance,
        "local_suspects": list(info.local_suspects),
        "members": members,
        "jobs": [{k: v for k, v in ranks_json(j).items() if k != "type"} for j in info.view.jobs],
    }


def view_text(info: Any) -> list[str]:
    """``membership view`` without ``--json``: a header line, then a line per member
    (and its status under it)."""
    view = info.view
    lines = [
        f"epoch {view.epoch}  arbiter {info.arbiter_id}  leader {info.leader_id or 'none'}  "
        f"in_quorum {str(info.in_quorum).lower()}"
    ]
    for m in view.members:
        labels = ",".join(f"{k}={v}" for k, v in m.labels.items())
        suspects = info.suspected_by.get(m.node_id)
        extra = f"  SUSPECT by {','.join(suspects)}" if suspects else ""
        if m.rank is not None:
            extra = f"  rank {m.rank}/{view.world_size(m.node_id)}" + extra
        extra += grace_text(*getattr(info, "graces", {}).get(m.node_id, (0.0, "")))
        extra += degraded_text(info.degraded.get(m.node_id, ()))
        lines.append(
            f"  {m.node_id:<20} {m.state.value:<6} incarnation {m.incarnation}  "
            f"since epoch {m.epoch}  {labels}{extra}"
        )
        status = info.statuses.get(m.node_id)
        if status is not None:
            lines.append(f"  {'':<20} {status_text(status)}")
    return lines


def ranks_json(j: JobRanks, arbiter: str = "") -> dict[str, Any]:
    """A job's assignment as the ``watch --json`` ``ranks`` object (module docstring)."""
    d: dict[str, Any] = {
        "type": "ranks",
        "epoch": j.epoch,
        "job": j.job,
        "world_size": j.world_size,
        "ranks": dict(sorted(j.ranks.items(), key=lambda item: item[1])),
    }
    if arbiter:
        d["arbiter"] = arbiter
    return d


def ranks_lines(jobs: tuple[JobRanks, ...], arbiter: str, as_json: bool) -> list[str]:
    """One ``ranks`` line per job (JSON, or ``epoch 12  job j1 ranks n1=0 ... (world size 3)``)."""
    if as_json:
        return [json.dumps(ranks_json(j, arbiter)) for j in jobs]
    return [
        f"epoch {j.epoch}  job {j.job} ranks "
        + (" ".join(f"{n}={r}" for n, r in sorted(j.ranks.items(), key=lambda i: i[1])) or "-")
        + f" (world size {j.world_size})"
        for j in jobs
    ]


def grace_json(seconds: float, reason: str) -> dict[str, Any]:
    """``grace_seconds`` and ``grace_reason`` of a node in a grace window, else nothing."""
    return {"grace_seconds": round(seconds, 3), "grace_reason": reason} if seconds > 0 else {}


def grace_text(seconds: float, reason: str) -> str:
    """``  GRACE 42s (checkpoint)`` for a node in a grace window, else ""."""
    return f"  GRACE {seconds:.0f}s ({reason or 'no reason'})" if seconds > 0 else ""
