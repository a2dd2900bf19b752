"""One seeded run: its shape from the seed, its faults, its checks, and how to replay it."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from arbiter.core.raft import ConflictingState
from arbiter.core.retention import RetentionPolicy
from tests.sim.faults import FaultSchedule
from tests.sim.invariants import InvariantViolation
from tests.sim.mutants import patched
from tests.sim.network import NetProfile
from tests.sim.world import World

__all__ = ["DRIFT", "RunResult", "replay_command", "run_seed"]

DRIFT = 1e-4
"""Nodes' clock-rate error bound in random runs (100 ppm: lease x drift = 75 us,
below the 200 us smallest one-way latency, so leases stay safe)."""


@dataclass(slots=True, kw_only=True)
class RunResult:
    """What a run did.

    Attributes:
        seed: the seed.
        seconds: simulated seconds asked for.
        error: the first broken invariant or core assertion (None if none).
        failed_at: virtual time of the failure (None if none).
        digest: hash of the trace and event counts (equal for equal runs).
        events: events run.
        wall: wall-clock seconds the run took (not part of the digest).
        shape: the cluster and network the seed drew, in words.
        lines: the trace lines.
    """

    seed: int
    seconds: float
    error: str | None
    failed_at: float | None
    digest: str
    events: int
    wall: float
    shape: str
    lines: list[str] = field(default_factory=list)
    mutant: str | None = None

    @property
    def ok(self) -> bool:
        """True if nothing broke."""
        return self.error is None


def replay_command(seed: int, seconds: float, mutant: str | None = None) -> str:
    """The one-line command that replays a run with its trace."""
    extra = f" --mutant {mutant}" if mutant else ""
    return f"python -m tests.sim --seed {seed} --seconds {seconds:g}{extra} --trace"


def build(seed: int, *, mutant: str | None = None, echo: bool = False) -> World:
    """The world a seed draws: 3 replicas (5 one time in five), 2 to 4 nodes, 2 subscribers,
    a random network profile, nodes' clocks drifting within ``DRIFT``; one seed in three
    forgets DEAD and LEFT records after 1 to 6 s, some also by count (bounded history); one
    in three has nodes ask for grace windows before some of their pauses (``faults`` rule 6)."""
    rng = random.Random(f"{seed}/shape")
    replicas = 5 if rng.random() < 0.2 else 3
    nodes = rng.randint(2, 4)
    profile = NetProfile.draw(rng)
    _, flags = patched(mutant)
    # A stream of its own, so the seeds that keep the default retention run as before.
    pick = random.Random(f"{seed}/retention")
    retention = None
    if pick.random() < 1 / 3:
        retention = RetentionPolicy(
            retention=round(pick.uniform(1.0, 6.0), 2),
            max_tombstones=pick.choice([None, 0, 1, 2]),
            retry_after=0.5,
        )
    world = World(
        seed,
        replicas=replicas,
        nodes=nodes,
        subscribers=2,
        profile=profile,
        mutants=flags,
        echo=echo,
        drift=DRIFT,
        retention=retention,
    )
    graces = random.Random(f"{seed}/grace")  # its own stream too
    if graces.random() < 1 / 3:
        world.grace_rng = graces
    return world


def run_seed(
    seed: int, seconds: float = 60.0, *, mutant: str | None = None, echo: bool = False
) -> RunResult:
    """Runs one seed for ``seconds`` of virtual time, checking every invariant.

    Args:
        seed: the seed; everything in the run derives from it.
        seconds: virtual seconds to run.
        mutant: a deliberate breakage to run with (see ``mutants``), or None.
        echo: print the trace as it happens.

    Returns:
        The result; ``error`` names the first broken invariant, if any.
    """
    start = time.perf_counter()
    patch, _ = patched(mutant)
    w = build(seed, mutant=mutant, echo=echo)
    p = w.net.profile
    shape = (
        f"{len(w.replicas)} replicas, {len(w.nodes)} nodes, drop {p.drop:g}, dup {p.dup:g}, "
        f"spike {p.spike:g}x{p.spike_max:g}s"
    )
    r = w.settings.retention
    if r.enabled and r.retention < 60:
        shape += f", forget after {r.retention:g}s / beyond {r.max_tombstones} tombstones"
    w.trace(f"seed {seed}: {shape}")
    error: str | None = None
    failed_at: float | None = None
    with patch:
        try:
            w.boot()
            FaultSchedule(w, random.Random(f"{seed}/faults"), seconds).start()
            w.run_until(seconds)
        except InvariantViolation as e:
            error, failed_at = str(e), w.q.now
        except AssertionError as e:  # a core's own assertion: as bad as a broken invariant
            error, failed_at = f"t={w.q.now:.4f}: core assertion: {e}", w.q.now
        except ConflictingState as e:  # Raft state contradicted: as bad, too
            error, failed_at = f"t={w.q.now:.4f}: conflicting raft state: {e}", w.q.now
    if error is not None:
        w.trace(f"FAILED {error}")
    return RunResult(
        seed=seed,
        seconds=seconds,
        error=error,
        failed_at=failed_at,
        digest=w.digest(),
        events=w.q.taken,
        wall=time.perf_counter() - start,
        shape=shape,
        lines=w.lines,
        mutant=mutant,
    )
