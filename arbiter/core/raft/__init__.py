"""Raft consensus core: sans-I/O, deterministic, etcd-raft style.

``RaftNode`` takes time, messages and proposals in (``tick``, ``step``,
``propose``) and hands out what to persist, send and apply (``ready``), which
the shell acknowledges (``advance``). Algorithm: Ongaro & Ousterhout, "In
Search of an Understandable Consensus Algorithm", 2014, with PreVote (thesis
§9.6) and CheckQuorum (thesis §6.2).
"""

from arbiter.core.raft.config import RaftConfig, Rng
from arbiter.core.raft.errors import InvalidInput, ProposalDropped, RaftError
from arbiter.core.raft.messages import (
    Entry,
    HardState,
    Message,
    MessageType,
    RaftStatus,
    Ready,
    Role,
)
from arbiter.core.raft.node import RaftNode
from arbiter.core.raft.quorum import committed_index, quorum_size

__all__ = [
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
    "committed_index",
    "quorum_size",
]
