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

The slow-accept runs (:func:`slow_accept_run`, ``replicas`` rule 8, invariant
S11): a join storm while two replicas are behind in accepting new streams,
their accept delay ramping up to 2.0 and 0.5 s, the third accepting at once,
every node on one host. The streams they have are read on time, so the
median read lag stays near 0; only the accept lag (readlag rule 2a) says the
replica is late. Its premise: the accept delay changes by less than the hold
of a node known only from the log (the lease, 0.75 s) within one accept delay
(here 0.25 s a second, so 0.5 s within 2 s). Mutant h reads the median alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from arbiter.server.load.readlag import ReadLag
from membership.shared.view import MemberState
from tests.sim.invariants import InvariantViolation
from tests.sim.mutants import patched
from tests.sim.network import NetProfile
from tests.sim.world import World

__all__ = [
    "LONGEST_BURST",
    "SlowAcceptResult",
    "StarvationResult",
    "slow_accept_run",
    "starved_run",
]

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


def _crash_to_dead(w: World, victim: str, limit: float) -> float | None:
    """Crashes ``victim`` (no longer counted as sending) and runs until every replica
    holds it DEAD: the seconds that took, None if not within ``limit`` seconds."""
    w.checker.sending.discard(victim)  # type: ignore[union-attr]
    w.crash_node(victim)
    crashed = w.q.now
    dead = _run_until(w, lambda: _held(w, [victim], MemberState.DEAD), limit)
    return w.q.now - crashed if dead else None


def _held(w: World, node_ids: list[str], state: MemberState) -> bool:
    """True when every replica is up and holds each of ``node_ids`` in ``state``
    (unlike ``storm.py``'s check, a replica down counts against it)."""
    return all(
        r.core is not None
        and all((m := r.core.state.member(n)) is not None and m.state is state for n in node_ids)
        for r in w.replicas.values()
    )


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
        assert _run_until(w, lambda: _held(w, ids, MemberState.ALIVE), 20.0), (
            "nodes not ALIVE within 20 s"
        )
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
            kill_to_dead = _crash_to_dead(w, victim, bound + 5.0)
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


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowAcceptResult:
    """What one slow-accept run did (seconds of virtual time).

    Attributes:
        seed: the seed.
        error: the first broken invariant (None if none).
        joined: nodes of the storm ALIVE on every replica by the end.
        waited: streams that waited to be accepted, per replica id.
        longest_wait: the longest accept delay a stream met, seconds.
        kill_to_dead: from a storm node's crash to its DEAD on every replica (None:
            not DEAD by the end, or the run broke before).
        bound: what ``kill_to_dead`` may be at most.
    """

    seed: int
    error: str | None
    joined: int
    waited: dict[str, int]
    longest_wait: float
    kill_to_dead: float | None
    bound: float

    @property
    def ok(self) -> bool:
        """True if no invariant broke."""
        return self.error is None


ACCEPT_RAMP = 0.25  # seconds of accept delay gained per second (the module's premise)


def slow_accept_run(
    seed: int, *, settled: int = 4, storm: int = 40, spread: float = 10.0, mutant: str | None = None
) -> SlowAcceptResult:
    """One run (module docstring): ``settled`` nodes ALIVE first, then ``storm`` more
    start within ``spread`` seconds while r1 and r2 accept new streams late; then
    one of the storm's nodes crashes.

    Raises:
        AssertionError: the cluster did not start (no leader, nodes not ALIVE).
    """
    patch, flags = patched(mutant)
    with patch:
        w = World(
            seed,
            replicas=3,
            nodes=settled + storm,
            subscribers=1,
            profile=NetProfile(),
            mutants=flags,
        )
        ids = list(w.nodes)
        first, later = ids[:settled], ids[settled:]
        reps = w.replicas
        for r in reps.values():
            r.read_lag = ReadLag()  # rule 8: every node on one host (peer_of's default)
            r.start()
        for nid in first:
            w.nodes[nid].start()
        for i, sub in enumerate(w.subs.values()):
            sub.connect(reps[w.replica_ids[i % len(w.replica_ids)]])

        assert _run_until(w, lambda: _held(w, first, MemberState.ALIVE), 20.0), (
            "nodes not ALIVE within 20 s"
        )
        w.checker.sending = set(ids)
        t0 = w.q.now
        waited: dict[str, int] = {}
        longest = [0.0]

        def ramp(rid: str, peak: float) -> None:
            def delay(now: float) -> float:
                d = min(peak, ACCEPT_RAMP * (now - t0))
                waited[rid] = waited.get(rid, 0) + 1
                longest[0] = max(longest[0], d)
                return d

            reps[rid].accept_delay = delay

        ramp("r1", 2.0)
        ramp("r2", 0.5)
        starts = random.Random(f"{seed}/accept")
        for nid in later:
            node = w.nodes[nid]
            node.phase = starts.uniform(1.0, 1.0 + spread)
            node.start()
        d = w.config.heartbeat_interval * w.config.missed_heartbeats
        bound = d + w.settings.max_lateness
        error, kill_to_dead = None, None
        victim = later[0]
        try:
            _run_until(w, lambda: _held(w, later, MemberState.ALIVE), spread + 20.0)
            kill_to_dead = _crash_to_dead(w, victim, bound + 5.0)
        except InvariantViolation as e:
            error = str(e)
        joined = sum(
            all(
                r.core is not None
                and (m := r.core.state.member(n)) is not None
                and m.state is not MemberState.JOINING
                for r in reps.values()
            )
            for n in later
        )
        return SlowAcceptResult(
            seed=seed,
            error=error,
            joined=joined,
            waited=waited,
            longest_wait=round(longest[0], 3),
            kill_to_dead=kill_to_dead,
            bound=bound,
        )
