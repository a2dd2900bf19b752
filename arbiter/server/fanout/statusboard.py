"""The latest status each node reported to this replica (live status, not replicated).

A node's status (load, GPU use, training phase, gauges...) rides on every
heartbeat. It is informational: never read by a failure detector, never
written to the log. Each replica keeps only the latest status per node, and
subscribers that opt in receive it coalesced per node and rate-limited.

Rules:

1. :meth:`StatusBoard.update` keeps the latest status of a node (``view``
   shows it) and bumps its version, which is what makes subscribers send the
   node again, only when the status *changed* since the last version
   (:func:`changed`): a new incarnation; a field the application reports
   (phase, step, progress, a gauge) set, cleared or given another value; a
   field appearing or disappearing; or a probed figure moving by at least
   its deadband since the last version: :data:`LOAD_DEADBAND` (0.1) for the
   load average, :data:`FRACTION_DEADBAND` (0.05, five points) for the CPU,
   memory, GPU and GPU memory fractions. Without a deadband every heartbeat
   of a busy node differs in the CPU use's last digits, and ``watch
   --status`` printed every node at every status interval. The comparison is
   with the status of the last version, not the previous heartbeat's, so a
   slow drift is sent once it adds up to the deadband.
   ``gpu_utilization`` may be probed (NVML) or reported by the application;
   the heartbeat does not say which, so it has the fraction deadband. So do
   the per-GPU figures (``gpus``: a GPU appearing, disappearing, lost or
   failing is a change; its utilisation and memory fractions have the
   fraction deadband, its byte counts none of their own). The heartbeat
   round trip (``rtt_seconds``) changes when it moves by
   :data:`RTT_DEADBAND` of its last version's value and 1 ms (the SDK
   already sends it only then: membership.shared.status.rtt_to_send).
2. Memory is bounded by the nodes the replica hears: an entry not updated for
   ``forget_after`` seconds is dropped by :meth:`prune`. An entry holds no
   older request's status than the latest (a protobuf submessage holds its
   whole request's memory): the status of the last version is that latest
   status while they are equal, and its plain values (:func:`fields_of`)
   once a status within the deadband replaces it.
3. Each entry keeps the node's step history (:class:`arbiter.core.degraded.
   StepHistory`, over ``step_window`` seconds) from the ``step`` of every
   status that carries one, for the DEGRADED step-rate rule; a new
   incarnation starts a new history. An entry whose statuses never carried a
   step has none (None: memory per node).
4. ``heard`` is the last heartbeat of the entry's incarnation, whether or not
   it carried a status: ingest workers send a node's status along only when it
   changed or every 5 s (``arbiter/server/ingest/worker.py`` rule 2), and call
   :meth:`StatusBoard.heard` for the others, so the silence ``view`` and
   status watchers show is the time since the node was heard, not since its
   status last changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from arbiter.core.degraded import StepHistory
from membership.shared.status import RTT_DEADBAND, RTT_MIN_MOVE
from membership.v1 import membership_pb2 as pb

__all__ = [
    "FRACTION_DEADBAND",
    "LOAD_DEADBAND",
    "RTT_DEADBAND",
    "StatusBoard",
    "StatusEntry",
    "changed",
    "differs",
    "fields_of",
]

# Rule 1: how far a probed figure moves before the status counts as changed.
LOAD_DEADBAND = 0.1  # load average (runnable processes)
FRACTION_DEADBAND = 0.05  # CPU, memory, GPU and GPU memory use, fractions 0..1
_Probed = Literal[
    "load", "cpu_utilization", "memory_utilization", "gpu_utilization", "gpu_memory_utilization"
]
_FRACTIONS: frozenset[_Probed] = frozenset(
    ("cpu_utilization", "memory_utilization", "gpu_utilization", "gpu_memory_utilization")
)


def fields_of(status: pb.NodeStatus) -> dict[str, Any]:
    """The fields set in ``status`` (``ListFields``: a field present, a map non-empty),
    name -> value, the gauges as a plain dict: what rule 1 compares, holding nothing
    of the message."""
    out = {f.name: v for f, v in status.ListFields()}
    if "gauges" in out:
        out["gauges"] = dict(out["gauges"])
    if "gpus" in out:
        out["gpus"] = tuple(_gpu_fields(g) for g in out["gpus"])
    return out


def _gpu_fields(gpu: Any) -> tuple[Any, ...]:
    """One GpuStatus as plain values: (index, lost, error, utilization or None,
    memory_utilization or None)."""
    return (
        gpu.index,
        gpu.lost,
        gpu.error,
        gpu.utilization if gpu.HasField("utilization") else None,
        gpu.memory_utilization if gpu.HasField("memory_utilization") else None,
    )


def changed(
    old: pb.NodeStatus,
    new: pb.NodeStatus,
    load_deadband: float = LOAD_DEADBAND,
    fraction_deadband: float = FRACTION_DEADBAND,
) -> bool:
    """Whether ``new`` differs from ``old`` enough to be sent again (rule 1).

    Read once per changed status of every heartbeat: the fields set in each
    (``ListFields``: a field present, a map non-empty) are compared once,
    instead of asking every field of both whether it is set.
    """
    if old == new:
        return False
    return differs(fields_of(old), fields_of(new), load_deadband, fraction_deadband)


def differs(
    was: dict[str, Any],
    now: dict[str, Any],
    load_deadband: float = LOAD_DEADBAND,
    fraction_deadband: float = FRACTION_DEADBAND,
) -> bool:
    """:func:`changed` of two statuses given as :func:`fields_of` (rule 1)."""
    if was.keys() != now.keys():
        return True  # a field (or the first gauge) appeared or disappeared
    for name, value in now.items():
        if name == "load":
            if abs(value - was[name]) >= load_deadband:
                return True
        elif name in _FRACTIONS:
            if abs(value - was[name]) >= fraction_deadband:
                return True
        elif name == "gauges":
            if value != was[name]:
                return True
        elif name == "gpus":
            if _gpus_changed(was[name], value, fraction_deadband):
                return True
        elif name == "rtt_seconds":
            move = abs(value - was[name])
            if move >= RTT_MIN_MOVE and move >= RTT_DEADBAND * was[name]:
                return True
        elif value != was[name]:  # phase, step, progress, health: any other value
            return True
    return False


def _gpus_changed(old: tuple[Any, ...], new: tuple[Any, ...], deadband: float) -> bool:
    """Rule 1 for the per-GPU figures (``old`` and ``new``: :func:`_gpu_fields` of each)."""
    if len(old) != len(new):
        return True
    for a, b in zip(old, new, strict=True):
        if a[:3] != b[:3]:  # index, lost, error
            return True
        for x, y in zip(a[3:], b[3:], strict=True):  # the fractions
            if (x is None) != (y is None) or (x is not None and abs(x - y) >= deadband):
                return True
    return False


@dataclass(slots=True)
class StatusEntry:
    """One node's latest status as heard here.

    Attributes:
        incarnation: the incarnation that reported it.
        status: the reported status (a protobuf message, never mutated).
        heard: monotonic seconds of the last heartbeat carrying it.
        version: board version of the last change (rule 1).
        steps: the node's step history (rule 3); None until a status carries a step.
    """

    incarnation: int
    status: pb.NodeStatus
    heard: float
    version: int
    # the status as of ``version`` (what rule 1 compares with): ``status`` itself while
    # they are equal, else its fields_of (rule 2)
    sent: pb.NodeStatus | dict[str, Any]
    steps: StepHistory | None  # rule 3


class StatusBoard:
    """Latest status per node (see the module rules).

    Args:
        forget_after: seconds without a heartbeat after which a node's entry
            is dropped by :meth:`prune`.
        load_deadband: rule 1's deadband for the load average.
        fraction_deadband: rule 1's deadband for the utilisation fractions.
        step_window: rule 3's window, seconds.
    """

    def __init__(
        self,
        forget_after: float = 60.0,
        load_deadband: float = LOAD_DEADBAND,
        fraction_deadband: float = FRACTION_DEADBAND,
        step_window: float = 30.0,
    ) -> None:
        self._step_window = step_window
        self._entries: dict[str, StatusEntry] = {}
        self._version = 0
        self._forget_after = forget_after
        self._load_deadband = load_deadband
        self._fraction_deadband = fraction_deadband

    @property
    def version(self) -> int:
        """The version of the most recent change."""
        return self._version

    def update(self, node_id: str, incarnation: int, status: pb.NodeStatus, now: float) -> None:
        """Records a heartbeat's status received at ``now`` (monotonic seconds); rules 1, 3."""
        entry = self._entries.get(node_id)
        if entry is not None and entry.incarnation == incarnation:
            entry.heard = now
            old, sent = entry.status, entry.sent
            entry.status = status  # the latest request's, even when equal (rule 2)
            if status == old:  # most heartbeats: the same status again (C compare)
                if sent is old:
                    entry.sent = status  # the same, held by the newer request (rule 2)
                return
            if status.HasField("step"):
                if entry.steps is None:
                    entry.steps = StepHistory(self._step_window)
                entry.steps.observe(status.step, now)
            was = sent if isinstance(sent, dict) else fields_of(sent)
            if not differs(was, fields_of(status), self._load_deadband, self._fraction_deadband):
                entry.sent = was  # its values, not an older request (rule 2)
                return
            self._version += 1
            entry.version, entry.sent = self._version, status
            return
        self._version += 1
        steps = None
        if status.HasField("step"):
            steps = StepHistory(self._step_window)
            steps.observe(status.step, now)
        self._entries[node_id] = StatusEntry(
            incarnation=incarnation,
            status=status,
            heard=now,
            version=self._version,
            sent=status,
            steps=steps,
        )

    def heard(self, node_id: str, incarnation: int, now: float) -> None:
        """Records a heartbeat that came without its status at ``now`` (rule 4): an
        ingest worker sends a status along only when it changed."""
        entry = self._entries.get(node_id)
        if entry is not None and entry.incarnation == incarnation:
            entry.heard = now

    def get(self, node_id: str) -> StatusEntry | None:
        """The node's entry, or None."""
        return self._entries.get(node_id)

    def items(self) -> list[tuple[str, StatusEntry]]:
        """Every (node_id, entry), sorted by node id."""
        return sorted(self._entries.items())

    def prune(self, now: float) -> int:
        """Drops entries not heard for ``forget_after`` seconds (rule 2); returns how many."""
        old = [n for n, e in self._entries.items() if now - e.heard > self._forget_after]
        for n in old:
            del self._entries[n]
        return len(old)

    def __len__(self) -> int:
        """Number of nodes with an entry."""
        return len(self._entries)
