"""The status board's deadband: a node is sent again only when its status changed enough."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbiter.server.fanout.statusboard import FRACTION_DEADBAND, LOAD_DEADBAND, StatusBoard, changed
from membership.v1 import membership_pb2 as pb

BASE = pb.NodeStatus(
    load=1.0,
    cpu_utilization=0.40,
    memory_utilization=0.50,
    gpu_utilization=0.30,
    gpu_memory_utilization=0.20,
    phase="train",
    step=10,
    progress=0.5,
    gauges={"loss": 0.3},
)


def _with(**fields: object) -> pb.NodeStatus:
    status = pb.NodeStatus()
    status.CopyFrom(BASE)
    for name, value in fields.items():
        if value is None:
            status.ClearField(name)
        elif name == "gauges":
            status.ClearField("gauges")
            status.gauges.update(value)  # type: ignore[arg-type]
        else:
            setattr(status, name, value)
    return status


@pytest.mark.parametrize(
    ("fields", "expect"),
    [
        # Probed figures: within the deadband is no change, beyond it is.
        ({"cpu_utilization": 0.40 + FRACTION_DEADBAND * 0.8}, False),
        ({"cpu_utilization": 0.40 - FRACTION_DEADBAND * 1.2}, True),
        ({"memory_utilization": 0.52}, False),
        ({"memory_utilization": 0.56}, True),
        ({"gpu_utilization": 0.34}, False),
        ({"gpu_memory_utilization": 0.26}, True),
        ({"load": 1.0 + LOAD_DEADBAND * 0.5}, False),
        ({"load": 1.0 + LOAD_DEADBAND * 1.5}, True),
        # A field appearing or disappearing.
        ({"cpu_utilization": None}, True),
        ({"load": None}, True),
        # What the application reports: any change.
        ({"phase": "eval"}, True),
        ({"phase": None}, True),
        ({"step": 11}, True),
        ({"progress": 0.5001}, True),
        ({"gauges": {"loss": 0.31}}, True),
        ({"gauges": {"loss": 0.3, "lr": 1e-3}}, True),
        ({"gauges": {}}, True),
        ({}, False),
    ],
)
def test_statusboard_changed_applies_the_deadband_to_probed_figures_only(
    fields: dict[str, object], expect: bool
) -> None:
    assert changed(BASE, _with(**fields)) is expect


def test_statusboard_jitter_of_cpu_use_bumps_no_version_but_keeps_the_latest() -> None:
    board = StatusBoard()
    board.update("n1", 7, BASE, now=0.0)
    v = board.version
    for i, cpu in enumerate((0.41, 0.39, 0.43, 0.38, 0.42)):  # an idle node's noise
        board.update("n1", 7, _with(cpu_utilization=cpu), now=1.0 + i)
    assert board.version == v  # nothing a subscriber needs again
    entry = board.get("n1")
    assert entry is not None
    assert entry.status.cpu_utilization == 0.42  # what view shows: the latest
    assert entry.heard == 5.0


def test_statusboard_holds_no_status_older_than_the_latest() -> None:
    """Rule 2: a status message holds its whole request; the entry keeps the latest one
    (also when an equal one arrives) and the last version's values, not its message."""
    board = StatusBoard()
    board.update("n1", 7, BASE, now=0.0)
    for i, status in enumerate(
        [_with(), _with(cpu_utilization=0.41), _with(cpu_utilization=0.41), _with(step=12)]
    ):
        board.update("n1", 7, status, now=1.0 + i)
        entry = board.get("n1")
        assert entry is not None and entry.status is status
        assert entry.sent is status or not isinstance(entry.sent, pb.NodeStatus)
    v = board.version
    board.update("n1", 7, _with(step=12, cpu_utilization=0.42), now=9.0)
    assert board.version == v  # compared with the values kept, the deadband holds


def test_statusboard_drift_is_sent_once_it_adds_up_to_the_deadband() -> None:
    board = StatusBoard()
    board.update("n1", 7, BASE, now=0.0)
    v = board.version
    # Steps of 0.02 never exceed the deadband from one heartbeat to the next,
    # but add up: compared with the status last sent, the third one does.
    board.update("n1", 7, _with(cpu_utilization=0.42), now=1.0)
    board.update("n1", 7, _with(cpu_utilization=0.44), now=2.0)
    assert board.version == v
    board.update("n1", 7, _with(cpu_utilization=0.46), now=3.0)
    assert board.version == v + 1
    board.update("n1", 7, _with(cpu_utilization=0.48), now=4.0)
    assert board.version == v + 1  # measured from 0.46 now


def test_statusboard_reported_change_or_new_incarnation_bumps_the_version() -> None:
    board = StatusBoard()
    board.update("n1", 7, BASE, now=0.0)
    v = board.version
    board.update("n1", 7, _with(step=11), now=1.0)
    assert board.version == v + 1
    board.update("n1", 8, _with(step=11), now=2.0)
    assert board.version == v + 2
    entry = board.get("n1")
    assert entry is not None and entry.incarnation == 8


def test_statusboard_custom_deadband() -> None:
    board = StatusBoard(fraction_deadband=0.01)
    board.update("n1", 7, BASE, now=0.0)
    v = board.version
    board.update("n1", 7, _with(cpu_utilization=0.415), now=1.0)
    assert board.version == v + 1


def _changed_field_by_field(old: pb.NodeStatus, new: pb.NodeStatus) -> bool:
    """Rule 1 as it was first written: every field of both asked whether it is set."""
    for name in ("phase", "step", "progress"):
        if old.HasField(name) != new.HasField(name) or getattr(old, name) != getattr(new, name):
            return True
    if dict(old.gauges) != dict(new.gauges):
        return True
    fractions = ("cpu_utilization", "memory_utilization", "gpu_utilization")
    probed = [("load", LOAD_DEADBAND)]
    probed += [(n, FRACTION_DEADBAND) for n in (*fractions, "gpu_memory_utilization")]
    for probe, band in probed:
        if old.HasField(probe) != new.HasField(probe):
            return True
        if old.HasField(probe) and abs(getattr(new, probe) - getattr(old, probe)) >= band:
            return True
    return False


_statuses = st.builds(
    lambda fields, gauges: pb.NodeStatus(**fields, gauges=gauges),
    st.fixed_dictionaries(
        {},
        optional={
            "load": st.sampled_from([0.0, 0.05, 0.1, 0.15, 1.0]),
            "cpu_utilization": st.sampled_from([0.0, 0.03, 0.05, 0.5]),
            "memory_utilization": st.sampled_from([0.2, 0.24, 0.26]),
            "gpu_utilization": st.sampled_from([0.0, 0.05, 0.9]),
            "gpu_memory_utilization": st.sampled_from([0.0, 0.01]),
            "phase": st.sampled_from(["", "train", "eval"]),
            "step": st.sampled_from([0, 1, 7]),
            "progress": st.sampled_from([0.0, 0.001, 0.5]),
        },
    ),
    st.dictionaries(st.sampled_from(["a", "b"]), st.sampled_from([0.0, 1.0]), max_size=2),
)


@settings(max_examples=500, deadline=None)
@given(_statuses, _statuses)
def test_statusboard_changed_agrees_with_asking_every_field(
    old: pb.NodeStatus, new: pb.NodeStatus
) -> None:
    assert changed(old, new) == _changed_field_by_field(old, new)


def _gpus(*gpus: pb.GpuStatus) -> pb.NodeStatus:
    status = pb.NodeStatus()
    status.CopyFrom(BASE)
    status.gpus.extend(gpus)
    return status


@pytest.mark.parametrize(
    ("new", "expect"),
    [
        # Per-GPU fractions have the fraction deadband; bytes alone are no change.
        (_gpus(pb.GpuStatus(index=0, utilization=0.53, memory_utilization=0.5)), False),
        (
            _gpus(
                pb.GpuStatus(index=0, utilization=0.5, memory_utilization=0.5, memory_used_bytes=7)
            ),
            False,
        ),
        (_gpus(pb.GpuStatus(index=0, utilization=0.6, memory_utilization=0.5)), True),
        # A GPU lost, failing, appearing or losing a figure: a change.
        (_gpus(pb.GpuStatus(index=0, lost=True, error="NVML_ERROR_GPU_IS_LOST")), True),
        (_gpus(pb.GpuStatus(index=0, utilization=0.5)), True),
        (
            _gpus(
                pb.GpuStatus(index=0, utilization=0.5, memory_utilization=0.5),
                pb.GpuStatus(index=1, utilization=0.0),
            ),
            True,
        ),
    ],
)
def test_statusboard_changed_per_gpu(new: pb.NodeStatus, expect: bool) -> None:
    old = _gpus(pb.GpuStatus(index=0, utilization=0.5, memory_utilization=0.5))
    assert changed(old, new) is expect


@pytest.mark.parametrize(
    ("rtt", "expect"),
    [(0.0105, False), (0.0119, False), (0.0121, True), (0.0079, True), (None, True)],
)
def test_statusboard_changed_round_trip_moves_by_a_fifth_and_a_millisecond(
    rtt: float | None, expect: bool
) -> None:
    assert changed(_with(rtt_seconds=0.01), _with(rtt_seconds=rtt)) is expect


def test_statusboard_keeps_each_incarnations_step_history() -> None:
    board = StatusBoard(step_window=10.0)
    for t in range(12):
        board.update("n1", 7, _with(step=100 + 5 * t), now=float(t))
    entry = board.get("n1")
    assert entry is not None and entry.steps is not None
    rate = entry.steps.rate(11.0)
    assert rate is not None and rate[0] == pytest.approx(5.0)
    board.update("n1", 8, _with(step=0), now=12.0)  # a new life: a new history
    entry = board.get("n1")
    assert entry is not None and entry.steps is not None and entry.steps.rate(13.0) is None
    # A node whose statuses carry no step keeps no history, until one does.
    board.update("n2", 1, _with(load=1.0, step=None), now=0.0)
    board.update("n2", 1, _with(load=2.0, step=None), now=1.0)
    quiet = board.get("n2")
    assert quiet is not None and quiet.steps is None
    board.update("n2", 1, _with(load=2.0, step=3), now=2.0)
    assert quiet.steps is not None and quiet.steps.rate(2.5) is None


def test_statusboard_heard_without_status_moves_heard_of_that_incarnation_only() -> None:
    # An ingest worker sends a status only when it changed: a heartbeat without one
    # still counts as heard (rule 4), else view's silence_seconds grew up to 5 s.
    board = StatusBoard(forget_after=60.0)
    board.update("n1", 7, BASE, now=0.0)
    v = board.version
    board.heard("n1", 7, now=4.0)
    entry = board.get("n1")
    assert entry is not None and entry.heard == 4.0 and entry.status == BASE
    assert board.version == v  # heard is no change for status watchers
    board.heard("n1", 6, now=9.0)  # an older incarnation's late heartbeat
    board.heard("n2", 1, now=9.0)  # no entry: nothing to refresh, nothing made
    entry = board.get("n1")
    assert entry is not None and entry.heard == 4.0 and board.get("n2") is None
    assert board.prune(now=63.0) == 0  # heard at 4.0: not forgotten yet
