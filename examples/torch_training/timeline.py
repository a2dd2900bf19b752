"""The runner's reading of a run: the workers' JSON lines, the figures, the checks.

Every worker writes its timeline as JSON lines on stdout (worker.py); the
runner's watch adds the cluster's view changes. Times are CLOCK_MONOTONIC
seconds, the same clock in every process of one machine, so the figures are
differences between events of different processes.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Tail", "kill_figures", "median_range", "short_error"]


@dataclass
class Tail:
    """The JSON lines of one worker's stdout file, read as they come."""

    name: str
    path: Path
    events: list[dict[str, Any]] = field(default_factory=list)
    _offset: int = 0

    def poll(self) -> list[dict[str, Any]]:
        """Reads the complete lines written since the last call; returns their events."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self._offset += end
        new = []
        for line in data[:end].decode(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    new.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        self.events += new
        return new

    def last(self, ev: str) -> dict[str, Any] | None:
        """The latest event named ``ev``."""
        return next((e for e in reversed(self.events) if e["ev"] == ev), None)

    def first_after(self, ev: str, t: float, **match: Any) -> dict[str, Any] | None:
        """The first event named ``ev`` at or after time ``t`` whose fields match."""
        for e in self.events:
            if e["ev"] == ev and e["t"] >= t and all(e.get(k) == v for k, v in match.items()):
                return e
        return None

    @property
    def step(self) -> int:
        """The latest step this worker applied (0 before the first)."""
        e = self.last("step")
        return int(e["step"]) if e else 0


def kill_figures(tails: dict[str, Tail], survivors: list[str], t_kill: float) -> dict[str, Any]:
    """Per survivor, seconds from the kill to: the collective's failure or abandonment,
    the new epoch seen, the group re-formed, the state agreed; and where it ended."""
    out: dict[str, Any] = {}
    for name in survivors:
        tail = tails[name]

        def dt(e: dict[str, Any] | None) -> float | None:
            return None if e is None else round(e["t"] - t_kill, 4)

        broke = [
            e
            for e in tail.events
            if e["ev"] in ("collective_failed", "collective_abandoned") and e["t"] >= t_kill
        ]
        seen = tail.first_after("epoch_seen", t_kill)
        formed = tail.first_after("formed", t_kill)
        synced = tail.first_after("synced", t_kill)
        done = tail.last("done")
        out[name] = {
            "collective": None
            if not broke
            else {
                "how": broke[0]["ev"].split("_")[1],
                "op": broke[0].get("op"),
                "after": dt(broke[0]),
                "error": broke[0].get("error", ""),
                "waited": broke[0].get("waited"),
            },
            "epoch_seen": dt(seen),
            "epoch": None if seen is None else seen["epoch"],
            "formed": dt(formed),
            "formed_epoch": None if formed is None else formed["epoch"],
            "rank": None if formed is None else formed["rank"],
            "world_size": None if formed is None else formed["world_size"],
            "synced_step": None if synced is None else synced["step"],
            "synced_src": None if synced is None else synced["src"],
            "steps": None if done is None else done["step"],
            "checksum": None if done is None else done["checksum"],
            "formations": None if done is None else done["formations"],
        }
    return out


def short_error(text: str) -> str:
    """Gloo's message without its source location and advice: ``Read error ...: Connection
    reset by peer``."""
    text = re.sub(r"^\[[^\]]*\] ", "", text)
    return text.split(". ")[0]


def median_range(values: list[float]) -> str:
    """``median (min..max)`` of seconds, or "-" when empty."""
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} s ({min(values):.2f}..{max(values):.2f})"
