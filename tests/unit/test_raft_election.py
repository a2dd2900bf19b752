"""RaftNode leader election: one leader per term, timeouts, votes, durability order."""

from __future__ import annotations

import random
from typing import Any

import pytest

from arbiter.core.raft import (
    Entry,
    HardState,
    InvalidInput,
    Message,
    MessageType,
    ProposalDropped,
    RaftConfig,
    RaftNode,
    Role,
)
from tests.unit.raft_harness import Network

IDS3 = ["a", "b", "c"]
IDS5 = ["a", "b", "c", "d", "e"]
CONFIG = RaftConfig()


def _node(node_id: str = "b", **kwargs: Any) -> RaftNode:
    kwargs.setdefault("peers", IDS3)
    return RaftNode(node_id=node_id, config=CONFIG, rng=random.Random(0), now=0.0, **kwargs)


@pytest.mark.parametrize("ids", [IDS3, IDS5], ids=["3", "5"])
@pytest.mark.parametrize("seed", range(3))
def test_election_single_leader_elected(ids: list[str], seed: int) -> None:
    net = Network(ids, seed=seed)
    assert net.run_until(lambda: net.stable_leader() is not None, timeout=10)
    lead = net.stable_leader()
    assert lead is not None
    assert [i for i, n in net.nodes.items() if n.status().role is Role.LEADER] == [lead]
    # The first election needs at most a few timeouts and stays put afterwards.
    term = net.nodes[lead].status().term
    net.run_for(10)
    assert net.stable_leader() == lead
    assert net.nodes[lead].status().term == term


@pytest.mark.parametrize(
    ("pre_vote", "check_quorum"), [(True, True), (True, False), (False, True), (False, False)]
)
def test_election_works_with_every_switch(pre_vote: bool, check_quorum: bool) -> None:
    net = Network(IDS3, seed=1, config=RaftConfig(pre_vote=pre_vote, check_quorum=check_quorum))
    assert net.run_until(lambda: net.stable_leader() is not None, timeout=10)


def test_election_new_leader_after_leader_crash() -> None:
    net = Network(IDS3, seed=2)
    assert net.run_until(lambda: net.stable_leader() is not None)
    old = net.stable_leader()
    assert old is not None
    old_term = net.nodes[old].status().term
    crash_time = net.now
    net.crash(old)
    assert net.run_until(lambda: net.stable_leader() not in (None, old), timeout=10)
    new = net.stable_leader()
    assert new is not None
    assert net.nodes[new].status().term > old_term
    # Detection takes one election timeout at least, a few at most.
    assert CONFIG.election_timeout <= net.now - crash_time < 5 * CONFIG.election_timeout


@pytest.mark.parametrize("pre_vote", [True, False])
def test_election_lone_survivor_never_leads(pre_vote: bool) -> None:
    net = Network(IDS3, seed=3, config=RaftConfig(pre_vote=pre_vote))
    assert net.run_until(lambda: net.stable_leader() is not None)
    lead = net.stable_leader()
    survivor = next(i for i in IDS3 if i != lead)
    for i in IDS3:
        if i != survivor:
            net.crash(i)
    term = net.nodes[survivor].status().term
    crash_time = net.now
    seen_roles = set()
    for _ in range(300):
        net.run_for(0.1)
        seen_roles.add(net.nodes[survivor].status().role)
        if net.now >= crash_time + CONFIG.election_timeout:
            assert not net.nodes[survivor].in_quorum(net.now)
    st = net.nodes[survivor].status()
    assert Role.LEADER not in seen_roles
    assert st.leader is None
    with pytest.raises(ProposalDropped):
        net.propose(survivor, b"x")
    if pre_vote:
        assert st.term == term, "PreVote keeps a lone replica's term still"
        assert Role.CANDIDATE not in seen_roles
    else:
        assert st.term > term


def test_election_same_seed_same_trace() -> None:
    def run(seed: int) -> list[str]:
        net = Network(IDS5, seed=seed, loss=0.1)
        net.run_for(3)
        lead = net.leader()
        if lead is not None:
            net.propose(lead, b"x")
        net.isolate("a")
        net.run_for(3)
        net.recover()
        net.run_for(3)
        return net.trace

    first, second = run(7), run(7)
    assert len(first) > 100
    assert first == second
    assert run(8) != first


def test_election_vote_is_in_same_ready_as_vote_response() -> None:
    node = _node("b")
    node.step(Message(type=MessageType.VOTE, src="a", dst="b", term=1), now=0.0)
    rd = node.ready()
    assert rd.hard_state == HardState(term=1, vote="a", commit=0)
    assert rd.messages == (
        Message(type=MessageType.VOTE_RESP, src="b", dst="a", term=1, reject=False),
    )
    node.advance(rd)
    assert not node.has_ready()
    # A second candidate in the same term is refused; nothing new to persist.
    node.step(Message(type=MessageType.VOTE, src="c", dst="b", term=1), now=0.1)
    rd = node.ready()
    assert rd.hard_state is None
    assert rd.messages == (
        Message(type=MessageType.VOTE_RESP, src="b", dst="c", term=1, reject=True),
    )


def test_election_candidate_ready_carries_term_and_self_vote() -> None:
    node = RaftNode(
        node_id="a",
        peers=IDS3,
        config=RaftConfig(pre_vote=False),
        rng=random.Random(0),
        now=0.0,
    )
    node.tick(node.next_deadline())
    rd = node.ready()
    assert node.status().role is Role.CANDIDATE
    assert rd.hard_state == HardState(term=1, vote="a", commit=0)
    assert {(m.type, m.dst, m.term) for m in rd.messages} == {
        (MessageType.VOTE, "b", 1),
        (MessageType.VOTE, "c", 1),
    }


def test_election_pre_candidate_keeps_term() -> None:
    node = _node("a")
    node.tick(node.next_deadline())
    rd = node.ready()
    assert node.status().role is Role.PRE_CANDIDATE
    assert node.status().term == 0
    assert rd.hard_state is None
    assert {(m.type, m.dst, m.term) for m in rd.messages} == {
        (MessageType.PRE_VOTE, "b", 1),
        (MessageType.PRE_VOTE, "c", 1),
    }


@pytest.mark.parametrize(
    ("my_log", "cand_index", "cand_term", "granted"),
    [
        ((), 0, 0, True),
        (((1, 1),), 0, 0, False),  # candidate's log is shorter
        (((1, 1),), 1, 1, True),  # equal
        (((1, 1), (2, 2)), 5, 1, False),  # longer but older last term
        (((1, 1), (2, 2)), 1, 3, True),  # shorter but newer last term
    ],
)
def test_election_vote_needs_up_to_date_log(
    my_log: tuple[tuple[int, int], ...], cand_index: int, cand_term: int, granted: bool
) -> None:
    entries = [Entry(term=t, index=i, data=b"x") for i, t in my_log]
    term = max((t for _, t in my_log), default=0)
    node = _node("b", hard_state=HardState(term=term, vote=None, commit=0), entries=entries)
    node.step(
        Message(
            type=MessageType.VOTE, src="a", dst="b", term=5, index=cand_index, log_term=cand_term
        ),
        now=0.0,
    )
    (resp,) = node.ready().messages
    assert resp.reject is not granted
    assert node.status().term == 5


def test_election_restored_vote_is_kept() -> None:
    node = _node("b", hard_state=HardState(term=3, vote="a", commit=0))
    node.step(Message(type=MessageType.VOTE, src="c", dst="b", term=3), now=0.0)
    node.step(Message(type=MessageType.VOTE, src="a", dst="b", term=3), now=0.0)
    assert [m.reject for m in node.ready().messages] == [True, False]


def test_election_stale_vote_request_refused_with_current_term() -> None:
    node = _node("b", hard_state=HardState(term=4, vote=None, commit=0))
    node.step(Message(type=MessageType.VOTE, src="a", dst="b", term=2), now=0.0)
    (resp,) = node.ready().messages
    assert (resp.type, resp.term, resp.reject) == (MessageType.VOTE_RESP, 4, True)


@pytest.mark.parametrize(
    "msg",
    [
        Message(type=MessageType.VOTE, src="a", dst="c", term=1),  # not for b
        Message(type=MessageType.VOTE, src="", dst="b", term=1),  # no sender
        Message(type=MessageType.VOTE, src="b", dst="b", term=1),  # from itself
        Message(type=MessageType.PROPOSE, src="a", dst="b", term=3),  # PROPOSE has no term
    ],
)
def test_election_invalid_message_raises(msg: Message) -> None:
    with pytest.raises(InvalidInput):
        _node("b").step(msg, now=0.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"peers": ["a", "c"]},  # node not in peers
        {"peers": ["a", "b", "b"]},  # duplicates
        {"hard_state": HardState(term=1, vote=None, commit=2)},  # commit beyond log
        {"entries": [Entry(term=1, index=2, data=b"")]},  # not from index 1
        {"entries": [Entry(term=2, index=1, data=b"")]},  # entry term beyond hard state term
    ],
)
def test_election_invalid_restore_raises(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        _node("b", **kwargs)


def test_election_invalid_config_raises() -> None:
    with pytest.raises(ValueError):
        RaftNode(
            node_id="a",
            peers=IDS3,
            config=RaftConfig(heartbeat_interval=1.0, election_timeout=1.0),
            rng=random.Random(0),
            now=0.0,
        )


def test_election_single_replica_leads_at_once() -> None:
    node = _node("a", peers=["a"])
    node.tick(node.next_deadline())
    assert node.status().role is Role.LEADER
    assert node.in_quorum(100.0)
    node.propose(b"x", 2.0)
    rd = node.ready()
    assert [e.data for e in rd.committed_entries] == [b"", b"x"]
    assert rd.messages == ()


def test_election_timeout_is_randomized_in_range() -> None:
    deadlines = set()
    for seed in range(50):
        node = RaftNode(node_id="a", peers=IDS3, config=CONFIG, rng=random.Random(seed), now=10.0)
        d = node.next_deadline() - 10.0
        assert CONFIG.election_timeout <= d < 2 * CONFIG.election_timeout
        deadlines.add(round(d, 6))
    assert len(deadlines) == 50


def test_election_granting_vote_restarts_election_timer() -> None:
    node = _node("b", hard_state=HardState(term=1, vote=None, commit=0))
    node.step(Message(type=MessageType.VOTE, src="a", dst="b", term=1), now=5.0)
    assert node.ready().messages[0].reject is False
    assert 5.0 + CONFIG.election_timeout <= node.next_deadline() < 5.0 + 2 * CONFIG.election_timeout


def _pre_candidate() -> RaftNode:
    node = _node("a", hard_state=HardState(term=1, vote=None, commit=0))
    node.tick(node.next_deadline())
    assert node.status().role is Role.PRE_CANDIDATE
    node.advance(node.ready())
    return node


def test_election_pre_candidate_ignores_stale_grant_then_counts_current_one() -> None:
    node = _pre_candidate()
    # A grant for term 1 answers an older pre-campaign: it does not count.
    node.step(Message(type=MessageType.PRE_VOTE_RESP, src="b", dst="a", term=1), now=2.0)
    assert node.status().role is Role.PRE_CANDIDATE
    node.step(Message(type=MessageType.PRE_VOTE_RESP, src="b", dst="a", term=2), now=2.0)
    st = node.status()
    assert (st.role, st.term) == (Role.CANDIDATE, 2)
    rd = node.ready()
    assert rd.hard_state == HardState(term=2, vote="a", commit=0)
    assert {(m.type, m.term) for m in rd.messages} == {(MessageType.VOTE, 2)}


@pytest.mark.parametrize("kind", [MessageType.PRE_VOTE_RESP, MessageType.VOTE_RESP])
def test_election_quorum_of_refusals_ends_campaign(kind: MessageType) -> None:
    node = _pre_candidate()
    if kind is MessageType.VOTE_RESP:
        node.step(Message(type=MessageType.PRE_VOTE_RESP, src="c", dst="a", term=2), now=2.0)
        assert node.status().role is Role.CANDIDATE
    term = node.status().term
    node.step(Message(type=kind, src="b", dst="a", term=term, reject=True), now=2.0)
    assert node.status().role is not Role.FOLLOWER  # one refusal of three is not a quorum
    node.step(Message(type=kind, src="c", dst="a", term=term, reject=True), now=2.0)
    st = node.status()
    assert (st.role, st.term, st.leader) == (Role.FOLLOWER, term, None)


@pytest.mark.parametrize("kind", [MessageType.APPEND, MessageType.HEARTBEAT])
def test_election_stale_leader_is_told_the_new_term(kind: MessageType) -> None:
    follower = _node("b", hard_state=HardState(term=5, vote=None, commit=0))
    follower.step(Message(type=kind, src="a", dst="b", term=3), now=0.0)
    (resp,) = follower.ready().messages
    assert (resp.type, resp.term, resp.dst) == (MessageType.APPEND_RESP, 5, "a")
    assert follower.status().term == 5
    # The stale leader steps down on hearing it.
    net = Network(IDS3, seed=0)
    assert net.run_until(lambda: net.stable_leader() is not None)
    lead = net.stable_leader()
    assert lead is not None
    term = net.nodes[lead].status().term
    other = next(i for i in IDS3 if i != lead)
    net.inject(
        Message(type=MessageType.APPEND_RESP, src=other, dst=lead, term=term + 2, reject=True)
    )
    st = net.nodes[lead].status()
    assert (st.role, st.term, st.leader) == (Role.FOLLOWER, term + 2, None)
