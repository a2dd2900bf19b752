"""RaftNode log replication: commit, apply, forwarding, repair of divergent logs, catch-up."""

from __future__ import annotations

import random

import pytest

from arbiter.core.raft import (
    Entry,
    HardState,
    Message,
    MessageType,
    ProposalDropped,
    RaftConfig,
    RaftNode,
    Role,
)
from arbiter.core.raft.replication import Progress, ProgressState
from tests.unit.raft_harness import Network
from tests.unit.raft_harness import all_applied as _all_applied
from tests.unit.raft_harness import elected as _elected

IDS3 = ["a", "b", "c"]
IDS5 = ["a", "b", "c", "d", "e"]


@pytest.mark.parametrize("ids", [IDS3, IDS5], ids=["3", "5"])
def test_replication_proposals_commit_and_apply_once_in_order(ids: list[str]) -> None:
    net, lead = _elected(ids)
    data = [f"cmd{i}".encode() for i in range(20)]
    for d in data:
        net.propose(lead, d)
    assert net.run_until(lambda: _all_applied(net, data), timeout=2)
    net.run_for(5)  # nothing is applied twice later
    assert _all_applied(net, data)
    for i in ids:
        st = net.nodes[i].status()
        assert st.commit == st.applied == st.last_index == len(data) + 1  # + the no-op


def test_replication_new_leader_appends_noop_first() -> None:
    net, lead = _elected(IDS3)
    first = net.applied[lead][0]
    assert first == Entry(term=net.nodes[lead].status().term, index=1, data=b"")


def test_replication_proposal_via_follower_is_forwarded() -> None:
    net, lead = _elected(IDS3)
    follower = next(i for i in IDS3 if i != lead)
    net.propose(follower, b"via-follower")
    assert [m.type for m in net.sent[-1:]] == [MessageType.PROPOSE]
    assert net.run_until(lambda: _all_applied(net, [b"via-follower"]), timeout=2)


def test_replication_proposal_dropped_without_leader() -> None:
    net = Network(IDS3, seed=0)
    for i in IDS3:
        with pytest.raises(ProposalDropped):
            net.propose(i, b"x")


def test_replication_forwarded_proposal_dropped_by_replica_without_leader() -> None:
    node = RaftNode(node_id="b", peers=IDS3, config=RaftConfig(), rng=random.Random(0), now=0.0)
    msg = Message(
        type=MessageType.PROPOSE,
        src="a",
        dst="b",
        term=0,
        entries=(Entry(term=0, index=0, data=b"x"),),
    )
    with pytest.raises(ProposalDropped):
        node.step(msg, 0.0)


def test_replication_empty_proposal_rejected() -> None:
    net, lead = _elected(IDS3)
    with pytest.raises(ValueError):
        net.propose(lead, b"")


def test_replication_leader_crash_keeps_committed_entries() -> None:
    net, lead = _elected(IDS3)
    net.propose(lead, b"one")
    assert net.run_until(lambda: _all_applied(net, [b"one"]), timeout=2)
    net.crash(lead)
    assert net.run_until(lambda: net.stable_leader() not in (None, lead), timeout=10)
    new = net.stable_leader()
    assert new is not None
    net.propose(new, b"two")
    assert net.run_until(lambda: _all_applied(net, [b"one", b"two"]), timeout=2)
    net.restart(lead)  # replays its own log, then learns the rest
    assert net.run_until(lambda: _all_applied(net, [b"one", b"two"], IDS3), timeout=5)
    assert net.nodes[lead].status().role is Role.FOLLOWER


def test_replication_divergent_uncommitted_entries_overwritten_on_rejoin() -> None:
    net, old = _elected(IDS5, seed=4)
    net.propose(old, b"committed")
    assert net.run_until(lambda: _all_applied(net, [b"committed"]), timeout=2)
    base = net.nodes[old].status().last_index
    net.isolate(old)
    for i in range(5):
        net.propose(old, f"lost{i}".encode())  # appended by the old leader, never committed
    assert net.nodes[old].status().last_index == base + 5
    assert net.run_until(lambda: net.stable_leader() not in (None, old), timeout=10)
    new = net.stable_leader()
    assert new is not None
    net.propose(new, b"kept")
    others = [i for i in IDS5 if i != old]
    assert net.run_until(lambda: _all_applied(net, [b"committed", b"kept"], others), timeout=2)
    net.recover()
    assert net.run_until(lambda: _all_applied(net, [b"committed", b"kept"], IDS5), timeout=5)
    logs = {i: net.disks[i].entries for i in IDS5}
    assert all(log == logs[new] for log in logs.values()), "persisted logs converge"
    assert not any(e.data.startswith(b"lost") for e in net.disks[old].entries)


def test_replication_far_behind_follower_catches_up_with_few_rejections() -> None:
    config = RaftConfig(max_append_entries=16)
    net, lead = _elected(IDS3, seed=1, config=config)
    lagger = next(i for i in IDS3 if i != lead)
    net.isolate(lagger)
    data = [f"cmd{i}".encode() for i in range(300)]
    for d in data:
        net.propose(lead, d)
    others = [i for i in IDS3 if i != lagger]
    assert net.run_until(lambda: _all_applied(net, data, others), timeout=2)
    before, healed_at = len(net.sent), net.now
    net.recover()
    assert net.run_until(lambda: _all_applied(net, data, IDS3), timeout=5)
    # Each acknowledgement pulls the next batch at once, not one batch per heartbeat.
    assert net.now - healed_at < 2 * RaftConfig().heartbeat_interval
    after = net.sent[before:]
    rejects = [m for m in after if m.type is MessageType.APPEND_RESP and m.reject]
    assert len(rejects) <= 2, rejects  # one probe, then the hint jumps straight to its log end
    appends = [m for m in after if m.type is MessageType.APPEND and m.dst == lagger]
    assert max(len(m.entries) for m in appends) <= 16
    assert len(appends) < 40  # 300 entries / 16 per message, plus a few probes


def _pump(nodes: dict[str, RaftNode], now: float) -> list[Message]:
    """Delivers every message between ``nodes`` until quiet; returns them all."""
    sent: list[Message] = []
    while any(n.has_ready() for n in nodes.values()):
        for n in nodes.values():
            rd = n.ready()
            n.advance(rd)
            for m in rd.messages:
                sent.append(m)
                if m.dst in nodes:
                    nodes[m.dst].step(m, now)
    return sent


def test_replication_long_divergent_follower_log_backs_off_by_term() -> None:
    """A follower holding 100 entries of a stale term is repaired in two round trips."""
    head = [Entry(term=1, index=1, data=b"")]
    leader_log = head + [Entry(term=3, index=i, data=b"new") for i in range(2, 102)]
    follower_log = head + [Entry(term=2, index=i, data=b"stale") for i in range(2, 102)]
    leader = RaftNode(
        node_id="a",
        peers=["a", "b"],
        config=RaftConfig(pre_vote=False, max_append_entries=200),
        rng=random.Random(0),
        now=0.0,
        hard_state=HardState(term=3, vote="a", commit=1),
        entries=leader_log,
    )
    follower = RaftNode(
        node_id="b",
        peers=["a", "b"],
        config=RaftConfig(),
        rng=random.Random(1),
        now=0.0,
        hard_state=HardState(term=3, vote=None, commit=1),
        entries=follower_log,
    )
    leader.tick(leader.next_deadline())  # candidate in term 4, then leader with b's vote
    sent = _pump({"a": leader, "b": follower}, now=2.5)
    assert leader.status().role is Role.LEADER
    rejects = [m for m in sent if m.type is MessageType.APPEND_RESP and m.reject]
    assert len(rejects) == 1  # one probe at 101 finds the match at index 1 by term
    assert follower.status().last_index == follower.status().commit == 102


def test_replication_commits_only_current_term_entries_by_counting() -> None:
    """Raft §5.4.2 (Figure 8): an old-term entry on a majority is not committed by counting."""
    old = [Entry(term=1, index=1, data=b""), Entry(term=2, index=2, data=b"x")]
    leader = RaftNode(
        node_id="s1",
        peers=["s1", "s2", "s3", "s4", "s5"],
        config=RaftConfig(pre_vote=False),
        rng=random.Random(0),
        now=0.0,
        hard_state=HardState(term=3, vote=None, commit=1),
        entries=old,
    )
    leader.tick(leader.next_deadline())
    for voter in ("s2", "s3"):
        leader.step(Message(type=MessageType.VOTE_RESP, src=voter, dst="s1", term=4), now=2.0)
    assert leader.status().role is Role.LEADER
    assert leader.status().last_index == 3  # the no-op of term 4
    for peer in ("s2", "s3"):  # index 2 (term 2) is now on s1, s2, s3: a majority
        leader.step(Message(type=MessageType.APPEND_RESP, src=peer, dst="s1", term=4, index=2), 2.0)
    assert leader.status().commit == 1
    for peer in ("s2", "s3"):  # the term-4 no-op on a majority commits both
        leader.step(Message(type=MessageType.APPEND_RESP, src=peer, dst="s1", term=4, index=3), 2.0)
    assert leader.status().commit == 3


def test_replication_new_leader_finds_lagging_follower_by_hint() -> None:
    """A new leader knows nothing of a follower 300 entries behind; the hint jumps there."""
    net, lead = _elected(IDS3, seed=1)
    lagger = next(i for i in IDS3 if i != lead)
    net.isolate(lagger)
    data = [f"cmd{i}".encode() for i in range(300)]
    for d in data:
        net.propose(lead, d)
    others = [i for i in IDS3 if i != lagger]
    assert net.run_until(lambda: _all_applied(net, data, others), timeout=2)
    net.crash(lead)
    net.recover()
    before = len(net.sent)
    assert net.run_until(lambda: _all_applied(net, data, [lagger]), timeout=10)
    new = net.stable_leader()
    assert new not in (None, lead, lagger)  # the lagger's log is too old to win
    after = net.sent[before:]
    rejects = [m for m in after if m.type is MessageType.APPEND_RESP and m.reject]
    assert len(rejects) <= 2, rejects


def test_replication_heartbeat_commit_is_capped_by_follower_match() -> None:
    net, lead = _elected(IDS3, seed=5)
    lagger = next(i for i in IDS3 if i != lead)
    lagger_last = net.nodes[lagger].status().last_index
    net.drop(lead, lagger)  # the lagger hears nothing, but its answers would still arrive
    start = len(net.sent)
    for i in range(5):
        net.propose(lead, f"x{i}".encode())
    net.run_for(0.5)
    assert net.nodes[lead].status().commit == lagger_last + 5
    beats = [m for m in net.sent[start:] if m.type is MessageType.HEARTBEAT]
    assert {m.dst for m in beats} == set(IDS3) - {lead}
    assert all(m.commit == lagger_last for m in beats if m.dst == lagger)
    assert beats[-1].commit == lagger_last + 5 or beats[-2].commit == lagger_last + 5
    net.recover()
    assert net.run_until(lambda: net.nodes[lagger].status().commit == lagger_last + 5)


def test_replication_report_unreachable_is_only_a_hint() -> None:
    net, lead = _elected(IDS3, seed=6)
    st = net.nodes[lead].status()
    for peer in IDS3:
        if peer != lead:
            net.nodes[lead].report_unreachable(peer)
            net.nodes[peer].report_unreachable(lead)  # a follower has nothing to do with it
    assert net.nodes[lead].status() == st
    net.propose(lead, b"after-hint")
    assert net.run_until(lambda: _all_applied(net, [b"after-hint"]), timeout=2)


def test_replication_restart_replays_committed_entries() -> None:
    net, lead = _elected(IDS3, seed=7)
    data = [b"p", b"q", b"r"]
    for d in data:
        net.propose(lead, d)
    assert net.run_until(lambda: _all_applied(net, data), timeout=2)
    follower = next(i for i in IDS3 if i != lead)
    net.crash(follower)
    net.restart(follower)
    node = net.nodes[follower]
    assert node.status().applied == 0  # the harness already replayed the first Ready...
    net.run_for(0.5)
    assert net.data_applied(follower) == data
    assert node.status().term == net.nodes[lead].status().term


def test_replication_ready_entries_mark_truncation_point() -> None:
    node = RaftNode(
        node_id="b",
        peers=IDS3,
        config=RaftConfig(),
        rng=random.Random(0),
        now=0.0,
        hard_state=HardState(term=2, vote=None, commit=1),
        entries=[Entry(term=1, index=1, data=b""), Entry(term=2, index=2, data=b"old")],
    )
    new = Entry(term=3, index=2, data=b"new")
    node.step(
        Message(
            type=MessageType.APPEND,
            src="a",
            dst="b",
            term=3,
            index=1,
            log_term=1,
            entries=(new,),
            commit=2,
        ),
        now=0.0,
    )
    rd = node.ready()
    assert rd.entries == (new,)  # entries[0].index 2 <= last persisted 2: truncate from 2
    assert rd.committed_entries == (Entry(term=1, index=1, data=b""), new)  # replay from 1
    assert rd.hard_state == HardState(term=3, vote=None, commit=2)
    assert rd.messages[0].index == 2 and not rd.messages[0].reject


def test_replication_advance_twice_raises() -> None:
    net, lead = _elected(IDS3)
    node = net.nodes[lead]
    node.propose(b"x", net.now)
    rd = node.ready()
    node.advance(rd)
    with pytest.raises(ValueError):
        node.advance(rd)


@pytest.mark.parametrize(
    ("state", "match", "next_", "rejected", "hint", "moved", "new_next", "new_state"),
    [
        # PROBE: jump to the hint, never below match + 1; stale rejections change nothing.
        (ProgressState.PROBE, 0, 301, 300, 10, True, 11, ProgressState.PROBE),
        (ProgressState.PROBE, 5, 301, 300, 2, True, 6, ProgressState.PROBE),
        (ProgressState.PROBE, 0, 301, 300, 400, True, 300, ProgressState.PROBE),
        (ProgressState.PROBE, 0, 301, 250, 10, False, 301, ProgressState.PROBE),
        # REPLICATE: back to probing after the match; rejections at or below match are stale.
        (ProgressState.REPLICATE, 40, 90, 60, 45, True, 41, ProgressState.PROBE),
        (ProgressState.REPLICATE, 40, 90, 40, 10, False, 90, ProgressState.REPLICATE),
    ],
)
def test_replication_progress_backs_off_after_rejection(
    state: ProgressState,
    match: int,
    next_: int,
    rejected: int,
    hint: int,
    moved: bool,
    new_next: int,
    new_state: ProgressState,
) -> None:
    pr = Progress(next_index=next_, now=0.0)
    pr.match, pr.state, pr.paused = match, state, state is ProgressState.PROBE
    assert pr.maybe_decrease_to(rejected, hint) is moved
    assert (pr.next, pr.state) == (new_next, new_state)
    if moved:
        assert not pr.paused


@pytest.mark.parametrize(
    ("match", "next_", "acked", "updated", "new_match", "new_next"),
    [(3, 4, 7, True, 7, 8), (3, 9, 7, True, 7, 9), (7, 9, 5, False, 7, 9), (7, 8, 7, False, 7, 8)],
)
def test_replication_progress_update_is_monotonic(
    match: int, next_: int, acked: int, updated: bool, new_match: int, new_next: int
) -> None:
    pr = Progress(next_index=next_, now=0.0)
    pr.match = match
    assert pr.maybe_update(acked) is updated
    assert (pr.match, pr.next) == (new_match, new_next)


def test_replication_report_unreachable_restarts_from_match() -> None:
    net, lead = _elected(IDS3, seed=8)
    peer = next(i for i in IDS3 if i != lead)
    match = net.nodes[peer].status().last_index
    net.drop(lead, peer)
    for i in range(3):
        net.propose(lead, f"lost{i}".encode())  # streamed optimistically, lost
    net.nodes[lead].report_unreachable(peer)
    net.recover()
    start = len(net.sent)
    net.propose(lead, b"next")
    (append,) = [m for m in net.sent[start:] if m.type is MessageType.APPEND and m.dst == peer]
    assert append.index == match  # probing right after the last known match
    assert net.run_until(lambda: net.nodes[peer].status().commit == match + 4, timeout=1)


def test_replication_entries_overwritten_between_ready_and_advance_stay_unstable() -> None:
    node = RaftNode(node_id="b", peers=IDS3, config=RaftConfig(), rng=random.Random(0), now=0.0)

    def append(term: int, data: bytes) -> Message:
        entry = Entry(term=term, index=1, data=data)
        return Message(type=MessageType.APPEND, src="a", dst="b", term=term, entries=(entry,))

    node.step(append(1, b"old"), now=0.0)
    taken = node.ready()
    assert [e.data for e in taken.entries] == [b"old"]
    node.step(append(2, b"new"), now=0.1)  # a new leader overwrites index 1 meanwhile
    node.advance(taken)
    rd = node.ready()
    assert [e.data for e in rd.entries] == [b"new"]
