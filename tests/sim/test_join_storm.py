"""Join storms in the simulator (issue 12, item 5; arbiter/core/batching.py).

Not timed: the figures are virtual seconds, epochs and entries of one seeded
run, the same on every machine.
"""

from __future__ import annotations

import pytest

from tests.sim.storm import join_storm

pytestmark = pytest.mark.sim


def test_join_storm_of_1000_nodes_within_a_second_is_alive_in_few_epochs_and_entries() -> None:
    r = join_storm(1000, spread=1.0, seed=1)
    assert r.interval > 0  # the lan preset batches
    assert r.alive_after <= 2.0, r
    assert r.epochs <= 10, r
    # One entry per replica per cut of the leader, and one epoch per cut:
    # the followers' batches come right after the leader's.
    assert all(n <= 10 for n in r.entries.values()), r.entries
    assert r.view_entries == r.epochs, r
    assert sum(size for _, _, size, _ in r.sizes) >= 3 * 1000  # every replica's every node


def test_join_storm_without_batching_moves_the_view_per_node() -> None:
    # The baseline the rule is measured against (interval 0: today's behaviour).
    r = join_storm(100, spread=1.0, seed=1, interval=0.0)
    assert r.epochs > 50, r
    assert r.total_entries > 150, r


@pytest.mark.parametrize("seed", [1, 2])
def test_join_storm_batching_does_not_delay_a_death(seed: int) -> None:
    # Same virtual schedule (the victim crashes at the same moment of the
    # run, after the same heartbeats), with and without batching: a SUSPECT is
    # never held (batching rule 1), so DEAD comes no later; the only
    # difference is the network's draws, which follow the messages sent
    # (about a millisecond here).
    batched = join_storm(50, seed=seed, kill="n7")
    plain = join_storm(50, seed=seed, kill="n7", interval=0.0)
    assert batched.kill_to_dead is not None and plain.kill_to_dead is not None
    assert batched.epochs < plain.epochs / 4, (batched, plain)
    assert batched.kill_to_dead <= plain.kill_to_dead + 0.005, (batched, plain)
