"""Probes of a node's load and utilisation: the providers a status collector runs.

A provider is a callable that returns some of
:data:`membership.shared.status.PROBED_FIELDS`; it may block and may raise, and the
collector (:class:`membership._node.collector.StatusCollector`) contains both: it
runs every provider in a thread of its own and never waits for one.

Providers here: the load average (``os.getloadavg``), CPU and memory (psutil,
imported on first use) and GPU utilisation and memory, per GPU and their
means (NVML, package ``nvidia-ml-py``, the ``gpu`` extra, initialised in the
probe's own thread; a GPU that falls off the bus is reported ``lost``).
A probe that cannot work on this machine is left out, and why is logged once
at DEBUG, never raised.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from membership.shared.status import GpuStatus
from membership.shared.validation import MAX_GPU_ERROR, MAX_GPUS

__all__ = [
    "NvmlProvider",
    "Provider",
    "PsutilProvider",
    "default_providers",
    "gpu_provider",
    "load_provider",
    "psutil_provider",
]

# The logger of the status feature as a whole (probes and collector), as before
# they had modules of their own: logging configuration that names it still works.
log = logging.getLogger("membership.status")

Provider = Callable[[], Mapping[str, Any]]
"""Returns some of :data:`PROBED_FIELDS` (numbers; ``gpus`` a tuple of
:class:`~membership.shared.status.GpuStatus`); may block, may raise (both are contained)."""


_logged: set[str] = set()


def log_once(key: str, level: int, msg: str, *args: object, exc_info: bool = False) -> None:
    """Logs ``msg`` the first time ``key`` is seen in this process, never again.

    A probe that is absent or failing stays so: it is said once, not at every turn.
    """
    if key not in _logged:
        _logged.add(key)
        log.log(level, msg, *args, exc_info=exc_info)


def load_provider() -> Provider | None:
    """The 1-minute load average from ``os.getloadavg()``; ``None`` where there is none.

    Returns:
        A provider returning ``{"load": ...}``, or ``None`` (Windows).
    """
    if not hasattr(os, "getloadavg"):
        log_once("no-load", logging.DEBUG, "load average absent: no os.getloadavg here")
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
        # Imported on first use: importing membership stays cheap.
        return PsutilProvider(importlib.import_module("psutil"))
    except Exception as e:  # ImportError, or a psutil that fails on this platform
        log_once("no-psutil", logging.DEBUG, "CPU and memory status absent: %s", e)
        return None


# NVML errors that mean the GPU itself is gone, not merely that one query is
# unsupported: it fell off the bus (NVML_ERROR_GPU_IS_LOST, Xid 79), is no
# longer found where it was (NVML_ERROR_GPU_NOT_FOUND), or needs a reset
# before it can be used again (NVML_ERROR_RESET_REQUIRED). A GPU giving one is
# reported ``lost``, and not asked anything else in that turn.
_LOST_ERRORS = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_GPU_NOT_FOUND", "NVML_ERROR_RESET_REQUIRED")


class NvmlProvider:
    """GPU utilisation and memory through NVML (package ``nvidia-ml-py``), per GPU.

    NVML is initialised on the first call, that is in the probe's own thread,
    so a driver that hangs holds that thread and never the caller's; when it
    cannot be initialised (no driver, no GPU) every call returns nothing.
    :meth:`close` shuts NVML down; the collector calls it from the same thread.

    Each call returns ``gpus``, one :class:`~membership.shared.status.GpuStatus` per
    GPU NVML lists (at most 32), and ``gpu_utilization`` and
    ``gpu_memory_utilization``, the means over the GPUs that answered. A GPU
    that fails is reported with what could be read and the NVML error's name;
    one that is gone (:data:`_LOST_ERRORS`) is reported ``lost``. Neither hides
    the others. A GPU whose handle could not be had at the start is asked
    for it again at every call.
    """

    def __init__(self, nvml: Any) -> None:
        """Keeps the module; calls nothing in it yet.

        Args:
            nvml: the ``pynvml`` module.
        """
        self._nvml = nvml
        # Per GPU index: its handle, or None while NVML did not give one.
        self._handles: list[Any | None] | None = None  # None: not initialised yet
        self._initialised = False
        self._closed = False
        self._lock = threading.Lock()
        self._names = {
            getattr(nvml, n): n
            for n in dir(nvml)
            if n.startswith("NVML_ERROR_") and isinstance(getattr(nvml, n), int)
        }

    def _error_name(self, e: BaseException) -> str:
        """``NVML_ERROR_...`` for an NVMLError (its ``value``), else the exception's class."""
        name = self._names.get(getattr(e, "value", None), type(e).__name__)
        return name[:MAX_GPU_ERROR]

    def _init(self) -> list[Any | None]:
        try:
            self._nvml.nvmlInit()
        except Exception as e:
            log_once("no-nvml", logging.DEBUG, "GPU status absent: NVML did not start: %s", e)
            return []
        self._initialised = True
        try:
            count = min(int(self._nvml.nvmlDeviceGetCount()), MAX_GPUS)
        except Exception as e:
            log_once("no-gpu", logging.DEBUG, "GPU status absent: no GPU listed by NVML: %s", e)
            return []
        if not count:
            log_once("no-gpu", logging.DEBUG, "GPU status absent: NVML lists no GPU")
        return [None] * count

    def _handle(self, handles: list[Any | None], index: int) -> Any:
        """GPU ``index``'s handle, asked for again while NVML has not given one (raises)."""
        handle = handles[index]
        if handle is None:
            handle = handles[index] = self._nvml.nvmlDeviceGetHandleByIndex(index)
        return handle

    def _ask(self, what: str, handle: Any, errors: list[str]) -> Any:
        """NVML's answer to one query of a GPU, or None with the error's name in ``errors``."""
        try:
            if what == "utilization":
                return self._nvml.nvmlDeviceGetUtilizationRates(handle)
            return self._nvml.nvmlDeviceGetMemoryInfo(handle)
        except Exception as e:
            errors.append(self._error_name(e))
            log_once(f"gpu-{what}-{errors[-1]}", logging.DEBUG, "GPU %s unavailable: %s", what, e)
            return None

    def _read(self, handles: list[Any | None], index: int) -> GpuStatus:
        """One GPU: what NVML answers, the first error's name, and whether it is lost."""
        values: dict[str, Any] = {}
        errors: list[str] = []
        handle = None
        try:
            handle = self._handle(handles, index)
        except Exception as e:
            errors.append(self._error_name(e))
        # A GPU that fell off the bus (Xid 79) must not hide the others, and
        # utilisation is not supported everywhere (MIG) while memory is.
        if handle is not None:
            busy = self._ask("utilization", handle, errors)
            if busy is not None:
                values["utilization"] = min(max(busy.gpu / 100, 0.0), 1.0)
        if handle is not None and not any(e in _LOST_ERRORS for e in errors):
            memory = self._ask("memory", handle, errors)
            if memory is not None:
                values["memory_used"], values["memory_total"] = int(memory.used), int(memory.total)
                if memory.total > 0:
                    values["memory_utilization"] = min(max(memory.used / memory.total, 0.0), 1.0)
        gone = [e for e in errors if e in _LOST_ERRORS]
        if gone:
            log_once(f"gpu-lost-{index}", logging.WARNING, "GPU %d is gone: %s", index, gone[0])
        error = gone[0] if gone else errors[0] if errors else ""
        return GpuStatus(index=index, lost=bool(gone), error=error, **values)

    def __call__(self) -> Mapping[str, Any]:
        """Returns ``gpus`` and the means ``gpu_utilization`` and
        ``gpu_memory_utilization`` over the GPUs that answered; nothing without GPUs."""
        with self._lock:
            if self._closed:
                return {}
            if self._handles is None:
                self._handles = self._init()
            handles = self._handles
        if not handles:
            return {}
        gpus = tuple(self._read(handles, i) for i in range(len(handles)))
        values: dict[str, Any] = {"gpus": gpus}
        busy = [g.utilization for g in gpus if g.utilization is not None]
        memory = [g.memory_utilization for g in gpus if g.memory_utilization is not None]
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
        log_once("no-pynvml", logging.DEBUG, "GPU status absent: %s", e)
        return None


def default_providers() -> list[Provider]:
    """Load, CPU and memory, and GPU: those available on this machine."""
    found: list[Provider | None] = [load_provider(), psutil_provider(), gpu_provider()]
    return [p for p in found if p is not None]
