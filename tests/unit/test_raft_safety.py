"""Randomised fault runs of RaftNodes; the harness checks safety after every event.

Invariants checked by ``raft_harness.Network`` on every delivery and tick:
at most one leader per term (Election Safety), every applied entry equals
the entry applied at that index anywhere (State Machine Safety), entries are
applied once and in order, and no message leaves before the term, vote and
entries it depends on are persisted.
"""

from __future__ import annotations

import pytest

from arbiter.core.raft import RaftConfig
from tests.unit.raft_harness import Network, random_faults

IDS5 = ["a", "b", "c", "d", "e"]


def _chaos(seed: int) -> Network:
    ids = IDS5 if seed % 2 else IDS5[:3]
    config = RaftConfig(pre_vote=seed % 3 != 0, check_quorum=seed % 4 != 0)
    net = Network(ids, seed=seed, loss=0.1, jitter=0.2 if seed % 3 == 1 else 0.0, config=config)
    return random_faults(net, ids, seed)


@pytest.mark.parametrize("seed", range(16))
def test_safety_holds_under_partitions_crashes_and_loss(seed: int) -> None:
    net = _chaos(seed)
    # Heal everything: the group converges on one leader and one applied sequence.
    net.recover()
    for i in sorted(net.down):
        net.restart(i)
    net.loss = 0.0
    assert net.run_until(lambda: net.stable_leader() is not None, timeout=30)
    lead = net.stable_leader()
    assert lead is not None
    net.propose(lead, b"final")
    assert net.run_until(
        lambda: (
            len({tuple(net.applied[i]) for i in net.ids}) == 1
            and b"final" in net.data_applied(lead)
        ),
        timeout=30,
    )
    assert len(net.leaders) >= 2 or seed % 2 == 0  # the faults did move leadership


def test_safety_same_seed_same_trace() -> None:
    first, second = _chaos(3).trace, _chaos(3).trace
    assert len(first) > 500
    assert first == second
    assert _chaos(4).trace != first
