"""What a node reports about itself with every heartbeat: the status value and its bounds.

A :class:`NodeStatus` holds probed load and utilisation (probed by the
providers of :mod:`membership._node.probes`, per GPU in :class:`GpuStatus`) plus
the training phase, step, progress, gauges and health flag the application
reports, and the heartbeat round trip the SDK measures; the threads that
keep it current are :class:`membership._node.collector.StatusCollector`. The
status is informational: arbiters never use it for liveness (a node that
says it is unhealthy is marked DEGRADED, never DEAD).

Rules:

1. Every :class:`NodeStatus` is valid: the constructor checks the bounds.
2. Sizes are bounded: at most :data:`MAX_GAUGES` gauges, names and phase of at
   most :data:`MAX_NAME_CHARS` characters of ``[A-Za-z0-9._/-]``, every number
   finite, a health reason of at most 256 printable characters, at most 32
   GPUs. A status is at most about 6 kB on the wire.
3. The application's values win over probed ones (:meth:`NodeStatus.merged_over`).

Pure: no threads, no clock, no logging, so that :mod:`membership.shared.view` (and
the arbiter's core through it) can use it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from membership.shared.errors import InvalidArgument
from membership.shared.validation import (
    MAX_GPUS,
    MAX_LABEL_KEY,
    NAME_PATTERN,
    STATUS_FRACTIONS,
    validate_gpus,
    validate_health_reason,
)

__all__ = [
    "MAX_GAUGES",
    "MAX_NAME_CHARS",
    "MAX_STEP",
    "PROBED_FIELDS",
    "GpuStatus",
    "NodeStatus",
    "finite_number",
    "probed_value",
    "rtt_to_send",
]

# At most this many gauges in one status (the arbiters accept up to
# membership.shared.validation.MAX_GAUGES = 64; keep below it).
MAX_GAUGES: Final = 32
# Gauge names and the phase: 1 to 63 characters of [A-Za-z0-9._/-], starting
# with a letter or digit. The arbiters refuse a heartbeat whose gauge names are
# longer or use other characters (membership.shared.validation.validate_status), so
# this must never accept more than that.
MAX_NAME_CHARS: Final = MAX_LABEL_KEY
# The step travels as an int64.
MAX_STEP: Final = 2**63 - 1
# The fields a provider may return; anything else it returns is dropped.
PROBED_FIELDS: Final = frozenset(
    {
        "load",
        "cpu_utilization",
        "memory_utilization",
        "gpu_utilization",
        "gpu_memory_utilization",
        "gpus",
    }
)


# The round trip a node sends changes only when it moved by this fraction of the
# last one sent and by at least RTT_MIN_MOVE seconds: otherwise every heartbeat
# would carry a new status and subscribers would get every node at every
# status interval (arbiter/server/fanout/statusboard.py rule 1).
RTT_DEADBAND = 0.2
RTT_MIN_MOVE = 0.001


def rtt_to_send(sent: float | None, measured: float | None) -> float | None:
    """The heartbeat round trip to put in the status: ``measured`` once it moved
    from ``sent`` by :data:`RTT_DEADBAND` of it and :data:`RTT_MIN_MOVE` seconds,
    else ``sent`` (also when nothing was measured lately).

    Args:
        sent: the round trip the last status carried, seconds (None: none yet).
        measured: the latest measurement, seconds (None: none lately).

    Returns:
        Seconds, rounded to the microsecond, or None.
    """
    if measured is None:
        return sent
    if sent is not None:
        move = abs(measured - sent)
        if move < RTT_MIN_MOVE or move < RTT_DEADBAND * sent:
            return sent
    return round(measured, 6)


def finite_number(name: str, value: object) -> float:
    """Checks that ``value`` is a finite real number (not a bool).

    Args:
        name: the field, for the message.
        value: what was given.

    Returns:
        The value as a float.

    Raises:
        InvalidArgument: naming ``name`` and what is wrong.
    """
    # bool is an int, and True is not a measurement.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        raise InvalidArgument(f"{name} is too large for a float: {value!r:.40}") from None
    if not math.isfinite(number):
        raise InvalidArgument(f"{name} must be a finite number, got {number}")
    return number


def _fraction(name: str, value: object) -> float:
    number = finite_number(name, value)
    if not 0.0 <= number <= 1.0:
        raise InvalidArgument(f"{name} must be between 0 and 1, got {number}")
    return number


def _load(name: str, value: object) -> float:
    number = finite_number(name, value)
    if number < 0:
        raise InvalidArgument(f"{name} must be >= 0, got {number}")
    return number


def _name(what: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string, got {value!r}")
    if not 0 < len(value) <= MAX_NAME_CHARS or not NAME_PATTERN.fullmatch(value):
        raise InvalidArgument(
            f"{what} {value[:80]!r} must be 1 to {MAX_NAME_CHARS} characters of letters, "
            "digits, '.', '_', '/', '-', starting with a letter or digit"
        )
    return value


def _step(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(f"step must be an integer, got {value!r}")
    step = int(value)
    if not 0 <= step <= MAX_STEP:
        raise InvalidArgument(f"step must be in 0..{MAX_STEP}, got {step}")
    return step


def _gauges(gauges: object) -> Mapping[str, float]:
    if not isinstance(gauges, Mapping):
        raise InvalidArgument(f"gauges must be a mapping of names to numbers, got {gauges!r}")
    if len(gauges) > MAX_GAUGES:
        raise InvalidArgument(f"{len(gauges)} gauges, the limit is MAX_GAUGES = {MAX_GAUGES}")
    return MappingProxyType(
        {_name("gauge name", k): finite_number(f"gauge {k!r}", v) for k, v in gauges.items()}
    )


def _empty_gauges() -> Mapping[str, float]:
    return MappingProxyType({})


def _bytes(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 0:
        raise InvalidArgument(f"{name} must be a whole number of bytes >= 0, got {value!r}")
    if int(value) >= 2**64:
        raise InvalidArgument(f"{name} does not fit 64 bits: {value!r}")
    return int(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuStatus:
    """One GPU as the node's NVML probe last read it (``NodeStatus.gpus``).

    Every instance is valid: the constructor checks the bounds.

    Attributes:
        index: NVML's device index, 0..31.
        utilization: fraction of the last sample period (1/6 s to 1 s, by
            product) during which a kernel ran on it, 0..1; ``None`` when
            NVML could not say (not supported on MIG, or the GPU is lost).
        memory_utilization: memory used / memory total, 0..1.
        memory_used: bytes of its memory in use.
        memory_total: bytes of its memory.
        lost: the GPU did not answer at all: it fell off the bus
            (``NVML_ERROR_GPU_IS_LOST``, Xid 79) or NVML lost it otherwise.
        error: the NVML error of what could not be read ("" when all was),
            e.g. ``"NVML_ERROR_GPU_IS_LOST"``; at most 64 printable characters.

    Raises:
        InvalidArgument: naming the field and the bound it breaks.
    """

    index: int
    utilization: float | None = None
    memory_utilization: float | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    lost: bool = False
    error: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.index, bool) or not isinstance(self.index, numbers.Integral):
            raise InvalidArgument(f"GPU index must be an integer, got {self.index!r}")
        for name in ("utilization", "memory_utilization"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _fraction(f"GPU {name}", value))
        for name in ("memory_used", "memory_total"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _bytes(f"GPU {name}", value))
        object.__setattr__(self, "lost", bool(self.lost))
        validate_gpus([(int(self.index), self.error, {})])


def _gpus(name: str, value: object) -> tuple[GpuStatus, ...]:
    if not isinstance(value, tuple | list) or not all(isinstance(g, GpuStatus) for g in value):
        raise InvalidArgument(f"{name} must be a sequence of GpuStatus, got {value!r:.80}")
    gpus = tuple(sorted(value, key=lambda g: g.index))
    if len(gpus) > MAX_GPUS or len({g.index for g in gpus}) != len(gpus):
        raise InvalidArgument(f"{name}: at most {MAX_GPUS} GPUs, each index once")
    return gpus


_PROBED_CHECKS: Final[Mapping[str, Callable[[str, object], object]]] = {
    "load": _load,
    "gpus": _gpus,
    **{f: _fraction for f in STATUS_FRACTIONS if f in PROBED_FIELDS},
}


def probed_value(name: str, value: object) -> Any:
    """Checks one value a provider returned: a field of :data:`PROBED_FIELDS` in its bounds.

    Args:
        name: the field the provider named.
        value: the value it returned.

    Returns:
        The value as a float; ``gpus`` as a tuple of :class:`GpuStatus` sorted by index.

    Raises:
        InvalidArgument: ``name`` is not a probed field, or the value is out of
            its bounds (a load below 0, a fraction outside 0..1, not finite,
            ``gpus`` not a sequence of at most 32 :class:`GpuStatus`).
    """
    check = _PROBED_CHECKS.get(name)
    if check is None:
        raise InvalidArgument(f"{name!r} is not one of {sorted(PROBED_FIELDS)}")
    return check(name, value)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStatus:
    """A node's status as sent with a heartbeat; ``None`` (or no gauges) means absent.

    Every instance is valid: the constructor checks the bounds.

    Attributes:
        load: 1-minute load average (runnable processes), >= 0.
        cpu_utilization: busy fraction of all CPUs over the last probe interval, 0..1.
        memory_utilization: fraction of RAM not available to new processes, 0..1.
        gpu_utilization: mean busy fraction over the node's GPUs, 0..1.
        gpu_memory_utilization: mean fraction of GPU memory in use, 0..1.
        phase: training phase named by the application, e.g. ``"allreduce"``.
        step: training step, 0..MAX_STEP.
        progress: fraction of the job done, 0..1.
        gauges: free-form numbers set by the application (read-only).
        healthy: the application's own health flag (``client.report(healthy=...)``);
            ``False`` makes the arbiters mark the node DEGRADED, never DEAD.
        health_reason: why it is unhealthy, at most 256 printable characters.
        rtt: the node's heartbeat round trip, seconds (send to ack, median over
            the arbiters), measured by the SDK.
        gpus: one :class:`GpuStatus` per GPU, by index (the probe's); the
            ``gpu_*`` means are over those that answered.

    Raises:
        InvalidArgument: naming the field and the bound it breaks.
    """

    load: float | None = None
    cpu_utilization: float | None = None
    memory_utilization: float | None = None
    gpu_utilization: float | None = None
    gpu_memory_utilization: float | None = None
    phase: str | None = None
    step: int | None = None
    progress: float | None = None
    gauges: Mapping[str, float] = field(default_factory=_empty_gauges)
    healthy: bool | None = None
    health_reason: str | None = None
    rtt: float | None = None
    gpus: tuple[GpuStatus, ...] = ()

    def __post_init__(self) -> None:
        if self.load is not None:
            object.__setattr__(self, "load", _load("load", self.load))
        for name in STATUS_FRACTIONS:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _fraction(name, value))
        if self.phase is not None:
            _name("phase", self.phase)
        if self.step is not None:
            object.__setattr__(self, "step", _step(self.step))
        object.__setattr__(self, "gauges", _gauges(self.gauges))
        if self.healthy is not None and not isinstance(self.healthy, bool):
            raise InvalidArgument(f"healthy must be True or False, got {self.healthy!r}")
        if self.health_reason is not None:
            validate_health_reason(self.health_reason)
        if self.rtt is not None:
            object.__setattr__(self, "rtt", _load("rtt", self.rtt))
        object.__setattr__(self, "gpus", _gpus("gpus", self.gpus))

    def merged_over(self, base: NodeStatus) -> NodeStatus:
        """This status, with ``base`` filling in what it lacks: ``self`` wins.

        Used as ``reported.merged_over(probed)``. Gauges are united, ``self``'s
        value winning; when together they exceed :data:`MAX_GAUGES`, all of
        ``self``'s are kept and ``base``'s are added in name order up to the limit.

        Returns:
            A new status.
        """
        values: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name != "gauges":
                mine = getattr(self, f.name)
                values[f.name] = getattr(base, f.name) if mine is None or mine == () else mine
        gauges = dict(self.gauges)
        for name in sorted(base.gauges):
            if len(gauges) >= MAX_GAUGES:
                break
            gauges.setdefault(name, base.gauges[name])
        return NodeStatus(**values, gauges=gauges)
