"""The data the Raft core takes in and hands out: entries, messages, states.

Everything here is plain, immutable data (frozen dataclasses, enums); the
shell maps it to and from the wire by field and enum name. The message set
and field meanings follow etcd raft (``raftpb.Message``), trimmed to what
this group needs (Ongaro & Ousterhout, "In Search of an Understandable
Consensus Algorithm", 2014, Fig. 2 and §7 for snapshots; Ongaro's thesis,
2014, §9.6 for PreVote and §4 for membership changes: ``EntryType.CONFIG``,
``Snapshot.configuration``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from arbiter.core.raft.configuration import ArbiterConfiguration

__all__ = [
    "Entry",
    "EntryType",
    "HardState",
    "Message",
    "MessageType",
    "PeerProgress",
    "RaftStatus",
    "Ready",
    "Role",
    "Snapshot",
]


class EntryType(enum.Enum):
    """What a log entry carries (etcd raft ``EntryNormal``/``EntryConfChange``)."""

    NORMAL = "normal"
    """A command for the state machine (or the leader's no-op, ``b""``)."""
    CONFIG = "config"
    """A configuration change: ``data`` is :func:`~arbiter.core.raft.configuration.encode_change`
    bytes. Raft acts on it as soon as it is in the log (thesis §4.1); the state machine
    learns it when it is applied, through ``Ready.committed_entries``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One log entry.

    Attributes:
        term: the term of the leader that created the entry.
        index: its position in the log, from 1.
        data: opaque command bytes. ``b""`` is the no-op entry a new leader
            appends at once (Raft §8); the state machine skips it. For a
            CONFIG entry, the encoded configuration change.
        type: NORMAL or CONFIG. Storage and the wire keep it with
            :mod:`arbiter.core.raft.codec`.
    """

    term: int
    index: int
    data: bytes
    type: EntryType = EntryType.NORMAL


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """The state machine as of a log position; it stands for every entry up to it (§7).

    Attributes:
        index: the last log index the snapshot covers (0: nothing, the empty log).
        term: the term of the entry at ``index`` (0 with ``index`` 0).
        data: the state machine's bytes after applying entries 1..``index``;
            opaque to Raft (left out of ``repr``, only its size is shown).
        configuration: the arbiter configuration in force at ``index`` (etcd's
            ``ConfState`` in the snapshot metadata), or None for a snapshot
            written before configurations were replicated: the replica then
            keeps the configuration it was started with. Storage and the wire
            keep it with :mod:`arbiter.core.raft.codec`.
    """

    index: int
    term: int
    data: bytes
    configuration: ArbiterConfiguration | None = None

    def __repr__(self) -> str:
        return (
            f"Snapshot(index={self.index}, term={self.term}, data=<{len(self.data)} bytes>, "
            f"configuration={self.configuration!r})"
        )


class MessageType(enum.Enum):
    """Kinds of message between replicas (the shell maps them by name)."""

    VOTE = "vote"
    """RequestVote: ``term`` is the candidate's term; ``index``/``log_term`` its last entry."""
    VOTE_RESP = "vote_resp"
    """Answer to VOTE: granted unless ``reject``."""
    PRE_VOTE = "pre_vote"
    """PreVote (thesis §9.6): like VOTE with ``term`` = the term the sender *would* campaign at;
    nobody changes term or vote because of it."""
    PRE_VOTE_RESP = "pre_vote_resp"
    """Answer to PRE_VOTE: a grant echoes the requested ``term``, a reject carries the voter's."""
    APPEND = "append"
    """AppendEntries: ``index``/``log_term`` name the entry preceding ``entries``; ``commit``
    is the leader's commit index."""
    APPEND_RESP = "append_resp"
    """Answer to APPEND: accepted -> ``index`` is the last index now known to match; rejected ->
    ``index`` is the rejected prev index, ``reject_hint``/``log_term`` a guess of where the
    logs may match."""
    HEARTBEAT = "heartbeat"
    """Leader liveness; ``commit`` = min(leader commit, follower's match index) (etcd)."""
    HEARTBEAT_RESP = "heartbeat_resp"
    """Answer to HEARTBEAT."""
    SNAPSHOT = "snapshot"
    """InstallSnapshot (§7, etcd MsgSnap): ``snapshot`` is the leader's latest snapshot, sent
    when the entries a follower needs were compacted away. The follower answers with an
    APPEND_RESP: ``index`` is its last index after restoring the snapshot, or its commit
    index if it already held everything the snapshot covers."""
    PROPOSE = "propose"
    """A proposal forwarded by a follower to its leader (etcd MsgProp): ``entries`` carry the
    data with ``term``/``index`` 0, and the message's own ``term`` is always 0 (proposals are
    not subject to term checks)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One Raft message from replica ``src`` to replica ``dst``.

    Attributes:
        type: what the message is; see :class:`MessageType` for field use.
        src: the sender's replica id.
        dst: the receiver's replica id (never equal to ``src``).
        term: the sender's term (for PRE_VOTE: the term it would campaign at;
            for PROPOSE: 0).
        log_term: APPEND: term of the entry at ``index``; VOTE/PRE_VOTE: the
            candidate's last log term; rejected APPEND_RESP: term of the entry
            at ``reject_hint`` on the follower (0 if unknown).
        index: APPEND: the index preceding ``entries``; VOTE/PRE_VOTE: the
            candidate's last index; APPEND_RESP: last matched index, or the
            rejected ``index`` if ``reject``.
        entries: the entries carried (APPEND, PROPOSE).
        commit: the leader's commit index (APPEND, HEARTBEAT).
        reject: the request was refused (VOTE_RESP, PRE_VOTE_RESP, APPEND_RESP).
        reject_hint: rejected APPEND_RESP: the highest index at which the
            follower's log may still match the leader's (at most its last
            index), so the leader can back off in one step (etcd).
        snapshot: the snapshot carried (SNAPSHOT only).
    """

    type: MessageType
    src: str
    dst: str
    term: int
    log_term: int = 0
    index: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    snapshot: Snapshot | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HardState:
    """The state that must be durable before dependent messages leave (Raft Fig. 2).

    Attributes:
        term: the latest term this replica has seen.
        vote: the candidate it voted for in ``term``, or None.
        commit: its commit index (durable as a convenience: it can always be
            re-learnt from the leader).
    """

    term: int
    vote: str | None
    commit: int


class Role(enum.Enum):
    """A replica's role (PRE_CANDIDATE is from thesis §9.6)."""

    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerProgress:
    """The leader's view of one follower (etcd ``tracker.Progress``), for status and promotion.

    Attributes:
        match: the highest log index known to be stored on the peer.
        next: the index of the next entry the leader will send it.
        state: ``"probe"``, ``"replicate"`` or ``"snapshot"`` (how the leader sends).
        last_heard: seconds since the leader last heard an answer from it
            (as of the ``now`` given to ``RaftNode.status``; 0.0 without one).
        voter: whether it votes in the configuration in force.
        member: whether it is a member of the configuration in force (False:
            its removal is not committed yet; the leader still sends it the log).
    """

    match: int
    next: int
    state: str
    last_heard: float
    voter: bool
    member: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class RaftStatus:
    """A snapshot of one replica's Raft state, for status pages and tests.

    Attributes:
        id: this replica's id.
        role: its current role.
        term: its current term.
        leader: the leader it knows for ``term`` (itself if leader), or None.
        commit: its commit index.
        applied: the highest index handed out in ``Ready.committed_entries``
            and acknowledged with ``advance``.
        last_index: the index of its last log entry (0 if empty).
        snapshot_index: the index of its latest snapshot; entries up to it
            are compacted away (0: none).
        progress: on a leader, its view of every other member of the
            configuration in force, by replica id; empty on other roles.
        configuration: the configuration in force (the latest in its log,
            committed or not; thesis §4.1).
        removed: it is not a member of the latest committed configuration
            (a committed removal): it never campaigns again.
    """

    id: str
    role: Role
    term: int
    leader: str | None
    commit: int
    applied: int
    last_index: int
    snapshot_index: int = 0
    progress: Mapping[str, PeerProgress] = field(default_factory=dict)
    configuration: ArbiterConfiguration | None = None
    removed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Ready:
    """Everything the core wants done, handed out by ``RaftNode.ready()``.

    The caller must act in this order (etcd raft's ``Ready`` contract):

    1. persist, durably and atomically: ``snapshot`` (if not None; it
       replaces every persisted entry), ``hard_state`` (if not None) and
       ``entries``: if ``entries[0].index`` is at or below the last persisted
       index, first delete every persisted entry from that index on, then
       append;
    2. send ``messages``;
    3. restore the state machine from ``snapshot`` (if not None), then apply
       ``committed_entries`` to it, in order;
    4. call ``RaftNode.advance(ready)`` with this same object.

    Attributes:
        hard_state: the hard state to persist, or None if unchanged since the
            last ``advance``.
        entries: new or overwritten entries to persist, contiguous and in
            index order (after ``snapshot.index`` when there is a snapshot).
        messages: messages to send; none is addressed to this replica.
        committed_entries: committed entries not handed out before, in index
            order (they may include some of ``entries``: persist first; with a
            snapshot they start at ``snapshot.index + 1``).
        snapshot: a snapshot received from the leader, to persist and to
            restore the state machine from, or None. Snapshots this replica
            takes itself (``RaftNode.compact``) never appear here.
    """

    hard_state: HardState | None
    entries: tuple[Entry, ...]
    messages: tuple[Message, ...]
    committed_entries: tuple[Entry, ...]
    snapshot: Snapshot | None = None
