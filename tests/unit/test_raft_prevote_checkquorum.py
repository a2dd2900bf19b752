"""PreVote (thesis §9.6) and CheckQuorum with leader leases (thesis §6.2, §4.2.3)."""

from __future__ import annotations

import random

import pytest

from arbiter.core.raft import Message, MessageType, RaftConfig, RaftNode, Role
from tests.unit.raft_harness import Network

IDS3 = ["a", "b", "c"]
IDS5 = ["a", "b", "c", "d", "e"]
T = RaftConfig().election_timeout


def _elected(
    ids: list[str], seed: int = 0, config: RaftConfig | None = None
) -> tuple[Network, str]:
    net = Network(ids, seed=seed, config=config)
    assert net.run_until(lambda: net.stable_leader() is not None, timeout=10)
    net.run_for(0.5)
    lead = net.stable_leader()
    assert lead is not None
    return net, lead


@pytest.mark.parametrize("ids", [IDS3, IDS5], ids=["3", "5"])
def test_prevote_rejoining_follower_does_not_disrupt_leader(ids: list[str]) -> None:
    net, lead = _elected(ids, seed=1)
    term = net.nodes[lead].status().term
    loner = next(i for i in ids if i != lead)
    net.isolate(loner)
    net.run_for(10 * T)
    assert net.nodes[loner].status().term == term, "pre-votes never raise the term"
    assert net.nodes[loner].status().role in (Role.FOLLOWER, Role.PRE_CANDIDATE)
    assert not net.nodes[loner].in_quorum(net.now)
    net.recover()
    assert net.run_until(lambda: net.nodes[loner].status().leader == lead, timeout=3)
    net.run_for(5 * T)
    assert net.stable_leader() == lead
    assert all(n.status().term == term for n in net.nodes.values())
    net.propose(lead, b"after")
    assert net.run_until(lambda: all(net.data_applied(i) == [b"after"] for i in ids), timeout=2)


def test_prevote_disabled_rejoining_follower_disrupts_leader() -> None:
    """The contrast: without PreVote and CheckQuorum the loner's high term deposes the leader."""
    config = RaftConfig(pre_vote=False, check_quorum=False)
    net, lead = _elected(IDS3, seed=1, config=config)
    term = net.nodes[lead].status().term
    loner = next(i for i in IDS3 if i != lead)
    net.isolate(loner)
    net.run_for(10 * T)
    assert net.nodes[loner].status().term > term + 3
    net.recover()
    net.run_for(5 * T)
    assert net.nodes[lead].status().term > term


def test_prevote_refused_while_voter_hears_leader() -> None:
    net, lead = _elected(IDS3, seed=2)
    follower = next(i for i in IDS3 if i != lead)
    other = next(i for i in IDS3 if i not in (lead, follower))
    st = net.nodes[follower].status()
    for kind in (MessageType.PRE_VOTE, MessageType.VOTE):
        before = len(net.sent)
        # A candidate with a longer log and a much higher term.
        net.inject(
            Message(
                type=kind,
                src=other,
                dst=follower,
                term=st.term + 5,
                index=100,
                log_term=st.term + 4,
            )
        )
        (resp,) = net.sent[before:]
        assert resp.reject and resp.term == st.term
        assert net.nodes[follower].status() == st, "in the leader's lease: no term change"


@pytest.mark.parametrize("check_quorum", [True, False])
@pytest.mark.parametrize(
    ("at", "granted"), [(0.5 * T, False), (0.999 * T, False), (T, True), (3 * T, True)]
)
def test_prevote_granted_only_after_leader_silent_for_election_timeout(
    check_quorum: bool, at: float, granted: bool
) -> None:
    node = RaftNode(
        node_id="b",
        peers=IDS3,
        config=RaftConfig(check_quorum=check_quorum),
        rng=random.Random(0),
        now=0.0,
    )
    node.step(Message(type=MessageType.HEARTBEAT, src="a", dst="b", term=1), now=0.0)
    assert node.in_quorum(at) is not granted
    node.advance(node.ready())
    node.step(
        Message(type=MessageType.PRE_VOTE, src="c", dst="b", term=2, index=0, log_term=0), now=at
    )
    (resp,) = node.ready().messages
    assert resp.type is MessageType.PRE_VOTE_RESP
    assert resp.reject is not granted
    assert resp.term == (2 if granted else 1)
    st = node.status()
    assert (st.term, st.leader, st.role) == (1, "a", Role.FOLLOWER), "a pre-vote changes nothing"


@pytest.mark.parametrize("ids", [IDS3, IDS5], ids=["3", "5"])
def test_checkquorum_isolated_leader_steps_down(ids: list[str]) -> None:
    net, lead = _elected(ids, seed=3)
    node = net.nodes[lead]
    assert node.in_quorum(net.now)
    isolated_at = net.now
    net.isolate(lead)
    assert net.run_until(lambda: node.status().role is not Role.LEADER, timeout=3 * T)
    # The lease runs from the last answer heard, before the cut: at most T after it.
    assert net.now <= isolated_at + T
    assert net.now >= isolated_at + T - 2 * RaftConfig().heartbeat_interval
    assert not node.in_quorum(net.now)
    assert node.status().leader is None
    # The majority elects a new leader meanwhile; the old one stays out of it.
    assert net.run_until(lambda: net.leader() not in (None, lead), timeout=10)
    net.run_for(3 * T)
    assert node.status().role is not Role.LEADER


def test_checkquorum_disabled_isolated_leader_stays() -> None:
    net, lead = _elected(IDS3, seed=3, config=RaftConfig(check_quorum=False))
    net.isolate(lead)
    net.run_for(5 * T)
    assert net.nodes[lead].status().role is Role.LEADER
    assert not net.nodes[lead].in_quorum(net.now)  # the status still tells the truth


@pytest.mark.parametrize("ids", [IDS3, IDS5], ids=["3", "5"])
def test_checkquorum_in_quorum_true_across_healthy_cluster(ids: list[str]) -> None:
    net, lead = _elected(ids, seed=4)
    for _ in range(30):
        net.run_for(0.37)
        assert all(n.in_quorum(net.now) for n in net.nodes.values())
    assert net.stable_leader() == lead


def test_checkquorum_follower_loses_quorum_after_leader_silence() -> None:
    net, lead = _elected(IDS3, seed=5)
    followers = [i for i in IDS3 if i != lead]
    net.crash(lead)
    crashed_at = net.now
    net.run_for(T - 2 * RaftConfig().heartbeat_interval)
    assert all(net.nodes[i].in_quorum(net.now) for i in followers)
    net.run_until(lambda: net.now > crashed_at + T, timeout=2 * T)
    assert not any(net.nodes[i].in_quorum(net.now) for i in followers if net.leader() != i)


def test_checkquorum_minority_partition_cannot_elect_or_commit() -> None:
    net, lead = _elected(IDS5, seed=6)
    minority = [lead, next(i for i in IDS5 if i != lead)]
    majority = [i for i in IDS5 if i not in minority]
    for a in minority:
        for b in majority:
            net.cut(a, b)
    net.propose(lead, b"minority")  # appended by the old leader, never committed
    net.run_for(10 * T)
    for i in minority:
        st = net.nodes[i].status()
        assert st.role is not Role.LEADER
        assert not net.nodes[i].in_quorum(net.now)
        assert b"minority" not in net.data_applied(i)
    new = net.leader()
    assert new in majority
    net.propose(new, b"majority")
    net.recover()
    assert net.run_until(lambda: all(net.data_applied(i) == [b"majority"] for i in IDS5), timeout=5)
