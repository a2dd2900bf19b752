"""How the ``membership`` command prints ranks per job and grace windows (text and JSON).

Split from :mod:`membership.output` (which re-exports :func:`ranks_json`): the
shapes are documented there, with the others. Pure functions, no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from membership.view import JobRanks

__all__ = ["grace_json", "grace_text", "ranks_json", "ranks_lines"]


def ranks_json(j: JobRanks, arbiter: str = "") -> dict[str, Any]:
    """A job's assignment as the ``watch --json`` ``ranks`` object (module docstring)."""
    d: dict[str, Any] = {
        "type": "ranks",
        "epoch": j.epoch,
        "job": j.job,
        "world_size": j.world_size,
        "ranks": dict(sorted(j.ranks.items(), key=lambda item: item[1])),
    }
    if arbiter:
        d["arbiter"] = arbiter
    return d


def ranks_lines(jobs: tuple[JobRanks, ...], arbiter: str, as_json: bool) -> list[str]:
    """One ``ranks`` line per job (JSON, or ``epoch 12  job j1 ranks n1=0 ... (world size 3)``)."""
    if as_json:
        return [json.dumps(ranks_json(j, arbiter)) for j in jobs]
    return [
        f"epoch {j.epoch}  job {j.job} ranks "
        + (" ".join(f"{n}={r}" for n, r in sorted(j.ranks.items(), key=lambda i: i[1])) or "-")
        + f" (world size {j.world_size})"
        for j in jobs
    ]


def grace_json(seconds: float, reason: str) -> dict[str, Any]:
    """``grace_seconds`` and ``grace_reason`` of a node in a grace window, else nothing."""
    return {"grace_seconds": round(seconds, 3), "grace_reason": reason} if seconds > 0 else {}


def grace_text(seconds: float, reason: str) -> str:
    """``  GRACE 42s (checkpoint)`` for a node in a grace window, else ""."""
    return f"  GRACE {seconds:.0f}s ({reason or 'no reason'})" if seconds > 0 else ""
