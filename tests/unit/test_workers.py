"""``ingest_workers``: auto or a count, and auto's usable cores (arbiter/workers.py)."""

from __future__ import annotations

import os

import pytest

from arbiter.config import ArbiterConfig
from arbiter.workers import (
    MAX_INGEST_WORKERS,
    cpu_quota,
    ingest_worker_count,
    parse_ingest_workers,
    usable_cores,
)
from membership.shared.errors import InvalidArgument


def test_workers_auto_is_the_lan_default_local_and_plain_keep_zero() -> None:
    assert ArbiterConfig.lan().validate().ingest_workers == "auto"
    assert ArbiterConfig.local().ingest_workers == 0
    assert ArbiterConfig().ingest_workers == 0
    cores = len(os.sched_getaffinity(0))
    assert 1 <= ingest_worker_count("auto") <= min(cores, MAX_INGEST_WORKERS)
    assert ingest_worker_count(3) == 3


@pytest.mark.parametrize("value", [-1, MAX_INGEST_WORKERS + 1, True, "2", "all", 1.0])
def test_workers_bad_values_are_refused_with_the_field_named(value: object) -> None:
    with pytest.raises(InvalidArgument, match="ingest_workers must be 'auto' or in"):
        ArbiterConfig.lan(ingest_workers=value).validate()


def test_workers_flag_parses_auto_or_a_number() -> None:
    assert parse_ingest_workers(" AUTO ") == "auto"
    assert parse_ingest_workers("4") == 4
    with pytest.raises(ValueError):
        parse_ingest_workers("many")


def test_workers_cgroup_quota_lowers_auto_rounded_up() -> None:
    v2 = {
        "/proc/self/cgroup": "0::/kubepods/pod1\n",
        "/sys/fs/cgroup/kubepods/pod1/cpu.max": "150000 100000\n",
    }
    assert cpu_quota(v2.get) == 1.5
    assert usable_cores(v2.get) == min(2, len(os.sched_getaffinity(0)))
    assert cpu_quota({"/sys/fs/cgroup/cpu.max": "max 100000"}.get) is None
    v1 = {
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "50000",
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000",
    }
    assert cpu_quota(v1.get) == 0.5 and usable_cores(v1.get) == 1
    unlimited = {
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1",
        "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "1",
    }
    assert cpu_quota(unlimited.get) is None
    assert cpu_quota({"/sys/fs/cgroup/cpu.max": "garbage"}.get) is None
    assert usable_cores(lambda path: None) == len(os.sched_getaffinity(0))
