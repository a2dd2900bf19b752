"""Event-loop lag of a replica while it persists Readies: fsync on the loop vs on the writer thread.

A replica acks heartbeats on its event loop; a commit with synchronous=FULL
waits for the disk. This runs an asyncio loop that saves one Ready (hard
state + one observation entry) ``--rate`` times a second to a real
:class:`arbiter.server.consensus.storage.Storage`, for ``--seconds`` in each of two
modes, and samples the loop's lag every 10 ms meanwhile:

- ``loop``: ``Storage.save`` called on the loop (the driver before issue 9);
- ``writer``: awaited through :class:`arbiter.server.consensus.writer.DiskWriter` (the driver now).

With ``--disk-load`` a background process writes buffered data to the same
file system (``dd``, 4 GB then ``sync``, over and over): the dirty pages an
fsync must wait behind on ext4, as when other programs write on the machine.
Prints, per mode, the loop lag and the save time (p50, p99, max).

Usage: python bench/loop_lag.py [--seconds 20] [--rate 50] [--disk-load] [--dir PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from arbiter.core.commands import Observation, ObserveBatch, Opinion, encode
from arbiter.core.raft import Entry, HardState, Ready
from arbiter.server.consensus.storage import Storage
from arbiter.server.consensus.writer import DiskWriter

IDS = ["a1", "a2", "a3"]
SAMPLE = 0.01  # seconds between two lag samples


def _ready(index: int) -> Ready:
    obs = Observation(
        node_id=f"node-{index % 1000:04d}",
        incarnation=1,
        opinion=Opinion.ALIVE,
        seq=index,
        labels=(("rack", "r1"),),
    )
    return Ready(
        hard_state=HardState(term=1, vote="a1", commit=index - 1),
        entries=(
            Entry(
                term=1,
                index=index,
                data=encode(ObserveBatch(replica_id="a1", observations=(obs,))),
            ),
        ),
        messages=(),
        committed_entries=(),
    )


def _figures(samples: list[float]) -> str:
    s = sorted(samples)
    if not s:
        return "no samples"

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(len(s) * p))] * 1000

    return f"p50 {q(0.5):7.1f} ms  p99 {q(0.99):7.1f} ms  max {s[-1] * 1000:7.1f} ms  (n={len(s)})"


async def _run(mode: str, store: Storage, seconds: float, rate: float) -> tuple[list, list]:
    lags: list[float] = []
    saves: list[float] = []
    writer = DiskWriter(store, name="bench")
    end = time.monotonic() + seconds

    async def sampler() -> None:
        while time.monotonic() < end:
            asked = time.monotonic() + SAMPLE
            await asyncio.sleep(SAMPLE)
            lags.append(max(0.0, time.monotonic() - asked))

    async def saver() -> None:
        index = 0
        while time.monotonic() < end:
            index += 1
            rd = _ready(index)
            if mode == "loop":
                t0 = time.perf_counter()
                store.save(rd)
                saves.append(time.perf_counter() - t0)
            else:
                saves.append(await writer.save(rd))
            await asyncio.sleep(1 / rate)

    try:
        await asyncio.gather(sampler(), saver())
    finally:
        await writer.drain()
        writer.close()
    return lags, saves


@contextlib.contextmanager
def _disk_load(folder: Path, enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    target = folder / "load"
    if shutil.which("dd"):
        write = f"dd if=/dev/zero of={target} bs=1M count=4000 2>/dev/null"
    else:
        write = f"{sys.executable} -c \"open('{target}','wb').write(bytes(4 << 30))\""
    proc = subprocess.Popen(
        ["sh", "-c", f"while true; do {write}; sync; rm -f {target}; done"],
        start_new_session=True,
    )
    try:
        time.sleep(1.0)  # let dirty pages build up
        yield
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        target.unlink(missing_ok=True)


def main(seconds: float, rate: float, disk_load: bool, folder: Path) -> None:
    print(f"disk: {folder}; {rate:g} saves/s for {seconds:g}s per mode; disk load: {disk_load}")
    for mode in ("loop", "writer"):
        path = folder / f"bench-{mode}"
        with _disk_load(folder, disk_load):
            store = Storage.open(path, replica_id="a1", cluster="bench", arbiters=IDS)
            try:
                lags, saves = asyncio.run(_run(mode, store, seconds, rate))
            finally:
                store.close()
        shutil.rmtree(path, ignore_errors=True)
        print(f"{mode:6s}  loop lag: {_figures(lags)}")
        print(f"{'':6s}  save:     {_figures(saves)}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds per mode")
    ap.add_argument("--rate", type=float, default=50.0, help="Readies saved per second")
    ap.add_argument("--disk-load", action="store_true", help="buffered writes in the background")
    ap.add_argument("--dir", type=Path, default=None, help="data folder (default: a temp dir)")
    args = ap.parse_args()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        main(args.seconds, args.rate, args.disk_load, args.dir)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-loop-lag-") as d:
            main(args.seconds, args.rate, args.disk_load, Path(d))
