"""Deliberate breakages of the cores, to prove the simulator catches each one.

Each is a context manager that patches one rule of a core for the duration
of a run and restores it after. They exist only to test the checker; the
issue's "done when" asks that each is caught within the CI seeds.

- ``a``: the tally declares DEAD on a single suspicion (tally.py, rule 4).
- ``b``: the vote is not on disk before the vote reply is sent (the
  simulator's Ready handling, see ``replicas`` rule 4).
- ``c``: a replica grants leases before its ALIVE observation is committed
  (observer.py, rule 4).
- ``d``: CheckQuorum disabled (``RaftConfig(check_quorum=False)``).
- ``e``: a forgotten record leaves no floor (tally.py rule 12,
  arbiter/core/floors.py), so its old incarnation may join again.
- ``f``: after a configuration change the tally keeps counting the quorum of
  the configuration before it (tally.py, rule 11): grown from three voters
  to five, it declares DEAD on two suspicions.
- ``g``: a starved replica ticks its detectors without the lateness its own
  stall gave it (``replicas`` rule 7; observer rule 6). Caught by the
  starvation runs (``tests/sim/starvation.py``, invariant S10), not by the
  random CI seeds, which starve no replica.
- ``h``: a replica slow to accept new streams measures its read lag without
  the accept lag (``replicas`` rule 8; readlag rule 2a: the median of rule 2
  alone). Caught by the slow-accept runs (``tests/sim/starvation.py``,
  invariant S11).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from arbiter.core.commands import Opinion
from arbiter.core.floors import Floors
from arbiter.core.observer import Carrier, HeartbeatVerdict, Observer
from arbiter.core.raft import ArbiterConfiguration
from arbiter.core.tally import ApplyResult, MembershipState
from tests.sim.world import Mutants

__all__ = ["MUTANTS", "patched"]

MUTANTS = ("a", "b", "c", "d", "e", "f", "g", "h")


@contextlib.contextmanager
def _single_suspicion_kills() -> Iterator[None]:
    original = MembershipState.death_votes

    def death_votes(self: MembershipState, node_id: str) -> tuple[str, ...]:
        # One suspicion counts as a quorum of them.
        return original(self, node_id) * self.quorum

    MembershipState.death_votes = death_votes  # type: ignore[method-assign]
    try:
        yield
    finally:
        MembershipState.death_votes = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _lease_before_commit() -> Iterator[None]:
    original = Observer.heartbeat

    def heartbeat(
        self: Observer,
        node_id: str,
        incarnation: int,
        labels: Mapping[str, str],
        now: float,
        state: MembershipState,
        interval: float | None = None,
        lease: float | None = None,
        carrier: Carrier | None = None,
    ) -> HeartbeatVerdict:
        v = original(self, node_id, incarnation, labels, now, state, interval, lease, carrier)
        op = self._opinions.get(node_id)
        if v.accepted and v.lease == 0.0 and op is not None and op.opinion is Opinion.ALIVE:
            # Grant as if the ALIVE opinion were committed already.
            granted = self._lease if lease is None else lease
            self._detector.hold(node_id, now + granted)
            return HeartbeatVerdict(
                accepted=True, state=v.state, incarnation=v.incarnation, lease=granted
            )
        return v

    Observer.heartbeat = heartbeat  # type: ignore[method-assign]
    try:
        yield
    finally:
        Observer.heartbeat = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _forget_without_floor() -> Iterator[None]:
    original = Floors.set
    Floors.set = lambda self, node_id, incarnation, state: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Floors.set = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _old_quorum_after_change() -> Iterator[None]:
    original = MembershipState.apply_configuration

    def apply_configuration(
        self: MembershipState, index: int, configuration: ArbiterConfiguration
    ) -> ApplyResult:
        quorum = self.quorum
        result = original(self, index, configuration)
        self._quorum = quorum  # the previous configuration's
        return result

    MembershipState.apply_configuration = apply_configuration  # type: ignore[method-assign]
    try:
        yield
    finally:
        MembershipState.apply_configuration = original  # type: ignore[method-assign]


def patched(mutant: str | None) -> tuple[contextlib.AbstractContextManager[None], Mutants]:
    """The core patch and the shell flags for ``mutant`` (None: no breakage).

    Raises:
        ValueError: for an unknown mutant name.
    """
    if mutant is None:
        return contextlib.nullcontext(), Mutants()
    if mutant == "a":
        return _single_suspicion_kills(), Mutants()
    if mutant == "b":
        return contextlib.nullcontext(), Mutants(vote_after_send=True)
    if mutant == "c":
        return _lease_before_commit(), Mutants()
    if mutant == "d":
        return contextlib.nullcontext(), Mutants(no_check_quorum=True)
    if mutant == "e":
        return _forget_without_floor(), Mutants()
    if mutant == "f":
        return _old_quorum_after_change(), Mutants()
    if mutant == "g":
        return contextlib.nullcontext(), Mutants(deaf_to_stalls=True)
    if mutant == "h":
        return contextlib.nullcontext(), Mutants(deaf_to_accepts=True)
    raise ValueError(f"unknown mutant {mutant!r}; one of {', '.join(MUTANTS)}")
