"""What a tombstone and a forgotten node's floor cost a replica (memory and snapshot bytes).

The bounded-history defaults (arbiter/config.py: tombstone_retention,
max_tombstones) and the README's "memory bound per removed node" rest on
these figures. In one process, on the sans-I/O tally of 3 arbiters:

1. baseline: ``--nodes`` nodes join (labels ``job``, ``rank``) and die: each
   leaves a DEAD record plus one observation per replica (a tombstone);
2. a Forget of all of them: each leaves only its floor.

Memory is measured with tracemalloc (Python allocations the state holds,
after ``gc.collect()``, node id strings included: the state holds its own,
decoded from the log), snapshot size with ``MembershipState.to_bytes()``.
Prints bytes per tombstone, per floor, and the floor as a ratio of the
tombstone measured in the same run.

Usage: python bench/tombstones.py [--nodes 10000]
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc

from arbiter.core.commands import Forget, Observation, ObserveBatch, Opinion, encode
from arbiter.core.tally import MembershipState

R3 = ("a1", "a2", "a3")


def _held() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    args = ap.parse_args()
    n = args.nodes
    ids = [f"node-{i:05d}" for i in range(n)]  # 10-character ids
    tracemalloc.start()
    base = _held()
    state = MembershipState(R3)
    index = 0

    def apply(command: ObserveBatch | Forget) -> None:
        nonlocal index
        index += 1
        state.apply(index, encode(command))

    for r in R3:
        apply(
            ObserveBatch(
                replica_id=r,
                observations=tuple(
                    Observation(
                        node_id=x,
                        incarnation=1,
                        opinion=Opinion.ALIVE,
                        seq=1,
                        labels=(("job", "j1"), ("rank", str(i))),
                    )
                    for i, x in enumerate(ids)
                ),
            )
        )
    for r in R3:
        apply(
            ObserveBatch(
                replica_id=r,
                observations=tuple(
                    Observation(
                        node_id=x,
                        incarnation=1,
                        opinion=Opinion.SUSPECT,
                        seq=2,
                        silence=0.9,
                        suspicion=6.0,
                        detector="missed",
                    )
                    for x in ids
                ),
            )
        )
    state.view()  # the cached view is part of what a replica holds
    tomb_mem = _held() - base
    tomb_snap = len(state.to_bytes())
    assert all(m.state.value == "DEAD" for m in state.view().members)
    apply(Forget(records=tuple((x, 1, "DEAD") for x in ids)))
    state.view()
    floor_mem = _held() - base
    floor_snap = len(state.to_bytes())
    assert not state.view().members and len(state.floors) == n
    tracemalloc.stop()
    print(f"{n} nodes of 3 arbiters, ids of {len(ids[0])} characters, 2 labels")
    print(
        f"tombstone (DEAD record + 3 observations): {tomb_mem / n:8.0f} B memory, "
        f"{tomb_snap / n:6.0f} B snapshot"
    )
    print(
        f"floor (after Forget):                     {floor_mem / n:8.0f} B memory, "
        f"{floor_snap / n:6.0f} B snapshot"
    )
    print(
        f"floor / tombstone: memory {floor_mem / tomb_mem:.3f}, "
        f"snapshot {floor_snap / tomb_snap:.3f}"
    )


if __name__ == "__main__":
    main()
