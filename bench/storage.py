"""Durable Raft state: fsync cost per Ready, snapshot cost and restart recovery time.

Measures :class:`arbiter.server.consensus.storage.Storage` on the data directory's
disk (a temporary folder, or --dir): the latency of ``save`` for the Ready
shapes the driver sees (a hard state with one observation batch; a full
APPEND of 64 entries), ``compact`` with a membership snapshot of N nodes,
and a restart (``load`` plus rebuilding the replica and replaying the log
after the snapshot), as the driver does at start. Prints medians and p99.

Usage: python bench/storage.py [--nodes 1000] [--readies 300] [--dir PATH]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from arbiter.core.commands import Observation, ObserveBatch, Opinion, encode
from arbiter.core.detection import MissedHeartbeatDetector
from arbiter.core.raft import Entry, HardState, RaftConfig, Ready
from arbiter.core.replica import Replica, ReplicaSettings
from arbiter.core.tally import MembershipState
from arbiter.server.consensus.storage import Storage

IDS = ["a1", "a2", "a3"]


def _batch(replica: str, nodes: range, seq: int) -> bytes:
    obs = tuple(
        Observation(
            node_id=f"node-{n:05d}",
            incarnation=1,
            opinion=Opinion.ALIVE,
            seq=seq + n,
            labels=(("rack", f"r{n % 40}"),),
        )
        for n in nodes
    )
    return encode(ObserveBatch(replica_id=replica, observations=obs))


def _ms(samples: list[float]) -> str:
    s = sorted(samples)
    p99 = s[min(len(s) - 1, int(len(s) * 0.99))]
    return f"median {statistics.median(s) * 1000:6.2f} ms  p99 {p99 * 1000:6.2f} ms"


def _timed(n: int, f: Callable[[int], None]) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        f(i)
        out.append(time.perf_counter() - t0)
    return out


def main(nodes: int, readies: int, folder: Path) -> None:
    store = Storage.open(folder / "bench", replica_id="a1", cluster="bench", arbiters=IDS)
    index = 0

    def one(i: int) -> None:
        nonlocal index
        index += 1
        data = _batch(IDS[i % 3], range(i % nodes, i % nodes + 1), i)
        store.save(
            Ready(
                hard_state=HardState(term=1, vote="a1", commit=index - 1),
                entries=(Entry(term=1, index=index, data=data),),
                messages=(),
                committed_entries=(),
            )
        )

    print(f"disk: {folder}")
    print(f"save, hard state + 1 entry:     {_ms(_timed(readies, one))}")

    def append64(i: int) -> None:
        nonlocal index
        entries = tuple(
            Entry(term=1, index=index + 1 + k, data=_batch("a2", range(k, k + 1), k))
            for k in range(64)
        )
        index += 64
        store.save(Ready(hard_state=None, entries=entries, messages=(), committed_entries=()))

    print(f"save, 64 entries:               {_ms(_timed(max(10, readies // 10), append64))}")

    # A state machine holding `nodes` ALIVE nodes observed by every replica.
    state = MembershipState(IDS)
    for k, rid in enumerate(IDS):
        state.apply(k + 1, _batch(rid, range(nodes), 1))
    t0 = time.perf_counter()
    blob = state.to_bytes()
    ser = time.perf_counter() - t0
    print(f"snapshot of {nodes} nodes: {len(blob) / 1024:.0f} KiB, to_bytes {ser * 1000:.1f} ms")
    store.close()

    # A restart: a fresh data dir holding that snapshot and `readies` entries after it.
    path = folder / "restart"
    with Storage.open(path, replica_id="a1", cluster="bench", arbiters=IDS) as s2:
        from arbiter.core.raft import Snapshot

        snap = Snapshot(index=3, term=1, data=blob)
        t0 = time.perf_counter()
        s2.compact(snap)
        print(f"compact (store snapshot):       {(time.perf_counter() - t0) * 1000:6.2f} ms")
        tail = tuple(
            Entry(term=1, index=4 + i, data=_batch(IDS[i % 3], range(i % nodes, i % nodes + 1), 9))
            for i in range(readies)
        )
        s2.save(
            Ready(
                hard_state=HardState(term=1, vote="a1", commit=3 + readies),
                entries=tail,
                messages=(),
                committed_entries=(),
            )
        )
    t0 = time.perf_counter()
    with Storage.open(path, replica_id="a1", cluster="bench", arbiters=IDS) as s3:
        durable = s3.load()
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    replica = Replica(
        replica_id="a1",
        replica_ids=IDS,
        raft_config=RaftConfig(),
        settings=ReplicaSettings(
            lease=0.75, observation_retry=0.5, restart_grace=0.75, heartbeat_interval=0.15
        ),
        detector=MissedHeartbeatDetector(interval=0.15, missed_limit=5),
        rng=random.Random(0),
        now=0.0,
        seq_base=10**12,
        hard_state=durable.hard_state,
        entries=durable.entries,
        snapshot=durable.snapshot,
    )
    while replica.has_ready():
        replica.advance(replica.ready())
    t_replay = time.perf_counter() - t0
    print(
        f"restart: load {t_load * 1000:.1f} ms, restore + replay {len(durable.entries)} entries "
        f"{t_replay * 1000:.1f} ms (epoch {replica.state.epoch})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--readies", type=int, default=300)
    parser.add_argument("--dir", type=Path, default=None, help="folder on the disk to measure")
    args = parser.parse_args()
    if args.dir is not None:
        main(args.nodes, args.readies, args.dir)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmp:
            main(args.nodes, args.readies, Path(tmp))
