"""Node status: bounds and merging (status), probes (probes), threads that never block (collector).

Threads are waited for with bounded timeouts on conditions, never with bare
sleeps; no test asserts a wall-clock duration tighter than a second.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from membership._node.collector import StatusCollector
from membership._node.probes import gpu_provider
from membership.shared import validation
from membership.shared.errors import ClosedError, InvalidArgument
from membership.shared.status import MAX_GAUGES, MAX_NAME_CHARS, MAX_STEP, NodeStatus

TIMEOUT = 5.0  # seconds: bound on every wait for a thread to get somewhere


def wait_until(condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def in_thread(fn: Callable[[], Any], timeout: float = 1.0) -> Any:
    """Runs fn in another thread and fails if it has not returned within timeout."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} blocked for more than {timeout} s"
    return out[0]


class Hung:
    """A provider that blocks for ever (until released) on its first call."""

    def __init__(self, first: Mapping[str, float] | None = None) -> None:
        self.first = first  # returned by the first call, which does not hang
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def __call__(self) -> Mapping[str, float]:
        self.calls += 1
        if self.first is not None and self.calls == 1:
            return self.first
        self.entered.set()
        self.release.wait()
        return {}


class Counter:
    """A provider whose cpu_utilization grows by 0.001 per call."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> Mapping[str, float]:
        self.calls += 1
        return {"cpu_utilization": min(self.calls / 1000, 1.0)}


@pytest.fixture
def hung() -> Iterator[Hung]:
    provider = Hung()
    yield provider
    provider.release.set()  # lets the worker thread end


@pytest.fixture
def collectors() -> Iterator[list[StatusCollector]]:
    made: list[StatusCollector] = []
    yield made
    for c in made:
        c.close()


def collector(made: list[StatusCollector], *providers: Any, **kw: Any) -> StatusCollector:
    kw.setdefault("probe_interval", 0.02)
    c = StatusCollector(providers=list(providers), **kw)
    made.append(c)
    c.start()
    return c


# --- bounds -----------------------------------------------------------------------

GOOD = [
    {},
    {"phase": "allreduce", "step": 1200, "progress": 0.5, "gpu_utilization": 0.93},
    {"step": 0, "progress": 0, "gpu_utilization": 1},
    {"step": MAX_STEP, "progress": 1.0},
    {"phase": "a" * MAX_NAME_CHARS},
    {"phase": "eval/epoch-3.val_set"},
    {"loss": 0.25, "tokens_per_s": 1e5, "lr": -1e-4, "count": 7},
    {"g" + "x" * (MAX_NAME_CHARS - 1): 1.0},
    {f"g{i}": float(i) for i in range(MAX_GAUGES)},
]

BAD = [
    # (report kwargs, words the message must contain)
    ({f"g{i}": 1.0 for i in range(MAX_GAUGES + 1)}, ["gauges", str(MAX_GAUGES)]),
    ({"g" * (MAX_NAME_CHARS + 1): 1.0}, ["gauge name", str(MAX_NAME_CHARS)]),
    ({"phase": "p" * (MAX_NAME_CHARS + 1)}, ["phase", str(MAX_NAME_CHARS)]),
    ({"phase": ""}, ["phase", str(MAX_NAME_CHARS)]),
    ({"phase": "all reduce"}, ["phase", "letters"]),
    ({"phase": 3}, ["phase", "string"]),
    ({"a b": 1.0}, ["gauge name", "letters"]),
    ({"a:b": 1.0}, ["gauge name", "letters"]),
    ({"débit": 1.0}, ["gauge name", "letters"]),
    ({"-x": 1.0}, ["gauge name", "starting"]),
    ({"loss": math.nan}, ["loss", "finite"]),
    ({"loss": math.inf}, ["loss", "finite"]),
    ({"loss": -math.inf}, ["loss", "finite"]),
    ({"loss": "0.5"}, ["loss", "number"]),
    ({"loss": None}, ["loss", "clear"]),
    ({"loss": True}, ["loss", "number"]),
    ({"progress": 1.01}, ["progress", "between 0 and 1"]),
    ({"progress": -0.1}, ["progress", "between 0 and 1"]),
    ({"progress": math.nan}, ["progress", "finite"]),
    ({"progress": True}, ["progress", "number"]),
    ({"gpu_utilization": 1.5}, ["gpu_utilization", "between 0 and 1"]),
    ({"gpu_utilization": False}, ["gpu_utilization", "number"]),
    ({"step": -1}, ["step", str(MAX_STEP)]),
    ({"step": MAX_STEP + 1}, ["step", str(MAX_STEP)]),
    ({"step": 1.5}, ["step", "integer"]),
    ({"step": True}, ["step", "integer"]),
    ({"load": 1.0}, ["load", "probed"]),
    ({"cpu_utilization": 0.5}, ["cpu_utilization", "probed"]),
]


@pytest.mark.parametrize("kwargs", GOOD)
def test_status_report_accepts_values_within_bounds(kwargs: dict[str, Any]) -> None:
    c = StatusCollector(providers=[])
    c.report(**kwargs)
    status = c.snapshot()
    for name, value in kwargs.items():
        got = getattr(status, name) if name in NodeStatus.__dataclass_fields__ else None
        if got is None:
            got = status.gauges[name]
        assert got == value
        assert type(got) is type(value) or isinstance(value, int)


@pytest.mark.parametrize(("kwargs", "words"), BAD)
def test_status_report_refuses_values_out_of_bounds(
    kwargs: dict[str, Any], words: list[str]
) -> None:
    c = StatusCollector(providers=[])
    c.report(phase="before", step=5, progress=0.5, gpu_utilization=0.25, kept=1.0)
    before = c.snapshot()
    with pytest.raises(InvalidArgument) as e:
        c.report(**kwargs)
    for word in words:
        assert word in str(e.value)
    assert c.snapshot() == before  # all or nothing: what was stored is not lost


def test_status_report_counts_gauges_already_set() -> None:
    c = StatusCollector(providers=[])
    c.report(**{f"g{i}": 1.0 for i in range(MAX_GAUGES)})
    with pytest.raises(InvalidArgument, match="already set"):
        c.report(one_more=1.0)
    c.report(g0=2.0)  # replacing one is fine
    c.clear("g1")
    c.report(one_more=1.0)
    assert len(c.snapshot().gauges) == MAX_GAUGES


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"load": -0.5}, "load"),
        ({"load": math.inf}, "load"),
        ({"cpu_utilization": 1.2}, "cpu_utilization"),
        ({"memory_utilization": math.nan}, "memory_utilization"),
        ({"gpu_memory_utilization": -1}, "gpu_memory_utilization"),
        ({"gauges": {"x": math.nan}}, "gauge 'x'"),
        ({"gauges": {f"g{i}": 0.0 for i in range(MAX_GAUGES + 1)}}, "MAX_GAUGES"),
        ({"gauges": [("x", 1.0)]}, "gauges"),
    ],
)
def test_status_node_status_checks_bounds(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        NodeStatus(**kwargs)


def test_status_node_status_gauges_are_read_only() -> None:
    source = {"x": 1}
    status = NodeStatus(gauges=source)
    source["y"] = 2
    assert dict(status.gauges) == {"x": 1.0}
    with pytest.raises(TypeError):
        status.gauges["z"] = 3  # type: ignore[index]


@pytest.mark.parametrize("name", ["a" * MAX_NAME_CHARS, "A-z_0.9/x", "0"])
def test_status_accepted_names_pass_the_arbiter_check(name: str) -> None:
    # Whatever a node accepts the arbiters must accept, or its heartbeats are refused.
    status = NodeStatus(phase=name, gauges={name: 1.0})
    validation.validate_status(status.phase or "", status.gauges)
    assert MAX_GAUGES <= validation.MAX_GAUGES


# --- merging ------------------------------------------------------------------------

MERGES = [
    (NodeStatus(), NodeStatus(), NodeStatus()),
    (
        NodeStatus(load=2.0, gpu_utilization=0.1, gauges={"a": 1.0, "b": 2.0}),
        NodeStatus(gpu_utilization=0.9, phase="eval", gauges={"b": 3.0, "c": 4.0}),
        NodeStatus(
            load=2.0, gpu_utilization=0.9, phase="eval", gauges={"a": 1.0, "b": 3.0, "c": 4.0}
        ),
    ),
    (
        NodeStatus(cpu_utilization=0.5, memory_utilization=0.25, step=3),
        NodeStatus(step=7, progress=0.0),
        NodeStatus(cpu_utilization=0.5, memory_utilization=0.25, step=7, progress=0.0),
    ),
    (  # too many together: all the application's kept, then probed ones by name
        NodeStatus(gauges={f"p{i:02}": 0.0 for i in range(4)}),
        NodeStatus(gauges={f"a{i:02}": 1.0 for i in range(MAX_GAUGES - 2)}),
        NodeStatus(
            gauges={
                **{f"a{i:02}": 1.0 for i in range(MAX_GAUGES - 2)},
                "p00": 0.0,
                "p01": 0.0,
            }
        ),
    ),
]


@pytest.mark.parametrize(("probed", "reported", "expected"), MERGES)
def test_status_merge_reported_wins_over_probed(
    probed: NodeStatus, reported: NodeStatus, expected: NodeStatus
) -> None:
    assert reported.merged_over(probed) == expected


def test_status_collector_merges_report_over_probes(collectors: list[StatusCollector]) -> None:
    c = collector(collectors, lambda: {"gpu_utilization": 0.1, "load": 1.5})
    wait_until(lambda: c.snapshot().gpu_utilization == 0.1)
    c.report(gpu_utilization=0.9, phase="allreduce", loss=0.5)
    status = c.snapshot()
    assert (status.gpu_utilization, status.load, status.phase) == (0.9, 1.5, "allreduce")
    c.clear("gpu_utilization", "loss")
    status = c.snapshot()
    assert (status.gpu_utilization, status.phase, dict(status.gauges)) == (0.1, "allreduce", {})
    c.clear()
    assert c.snapshot() == NodeStatus(gpu_utilization=0.1, load=1.5)


# --- probes that hang ------------------------------------------------------------


def test_status_snapshot_returns_while_a_provider_is_blocked(
    collectors: list[StatusCollector], hung: Hung
) -> None:
    c = collector(collectors, hung)
    assert hung.entered.wait(TIMEOUT)
    assert in_thread(c.snapshot) == NodeStatus()
    in_thread(lambda: c.report(step=10))
    assert in_thread(c.snapshot).step == 10
    in_thread(c.statistics)


def test_status_hung_provider_does_not_stop_the_others(
    collectors: list[StatusCollector], hung: Hung
) -> None:
    counter = Counter()
    c = collector(collectors, hung, counter)
    assert hung.entered.wait(TIMEOUT)
    seen = counter.calls
    # Several further turns of the other provider, each visible in the snapshot.
    wait_until(lambda: (c.snapshot().cpu_utilization or 0) >= (seen + 5) / 1000)
    hung_stats, counter_stats = c.statistics().probes
    assert hung.calls == 1  # never started twice
    assert hung_stats.running and hung_stats.runs == 1 and hung_stats.skipped >= 4
    assert counter_stats.runs >= seen + 5
    # Both had every turn; the hung one skipped all of them after its first.
    assert hung_stats.runs + hung_stats.skipped == counter_stats.runs + counter_stats.skipped


def test_status_hung_provider_value_goes_stale(
    collectors: list[StatusCollector],
) -> None:
    hung = Hung(first={"load": 3.0, "gpu_utilization": 0.5})
    try:
        c = collector(collectors, hung, Counter(), probe_interval=0.02, stale_after=1.0)
        wait_until(lambda: c.snapshot().load == 3.0)
        assert hung.entered.wait(TIMEOUT)
        wait_until(lambda: c.snapshot().load is None)
        status = c.snapshot()
        assert status.gpu_utilization is None
        assert status.cpu_utilization is not None  # the healthy provider's value stays
        assert c.statistics().probes[0].age is None
    finally:
        hung.release.set()


def test_status_close_returns_with_a_hung_provider(hung: Hung) -> None:
    non_daemon_before = {t for t in threading.enumerate() if not t.daemon}
    c = StatusCollector(providers=[hung, Counter()], probe_interval=0.02)
    c.start()
    assert hung.entered.wait(TIMEOUT)
    in_thread(c.close, timeout=3.0)
    in_thread(c.close)  # idempotent

    def ours() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("membership-status")]

    # Only the hung worker stays. The Counter's worker ends too, but not always before
    # close() returns: one caught mid-probe (a busy machine) is left to end by itself,
    # as close() documents (it cannot tell a provider that hangs from one that runs).
    deadline = time.monotonic() + TIMEOUT
    while {t.name for t in ours()} != {"membership-status-Hung"}:
        names = {t.name for t in ours()}
        assert time.monotonic() < deadline, f"workers left after close: {names}"
        time.sleep(0.01)  # polling the condition above
    left = ours()
    assert all(t.daemon for t in left)
    assert {t for t in threading.enumerate() if not t.daemon} <= non_daemon_before
    assert c.snapshot() == NodeStatus()  # probed values are not kept after close
    hung.release.set()
    left[0].join(TIMEOUT)
    assert not left[0].is_alive()


def test_status_start_after_close_is_refused_and_report_still_works() -> None:
    with StatusCollector(providers=[Counter()], probe_interval=0.02) as c:
        c.start()  # idempotent
    with pytest.raises(ClosedError):
        c.start()
    c.report(phase="done")
    assert c.snapshot().phase == "done"


def test_status_failing_providers_are_contained(
    collectors: list[StatusCollector], caplog: pytest.LogCaptureFixture
) -> None:
    def raises() -> Mapping[str, float]:
        raise RuntimeError("probe broke")

    def garbage() -> Mapping[str, float]:
        return {
            "load": math.nan,
            "cpu_utilization": 93.0,
            "temperature": 40.0,
            "memory_utilization": 0.5,
        }

    def not_a_mapping() -> Mapping[str, float]:
        return 0.5  # type: ignore[return-value]

    with caplog.at_level(logging.WARNING, logger="membership.status"):
        c = collector(collectors, raises, garbage, not_a_mapping)
        wait_until(lambda: all(p.runs >= 3 for p in c.statistics().probes))
    assert c.snapshot() == NodeStatus(memory_utilization=0.5)
    failures = {p.name: p.failures for p in c.statistics().probes}
    assert failures["raises"] >= 2 and failures["not_a_mapping"] >= 2 and failures["garbage"] == 0
    messages = [r.getMessage() for r in caplog.records]
    assert sum("provider raises failed" in m for m in messages) == 1  # logged once


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"probe_interval": 0}, "probe_interval"),
        ({"probe_interval": -1.0}, "probe_interval"),
        ({"probe_interval": math.nan}, "probe_interval"),
        ({"probe_interval": True}, "probe_interval"),
        ({"probe_interval": 1.0, "stale_after": 0.5}, "stale_after"),
        ({"stale_after": math.inf}, "stale_after"),
    ],
)
def test_status_collector_checks_its_settings(kwargs: dict[str, Any], word: str) -> None:
    with pytest.raises(InvalidArgument, match=word):
        StatusCollector(providers=[], **kwargs)


# --- the default providers ---------------------------------------------------------


def test_status_default_providers_give_plausible_values(
    collectors: list[StatusCollector],
) -> None:
    c = StatusCollector(probe_interval=0.05)
    collectors.append(c)
    c.start()

    def complete() -> bool:
        s = c.snapshot()
        return None not in (s.load, s.cpu_utilization, s.memory_utilization)

    wait_until(complete)
    s = c.snapshot()
    assert s.load is not None and s.load >= 0
    assert s.cpu_utilization is not None and 0 <= s.cpu_utilization <= 1
    assert s.memory_utilization is not None and 0 < s.memory_utilization <= 1


def test_status_gpu_provider_is_absent_here(caplog: pytest.LogCaptureFixture) -> None:
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has an NVIDIA GPU")
    with caplog.at_level(logging.DEBUG, logger="membership.status"):
        provider = gpu_provider()
        if importlib.util.find_spec("pynvml") is None:
            assert provider is None
        else:  # the extra is installed but there is no GPU or driver
            assert provider is not None and provider() == {}
            provider.close()
    assert all(r.levelno <= logging.DEBUG for r in caplog.records)
    with StatusCollector(probe_interval=0.05) as c:
        wait_until(lambda: c.snapshot().memory_utilization is not None)
        assert (c.snapshot().gpu_utilization, c.snapshot().gpu_memory_utilization) == (None, None)


class FakeNvml(types.ModuleType):
    """Two GPUs: 50 % and 100 % busy, a quarter and three quarters of memory used."""

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.inits = self.shutdowns = 0
        self.thread_ids: set[int] = set()

    def nvmlInit(self) -> None:
        self.inits += 1
        self.thread_ids.add(threading.get_ident())

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1
        self.thread_ids.add(threading.get_ident())

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return types.SimpleNamespace(gpu=(50, 100)[h], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return types.SimpleNamespace(used=(1, 3)[h], total=4, free=(3, 1)[h])


def test_status_gpu_provider_uses_nvml_once_and_closes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    c = StatusCollector(probe_interval=0.02)
    with c:
        wait_until(lambda: c.snapshot().gpu_utilization is not None)
        wait_until(lambda: c.statistics().probes[-1].runs >= 3)
        assert c.snapshot().gpu_utilization == 0.75
        assert c.snapshot().gpu_memory_utilization == 0.5
    assert (nvml.inits, nvml.shutdowns) == (1, 1)
    assert len(nvml.thread_ids) == 1 and threading.get_ident() not in nvml.thread_ids


def test_status_gpu_provider_without_driver_gives_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = FakeNvml()

    def no_driver() -> None:
        raise nvml.NVMLError("Driver Not Loaded")

    monkeypatch.setattr(nvml, "nvmlInit", no_driver)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    provider = gpu_provider()
    assert provider is not None
    assert provider() == {} and provider() == {}
    provider.close()
    assert nvml.shutdowns == 0
