"""The tally under a changing arbiter configuration (tally.py rule 11, rule 9 for learners)."""

from __future__ import annotations

import json

import pytest

from arbiter.core.raft import ArbiterConfiguration, Snapshot
from arbiter.core.replica import RestoreError, restore_state
from arbiter.core.tally import MembershipState, SnapshotDecodeError
from membership.shared.view import MemberState
from tests.unit.test_tally import R3, a, log, members, obs, s

ALIVE, DEAD = MemberState.ALIVE, MemberState.DEAD


def conf(voters: str, learners: str = "", index: int = 0) -> ArbiterConfiguration:
    return ArbiterConfiguration(
        voters={v: f"{v}:1" for v in voters.split()},
        learners={x: f"{x}:1" for x in learners.split()},
        index=index,
    )


def test_tally_learner_observations_never_count() -> None:
    feed = log(R3)
    at = feed.state.applied_index + 1
    feed.state.apply_configuration(at, conf("r1 r2 r3", "r4", index=at))
    results = feed(obs("r4", a("n", 1, 1)), obs("r1", a("n", 1, 1)))
    # Stored (committed, so the learner grants leases) but never counted (rule 9).
    assert results[0].error is None
    assert feed.state.observation("r4", "n") is not None
    assert members(feed.state) == []  # one voter's ALIVE is no quorum; r4's did not count
    feed(obs("r2", a("n", 1, 1)))
    assert members(feed.state) == [("n", 1, ALIVE)]


def test_tally_removal_drops_the_removed_voters_observations_and_decides_on_the_spot() -> None:
    # Four voters: quorum 3. Two suspect n (not enough); r4, which never did, is removed:
    # quorum 2 of three, and the configuration entry itself declares n DEAD.
    feed = log(("r1", "r2", "r3", "r4"))
    feed(*(obs(r, a("n", 1, 1)) for r in ("r1", "r2", "r3", "r4")))
    feed(obs("r1", s("n", 1, 2)), obs("r2", s("n", 1, 2)), obs("r4", a("n", 1, 3)))
    assert members(feed.state) == [("n", 1, ALIVE)]
    at = feed.state.applied_index + 1
    result = feed.state.apply_configuration(at, conf("r1 r2 r3", index=at))
    assert result.change is not None and result.change.epoch == 2
    assert [(c.node_id, c.state) for c in result.change.changes] == [("n", DEAD)]
    assert [e.arbiter_id for e in result.change.changes[0].evidence] == ["r1", "r2"]
    assert feed.state.observation("r4", "n") is None
    assert (feed.state.quorum, feed.state.arbiters) == (2, ("r1", "r2", "r3"))


def test_tally_removed_voters_suspicion_no_longer_counts() -> None:
    # r3's SUSPECT counted towards a quorum of three voters; once r3 is removed it is
    # gone, and r1 alone (of r1, r2) is no quorum.
    feed = log(R3, *(obs(r, a("n", 1, 1)) for r in R3))
    feed(obs("r3", s("n", 1, 2)))
    at = feed.state.applied_index + 1
    assert feed.state.apply_configuration(at, conf("r1 r2", index=at)).change is None
    feed(obs("r1", s("n", 1, 3)))
    assert members(feed.state) == [("n", 1, ALIVE)]
    feed(obs("r2", s("n", 1, 3)))
    assert members(feed.state) == [("n", 1, DEAD)]


def test_tally_growth_raises_the_quorum() -> None:
    feed = log(R3, *(obs(r, a("n", 1, 1)) for r in R3))
    at = feed.state.applied_index + 1
    feed.state.apply_configuration(at, conf("r1 r2 r3 r4 r5", index=at))
    assert feed.state.quorum == 3
    feed(obs("r1", s("n", 1, 2)), obs("r2", s("n", 1, 2)))
    assert members(feed.state) == [("n", 1, ALIVE)]  # two of five is no quorum
    feed(obs("r5", s("n", 1, 2)))  # a new voter's suspicion counts
    assert members(feed.state) == [("n", 1, DEAD)]


def test_tally_configuration_survives_a_snapshot_and_restore_checks_it() -> None:
    feed = log(conf("r1 r2 r3"), *(obs(r, a("n", 1, 1)) for r in R3))  # type: ignore[arg-type]
    at = feed.state.applied_index + 1
    c = conf("r1 r2 r3", "r4", index=at)
    feed.state.apply_configuration(at, c)
    data = feed.state.to_bytes()
    copy = MembershipState.from_bytes(data)
    assert copy.configuration == c and copy.to_bytes() == data
    snap = Snapshot(index=at, term=1, data=data, configuration=c)
    assert restore_state(snap).configuration == c
    with pytest.raises(RestoreError, match=r"configured with r1, r2, r3$"):
        restore_state(Snapshot(index=at, term=1, data=data, configuration=conf("r1 r2 r3").at(at)))


def test_tally_old_snapshot_without_configuration_takes_the_initial_addresses() -> None:
    feed = log(R3, *(obs(r, a("n", 1, 1)) for r in R3))
    data = feed.state.to_bytes()
    assert b'"config"' not in data  # as written before configurations were replicated
    snap = Snapshot(index=feed.state.applied_index, term=1, data=data)
    restored = restore_state(snap, conf("r1 r2 r3"))
    assert restored.configuration == conf("r1 r2 r3")
    with pytest.raises(RestoreError):
        restore_state(snap, conf("r1 r2 r4"))


@pytest.mark.parametrize(
    "config",
    [
        {"voters": {"r1": "h:1"}, "learners": {}, "index": 0},  # voters are not the arbiters
        {"voters": {"r1": "h", "r2": "h", "r3": "h"}, "learners": {}, "index": 99},  # > applied
        {"voters": {"r1": "h", "r2": "h", "r3": "h"}, "learners": {"r1": "h"}, "index": 1},
        {"voters": {"r1": "h", "r2": "h", "r3": "h"}, "index": 1},  # a key missing
    ],
)
def test_tally_snapshot_refuses_a_bad_configuration(config: object) -> None:
    feed = log(R3, obs("r1", a("n", 1, 1)), obs("r2", a("n", 1, 1)))
    snap = json.loads(feed.state.to_bytes())
    snap["config"] = config
    with pytest.raises(SnapshotDecodeError):
        MembershipState.from_bytes(json.dumps(snap, sort_keys=True, separators=(",", ":")).encode())
