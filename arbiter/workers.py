"""How many heartbeat-ingest workers a replica runs (``ingest_workers``, ``--ingest-workers``).

Rules:

1. ``ingest_workers`` is ``"auto"`` or a whole number in
   ``[0, MAX_INGEST_WORKERS]``; 0 keeps heartbeat ingest in the replica's
   process (arbiter/server/ingest).
2. ``"auto"`` (the lan preset's default) is the number of cores this
   process may run on, :func:`usable_cores`: its CPU affinity
   (``os.sched_getaffinity``: a cgroup cpuset, ``taskset``), lowered to the
   cgroup's CPU quota rounded up when one is set (cgroup v2 ``cpu.max``, v1
   ``cpu.cfs_quota_us``: a container's ``--cpus``, a Kubernetes CPU limit; a
   quota of 1.5 CPUs is 2 workers), capped at MAX_INGEST_WORKERS: heartbeat
   load scales with the cores, one event loop each (issue 12, "Scale with
   cores"). More workers than the CPUs the quota grants would only add
   processes (memory, start-up) that wait for the same CPU time.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

from membership.shared.errors import InvalidArgument

__all__ = [
    "MAX_INGEST_WORKERS",
    "check_ingest_workers",
    "cpu_quota",
    "ingest_worker_count",
    "parse_ingest_workers",
    "usable_cores",
]

MAX_INGEST_WORKERS = 64  # workers at most, "auto" included (rule 1)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def cpu_quota(read: Callable[[str], str | None] = _read) -> float | None:
    """CPUs the process's cgroup may use (quota / period), None without a quota (rule 2).

    Args:
        read: a file's text, None when it cannot be read (for tests).
    """
    own = "/"
    for line in (read("/proc/self/cgroup") or "").splitlines():
        if line.startswith("0::"):
            own = line[3:].strip() or "/"
    v2 = read(f"/sys/fs/cgroup{own.rstrip('/')}/cpu.max") or read("/sys/fs/cgroup/cpu.max")
    try:
        if v2 is not None:
            quota, period = v2.split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        for base in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
            q, p = read(f"{base}/cpu.cfs_quota_us"), read(f"{base}/cpu.cfs_period_us")
            if q is not None and p is not None:
                return None if int(q) <= 0 else int(q) / int(p)
    except ValueError:  # a file of another shape: no quota known
        return None
    return None


def usable_cores(read: Callable[[str], str | None] = _read) -> int:
    """The cores this process may run on (rule 2), at least 1.

    Args:
        read: a file's text, None when it cannot be read (for tests).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = cpu_quota(read)
    if quota is not None and quota > 0:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def parse_ingest_workers(value: str) -> int | str:
    """``auto`` or a whole number, from a flag or an environment variable (rule 1;
    the range is :func:`check_ingest_workers`'s).

    Raises:
        ValueError: neither (argparse reports it as a bad value).
    """
    if value.strip().lower() == "auto":
        return "auto"
    return int(value)


def check_ingest_workers(value: object) -> None:
    """Rule 1.

    Raises:
        InvalidArgument: ``value`` is neither ``"auto"`` nor an int in range.
    """
    if value != "auto" and not (type(value) is int and 0 <= value <= MAX_INGEST_WORKERS):
        raise InvalidArgument(
            f"ingest_workers must be 'auto' or in [0, {MAX_INGEST_WORKERS}], got {value!r}"
        )


def ingest_worker_count(value: int | str) -> int:
    """K, the worker processes to run for ``value`` (rules 1 and 2)."""
    if value == "auto":
        return min(MAX_INGEST_WORKERS, usable_cores())
    return int(value)
