"""The NVML probe on hardware that misbehaves: per-GPU figures, a missing driver, a GPU
that falls off the bus, a query that is not supported.

There is no GPU here: a fake ``pynvml`` is put in ``sys.modules``, and it raises
the real error classes of ``nvidia-ml-py`` (``pynvml.NVMLError(code)`` gives the
subclass NVML's Python binding raises, e.g. ``NVMLError_GpuIsLost``). A probe
that hangs is covered in test_status.py.
"""

from __future__ import annotations

import logging
import os
import sys
import types
from typing import Any

import pytest

from membership._node.collector import StatusCollector
from membership._node.probes import NvmlProvider, gpu_provider
from membership.cli.output import status_json, status_text
from membership.shared import convert
from membership.shared.status import GpuStatus
from membership.shared.validation import validate_gpus
from tests.integration.harness import wait_until

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py (the test extra) is not installed")

GiB = 2**30


class FakeNvml(types.ModuleType):
    """NVML with ``count`` GPUs whose answers and failures the test sets.

    ``busy[i]`` is GPU i's utilisation in percent, ``used[i]`` its memory in
    use out of 16 GiB; ``fail[(i, query)]`` is an NVML error code raised by
    that query of GPU i (query: "handle", "utilization", "memory").
    """

    def __init__(self, count: int = 2) -> None:
        super().__init__("pynvml")
        for name in dir(pynvml):  # the real constants and error classes
            if name.startswith(("NVML_ERROR_", "NVMLError")):
                setattr(self, name, getattr(pynvml, name))
        self.count = count
        self.busy = [40, 80, 20, 60][:count]
        self.used = [4 * GiB, 12 * GiB, 1 * GiB, 8 * GiB][:count]
        self.fail: dict[tuple[int, str], int] = {}
        self.init_error: int | None = None
        self.shutdowns = 0

    def _check(self, index: int, query: str) -> None:
        code = self.fail.get((index, query))
        if code is not None:
            raise pynvml.NVMLError(code)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._check(index, "handle")
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        self._check(handle, "utilization")
        return types.SimpleNamespace(gpu=self.busy[handle], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        self._check(handle, "memory")
        used = self.used[handle]
        return types.SimpleNamespace(used=used, total=16 * GiB, free=16 * GiB - used)


def test_gpu_probe_reports_each_gpu_and_their_means() -> None:
    nvml = FakeNvml(count=2)
    values = NvmlProvider(nvml)()
    assert values["gpus"] == (
        GpuStatus(
            index=0,
            utilization=0.4,
            memory_utilization=0.25,
            memory_used=4 * GiB,
            memory_total=16 * GiB,
        ),
        GpuStatus(
            index=1,
            utilization=0.8,
            memory_utilization=0.75,
            memory_used=12 * GiB,
            memory_total=16 * GiB,
        ),
    )
    assert values["gpu_utilization"] == pytest.approx(0.6)
    assert values["gpu_memory_utilization"] == pytest.approx(0.5)


def test_gpu_probe_survives_a_gpu_falling_off_the_bus(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml(count=3)
    provider = NvmlProvider(nvml)
    assert len(provider()["gpus"]) == 3
    # Xid 79: GPU 1 falls off the bus; every query of it fails with GPU_IS_LOST.
    for query in ("utilization", "memory"):
        nvml.fail[(1, query)] = pynvml.NVML_ERROR_GPU_IS_LOST
    with caplog.at_level(logging.DEBUG, logger="membership.status"):
        for _ in range(3):
            values = provider()
    gpus = values["gpus"]
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[1] == GpuStatus(index=1, lost=True, error="NVML_ERROR_GPU_IS_LOST")
    assert not gpus[0].lost and gpus[0].utilization == 0.4
    # The means are over the GPUs that answered: (40 + 20) / 2 %.
    assert values["gpu_utilization"] == pytest.approx(0.3)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "GPU 1 is gone" in warnings[0].getMessage()
    # A GPU reset brings it back.
    nvml.fail.clear()
    assert not provider()["gpus"][1].lost


def test_gpu_probe_a_gpu_lost_before_start_is_reported_and_asked_for_again() -> None:
    nvml = FakeNvml(count=2)
    nvml.fail[(0, "handle")] = pynvml.NVML_ERROR_GPU_IS_LOST
    provider = NvmlProvider(nvml)
    gpus = provider()["gpus"]
    assert gpus[0] == GpuStatus(index=0, lost=True, error="NVML_ERROR_GPU_IS_LOST")
    assert gpus[1].utilization == 0.8
    del nvml.fail[(0, "handle")]
    assert provider()["gpus"][0].utilization == 0.4


def test_gpu_probe_a_query_not_supported_keeps_the_rest() -> None:
    nvml = FakeNvml(count=1)  # a MIG instance: no utilisation, memory yes
    nvml.fail[(0, "utilization")] = pynvml.NVML_ERROR_NOT_SUPPORTED
    values = NvmlProvider(nvml)()
    (gpu,) = values["gpus"]
    assert gpu.utilization is None and gpu.memory_utilization == 0.25
    assert gpu.error == "NVML_ERROR_NOT_SUPPORTED" and not gpu.lost
    assert "gpu_utilization" not in values and values["gpu_memory_utilization"] == 0.25


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_DRIVER_NOT_LOADED, pynvml.NVML_ERROR_LIBRARY_NOT_FOUND]
)
def test_gpu_probe_without_a_driver_gives_nothing_and_never_raises(code: int) -> None:
    nvml = FakeNvml()
    nvml.init_error = code
    provider = NvmlProvider(nvml)
    assert provider() == {} and provider() == {}
    provider.close()
    assert nvml.shutdowns == 0  # NVML never started: nothing to shut down


def test_gpu_probe_real_binding_without_driver_gives_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has an NVIDIA GPU")
    with caplog.at_level(logging.DEBUG, logger="membership.status"):
        provider = gpu_provider()
        assert provider is not None  # the real nvidia-ml-py, no libnvidia-ml here
        assert provider() == {}
        provider.close()
    assert all(r.levelno <= logging.DEBUG for r in caplog.records)


def test_gpu_status_travels_to_the_wire_and_is_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(count=2)
    nvml.fail[(1, "utilization")] = pynvml.NVML_ERROR_GPU_IS_LOST
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with StatusCollector(probe_interval=0.02) as c:
        wait_until(lambda: len(c.snapshot().gpus) == 2, 10, "the GPU probe")
        status = c.snapshot()
    wire = convert.status_to_pb(status)
    validate_gpus(convert.gpu_figures(wire))  # what the arbiter checks
    assert convert.status_from_pb(wire).gpus == status.gpus
    assert wire.gpus[1].lost and wire.gpus[1].error == "NVML_ERROR_GPU_IS_LOST"
    assert wire.gpus[0].memory_total_bytes == 16 * GiB
    assert "gpu0 40% mem 25%" in status_text(status)
    assert "gpu1 LOST" in status_text(status)
    assert status_json(status)["gpus"][1] == {
        "index": 1,
        "lost": True,
        "error": "NVML_ERROR_GPU_IS_LOST",
    }
