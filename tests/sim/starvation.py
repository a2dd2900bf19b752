"""Replicas starved of CPU in the simulator (issue 24; ``replicas`` rule 7, invariant S10).

One seeded run: 3 replicas, a clean network (nothing lost, so every silence is the
replicas' own), nodes that never stop sending. After every node is ALIVE, bursts
starve two or all three replicas at once (a quorum: the busy neighbours of a
shared machine), each burst 0.3 to 2.5 s long (D is 0.75 s), with 0.05 to 0.8 s
of running between bursts. Every invariant is checked after every step, and S10
for every node that keeps sending: none is DEAD. Then, with the bursts going on,
one node crashes: it must be DEAD all the same, within D plus the lateness the
core allows (``ReplicaSettings.max_lateness``, the longest lease) plus the
longest burst, which may hold the suspicion's commit.

Used by ``test_sim.py`` (and by mutant g, which it must catch).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from membership.shared.view import MemberState
from tests.sim.invariants import InvariantViolation
from tests.sim.mutants import patched
from tests.sim.network import NetProfile
from tests.sim.world import World

__all__ = ["LONGEST_BURST", "StarvationResult", "starved_run"]

LONGEST_BURST = 2.5  # seconds
SHORTEST_BURST = 0.3


@dataclass(frozen=True, slots=True, kw_only=True)
class StarvationResult:
    """What one starvation run did (seconds of virtual time).

    Attributes:
        seed: the seed.
        error: the first broken invariant (None if none).
        bursts: starvation bursts before the crash.
        starved_seconds: seconds during which a quorum of replicas was starved.
        kill_to_dead: from the victim's crash to its DEAD on every replica (None:
            not DEAD by the end, or the run broke before).
        bound: what ``kill_to_dead`` may be at most.
    """

    seed: int
    error: str | None
    bursts: int
    starved_seconds: float
    kill_to_dead: float | None
    bound: float

    @property
    def ok(self) -> bool:
        """True if no invariant broke."""
        return self.error is None


def _run_until(w: World, pred: Callable[[], bool], limit: float) -> bool:
    """Runs ``w`` until ``pred()`` holds (True) or ``limit`` virtual seconds pass (False)."""
    end = w.q.now + limit
    while not pred():
        nt = w.q.next_time()
        if nt is None or nt > end:
            return False
        w.q.run_next()
    return True


def starved_run(
    seed: int, *, nodes: int = 6, starving: float = 30.0, mutant: str | None = None
) -> StarvationResult:
    """One run (module docstring): ``starving`` seconds of bursts, then a crash.

    Raises:
        AssertionError: the cluster did not start (no leader, nodes not ALIVE).
    """
    patch, flags = patched(mutant)
    with patch:
        w = World(seed, replicas=3, nodes=nodes, subscribers=1, profile=NetProfile(), mutants=flags)
        w.boot()
        ids = list(w.nodes)

        def all_alive() -> bool:
            return all(
                r.core is not None
                and all(
                    (m := r.core.state.member(n)) is not None and m.state is MemberState.ALIVE
                    for n in ids
                )
                for r in w.replicas.values()
            )

        assert _run_until(w, all_alive, 20.0), "nodes not ALIVE within 20 s"
        w.checker.sending = set(ids)
        rng = random.Random(f"{seed}/starve")
        t = w.q.now
        end = t + starving
        bursts, starved = 0, 0.0
        victim = ids[0]
        settings = w.settings
        d = w.config.heartbeat_interval * w.config.missed_heartbeats
        bound = d + settings.max_lateness + LONGEST_BURST
        error, kill_to_dead = None, None
        try:
            # The schedule is drawn up front: the replicas' own draws stay their own.
            while t < end + bound:
                length = rng.uniform(SHORTEST_BURST, LONGEST_BURST)
                group = rng.choice((("r1", "r2"), ("r2", "r3"), ("r1", "r3"), ("r1", "r2", "r3")))
                for rid in group:
                    skew = rng.uniform(0.0, 0.05)  # the group's processes stop and go apart
                    w.q.at(t + skew, w.replicas[rid].starve, length)
                if t < end:
                    bursts += 1
                    starved += length
                t += length + rng.uniform(0.05, 0.8)
            w.run_until(end)
            w.checker.sending.discard(victim)
            w.crash_node(victim)
            crashed = w.q.now

            def victim_dead() -> bool:
                return all(
                    r.core is not None
                    and (m := r.core.state.member(victim)) is not None
                    and m.state is MemberState.DEAD
                    for r in w.replicas.values()
                )

            if _run_until(w, victim_dead, bound + 5.0):
                kill_to_dead = w.q.now - crashed
            w.run_until(t)  # the rest of the bursts: still nobody else DEAD
        except InvariantViolation as e:
            error = str(e)
        return StarvationResult(
            seed=seed,
            error=error,
            bursts=bursts,
            starved_seconds=round(starved, 3),
            kill_to_dead=kill_to_dead,
            bound=bound,
        )
