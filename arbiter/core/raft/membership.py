"""Membership changes: when a leader may propose one, and what follows from them.

Single-server changes with a learner phase (Ongaro, "Consensus: Bridging
Theory and Practice", PhD thesis, Stanford, 2014, §4.1-4.2; etcd raft's
learners and ``ConfChange``). The configuration itself, and what a change
may do to it, are in :mod:`arbiter.core.raft.configuration`.

Rules:

1. One change at a time. A leader refuses a change (``ProposalDropped``)
   while the configuration in force is not committed, and until the no-op of
   its own term is committed: a new leader may hold an uncommitted change of
   an earlier term in its log that a later leader could overwrite, so a
   change of its own made on top of it could commit under two configurations
   that do not overlap (the bug Ongaro reported on raft-dev, 2015; etcd waits
   the same way). Followers never forward a change: only the leader knows
   whether one is pending.
2. A change takes effect as soon as its entry is in a replica's log (thesis
   §4.1), committed or not, and is undone when the entry is truncated.
3. Removal. A leader removed from the configuration keeps leading, without
   counting itself towards commit or its lease, until the removal commits,
   then steps down (thesis §4.2.2). A replica that is not a member of the
   configuration committed in its log is *removed*: it never campaigns, and
   the shell stops it.
4. Promotion. With ``RaftConfig.auto_promote`` the leader proposes PROMOTE
   for a learner that has caught up (replication rule 9), checked at each
   heartbeat, one change at a time; ``promote`` by hand works either way.
"""

from __future__ import annotations

import math

from arbiter.core.raft.configuration import ArbiterConfiguration, ConfChange, encode_change
from arbiter.core.raft.errors import InvalidInput, ProposalDropped, TermNotCommitted
from arbiter.core.raft.log import RaftLog
from arbiter.core.raft.messages import Entry, EntryType, Message

__all__ = ["check_change", "config_entry", "forwarded", "is_removed", "leader_must_step_down"]


def check_change(
    change: ConfChange, *, leader: bool, log: RaftLog, term_start: float, node_id: str
) -> ArbiterConfiguration:
    """The configuration ``change`` would make if proposed now (rule 1).

    Args:
        change: the change asked for.
        leader: whether the proposing replica leads.
        log: its log.
        term_start: the index of its own term's no-op (``inf`` if not leader).
        node_id: its id (for messages).

    Raises:
        ProposalDropped: not the leader, a change is pending, or the leader's
            no-op is not committed yet.
        InvalidInput: the change does not apply to the configuration in force.
    """
    if not leader:
        raise ProposalDropped(f"{node_id} is not the leader: configuration changes go to it")
    conf = log.configuration
    if conf.index > log.committed:
        raise ProposalDropped(
            f"a configuration change (entry {conf.index}) is not committed yet; one at a time"
        )
    if math.isinf(term_start) or log.committed < term_start:
        raise TermNotCommitted(f"{node_id} has not committed an entry of its own term yet")
    return conf.apply(change, log.last_index + 1)


def config_entry(change: ConfChange, result: ArbiterConfiguration, term: int) -> Entry:
    """The CONFIG entry for ``change`` making ``result`` (its index is set on append)."""
    return Entry(term=term, index=0, data=encode_change(change, result), type=EntryType.CONFIG)


def forwarded(msg: Message, term: int) -> tuple[Entry, ...]:
    """The entries of a forwarded PROPOSE, for the leader's log at ``term``.

    Raises:
        InvalidInput: it carries a CONFIG entry (changes are never forwarded, rule 1).
    """
    if any(e.type is not EntryType.NORMAL for e in msg.entries):
        raise InvalidInput(f"PROPOSE from {msg.src} carries a configuration change")
    return tuple(Entry(term=term, index=0, data=e.data) for e in msg.entries)


def is_removed(log: RaftLog, node_id: str) -> bool:
    """Rule 3: ``node_id`` is not a member of the configuration committed in ``log``.

    A replica that knows no configuration yet (started to join) is not removed.
    """
    conf = log.configuration_at(log.committed)
    return bool(conf.voters) and node_id not in conf


def leader_must_step_down(log: RaftLog, node_id: str) -> bool:
    """Rule 3: the leader's removal (it is no voter) is committed."""
    conf = log.configuration
    return not conf.is_voter(node_id) and conf.index <= log.committed
