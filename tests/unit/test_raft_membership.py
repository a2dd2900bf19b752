"""Raft single-server membership changes with learners (Ongaro's thesis §4.1-4.2; etcd).

Each test drives the harness network (``raft_harness``), whose invariants
(one leader per term, applied entries equal to the committed ones, durable
state before dependent messages) are checked after every event.
"""

from __future__ import annotations

import random

import pytest

from arbiter.core.raft import (
    ArbiterConfiguration,
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryType,
    InvalidInput,
    MessageType,
    ProposalDropped,
    RaftConfig,
    RaftNode,
    Role,
    Snapshot,
)
from arbiter.core.raft.codec import (
    entry_from_payload,
    entry_payload,
    snapshot_from_payload,
    snapshot_payload,
)
from tests.unit.raft_harness import Network

ADD, PROMOTE, REMOVE = ConfChangeOp.ADD_LEARNER, ConfChangeOp.PROMOTE, ConfChangeOp.REMOVE
MANUAL = RaftConfig(auto_promote=False)


def _net(ids: tuple[str, ...] = ("a", "b", "c"), seed: int = 1, **kw: object) -> Network:
    net = Network(list(ids), seed=seed, **kw)  # type: ignore[arg-type]
    assert net.run_until(lambda: net.stable_leader() is not None, timeout=10)
    lead = net.stable_leader()
    assert lead is not None
    net.propose(lead, b"x")  # the leader's own term has a committed entry
    net.run_for(0.5)
    return net


def _lead(net: Network) -> str:
    lead = net.stable_leader()
    assert lead is not None
    return lead


def _committed(net: Network, node: str) -> ArbiterConfiguration:
    n = net.nodes[node]
    return n.configuration_at(n.status().commit)


def test_membership_learner_gets_the_log_but_never_counts() -> None:
    net = _net(config=MANUAL)
    lead = _lead(net)
    net.add("d")
    conf = net.change(lead, ADD, "d")
    assert conf.learners == {"d": "d:1"} and conf.index == net.nodes[lead].status().last_index
    assert net.run_until(lambda: net.data_applied("d") == [b"x"], timeout=5)
    # The two other voters cut off: leader + learner are no quorum, nothing commits.
    for v in ("a", "b", "c"):
        if v != lead:
            net.cut(lead, v)
    before = net.nodes[lead].status().commit
    net.propose(lead, b"y")
    net.run_for(0.5)
    assert net.nodes[lead].status().commit == before
    assert net.nodes["d"].status().last_index == net.nodes[lead].status().last_index
    # CheckQuorum counts voters only: the leader steps down although d answers.
    assert net.run_until(lambda: net.nodes[lead].status().role is not Role.LEADER, timeout=3)


def test_membership_learner_never_campaigns() -> None:
    net = _net(config=MANUAL)
    lead = _lead(net)
    net.add("d")
    net.change(lead, ADD, "d")
    net.run_for(1)
    net.isolate("d")
    net.run_for(10)  # many election timeouts
    assert not [
        m for m in net.sent if m.src == "d" and m.type in (MessageType.PRE_VOTE, MessageType.VOTE)
    ]
    assert net.nodes["d"].status().role is Role.FOLLOWER


def test_membership_caught_up_learner_is_promoted_automatically() -> None:
    net = _net()
    lead = _lead(net)
    net.add("d")
    net.change(lead, ADD, "d")
    assert net.run_until(lambda: _committed(net, lead).is_voter("d"), timeout=5)
    conf = _committed(net, lead)
    assert (list(conf.voters), dict(conf.learners)) == (["a", "b", "c", "d"], {})
    net.run_for(0.5)
    assert all(n.configuration == conf for n in net.nodes.values())


def test_membership_no_automatic_promotion_when_switched_off_and_manual_promote() -> None:
    net = _net(config=MANUAL)
    lead = _lead(net)
    net.add("d")
    net.change(lead, ADD, "d")
    net.run_for(3)
    assert _committed(net, lead).learners == {"d": "d:1"}
    net.change(lead, PROMOTE, "d")
    assert net.run_until(lambda: _committed(net, lead).is_voter("d"), timeout=3)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (ConfChange(op=ADD, replica_id="b", address="z:1"), "already a member"),
        (ConfChange(op=ADD, replica_id="z", address=""), "needs its address"),
        (ConfChange(op=PROMOTE, replica_id="b"), "not a learner"),
        (ConfChange(op=PROMOTE, replica_id="z"), "not a learner"),
        (ConfChange(op=REMOVE, replica_id="z"), "not a member"),
    ],
)
def test_membership_invalid_changes_are_refused(change: ConfChange, match: str) -> None:
    net = _net()
    lead = _lead(net)
    with pytest.raises(InvalidInput, match=match):
        net.nodes[lead].propose_conf_change(change, net.now)


def test_membership_address_in_use_and_last_voter_are_refused() -> None:
    net = _net(("a",))
    net.change("a", ADD, "b", "b:1")
    net.run_for(1)
    with pytest.raises(InvalidInput, match="in use by 'b'"):
        net.change("a", ADD, "c", "b:1")
    one = ArbiterConfiguration(voters={"a": "a:1"})
    with pytest.raises(InvalidInput, match="last voter"):
        one.apply(ConfChange(op=REMOVE, replica_id="a"), 1)


def test_membership_one_change_at_a_time_and_only_at_the_leader() -> None:
    net = _net(config=MANUAL)
    lead = _lead(net)
    follower = next(i for i in net.nodes if i != lead)
    with pytest.raises(ProposalDropped, match="not the leader"):
        net.change(follower, ADD, "d")
    for v in net.nodes:
        if v != lead:
            net.cut(lead, v)  # the change cannot commit
    net.change(lead, ADD, "d")
    with pytest.raises(ProposalDropped, match="not committed yet"):
        net.change(lead, ADD, "e")


def test_membership_new_leader_waits_for_its_noop_before_a_change() -> None:
    # etcd's rule (Ongaro, raft-dev 2015): a leader may hold an uncommitted change of an
    # earlier term; it changes nothing before an entry of its own term commits.
    node = RaftNode(node_id="a", peers=["a", "b", "c"], config=MANUAL, rng=random.Random(0), now=0)
    node.tick(10.0)  # pre-candidate
    for peer in ("b", "c"):
        node.step(_grant(MessageType.PRE_VOTE_RESP, peer, 1), 10.0)
    node.step(_grant(MessageType.VOTE_RESP, "b", 1), 10.0)
    assert node.status().role is Role.LEADER  # its no-op is appended, not committed
    with pytest.raises(ProposalDropped, match="own term"):
        node.propose_conf_change(ConfChange(op=ADD, replica_id="d", address="d:1"), 10.0)


def _grant(type_: MessageType, src: str, term: int):  # type: ignore[no-untyped-def]
    from arbiter.core.raft import Message

    return Message(type=type_, src=src, dst="a", term=term)


def test_membership_uncommitted_change_is_in_force_and_reverts_when_truncated() -> None:
    net = _net(config=MANUAL)
    old = _lead(net)
    net.isolate(old)
    net.add("d")
    net.change(old, ADD, "d")  # in the old leader's log only
    assert "d" in net.nodes[old].configuration
    assert net.run_until(lambda: net.leader() not in (None, old), timeout=10)
    new = net.leader()
    assert new is not None and "d" not in net.nodes[new].configuration
    net.propose(new, b"y")
    net.recover()
    assert net.run_until(lambda: net.data_applied(old)[-1:] == [b"y"], timeout=10)
    assert "d" not in net.nodes[old].configuration  # the entry was overwritten: reverted


def test_membership_removed_leader_commits_without_itself_then_steps_down() -> None:
    net = _net()
    lead = _lead(net)
    others = [i for i in net.nodes if i != lead]
    net.cut(lead, others[0])  # the new configuration {others} needs both of them
    net.change(lead, REMOVE, lead)
    net.run_for(0.3)  # less than T: CheckQuorum (over {others}) keeps it leader
    st = net.nodes[lead].status()
    assert st.role is Role.LEADER and st.commit < st.configuration.index  # type: ignore[union-attr]
    net.recover()
    assert net.run_until(lambda: net.nodes[lead].status().role is Role.FOLLOWER, timeout=3)
    assert net.nodes[lead].removed
    assert net.run_until(lambda: net.stable_leader() in others, timeout=10)
    net.run_for(10)
    assert not [m for m in net.sent[-200:] if m.src == lead and m.type is MessageType.PRE_VOTE]


def test_membership_joining_replica_gets_a_snapshot_when_the_leader_never_compacted() -> None:
    net = _net()
    lead = _lead(net)
    assert net.nodes[lead].snapshot().index == 0
    net.add("d")
    net.change(lead, ADD, "d")
    assert net.run_until(lambda: net.data_applied("d") == [b"x"], timeout=5)
    assert net.disks["d"].snapshot is not None  # it started from the leader's snapshot
    assert net.disks["d"].snapshot.configuration.voters.keys() == {"a", "b", "c"}


def test_membership_restart_restores_snapshot_configuration_then_later_entries() -> None:
    net = _net(config=MANUAL)
    lead = _lead(net)
    net.add("d")
    net.change(lead, ADD, "d")
    net.run_for(1)
    for i, n in net.nodes.items():
        if n.status().applied > n.snapshot().index:
            net.compact(i)
    net.change(lead, PROMOTE, "d")  # after every snapshot: only in the logs
    net.run_for(1)
    expect = net.nodes[lead].configuration
    for i in list(net.nodes):
        net.crash(i)
        net.restart(i)
        assert net.nodes[i].configuration == expect, i
        assert net.nodes[i].configuration_at(net.disks[i].base).learners == {"d": "d:1"}


def test_membership_status_shows_each_peers_progress() -> None:
    net = _net(config=MANUAL)
    lead = _lead(net)
    net.add("d")
    net.change(lead, ADD, "d")
    net.run_for(1)
    st = net.nodes[lead].status(net.now)
    assert sorted(st.progress) == sorted(i for i in net.nodes if i != lead)
    last = st.last_index
    assert all(p.match == last and p.next == last + 1 for p in st.progress.values())
    assert st.progress["d"].voter is False and 0 <= st.progress["d"].last_heard < 0.2
    assert net.nodes["d"].status(net.now).progress == {}  # followers have none


@pytest.mark.parametrize(
    "entry",
    [
        Entry(term=1, index=1, data=b""),
        Entry(term=1, index=2, data=b'{"v":1}'),
        Entry(term=1, index=3, data=b"\x00raw"),
        Entry(term=1, index=4, data=b"\x01raw"),
        Entry(term=2, index=5, data=b'{"op":"promote"}', type=EntryType.CONFIG),
    ],
)
def test_codec_entry_round_trip(entry: Entry) -> None:
    payload = entry_payload(entry)
    assert entry_from_payload(entry.term, entry.index, payload) == entry
    if entry.type is EntryType.NORMAL and entry.data[:1] not in (b"\x00", b"\x01"):
        assert payload == entry.data  # what the data dir and the wire held before


@pytest.mark.parametrize(
    "snap",
    [
        Snapshot(index=3, term=1, data=b'{"v":1}'),
        Snapshot(index=3, term=1, data=b"\x01x"),
        Snapshot(
            index=3,
            term=1,
            data=b'{"v":1}',
            configuration=ArbiterConfiguration(voters={"a": "h:1"}, learners={"b": "h:2"}, index=2),
        ),
    ],
)
def test_codec_snapshot_round_trip(snap: Snapshot) -> None:
    assert snapshot_from_payload(3, 1, snapshot_payload(snap)) == snap


def test_codec_bad_snapshot_configuration_header_is_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        snapshot_from_payload(3, 1, b"\x01CONF\x00\x00\x00\x05{bad}")


def test_membership_removed_follower_learns_its_removal_and_never_campaigns() -> None:
    net = _net()
    lead = _lead(net)
    gone = next(i for i in net.nodes if i != lead)
    net.change(lead, REMOVE, gone)
    # The leader sends it the log until its removal commits, so it learns it.
    assert net.run_until(lambda: net.nodes[gone].removed, timeout=3)
    st = net.nodes[lead].status(net.now)
    assert gone not in st.progress and gone not in net.nodes[lead].configuration
    mark = len(net.sent)
    net.run_for(10)
    assert not [m for m in net.sent[mark:] if m.src == gone and m.type is MessageType.PRE_VOTE]
