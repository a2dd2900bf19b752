"""Runs a Python program with memory probes a benchmark can trigger: ``bench/memory.py``'s helper.

    python bench/memory_probe.py --out DIR [--trace-frames K] -- -m membership arbiter ...
    python bench/memory_probe.py --out DIR -- bench/scale_bare.py --listen ...

The program (a module after ``-m``, or a script) runs as it would under
``python``, in this process; nothing of it is changed. On SIGUSR2 this
process writes ``DIR/probe-<k>.json`` (k = 0, 1, ...), then renames it into
place, so a reader never sees half a file:

- ``rss_kib``: VmRSS (/proc/self/status);
- ``malloc``: glibc's ``mallinfo2()`` summed over its arenas, bytes:
  ``in_use`` (uordblks + hblkhd: what C code holds, gRPC's core, upb arenas
  of protobuf messages, sockets' buffers), ``free_held`` (fordblks: freed
  but not returned to the system), ``mmapped`` (hblkhd);
- ``pymalloc``: Python's small-object allocator (objects up to 512 bytes),
  from ``sys._debugmallocstats``: bytes in allocated blocks, in free blocks
  and pools, and in its arenas (its share of the RSS);
- ``sqlite``: bytes SQLite's allocator holds (its page caches; part of
  ``malloc``), when the program uses SQLite;
- ``gc_types``: gc-tracked objects per type name (containers: instances,
  dicts, lists, frames, coroutines, protobuf messages ...);
- with ``--trace-frames K``: the first probe starts tracemalloc (K frames per
  trace), every later one writes ``DIR/probe-<k>.tracemalloc``, a
  ``tracemalloc.Snapshot.dump`` (``Snapshot.load`` reads it): what was
  allocated since the first probe and is still held, by where it was
  allocated. Tracing from the first probe on keeps the program's start at
  full speed; it slows Python's allocator several times after it, so a
  traced run gives the attribution, never a figure.

On SIGUSR1 it calls glibc's ``malloc_trim(0)`` and writes ``DIR/trim-<k>.json``
(RSS before and after, the seconds it took): what freed heap memory the
allocator still held resident.

The snapshot is taken in the signal handler, between two bytecodes of the
main thread (the event loop's), so the program is paused while it is written.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import re
import runpy
import signal
import sys
import tempfile
import time
import traceback
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def malloc_info() -> dict[str, int]:
    """glibc's allocator over all its arenas, bytes ({} without glibc's mallinfo2)."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    m = fn()
    return {
        "in_use": m.uordblks + m.hblkhd,
        "free_held": m.fordblks,
        "mmapped": m.hblkhd,
        "arena": m.arena,
    }


def pymalloc_info() -> dict[str, int]:
    """Python's small-object allocator, bytes, parsed from ``sys._debugmallocstats``."""
    with tempfile.TemporaryFile(mode="w+") as f:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(f.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read()
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"^(# [\w ]+?)\s*=\s*([\d,]+)$", line.strip())
        if m is not None:
            out[m.group(1).lstrip("# ").strip()] = int(m.group(2).replace(",", ""))
        m = re.match(r"^Total\s*=\s*([\d,]+)$", line.strip())
        if m is not None and "total" not in out:  # the first: the arenas' (then the arena map's)
            out["total"] = int(m.group(1).replace(",", ""))
    return {
        "allocated": out.get("bytes in allocated blocks", 0),
        "available": out.get("bytes in available blocks", 0),
        "total": out.get("total", 0),
        "arenas_allocated_current": out.get("arenas allocated current", 0),
    }


def sqlite_used() -> int | None:
    """Bytes SQLite's allocator holds in this process (page caches of the Raft log's
    database), or None when libsqlite3 is not loaded."""
    if "_sqlite3" not in sys.modules:
        return None
    try:
        fn = ctypes.CDLL("libsqlite3.so.0").sqlite3_memory_used
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int64
    return int(fn())


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def probe(out: Path, k: int, frames: int = 0) -> None:
    """Writes probe ``k`` (module docstring)."""
    counts: Counter[str] = Counter(type(o).__name__ for o in gc.get_objects())
    record: dict[str, Any] = {
        "k": k,
        "rss_kib": rss_kib(),
        "malloc": malloc_info(),
        "pymalloc": pymalloc_info(),
        "sqlite": sqlite_used(),
        "gc_types": dict(counts.most_common(200)),
        "gc_objects": sum(counts.values()),
    }
    if frames > 0 and not tracemalloc.is_tracing():
        tracemalloc.start(frames)
    elif tracemalloc.is_tracing():
        tmp = out / f".probe-{k}.tracemalloc"
        tracemalloc.take_snapshot().dump(str(tmp))
        tmp.rename(out / f"probe-{k}.tracemalloc")
        record["traced"] = tracemalloc.get_traced_memory()[0]
    tmp = out / f".probe-{k}.json"
    tmp.write_text(json.dumps(record) + "\n")
    tmp.rename(out / f"probe-{k}.json")


def trim(out: Path, k: int) -> None:
    """glibc's ``malloc_trim(0)`` (free pages of every arena back to the system), timed;
    writes ``DIR/trim-<k>.json``: RSS before and after, KiB, and the seconds it took."""
    before = rss_kib()
    t0 = time.perf_counter()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    took = time.perf_counter() - t0
    tmp = out / f".trim-{k}.json"
    tmp.write_text(json.dumps({"rss_before_kib": before, "rss_after_kib": rss_kib(), "s": took}))
    tmp.rename(out / f"trim-{k}.json")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory of the probes")
    p.add_argument("--trace-frames", type=int, default=0, help="tracemalloc frames (0: off)")
    argv = sys.argv[1:]
    if "--" not in argv:
        p.error("the program follows --: -- -m MODULE ARGS, or -- SCRIPT ARGS")
    cut = argv.index("--")
    args = p.parse_args(argv[:cut])
    rest = argv[cut + 1 :]
    if not rest:
        p.error("no program after --")
    args.out.mkdir(parents=True, exist_ok=True)
    taken = [0]

    def on_signal(signum: int, frame: Any) -> None:
        try:
            probe(args.out, taken[0], args.trace_frames)
        except Exception:  # a probe must not end the program it watches
            traceback.print_exc()
        taken[0] += 1

    def on_trim(signum: int, frame: Any) -> None:
        try:
            trim(args.out, trims[0])
        except Exception:  # a probe must not end the program it watches
            traceback.print_exc()
        trims[0] += 1

    trims = [0]
    signal.signal(signal.SIGUSR2, on_signal)
    signal.signal(signal.SIGUSR1, on_trim)
    if rest[0] == "-m":
        module = rest[1]
        sys.argv = [module, *rest[2:]]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script = rest[0]
        sys.argv = list(rest)
        sys.path.insert(0, str(Path(script).resolve().parent))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
