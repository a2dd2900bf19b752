"""Follower side of the leader's messages: APPEND, SNAPSHOT and HEARTBEAT answered.

Each function takes the follower's log and a message of its current term
from its leader, changes the log in place and returns the answer. The
answer leaves in the same Ready as the log change, so after it is durable
(the Ready order: persist, then send). Rules (Ongaro & Ousterhout, "In
Search of an Understandable Consensus Algorithm", 2014, §5.3 and §7; etcd
raft ``handleAppendEntries``, ``handleSnapshot``, ``handleHeartbeat``):

1. APPEND: one whose previous entry does not match is refused with a hint,
   the last index whose term is at most the leader's term for that entry
   (etcd ``findConflictByTerm``), so one round trip skips a whole divergent
   term; one below the commit index is answered with the commit index.
2. SNAPSHOT at or below the commit index brings nothing: it is answered with
   the commit index.
3. SNAPSHOT whose last entry (index and term) the log already holds only
   moves the commit index up to it; the log is kept, and the leader sends
   what follows by APPEND.
4. Any other SNAPSHOT replaces the whole log; it is handed out in
   ``Ready.snapshot`` to persist and to restore the state machine from, and
   answered with the new last index, the snapshot's. Snapshots are answered
   with an APPEND_RESP, so the leader needs no second kind of acknowledgement.
5. HEARTBEAT raises the commit index to the one it carries, which the
   leader caps at what it knows this log holds.
"""

from __future__ import annotations

from dataclasses import replace

from arbiter.core.raft.configuration import decode_change
from arbiter.core.raft.errors import ConflictingState, InvalidInput
from arbiter.core.raft.log import RaftLog
from arbiter.core.raft.messages import EntryType, Message, MessageType

__all__ = ["answer_append", "answer_heartbeat", "answer_snapshot"]


def _answer(msg: Message, type_: MessageType) -> Message:
    return Message(type=type_, src=msg.dst, dst=msg.src, term=msg.term)


def answer_append(log: RaftLog, msg: Message) -> Message:
    """AppendEntries (rule 1); returns the APPEND_RESP.

    Args:
        log: the follower's log; changed in place.
        msg: an APPEND of the follower's current term from its leader.

    Raises:
        InvalidInput: if the entries do not follow ``msg.index`` one by one,
            or one has a term above the message's (malformed); the log is
            left unchanged.
    """
    for pos, e in enumerate(msg.entries):
        if not (e.index == msg.index + 1 + pos and e.term <= msg.term):
            raise InvalidInput(f"malformed APPEND {msg}")
        if e.type is EntryType.CONFIG:
            decode_change(e.data, e.index)  # raises InvalidInput before the log changes
    resp = _answer(msg, MessageType.APPEND_RESP)
    if msg.index < log.committed:
        return replace(resp, index=log.committed)
    last_new = log.maybe_append(msg.index, msg.log_term, msg.commit, msg.entries)
    if last_new is not None:
        return replace(resp, index=last_new)
    hint, hint_term = log.find_conflict_by_term(msg.index, msg.log_term)
    return replace(resp, index=msg.index, reject=True, reject_hint=hint, log_term=hint_term)


def answer_snapshot(log: RaftLog, msg: Message) -> Message:
    """InstallSnapshot (rules 2 to 4); returns the APPEND_RESP.

    Args:
        log: the follower's log; changed in place.
        msg: a SNAPSHOT of the follower's current term from its leader.

    Raises:
        InvalidInput: for a SNAPSHOT without a snapshot, at index 0, or
            with a term above the message's (malformed); the log is left
            unchanged.
    """
    snap = msg.snapshot
    if snap is None or snap.index <= 0 or snap.term > msg.term:
        raise InvalidInput(f"malformed {msg}")
    resp = _answer(msg, MessageType.APPEND_RESP)
    if snap.index <= log.committed:
        return replace(resp, index=log.committed)
    if log.matches(snap.index, snap.term):
        log.commit_to(snap.index)
        return replace(resp, index=log.committed)
    log.restore(snap)
    return replace(resp, index=log.last_index)


def answer_heartbeat(log: RaftLog, msg: Message) -> Message:
    """Heartbeat (rule 5); returns the HEARTBEAT_RESP.

    Raises:
        ConflictingState: if the commit index is beyond this log: the leader
            believes this replica holds entries it does not (its durable
            state was lost); the log is left unchanged.
    """
    if msg.commit > log.last_index:
        raise ConflictingState(
            f"heartbeat commit {msg.commit} beyond my last index {log.last_index}"
        )
    log.commit_to(msg.commit)
    return _answer(msg, MessageType.HEARTBEAT_RESP)
