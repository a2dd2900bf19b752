"""Replica-level membership changes: the interface the shell drives (replica.py rules 2 and 7)."""

from __future__ import annotations

import random

import pytest

from arbiter.core.detection import MissedHeartbeatDetector
from arbiter.core.raft import InvalidInput, Message, ProposalDropped, RaftConfig, Role
from arbiter.core.replica import Replica, ReplicaSettings
from membership.shared.view import MemberState

ADDRS = {"a1": "h:1", "a2": "h:2", "a3": "h:3"}


def _replica(rid: str, *, join: bool = False) -> Replica:
    return Replica(
        replica_id=rid,
        replica_ids=list(ADDRS),
        addresses=ADDRS,
        join=join,
        raft_config=RaftConfig(),
        settings=ReplicaSettings(
            lease=0.5, observation_retry=0.2, restart_grace=0.0, heartbeat_interval=0.1
        ),
        detector=MissedHeartbeatDetector(interval=0.1, missed_limit=5),
        rng=random.Random(rid),
        now=0.0,
        seq_base=1,
    )


class _Group:
    """Replicas exchanging messages instantly (in memory, no disk: nobody restarts here)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reps = {r: _replica(r) for r in ADDRS}
        self.queue: list[Message] = []

    def add(self, rid: str) -> Replica:
        self.reps[rid] = _replica(rid, join=True)
        return self.reps[rid]

    def _flush(self, rep: Replica) -> None:
        while rep.has_ready():
            rd = rep.ready()
            self.queue.extend(rd.messages)
            rep.advance(rd)
        rep.maybe_compact()

    def run(self, seconds: float, node_to: tuple[str, ...] = ()) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now += 0.01
            for rid in node_to:
                if rid in self.reps:
                    self.reps[rid].heartbeat("n1", 1, {}, self.now)
            for rep in self.reps.values():
                rep.tick(self.now)
                self._flush(rep)
            while self.queue:
                msg = self.queue.pop(0)
                if msg.dst in self.reps:
                    self.reps[msg.dst].step(msg, self.now)
                    self._flush(self.reps[msg.dst])

    def leader(self) -> Replica:
        leads = [r for r in self.reps.values() if r.status().role is Role.LEADER]
        assert len(leads) == 1
        return leads[0]


def _started() -> _Group:
    g = _Group()
    g.run(3.0)
    return g


def test_replica_config_change_refusals() -> None:
    g = _started()
    lead = g.leader()
    follower = next(r for r in g.reps.values() if r is not lead)
    with pytest.raises(InvalidInput, match="unknown configuration change 'demote'"):
        lead.propose_config_change("demote", "a2", None, g.now)
    with pytest.raises(ProposalDropped):
        follower.propose_config_change("add_learner", "a4", "h:4", g.now)
    with pytest.raises(InvalidInput, match="in use"):
        lead.propose_config_change("add_learner", "a4", "h:1", g.now)
    assert lead.configuration.index == 0 and lead.applied_configuration.voters == ADDRS


def test_replica_joins_learns_the_configuration_and_counts_only_once_a_voter() -> None:
    g = _started()
    joiner = g.add("a4")
    assert joiner.status().role is Role.FOLLOWER and not joiner.removed
    lead = g.leader()
    lead.propose_config_change("add_learner", "a4", "h:4", g.now)
    assert lead.configuration.learners == {"a4": "h:4"}  # in force at once
    g.run(0.02, node_to=("a1", "a2", "a3", "a4"))
    assert joiner.applied_configuration.learners == {"a4": "h:4"}  # from the snapshot
    assert joiner.applied_configuration.voters == ADDRS
    assert joiner.heartbeat("n1", 1, {}, g.now).accepted  # it serves nodes as a learner
    g.run(2.0, node_to=("a1", "a2", "a3", "a4"))  # the leader promotes it once caught up
    assert joiner.applied_configuration.voters.keys() == {"a1", "a2", "a3", "a4"}
    g.run(1.0, node_to=("a1", "a2", "a3", "a4"))
    assert lead.state.observation("a4", "n1") is not None  # now its observations count
    assert joiner.heartbeat("n1", 1, {}, g.now).lease > 0
    member = lead.state.member("n1")
    assert member is not None and member.state is MemberState.ALIVE
    st = lead.status(g.now)
    assert st.progress["a4"].voter and st.progress["a4"].match == st.last_index


def test_replica_removed_grants_no_lease_and_says_it_is_removed() -> None:
    g = _started()
    g.run(1.0, node_to=tuple(ADDRS))
    lead = g.leader()
    gone_id = next(r for r in ADDRS if g.reps[r] is not lead)
    gone = g.reps[gone_id]
    assert gone.heartbeat("n1", 1, {}, g.now).lease > 0
    lead.propose_config_change("remove", gone_id, None, g.now)
    g.run(0.5, node_to=tuple(ADDRS))
    assert gone.removed and gone_id not in lead.applied_configuration
    assert gone.heartbeat("n1", 1, {}, g.now).lease == 0.0
    assert lead.state.observation(gone_id, "n1") is None  # tally rule 11
