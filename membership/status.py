"""What a node reports about itself with every heartbeat: probed load and utilisation,
plus the training phase, step, progress and gauges the application reports.

The status is informational: arbiters never use it for liveness. So collecting
it must never cost a heartbeat (field report C26: a heartbeat blocked behind
slow metadata collection got a healthy node suspected).

Rules:

1. :meth:`StatusCollector.snapshot` never blocks and does no I/O: it returns
   the immutable :class:`NodeStatus` that the probe threads and
   :meth:`StatusCollector.report` last published (one attribute read, no lock).
2. Each provider runs in a daemon worker thread of its own; one daemon
   scheduler thread gives every provider a turn each ``probe_interval``
   seconds. A provider still running when its turn comes is skipped: never
   waited for, never started twice. A provider that hangs for ever holds one
   thread and nothing else.
3. A probed value is dropped once it is older than ``stale_after`` seconds
   (counted from when its provider returned it).
4. The application's values win over probed ones (:meth:`NodeStatus.merged_over`).
5. Sizes are bounded: at most :data:`MAX_GAUGES` gauges, names and phase of at
   most :data:`MAX_NAME_CHARS` characters of ``[A-Za-z0-9._/-]``, every number
   finite. A status is at most about 2.5 kB on the wire.

Why threads of our own and not a ``ThreadPoolExecutor``: the executor joins
every worker at interpreter exit (``threading._register_atexit``), so one
provider blocked for ever (a hung NVML driver, a dead NFS mount) would make the
training process hang at exit. Our threads are daemons and are never joined
while their provider runs. One long-lived thread per provider (rather than a
fresh thread per run) also keeps per-thread state such as NVML's in one place.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import numbers
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any, Final

from membership.errors import ClosedError, InvalidArgument
from membership.validation import MAX_LABEL_KEY, NAME_PATTERN, STATUS_FRACTIONS

__all__ = [
    "MAX_GAUGES",
    "MAX_NAME_CHARS",
    "MAX_STEP",
    "PROBED_FIELDS",
    "NodeStatus",
    "NvmlProvider",
    "ProbeStatistics",
    "Provider",
    "PsutilProvider",
    "StatusCollector",
    "StatusStatistics",
    "default_providers",
    "gpu_provider",
    "load_provider",
    "psutil_provider",
]

log = logging.getLogger("membership.status")

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
_REPORTED_FIELDS: Final = ("phase", "step", "progress", "gpu_utilization")

Provider = Callable[[], Mapping[str, float]]
"""Returns some of :data:`PROBED_FIELDS`; may block, may raise (both are contained)."""


def _number(name: str, value: object) -> float:
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
    number = _number(name, value)
    if not 0.0 <= number <= 1.0:
        raise InvalidArgument(f"{name} must be between 0 and 1, got {number}")
    return number


def _load(name: str, value: object) -> float:
    number = _number(name, value)
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
        {_name("gauge name", k): _number(f"gauge {k!r}", v) for k, v in gauges.items()}
    )


def _empty_gauges() -> Mapping[str, float]:
    return MappingProxyType({})


_PROBED_CHECKS: Final[Mapping[str, Callable[[str, object], float]]] = {
    "load": _load,
    **{f: _fraction for f in STATUS_FRACTIONS if f in PROBED_FIELDS},
}


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


# --- providers -----------------------------------------------------------------

_logged: set[str] = set()


def _log_once(key: str, level: int, msg: str, *args: object, exc_info: bool = False) -> None:
    if key not in _logged:
        _logged.add(key)
        log.log(level, msg, *args, exc_info=exc_info)


def load_provider() -> Provider | None:
    """The 1-minute load average from ``os.getloadavg()``; ``None`` where there is none.

    Returns:
        A provider returning ``{"load": ...}``, or ``None`` (Windows).
    """
    if not hasattr(os, "getloadavg"):
        _log_once("no-load", logging.DEBUG, "load average absent: no os.getloadavg here")
        return None

    def load() -> Mapping[str, float]:
        return {"load": os.getloadavg()[0]}

    return load


class PsutilProvider:
    """CPU and memory utilisation via psutil.

    CPU use is computed from ``psutil.cpu_times()`` deltas between two calls
    of this provider (psutil's formula: guest time is already in user time,
    iowait counts as idle), so it depends on no state psutil keeps per thread
    and is not disturbed by the application calling ``psutil.cpu_percent()``.
    """

    def __init__(self, psutil: Any) -> None:
        """Reads the CPU counters once, so that the first call has a base.

        Args:
            psutil: the psutil module.
        """
        self._psutil = psutil
        self._last = psutil.cpu_times()

    @staticmethod
    def _total_busy(times: Any) -> tuple[float, float]:
        total = float(sum(times)) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
        return total, total - times.idle - getattr(times, "iowait", 0.0)

    def __call__(self) -> Mapping[str, float]:
        """Returns ``cpu_utilization`` (since the previous call; absent when no CPU
        time has been accounted since) and ``memory_utilization``."""
        memory = self._psutil.virtual_memory()
        values = {"memory_utilization": min(max(1 - memory.available / memory.total, 0.0), 1.0)}
        times = self._psutil.cpu_times()
        total0, busy0 = self._total_busy(self._last)
        total1, busy1 = self._total_busy(times)
        self._last = times
        if total1 > total0:
            values["cpu_utilization"] = min(max((busy1 - busy0) / (total1 - total0), 0.0), 1.0)
        return values


def psutil_provider() -> PsutilProvider | None:
    """CPU and memory via psutil, or ``None`` when psutil cannot be imported."""
    try:
        # Imported on first use: importing membership.status stays cheap.
        return PsutilProvider(importlib.import_module("psutil"))
    except Exception as e:  # ImportError, or a psutil that fails on this platform
        _log_once("no-psutil", logging.DEBUG, "CPU and memory status absent: %s", e)
        return None


class NvmlProvider:
    """GPU utilisation and memory through NVML (package ``nvidia-ml-py``).

    NVML is initialised on the first call, that is in the probe's own thread,
    so a driver that hangs holds that thread and never the caller's; when it
    cannot be initialised (no driver, no GPU) every call returns nothing.
    :meth:`close` shuts NVML down; the collector calls it from the same thread.
    """

    def __init__(self, nvml: Any) -> None:
        """Keeps the module; calls nothing in it yet.

        Args:
            nvml: the ``pynvml`` module.
        """
        self._nvml = nvml
        self._handles: list[Any] | None = None  # None: not initialised yet
        self._initialised = False
        self._closed = False
        self._lock = threading.Lock()

    def _init(self) -> list[Any]:
        try:
            self._nvml.nvmlInit()
        except Exception as e:
            _log_once("no-nvml", logging.DEBUG, "GPU status absent: NVML did not start: %s", e)
            return []
        self._initialised = True
        try:
            count = self._nvml.nvmlDeviceGetCount()
            handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as e:
            _log_once("no-gpu", logging.DEBUG, "GPU status absent: no GPU listed by NVML: %s", e)
            return []
        if not handles:
            _log_once("no-gpu", logging.DEBUG, "GPU status absent: NVML lists no GPU")
        return handles

    def __call__(self) -> Mapping[str, float]:
        """Returns ``gpu_utilization`` and ``gpu_memory_utilization``, means over the
        GPUs that answer; nothing when none does."""
        with self._lock:
            if self._closed:
                return {}
            if self._handles is None:
                self._handles = self._init()
            handles = self._handles
        busy: list[float] = []
        memory: list[float] = []
        # A GPU that fell off the bus (Xid 79) must not hide the others, and
        # utilisation is not supported everywhere (MIG) while memory is.
        for handle in handles:
            try:
                busy.append(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100)
            except Exception as e:
                _log_once("gpu-busy", logging.DEBUG, "GPU utilisation unavailable: %s", e)
            try:
                info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                memory.append(info.used / info.total)
            except Exception as e:
                _log_once("gpu-memory", logging.DEBUG, "GPU memory unavailable: %s", e)
        values: dict[str, float] = {}
        if busy:
            values["gpu_utilization"] = min(max(sum(busy) / len(busy), 0.0), 1.0)
        if memory:
            values["gpu_memory_utilization"] = min(max(sum(memory) / len(memory), 0.0), 1.0)
        return values

    def close(self) -> None:
        """Shuts NVML down if this provider started it; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self._initialised:
                return
        try:
            self._nvml.nvmlShutdown()
        except Exception as e:
            log.debug("nvmlShutdown failed: %s", e)


def gpu_provider() -> NvmlProvider | None:
    """The GPU provider, or ``None`` when ``nvidia-ml-py`` (the ``gpu`` extra) is absent.

    Absence is logged once at DEBUG, never raised.
    """
    try:
        return NvmlProvider(importlib.import_module("pynvml"))
    except ImportError as e:
        _log_once("no-pynvml", logging.DEBUG, "GPU status absent: %s", e)
        return None


def default_providers() -> list[Provider]:
    """Load, CPU and memory, and GPU: those available on this machine."""
    found: list[Provider | None] = [load_provider(), psutil_provider(), gpu_provider()]
    return [p for p in found if p is not None]


# --- the collector ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeStatistics:
    """One provider's record.

    Attributes:
        name: the provider's name (its ``__name__`` or class name).
        runs: how many times it was started.
        skipped: turns skipped because it was still running.
        failures: runs that raised or returned something that is not a mapping.
        running: whether it is running now.
        age: seconds since its value was returned, ``None`` when none is held.
    """

    name: str
    runs: int
    skipped: int
    failures: int
    running: bool
    age: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusStatistics:
    """What :meth:`StatusCollector.statistics` returns: one record per provider."""

    probes: tuple[ProbeStatistics, ...]


@dataclass(slots=True, eq=False)
class _Probe:
    """One provider, its worker thread and its latest value (guarded by the collector's lock)."""

    provider: Provider
    owned: bool  # created by the collector, so closed by it
    name: str
    go: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    running: bool = False
    values: Mapping[str, float] | None = None
    at: float = 0.0  # monotonic seconds when ``values`` was returned
    runs: int = 0
    skipped: int = 0
    failures: int = 0


class StatusCollector:
    """Keeps the node's status current without ever making a heartbeat wait for it.

    Thread-safe. See the module docstring for the rules. Use as a context
    manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(
        self,
        providers: Sequence[Provider] | None = None,
        *,
        probe_interval: float = 1.0,
        stale_after: float | None = None,
    ) -> None:
        """Checks the settings; starts nothing (see :meth:`start`).

        Args:
            providers: the probes to run; ``None`` for :func:`default_providers`
                (which the collector then also closes).
            probe_interval: seconds between two turns of each provider.
            stale_after: seconds after which a probed value is dropped when its
                provider has not returned a newer one; default 3 x probe_interval.

        Raises:
            InvalidArgument: when an interval is not a positive finite number, or
                ``stale_after`` < ``probe_interval`` (values would flicker).
        """
        probe_interval = _number("probe_interval", probe_interval)
        if probe_interval <= 0:
            raise InvalidArgument(f"probe_interval must be > 0 seconds, got {probe_interval}")
        stale_after = 3 * probe_interval if stale_after is None else stale_after
        stale_after = _number("stale_after", stale_after)
        if stale_after < probe_interval:
            raise InvalidArgument(
                f"stale_after ({stale_after} s) must be >= probe_interval ({probe_interval} s)"
            )
        owned = providers is None
        chosen = default_providers() if providers is None else list(providers)
        for p in chosen:
            if not callable(p):
                raise InvalidArgument(f"a provider must be callable, got {p!r}")
        self._probe_interval = probe_interval
        self._stale_after = stale_after
        self._probes = [
            _Probe(p, owned=owned, name=getattr(p, "__name__", None) or type(p).__name__)
            for p in chosen
        ]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._scheduler: threading.Thread | None = None
        self._closed = False
        self._reported = NodeStatus()
        self._published = NodeStatus()  # replaced whole, never mutated: rule 1

    @property
    def probe_interval(self) -> float:
        """Seconds between two turns of each provider."""
        return self._probe_interval

    @property
    def stale_after(self) -> float:
        """Seconds after which a probed value is dropped."""
        return self._stale_after

    def snapshot(self) -> NodeStatus:
        """The current status: reported values over fresh probed ones. Never blocks."""
        return self._published

    def report(
        self,
        *,
        phase: str | None = None,
        step: int | None = None,
        progress: float | None = None,
        gpu_utilization: float | None = None,
        **gauges: float,
    ) -> None:
        """Sets the application's values; ``None`` leaves a field as it is.

        A value reported here wins over a probed one until :meth:`clear` unsets it.
        All or nothing: on error nothing changes.

        Args:
            phase: training phase, 1 to MAX_NAME_CHARS characters of ``[A-Za-z0-9._/-]``.
            step: training step, 0..MAX_STEP.
            progress: fraction of the job done, 0..1.
            gpu_utilization: 0..1, when the application knows better than NVML.
            **gauges: free-form numbers by name (names as for ``phase``); at most
                MAX_GAUGES set at a time, counting those set before.

        Raises:
            InvalidArgument: naming the field and the bound it breaks.
        """
        for name, value in gauges.items():
            if name in PROBED_FIELDS:
                raise InvalidArgument(
                    f"{name!r} is probed, not reported: report() takes phase, step, "
                    "progress, gpu_utilization and gauges"
                )
            if value is None:
                raise InvalidArgument(f"gauge {name!r} is None: use clear({name!r}) to unset it")
        changes: dict[str, Any] = {
            k: v
            for k, v in (
                ("phase", phase),
                ("step", step),
                ("progress", progress),
                ("gpu_utilization", gpu_utilization),
            )
            if v is not None
        }
        with self._lock:
            current = self._reported
            merged = {**current.gauges, **gauges}
            if len(merged) > MAX_GAUGES:
                raise InvalidArgument(
                    f"this report would make {len(merged)} gauges ({len(current.gauges)} already "
                    f"set), the limit is MAX_GAUGES = {MAX_GAUGES}: clear() some first"
                )
            self._reported = dataclasses.replace(current, **changes, gauges=merged)
            self._publish_locked(time.monotonic())

    def clear(self, *names: str) -> None:
        """Unsets reported values: ``phase``, ``step``, ``progress``,
        ``gpu_utilization`` or gauge names; with no names, all of them.
        Names that are not set are ignored."""
        with self._lock:
            current = self._reported
            if names:
                unset: dict[str, Any] = {n: None for n in names if n in _REPORTED_FIELDS}
                gauges = {k: v for k, v in current.gauges.items() if k not in names}
                self._reported = dataclasses.replace(current, **unset, gauges=gauges)
            else:
                self._reported = NodeStatus()
            self._publish_locked(time.monotonic())

    def statistics(self) -> StatusStatistics:
        """Runs, skipped turns and failures of every provider."""
        with self._lock:
            now = time.monotonic()
            return StatusStatistics(
                probes=tuple(
                    ProbeStatistics(
                        name=p.name,
                        runs=p.runs,
                        skipped=p.skipped,
                        failures=p.failures,
                        running=p.running,
                        age=None if p.values is None else now - p.at,
                    )
                    for p in self._probes
                )
            )

    def start(self) -> None:
        """Starts probing in daemon threads; a second call does nothing.

        Raises:
            ClosedError: after :meth:`close`.
        """
        with self._lock:
            if self._closed:
                raise ClosedError("the status collector is closed")
            if self._scheduler is not None:
                return
            for probe in self._probes:
                probe.thread = threading.Thread(
                    target=self._work,
                    args=(probe,),
                    name=f"membership-status-{probe.name}",
                    daemon=True,
                )
                probe.thread.start()
            self._scheduler = threading.Thread(
                target=self._schedule, name="membership-status", daemon=True
            )
            self._scheduler.start()

    def close(self) -> None:
        """Stops probing; idempotent, and returns promptly even when a provider hangs.

        Idle workers end (and close the providers the collector created) before
        this returns; a worker whose provider is still running is left behind as
        a daemon thread and ends, closing its provider, when the provider returns.
        Afterwards :meth:`snapshot` holds the reported values only, and
        :meth:`report` still works.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            for probe in self._probes:
                probe.go.set()
                probe.values = None  # nothing would expire them any more
            self._publish_locked(time.monotonic())
            scheduler = self._scheduler
            busy = {id(p) for p in self._probes if p.running}
        if scheduler is None:  # never started: nothing runs, close what we own here
            for probe in self._probes:
                self._close_provider(probe)
            return
        # The scheduler only waits on self._stop, so it ends at once.
        scheduler.join(timeout=self._probe_interval + 1.0)
        for probe in self._probes:
            if id(probe) not in busy and probe.thread is not None:
                probe.thread.join(timeout=1.0)

    def __enter__(self) -> StatusCollector:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- threads ---------------------------------------------------------------

    def _schedule(self) -> None:
        next_turn = time.monotonic()
        while True:
            with self._lock:
                if self._stop.is_set():  # set under the lock by close()
                    return
                now = time.monotonic()
                if now >= next_turn:
                    for probe in self._probes:
                        if probe.running:
                            probe.skipped += 1  # rule 2: not waited for, not started twice
                        else:
                            probe.running = True
                            probe.runs += 1
                            probe.go.set()
                    next_turn += self._probe_interval
                    if next_turn <= now:  # we were not scheduled for a while: skip missed turns
                        next_turn = now + self._probe_interval
                self._publish_locked(now)
                # Also wake when a held value goes stale, so it is dropped on time
                # (rule 3); after publishing, every held value expires after now.
                expiries = [p.at + self._stale_after for p in self._probes if p.values is not None]
            wake = min([next_turn, *expiries])
            self._stop.wait(max(wake - time.monotonic(), 0.0))

    def _work(self, probe: _Probe) -> None:
        try:
            while True:
                probe.go.wait()
                probe.go.clear()
                if self._stop.is_set():
                    return
                values = self._run(probe)
                with self._lock:
                    probe.running = False
                    if self._stop.is_set():
                        return
                    if values is not None:
                        probe.values = values
                        probe.at = time.monotonic()
                        self._publish_locked(probe.at)
                    else:
                        probe.failures += 1
        finally:
            with self._lock:
                probe.running = False
            self._close_provider(probe)

    def _run(self, probe: _Probe) -> Mapping[str, float] | None:
        try:
            raw = probe.provider()
        except Exception:
            _log_once(
                f"raise-{id(self)}-{probe.name}",
                logging.WARNING,
                "status provider %s failed (reported once)",
                probe.name,
                exc_info=True,
            )
            return None
        if not isinstance(raw, Mapping):
            _log_once(
                f"type-{id(self)}-{probe.name}",
                logging.WARNING,
                "status provider %s returned %r, not a mapping",
                probe.name,
                type(raw),
            )
            return None
        values: dict[str, float] = {}
        for key, value in raw.items():
            check = _PROBED_CHECKS.get(key)
            try:
                if check is None:
                    raise InvalidArgument(f"{key!r} is not one of {sorted(PROBED_FIELDS)}")
                values[key] = check(key, value)
            except InvalidArgument as e:
                _log_once(
                    f"value-{id(self)}-{probe.name}-{key}",
                    logging.WARNING,
                    "status provider %s: value dropped: %s",
                    probe.name,
                    e,
                )
        return values

    def _close_provider(self, probe: _Probe) -> None:
        close = getattr(probe.provider, "close", None)
        if probe.owned and callable(close):
            try:
                close()
            except Exception:
                log.debug("closing status provider %s failed", probe.name, exc_info=True)

    def _publish_locked(self, now: float) -> None:
        probed: dict[str, Any] = {}
        for probe in self._probes:
            if probe.values is not None:
                if probe.at + self._stale_after <= now:
                    probe.values = None  # rule 3
                else:
                    probed.update(probe.values)
        self._published = self._reported.merged_over(NodeStatus(**probed))
