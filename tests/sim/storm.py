"""A join storm in the simulator: N nodes start within ``spread`` seconds of virtual time.

What it counts (issue 12, item 5; :mod:`arbiter.core.batching`): how long
until every node is ALIVE in every replica's view, in how many epochs, and
how many ObserveBatch entries were committed (from each replica, and of them
the ones that moved the view); then, optionally, the time from a node's
crash (at a fixed moment of the run) to its DEAD. One seed gives one run, as
everywhere in the simulator; every invariant is checked after every step.

Used by ``test_join_storm.py`` and by ``bench/join_storm.py --sim``.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from dataclasses import dataclass, field

from arbiter.core.commands import ObserveBatch, ObserveBatches, decode
from membership.shared.view import MemberState
from tests.sim.network import NetProfile
from tests.sim.world import World

__all__ = ["StormResult", "join_storm"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StormResult:
    """Figures of one simulated join storm (seconds of virtual time).

    Attributes:
        nodes: how many nodes joined.
        interval: the replicas' ``observation_batch_interval``.
        alive_after: from the first node's start to every node ALIVE on every replica.
        epochs: epochs the view moved through meanwhile.
        entries: ObserveBatch entries committed meanwhile, per replica id.
        view_entries: of those, the entries that moved the view.
        sizes: (seconds since the start, replica id, observations, moved the
            view) of every ObserveBatch entry committed meanwhile, in log order.
        kill_to_dead: seconds from the victim's crash to its DEAD on every
            replica, or None when no victim was crashed.
    """

    nodes: int
    interval: float
    alive_after: float
    epochs: int
    entries: dict[str, int]
    view_entries: int
    sizes: list[tuple[float, str, int, bool]] = field(default_factory=list)
    kill_to_dead: float | None = None

    @property
    def total_entries(self) -> int:
        """ObserveBatch entries committed during the storm, all replicas."""
        return sum(self.entries.values())


def _all(world: World, node_ids: list[str], state: MemberState) -> bool:
    for r in world.replicas.values():
        core = r.core
        if core is None:
            continue
        for nid in node_ids:
            m = core.state.member(nid)
            if m is None or m.state is not state:
                return False
    return True


def join_storm(
    nodes: int,
    *,
    spread: float = 1.0,
    interval: float | None = None,
    seed: int = 1,
    kill: str | None = None,
    kill_at: float = 3.0,
    limit: float = 20.0,
    profile: NetProfile | None = None,
) -> StormResult:
    """Runs one join storm and returns its figures.

    Args:
        nodes: how many nodes start.
        spread: they start at uniformly drawn times within this many seconds.
        interval: ``observation_batch_interval`` of every replica (None: the
            lan preset's).
        seed: the run's seed (the start times come from ``f"{seed}/storm"``).
        kill: a node id to crash ``kill_at`` seconds after the storm began
            (the same virtual moment whatever ``interval``, so that two runs
            compare one death on one schedule).
        kill_at: see ``kill``; after every node is ALIVE.
        limit: seconds of virtual time the storm (and then the death) may take.
        profile: the network (None: a clean LAN).

    Raises:
        AssertionError: a bound of ``limit`` was passed, or an invariant broke.
    """
    w = World(seed, replicas=3, nodes=nodes, subscribers=1, profile=profile or NetProfile())
    if interval is not None:
        w.settings = dataclasses.replace(w.settings, observation_batch_interval=interval)
    for r in w.replicas.values():
        r.start()
    for i, s in enumerate(w.subs.values()):
        s.connect(w.replicas[w.replica_ids[i % len(w.replica_ids)]])
    q = w.q
    while (lead := w.leader()) is None or lead.core is None or not lead.core.state.instance:
        assert q.now < limit, "no leader"
        q.run_next()
    batches: list[tuple[float, str, int, bool]] = []
    applied = w.checker.applied
    t0 = q.now

    def counted(rep, entry, result):  # type: ignore[no-untyped-def]
        if rep.id == w.replica_ids[0] and entry.data:
            command = decode(entry.data)
            moved = result.change is not None
            if isinstance(command, ObserveBatch):
                batches.append((q.now - t0, command.replica_id, len(command.observations), moved))
            elif isinstance(command, ObserveBatches):  # gathered: "a1+a2+a3"
                who = "+".join(sorted({b.replica_id for b in command.batches}))
                size = sum(len(b.observations) for b in command.batches)
                batches.append((q.now - t0, who, size, moved))
        return applied(rep, entry, result)

    w.checker.applied = counted  # type: ignore[method-assign]
    first = w.replicas[w.replica_ids[0]].core
    assert first is not None
    epoch0 = first.state.epoch
    starts = random.Random(f"{seed}/storm")
    ids = list(w.nodes)
    for n in w.nodes.values():
        n.phase = starts.uniform(0, spread)
        n.start()
    while not _all(w, ids, MemberState.ALIVE):
        assert q.now - t0 < limit, f"not all ALIVE within {limit}s"
        q.run_next()
    alive_after = q.now - t0
    sizes = list(batches)
    result = StormResult(
        nodes=nodes,
        interval=w.settings.observation_batch_interval,
        alive_after=alive_after,
        epochs=first.state.epoch - epoch0,
        entries=dict(sorted(Counter(r for _, r, _, _ in sizes).items())),
        view_entries=sum(1 for *_, moved in sizes if moved),
        sizes=sizes,
    )
    if kill is None:
        return result
    assert q.now < t0 + kill_at, f"the storm took {alive_after:.3f}s, past kill_at"
    w.run_until(t0 + kill_at)
    w.crash_node(kill)
    crashed = q.now
    while not _all(w, [kill], MemberState.DEAD):
        assert q.now - crashed < limit, f"{kill} not DEAD within {limit}s"
        q.run_next()
    return dataclasses.replace(result, kill_to_dead=q.now - crashed)
