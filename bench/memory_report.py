"""The tables of bench/memory.py: KiB per node per system, and where a server's memory went.
Not a program of its own."""

from __future__ import annotations

import argparse
import math
import statistics
import tracemalloc
from pathlib import Path
from typing import Any

__all__ = ["breakdown", "print_breakdown", "table"]

# tracemalloc frames inside these are the machinery, not the owner: a trace is
# charged to its innermost frame outside them (with --trace K > 1).
_MACHINERY = (
    "/asyncio/", "/grpc/", "/google/protobuf/", "<frozen", "/tracemalloc.py", "<string>",
    "/dataclasses.py",
)  # fmt: skip


def _parts(p0: dict[str, Any], p1: dict[str, Any], n: int) -> dict[str, float]:
    """Growth per node, bytes, of the RSS and of each allocator's share."""
    m0, m1 = p0.get("malloc", {}), p1.get("malloc", {})
    y0, y1 = p0.get("pymalloc", {}), p1.get("pymalloc", {})
    out = {
        "rss": (p1["rss_kib"] - p0["rss_kib"]) * 1024 / n,
        "malloc in use (C: gRPC core, upb, buffers)": (m1.get("in_use", 0) - m0.get("in_use", 0))
        / n,
        "malloc freed, held": (m1.get("free_held", 0) - m0.get("free_held", 0)) / n,
        "pymalloc blocks in use (Python objects)": (y1.get("allocated", 0) - y0.get("allocated", 0))
        / n,
        "pymalloc arenas (in use + free)": (y1.get("total", 0) - y0.get("total", 0)) / n,
    }
    if p0.get("sqlite") is not None and p1.get("sqlite") is not None:
        out["of malloc: SQLite (page caches, bounded)"] = (p1["sqlite"] - p0["sqlite"]) / n
    if "traced" in p1:  # traced from p0 on
        out["tracemalloc traced (Python allocations since)"] = p1["traced"] / n
    return out


def _owner(tb: tracemalloc.Traceback) -> str:
    """The innermost frame of a trace that is not library machinery (``_MACHINERY``)."""
    frames = list(tb)[::-1]  # a Traceback iterates oldest first: most recent first here
    for fr in frames:
        if not any(m in fr.filename for m in _MACHINERY):
            return f"{_short(fr.filename)}:{fr.lineno}"
    fr = frames[0]
    return f"{_short(fr.filename)}:{fr.lineno}"


def _short(path: str) -> str:
    parts = Path(path).parts
    for anchor in ("arbiter", "membership", "grpc", "google", "asyncio", "bench"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) :])
    return "/".join(parts[-2:])


def _traced(r: dict[str, Any], top: int) -> dict[str, list[tuple[str, float, float]]]:
    """(where, bytes per node, blocks per node) of the traced growth, by line and by file."""
    p1 = r["probes"][1]
    if not p1.get("tracemalloc"):
        return {}
    # traced from the first probe on (memory_probe.py): the snapshot is the growth
    s1 = tracemalloc.Snapshot.load(p1["tracemalloc"])
    n = r["n"]
    by: dict[str, dict[str, list[float]]] = {"line": {}, "file": {}, "top frame": {}}
    for sign, snap in ((1, s1),):
        for stat in snap.statistics("traceback"):
            owner = _owner(stat.traceback)
            first = stat.traceback[-1]  # the most recent frame
            for key, where in (
                ("line", owner),
                ("file", owner.rsplit(":", 1)[0]),
                ("top frame", f"{_short(first.filename)}:{first.lineno}"),
            ):
                acc = by[key].setdefault(where, [0.0, 0.0])
                acc[0] += sign * stat.size
                acc[1] += sign * stat.count
    out = {}
    for key, acc in by.items():
        rows = sorted(acc.items(), key=lambda kv: -abs(kv[1][0]))[:top]
        out[key] = [(w, s / n, c / n) for w, (s, c) in rows]
    return out


def breakdown(r: dict[str, Any], top: int) -> dict[str, Any]:
    """Where one measured server's memory went, per node (bytes): allocators, gc types, traces."""
    p0, p1 = r["probes"]
    n = r["n"]
    g0, g1 = p0.get("gc_types", {}), p1.get("gc_types", {})
    types = {t: (g1.get(t, 0) - g0.get(t, 0)) / n for t in set(g0) | set(g1)}
    return {
        "parts": _parts(p0, p1, n),
        "gc_types": sorted(
            ((t, c) for t, c in types.items() if abs(c) >= 0.01), key=lambda tc: -abs(tc[1])
        )[:top],
        "traced": _traced(r, top),
    }


def print_breakdown(r: dict[str, Any]) -> None:
    """Prints :func:`breakdown`'s result of one run."""
    b = r["breakdown"]
    print(f"\n== {r['system']} N={r['n']} round {r['round']}: growth per node, bytes")
    for k, v in b["parts"].items():
        print(f"  {v:10.0f}  {k}")
    print("  gc-tracked objects per node, by type:")
    for t, c in b["gc_types"]:
        print(f"  {c:10.2f}  {t}")
    for key, rows in b["traced"].items():
        label = {"line": "line (innermost frame of ours)", "file": "file", "top frame": "line"}
        print(f"  tracemalloc growth per node by {label[key]}: bytes, blocks")
        for where, size, count in rows:
            print(f"  {size:10.1f} {count:7.2f}  {where}")


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def table(
    args: argparse.Namespace, sizes: list[int], systems: list[str], results: list[dict[str, Any]]
) -> str:
    """KiB per node of every system, the rounds and their median, and ours / bare."""
    lines = [
        "",
        f"resident memory per node, KiB (RSS growth from before the join to {args.settle:g} s "
        f"after every node was ALIVE, / N); mode {args.mode}, {args.rounds} round(s)",
        f"{'N':>6} {'system':8} {'median':>7} {'rounds':24} {'MiB before':>10} {'after':>7} "
        f"{'interval s':>10} {'sent/required/s':>16} {'late p99 ms':>11}",
    ]
    for n in sizes:
        med: dict[str, float] = {}
        for s in systems:
            rs = [r for r in results if r["n"] == n and r["system"] == s]
            if not rs:
                continue
            ks = [r["kib_per_node"] for r in rs]
            med[s] = _med(ks)
            last = rs[-1]
            lines.append(
                f"{n:>6} {s:8} {med[s]:7.1f} {' '.join(f'{k:.1f}' for k in ks):24} "
                f"{last['rss0_mib']:10.1f} {last['rss1_mib']:7.1f} "
                f"{last['interval_s'] or 0:10.3f} "
                f"{last['sent_rate']:7.0f}/{last['required_rate']:<8.0f} "
                f"{last['late_p99_ms']:11.0f}"
            )
        for s in systems:
            if s != "bare" and s in med and "bare" in med:
                lines.append(
                    f"{'':>6} {s}/bare: x{med[s] / med['bare']:.2f}, "
                    f"{med[s] - med['bare']:+.1f} KiB/node beyond bare"
                )
    return "\n".join(lines)
