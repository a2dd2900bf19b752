"""Raft consensus core: sans-I/O, deterministic, etcd-raft style.

``RaftNode`` takes time, messages and proposals in (``tick``, ``step``,
``propose``) and hands out what to persist, send and apply (``ready``), which
the shell acknowledges (``advance``). Algorithm: Ongaro & Ousterhout, "In
Search of an Understandable Consensus Algorithm", 2014, with PreVote (thesis
§9.6), CheckQuorum (thesis §6.2) and log compaction by snapshots (§7).
"""

from arbiter.core.raft.config import RaftConfig, Rng
from arbiter.core.raft.errors import ConflictingState, InvalidInput, ProposalDropped, RaftError
from arbiter.core.raft.messages import (
    Entry,
    HardState,
    Message,
    MessageType,
    RaftStatus,
    Ready,
    Role,
    Snapshot,
)
from arbiter.core.raft.node import RaftNode
from arbiter.core.raft.quorum import committed_index, quorum_size

__all__ = [
    "ConflictingState",
    "Entry",
    "HardState",
    "InvalidInput",
    "Message",
    "MessageType",
    "ProposalDropped",
    "RaftConfig",
    "RaftError",
    "RaftNode",
    "RaftStatus",
    "Ready",
    "Rng",
    "Role",
    "Snapshot",
    "committed_index",
    "quorum_size",
]
