"""How many heartbeat-ingest workers a replica runs (``ingest_workers``, ``--ingest-workers``).

Rules:

1. ``ingest_workers`` is ``"auto"`` or a whole number in
   ``[0, MAX_INGEST_WORKERS]``; 0 keeps heartbeat ingest in the replica's
   process (arbiter/server/ingest).
2. ``"auto"`` (the lan preset's default) is the number of cores this
   process may run on, :func:`usable_cores` (its CPU affinity: a cgroup
   cpuset, ``taskset`` or a container's limit of CPUs, not the machine's
   count), capped at MAX_INGEST_WORKERS: heartbeat load scales with the
   cores, one event loop each (issue 12, "Scale with cores").
"""

from __future__ import annotations

import os

from membership.errors import InvalidArgument

__all__ = [
    "MAX_INGEST_WORKERS",
    "check_ingest_workers",
    "ingest_worker_count",
    "parse_ingest_workers",
    "usable_cores",
]

MAX_INGEST_WORKERS = 64  # workers at most, "auto" included (rule 1)


def usable_cores() -> int:
    """The cores this process may run on (rule 2), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


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
