"""What a node reports about itself with every heartbeat: the status value and its bounds.

A :class:`NodeStatus` holds probed load and utilisation (probed by the
providers of :mod:`membership.probes`) plus the training phase, step,
progress and gauges the application reports; the threads that keep it
current are :class:`membership.collector.StatusCollector`. The status is
informational: arbiters never use it for liveness.

Rules:

1. Every :class:`NodeStatus` is valid: the constructor checks the bounds.
2. Sizes are bounded: at most :data:`MAX_GAUGES` gauges, names and phase of at
   most :data:`MAX_NAME_CHARS` characters of ``[A-Za-z0-9._/-]``, every number
   finite. A status is at most about 2.5 kB on the wire.
3. The application's values win over probed ones (:meth:`NodeStatus.merged_over`).

Pure: no threads, no clock, no logging, so that :mod:`membership.view` (and
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

from membership.errors import InvalidArgument
from membership.validation import MAX_LABEL_KEY, NAME_PATTERN, STATUS_FRACTIONS

__all__ = [
    "MAX_GAUGES",
    "MAX_NAME_CHARS",
    "MAX_STEP",
    "PROBED_FIELDS",
    "NodeStatus",
    "finite_number",
    "probed_value",
]

# At most this many gauges in one status (the arbiters accept up to
# membership.validation.MAX_GAUGES = 64; keep below it).
MAX_GAUGES: Final = 32
# Gauge names and the phase: 1 to 63 characters of [A-Za-z0-9._/-], starting
# with a letter or digit. The arbiters refuse a heartbeat whose gauge names are
# longer or use other characters (membership.validation.validate_status), so
# this must never accept more than that.
MAX_NAME_CHARS: Final = MAX_LABEL_KEY
# The step travels as an int64.
MAX_STEP: Final = 2**63 - 1
# The fields a provider may return; anything else it returns is dropped.
PROBED_FIELDS: Final = frozenset(
    {"load", "cpu_utilization", "memory_utilization", "gpu_utilization", "gpu_memory_utilization"}
)


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


_PROBED_CHECKS: Final[Mapping[str, Callable[[str, object], float]]] = {
    "load": _load,
    **{f: _fraction for f in STATUS_FRACTIONS if f in PROBED_FIELDS},
}


def probed_value(name: str, value: object) -> float:
    """Checks one value a provider returned: a field of :data:`PROBED_FIELDS` in its bounds.

    Args:
        name: the field the provider named.
        value: the value it returned.

    Returns:
        The value as a float.

    Raises:
        InvalidArgument: ``name`` is not a probed field, or the value is out of
            its bounds (a load below 0, a fraction outside 0..1, not finite).
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
                values[f.name] = getattr(base, f.name) if mine is None else mine
        gauges = dict(self.gauges)
        for name in sorted(base.gauges):
            if len(gauges) >= MAX_GAUGES:
                break
            gauges.setdefault(name, base.gauges[name])
        return NodeStatus(**values, gauges=gauges)
