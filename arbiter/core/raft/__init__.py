"""Raft consensus core: sans-I/O, deterministic, etcd-raft style.

``RaftNode`` takes time, messages and proposals in (``tick``, ``step``,
``propose``) and hands out what to persist, send and apply (``ready``), which
the shell acknowledges (``advance``). Algorithm: Ongaro & Ousterhout, "In
Search of an Understandable Consensus Algorithm", 2014, with PreVote (thesis
§9.6), CheckQuorum (thesis §6.2), log compaction by snapshots (§7) and
single-server membership changes with learners (thesis §4.1-4.2; see
``configuration`` and ``membership``).
"""

from arbiter.core.raft.config import RaftConfig, Rng
from arbiter.core.raft.configuration import (
    EMPTY,
    ArbiterConfiguration,
    ConfChange,
    ConfChangeOp,
    decode_change,
    encode_change,
)
from arbiter.core.raft.errors import (
    ConflictingState,
    InvalidInput,
    ProposalDropped,
    RaftError,
    TermNotCommitted,
)
from arbiter.core.raft.messages import (
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    PeerProgress,
    RaftStatus,
    Ready,
    Role,
    Snapshot,
)
from arbiter.core.raft.node import RaftNode
from arbiter.core.raft.quorum import committed_index, quorum_size

__all__ = [
    "EMPTY",
    "ArbiterConfiguration",
    "ConfChange",
    "ConfChangeOp",
    "ConflictingState",
    "Entry",
    "EntryType",
    "HardState",
    "InvalidInput",
    "Message",
    "MessageType",
    "PeerProgress",
    "ProposalDropped",
    "RaftConfig",
    "RaftError",
    "RaftNode",
    "RaftStatus",
    "Ready",
    "Rng",
    "Role",
    "Snapshot",
    "TermNotCommitted",
    "committed_index",
    "decode_change",
    "encode_change",
    "quorum_size",
]
