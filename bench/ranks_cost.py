"""What ranks per job cost the tally: apply time of a join storm and of deaths, snapshot bytes.

Every replica applies every committed entry; with ranks on (rules version 2,
``arbiter/core/ranks.py``) an entry that changes a member of a job also
re-ranks that job and rewrites the records of its members whose rank or
world size moved (all of them when the world size changes). This prints,
for one job of N members, the time to apply a join storm (batches of
``--batch`` joins, two replicas' observations each), the time to apply the
entry that decides a death (mean of ``--deaths`` deaths), and the snapshot
size, with ranks off and on. Wall-clock times on this machine; the core is
single-threaded and deterministic, so the ratio is the figure to read.

Run::

    .venv/bin/python bench/ranks_cost.py --nodes 1000 10000
"""

from __future__ import annotations

import argparse
import statistics
import time

from arbiter.core.commands import Bootstrap, Observation, ObserveBatch, Opinion, encode
from arbiter.core.ranks import RULES
from arbiter.core.tally import MembershipState

R3 = ("r1", "r2", "r3")


def _batch(replica: str, nodes: list[str], opinion: Opinion, seq: int) -> bytes:
    labels = (("job", "j1"),) if opinion is Opinion.ALIVE else ()
    obs = tuple(
        Observation(node_id=n, incarnation=1, opinion=opinion, seq=seq, labels=labels)
        for n in nodes
    )
    return encode(ObserveBatch(replica_id=replica, observations=obs))


def run(n: int, batch: int, deaths: int, ranks: bool) -> tuple[float, float, int]:
    """(seconds to apply the join storm, mean seconds of a deciding death entry, snapshot
    bytes) for one job of ``n`` members."""
    state = MembershipState(R3)
    index = 0

    def apply(data: bytes) -> float:
        nonlocal index
        index += 1
        t0 = time.perf_counter()
        state.apply(index, data)
        return time.perf_counter() - t0

    if ranks:
        apply(encode(Bootstrap(instance="ab", rules=RULES)))
    nodes = [f"n{i:05d}" for i in range(n)]
    entries = [
        _batch(r, nodes[i : i + batch], Opinion.ALIVE, 1)
        for i in range(0, n, batch)
        for r in ("r1", "r2")
    ]
    storm = sum(apply(e) for e in entries)
    assert state.epoch == len(entries) // 2
    victims = nodes[: deaths * 7 : 7]
    per_death = []
    for v in victims:
        apply(_batch("r1", [v], Opinion.SUSPECT, 2))
        per_death.append(apply(_batch("r2", [v], Opinion.SUSPECT, 2)))  # the quorum: DEAD
    return storm, statistics.mean(per_death), len(state.to_bytes())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--batch", type=int, default=100, help="joins per entry (default 100)")
    p.add_argument("--deaths", type=int, default=20, help="deaths measured (default 20)")
    args = p.parse_args()
    print("members  ranks  join storm (s)  per death (ms)  snapshot (bytes)")
    for n in args.nodes:
        rows = {on: run(n, args.batch, args.deaths, on) for on in (False, True)}
        for on, (storm, death, size) in rows.items():
            word = "on " if on else "off"
            print(f"{n:>7}  {word}  {storm:>14.3f}  {death * 1e3:>14.3f}  {size:>16}")
        off, on_ = rows[False], rows[True]
        print(
            f"{n:>7}  ratio  {on_[0] / off[0]:>14.2f}  {on_[1] / off[1]:>14.2f}  "
            f"{on_[2] / off[2]:>16.3f}"
        )


if __name__ == "__main__":
    main()
