"""The Ready cycle: what the shell must persist, send and apply, and its acknowledgement.

As in etcd raft's ``RawNode.Ready``/``Advance``: the core collects outgoing
messages and tracks what it last handed out; ``ready()`` shows the work
without changing anything, and ``advance(ready)`` records it as done. Inputs
stepped between the two stay for the next Ready. Because a Ready carries the
hard state together with every message queued so far, and the shell
persists before it sends, a term or vote change is durable before any
message that depends on it leaves (Ongaro & Ousterhout, "In Search of an
Understandable Consensus Algorithm", 2014, Fig. 2: "respond to RPCs" only
after updating stable storage). A snapshot restored from the leader is
handed out until acknowledged, and the entries to apply follow it.
"""

from __future__ import annotations

from typing import TypedDict, Unpack

from arbiter.core.raft.errors import InvalidInput
from arbiter.core.raft.log import RaftLog
from arbiter.core.raft.messages import Entry, HardState, Message, MessageType, Ready, Snapshot

__all__ = ["MessageFields", "Outbox"]


class MessageFields(TypedDict, total=False):
    """The optional fields of a ``Message`` (for typed ``**kwargs``)."""

    index: int
    log_term: int
    entries: tuple[Entry, ...]
    commit: int
    reject: bool
    reject_hint: int
    snapshot: Snapshot


class Outbox:
    """Queued messages and the hard state last acknowledged as persisted.

    Args:
        node_id: the sender of every message.
        log: the replica's log (its unstable and to-apply entries go out too).
        persisted: the hard state already durable (restored, or the zero state).
    """

    def __init__(self, node_id: str, log: RaftLog, persisted: HardState) -> None:
        self._id = node_id
        self._log = log
        self._persisted = persisted
        self.messages: list[Message] = []

    def send(
        self, type_: MessageType, dst: str, term: int, **fields: Unpack[MessageFields]
    ) -> None:
        """Queues a message from this replica; never to itself."""
        assert dst != self._id, f"{self._id}: no message to self"
        self.messages.append(Message(type=type_, src=self._id, dst=dst, term=term, **fields))

    def has_ready(self, hard_state: HardState) -> bool:
        """True if there is anything to persist, send or apply."""
        log = self._log
        return bool(
            self.messages
            or hard_state != self._persisted
            or log.unstable_from <= log.last_index
            or log.committed > log.applied
            or log.pending_snapshot is not None
        )

    def ready(self, hard_state: HardState) -> Ready:
        """The pending work, given the current hard state; changes nothing."""
        return Ready(
            hard_state=None if hard_state == self._persisted else hard_state,
            entries=self._log.unstable_entries(),
            messages=tuple(self.messages),
            committed_entries=self._log.entries_to_apply(),
            snapshot=self._log.pending_snapshot,
        )

    def advance(self, ready: Ready) -> None:
        """Records ``ready`` as persisted, sent and applied.

        Raises:
            InvalidInput: if ``ready`` is not the oldest unacknowledged Ready
                (taken twice, advanced twice, or out of order).
        """
        n = len(ready.messages)
        applied = ready.committed_entries
        snapshot = ready.snapshot
        base = self._log.applied if snapshot is None else snapshot.index
        if (
            tuple(self.messages[:n]) != ready.messages
            or (applied and applied[0].index != base + 1)
            or (snapshot is not None and snapshot.index <= self._log.applied)
        ):
            raise InvalidInput("advance() takes the Ready last returned by ready(), once")
        del self.messages[:n]
        if ready.hard_state is not None:
            self._persisted = ready.hard_state
        if snapshot is not None:
            self._log.snapshot_applied(snapshot)
        if ready.entries:
            self._log.stable_to(ready.entries[-1].index, ready.entries[-1].term)
        if applied:
            self._log.applied_to(applied[-1].index)
