"""Probes of a node's load and utilisation: the providers a status collector runs.

A provider is a callable that returns some of
:data:`membership.status.PROBED_FIELDS`; it may block and may raise, and the
collector (:class:`membership.collector.StatusCollector`) contains both: it
runs every provider in a thread of its own and never waits for one.

Providers here: the load average (``os.getloadavg``), CPU and memory (psutil,
imported on first use) and GPU utilisation and memory (NVML, package
``nvidia-ml-py``, the ``gpu`` extra, initialised in the probe's own thread).
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

Provider = Callable[[], Mapping[str, float]]
"""Returns some of :data:`PROBED_FIELDS`; may block, may raise (both are contained)."""


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
            log_once("no-nvml", logging.DEBUG, "GPU status absent: NVML did not start: %s", e)
            return []
        self._initialised = True
        try:
            count = self._nvml.nvmlDeviceGetCount()
            handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as e:
            log_once("no-gpu", logging.DEBUG, "GPU status absent: no GPU listed by NVML: %s", e)
            return []
        if not handles:
            log_once("no-gpu", logging.DEBUG, "GPU status absent: NVML lists no GPU")
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
                log_once("gpu-busy", logging.DEBUG, "GPU utilisation unavailable: %s", e)
            try:
                info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                memory.append(info.used / info.total)
            except Exception as e:
                log_once("gpu-memory", logging.DEBUG, "GPU memory unavailable: %s", e)
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
        log_once("no-pynvml", logging.DEBUG, "GPU status absent: %s", e)
        return None


def default_providers() -> list[Provider]:
    """Load, CPU and memory, and GPU: those available on this machine."""
    found: list[Provider | None] = [load_provider(), psutil_provider(), gpu_provider()]
    return [p for p in found if p is not None]
