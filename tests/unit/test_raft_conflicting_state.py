"""Peer messages the Raft core refuses with an error, never an ``assert`` (which ``-O`` strips).

Each case steps one message from another replica that the core used to
check with an ``assert``: a malformed APPEND or SNAPSHOT (``InvalidInput``), or
one that contradicts this replica's durable state (``ConflictingState``: a
commit beyond its log, two leaders in a term, an acknowledgement beyond the
leader's log). The same cases run again in a ``python -O`` subprocess.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from arbiter.core.raft import (
    ConflictingState,
    Entry,
    HardState,
    InvalidInput,
    Message,
    MessageType,
    RaftConfig,
    RaftError,
    RaftNode,
    Role,
    Snapshot,
)
from arbiter.errors import ArbiterError

ROOT = Path(__file__).resolve().parents[2]
IDS3 = ["a", "b", "c"]


def _node(**kwargs: object) -> RaftNode:
    return RaftNode(
        node_id="a",
        peers=IDS3,
        config=RaftConfig(pre_vote=False),
        rng=random.Random(0),
        now=0.0,
        **kwargs,  # type: ignore[arg-type]
    )


def _follower_of_b() -> RaftNode:
    """Replica a, follower of b in term 1, log and commit empty."""
    node = _node(hard_state=HardState(term=1, vote=None, commit=0))
    node.step(Message(type=MessageType.HEARTBEAT, src="b", dst="a", term=1, commit=0), 0.1)
    st = node.status()
    if (st.role, st.leader, st.term) != (Role.FOLLOWER, "b", 1):
        raise RuntimeError(f"setup: {st}")
    return node


def _leader() -> RaftNode:
    """Replica a, leader of term 1 with its no-op at index 1."""
    node = _node()
    node.tick(node.next_deadline())
    node.step(Message(type=MessageType.VOTE_RESP, src="b", dst="a", term=1), 2.5)
    if node.status().role is not Role.LEADER:
        raise RuntimeError(f"setup: {node.status()}")
    return node


def _step(node: RaftNode, **fields: object) -> RaftNode:
    node.step(Message(dst="a", **fields), 3.0)  # type: ignore[arg-type]
    return node


def heartbeat_commit_beyond_log() -> RaftNode:
    node = _follower_of_b()
    return _step(node, type=MessageType.HEARTBEAT, src="b", term=1, commit=5)


def second_leader_append_to_leader() -> RaftNode:
    return _step(_leader(), type=MessageType.APPEND, src="b", term=1, index=0, log_term=0)


def second_leader_heartbeat_to_leader() -> RaftNode:
    return _step(_leader(), type=MessageType.HEARTBEAT, src="b", term=1, commit=0)


def second_leader_heartbeat_to_follower() -> RaftNode:
    return _step(_follower_of_b(), type=MessageType.HEARTBEAT, src="c", term=1, commit=0)


def ack_beyond_leader_log() -> RaftNode:
    return _step(_leader(), type=MessageType.APPEND_RESP, src="b", term=1, index=7)


def _append_with_gap(node: RaftNode) -> RaftNode:
    gap = (Entry(term=1, index=2, data=b"x"),)
    return _step(node, type=MessageType.APPEND, src="b", term=1, index=0, log_term=0, entries=gap)


def append_with_gap() -> RaftNode:
    return _append_with_gap(_follower_of_b())


def append_entry_of_future_term() -> RaftNode:
    future = (Entry(term=2, index=1, data=b"x"),)
    node = _follower_of_b()
    return _step(node, type=MessageType.APPEND, src="b", term=1, index=0, entries=future)


def snapshot_missing() -> RaftNode:
    return _step(_follower_of_b(), type=MessageType.SNAPSHOT, src="b", term=1, commit=3)


def snapshot_at_index_zero() -> RaftNode:
    snap = Snapshot(index=0, term=1, data=b"")
    return _step(_follower_of_b(), type=MessageType.SNAPSHOT, src="b", term=1, snapshot=snap)


def snapshot_of_future_term() -> RaftNode:
    snap = Snapshot(index=4, term=2, data=b"s")
    return _step(_follower_of_b(), type=MessageType.SNAPSHOT, src="b", term=1, snapshot=snap)


CASES: list[tuple[Callable[[], RaftNode], type[RaftError]]] = [
    (heartbeat_commit_beyond_log, ConflictingState),
    (second_leader_append_to_leader, ConflictingState),
    (second_leader_heartbeat_to_leader, ConflictingState),
    (second_leader_heartbeat_to_follower, ConflictingState),
    (ack_beyond_leader_log, ConflictingState),
    (append_with_gap, InvalidInput),
    (append_entry_of_future_term, InvalidInput),
    (snapshot_missing, InvalidInput),
    (snapshot_at_index_zero, InvalidInput),
    (snapshot_of_future_term, InvalidInput),
]


@pytest.mark.parametrize(("case", "error"), CASES, ids=[c.__name__ for c, _ in CASES])
def test_raft_peer_message_contradicting_state_raises(
    case: Callable[[], RaftNode], error: type[RaftError]
) -> None:
    with pytest.raises(error):
        case()


def test_raft_conflicting_heartbeat_leaves_log_and_commit_unchanged() -> None:
    node = _follower_of_b()
    before = node.status()
    with pytest.raises(ConflictingState):
        _step(node, type=MessageType.HEARTBEAT, src="b", term=1, commit=5)
    after = node.status()
    assert (after.commit, after.last_index, after.leader) == (0, 0, "b")
    assert after == before
    assert not node.ready().committed_entries


def test_raft_malformed_append_leaves_log_unchanged() -> None:
    node = _follower_of_b()
    with pytest.raises(InvalidInput):
        _append_with_gap(node)
    assert node.status().last_index == 0
    assert not node.ready().entries


def test_raft_second_leader_keeps_this_leaders_role_and_log() -> None:
    node = _leader()
    before = node.status()
    with pytest.raises(ConflictingState, match="two leaders in term 1"):
        _step(node, type=MessageType.APPEND, src="b", term=1, index=0, log_term=0)
    assert node.status() == before


def test_raft_errors_share_the_arbiter_root_and_keep_their_bases() -> None:
    from arbiter.core.commands import CommandDecodeError
    from arbiter.core.replica import RestoreError
    from arbiter.core.tally import SnapshotDecodeError
    from arbiter.server.consensus.storage import StorageError

    assert issubclass(ConflictingState, RaftError)
    assert not issubclass(ConflictingState, AssertionError)
    for cls in (RaftError, CommandDecodeError, SnapshotDecodeError, RestoreError, StorageError):
        assert issubclass(cls, ArbiterError), cls
    for cls in (InvalidInput, CommandDecodeError, SnapshotDecodeError, RestoreError):
        assert issubclass(cls, ValueError), cls
    assert issubclass(StorageError, OSError)
    assert StorageError(2, "gone").errno == 2


_UNDER_O = """
import sys
from tests.unit import test_raft_conflicting_state as t
print("optimize", sys.flags.optimize)
for case, error in t.CASES:
    try:
        case()
    except error:
        print(case.__name__, "raised", error.__name__)
    except BaseException as e:
        print(case.__name__, "raised", type(e).__name__, e)
    else:
        print(case.__name__, "accepted the message")
"""


def test_raft_peer_message_checks_survive_python_O() -> None:
    out = subprocess.run(
        [sys.executable, "-O", "-c", _UNDER_O],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    expected = ["optimize 1"] + [f"{c.__name__} raised {e.__name__}" for c, e in CASES]
    assert out.stdout.splitlines() == expected, out.stdout + out.stderr
