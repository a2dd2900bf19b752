"""The leader gathers the replicas' ALIVE batches into its cut: one epoch per slice of a storm.

Sans-I/O: time is an argument (monotonic seconds); the replica hands over the
forwarded proposals and asks what to propose.

Why: a node is ALIVE in the entry that completes a quorum of ALIVE
observations (tally rule 3), and every entry that changes the view is an
epoch (tally rule 6). With each replica's batch its own entry, the leader's
cut of a join storm's slice (:mod:`arbiter.core.batching`, rule 2) made one
epoch when the first follower's batch completed the quorum, another when the
second follower's completed what the first had not heard, and more where a
replica that read the storm late completed the others' quorums one driver
turn at a time: 10 to 28 epochs for 1,000 joins on a 2-core machine where the
simulator, whose replicas are never late, needs 6 (docs/scale.md). Pacing
each replica alone cannot help: two followers are a quorum of three. So the
followers' batches travel as today (a follower's proposal is forwarded to
the leader, Raft section 6, etcd's MsgProp) and the leader, instead of
appending each as its own entry, keeps them until its next cut and appends
them with its own in one entry (commands rule 2b; tally rule 2b). This is the
batching of proposals per Ready of etcd's raft, applied across replicas.

Rules:

1. In force. From rules version :data:`GATHER_RULES` on (tally rule 10: the
   leader raises it; every replica's code then decodes the entry) and while
   pacing is on (``observation_batch_interval`` > 0, batching rule 4).
2. What is gathered. On the leader, a forwarded PROPOSE whose every entry
   is an ObserveBatch of the sender itself holding only ALIVE observations,
   none of which refutes that replica's committed suspicion
   (:func:`arbiter.core.batching.refutes`, never held), is kept: per
   replica, the newest observation of each node (by incarnation, then seq,
   as the tally keeps them: tally rule 1), so a follower's retry of a batch
   still waiting here adds nothing to the entry. Anything else is stepped
   into Raft at once, as before: a suspicion is never delayed (time to DEAD
   is the product). A later suspicion overtaking a gathered ALIVE of the
   same replica is harmless: the tally keeps each replica's highest
   (incarnation, seq) whatever the order (tally rule 1).
3. When. The leader cuts when its own held observations go out (batching rule
   2) or when :meth:`BatchPacer.release_at` of the oldest gathered batch
   comes, whichever is first; its own held ones then go too, however young
   (the leader, the busiest replica, often hears a storm last: its
   observations must not wait for a cut of their own). Everything gathered,
   with the leader's own batch when that holds ALIVE observations only, goes
   in one ObserveBatches entry; one cut is in flight at a time (batching rule
   2b) and a long storm's cuts space out (batching rule 2a). A cut after a
   quiet spell (none within ``interval``) waits the *gather window*,
   ``interval / 4``, after its oldest observation: the replicas hear the same
   heartbeat within milliseconds of each other, and a cut at once would carry
   one replica's observation alone and leave the quorum to the next cut,
   ``interval`` later (the simulator's scenarios found it: a lone rejoin took
   0.42 s instead of 0.23 s). With the window a lone join is ALIVE after it
   and one Raft round, where the leader's leading edge and the followers'
   following took two rounds. The interval counts from the last cut made while
   gathering: the leader's cut just before gathering came into force (the
   Bootstrap that raises the rules version commits with a fresh cluster's
   first joins) does not delay the first gathered one.
4. Followers do not wait. While gathering is in force a follower holds
   nothing (batching rule 3 is off): it proposes what it hears at once,
   subject to one batch in flight (batching rule 6), and the leader's cut
   does the aligning. A node is ALIVE at the first cut after a quorum of
   replicas heard it.
5. A leader that steps down drops what it gathered (counted as dropped
   proposals); each follower proposes again after its retry timeout or as
   soon as it sees the new leader (retry rule 4), as for any proposal a
   deposed leader never appended.

Costs: the leader decodes each forwarded proposal once more (a few per
second per replica, since each follower has one batch in flight); a
follower's batch commits at the leader's next cut, up to the spacing
(``interval``; at most ``5 x interval`` in a long storm) plus one commit
later than when appended at once, while its held observations no longer wait
up to ``2 x interval`` for the leader's; one larger entry instead of up to
three. A join under a starved leader waits for that leader's cuts, where two
followers could complete a quorum without it: with four busy loops on 2
cores, 1,000 joins took 7 to 14 s against 7 to 12 s (docs/scale.md,
"Gathering"). Deaths do not wait: suspicions are never gathered.
"""

from __future__ import annotations

from collections.abc import Sequence

from arbiter.core.batching import refutes
from arbiter.core.commands import CommandDecodeError, Observation, ObserveBatch, Opinion, decode
from arbiter.core.raft import Entry, EntryType
from arbiter.core.tally import MembershipState

__all__ = ["GATHER_RULES", "Gather", "gatherable"]

GATHER_RULES = 3
"""The rules version from which the leader gathers the replicas' ALIVE batches (rule 1)."""


def gatherable(batch: ObserveBatch, sender: str, state: MembershipState) -> bool:
    """True when the leader may keep ``batch`` for its next cut (rule 2).

    Args:
        batch: a forwarded proposal's command.
        sender: the replica that forwarded it.
        state: the leader's committed state machine.
    """
    if batch.replica_id != sender or not batch.observations:
        return False
    for o in batch.observations:
        if o.opinion is not Opinion.ALIVE or refutes(o.node_id, o.incarnation, sender, state):
            return False
    return True


class Gather:
    """The forwarded ALIVE batches a leader keeps for its next cut (module rules).

    Attributes:
        dropped: batches dropped because this replica stopped leading (rule 5).
    """

    __slots__ = ("_kept", "_oldest", "dropped")

    def __init__(self) -> None:
        # replica id -> node id -> its newest observation (rule 2), replicas in arrival order
        self._kept: dict[str, dict[str, Observation]] = {}
        self._oldest: float | None = None
        self.dropped = 0

    def __len__(self) -> int:
        """How many replicas' batches are kept."""
        return len(self._kept)

    @property
    def oldest(self) -> float | None:
        """When the oldest kept batch arrived (monotonic seconds), None when empty."""
        return self._oldest

    def offer(
        self, sender: str, entries: Sequence[Entry], now: float, state: MembershipState
    ) -> bool:
        """Keeps a forwarded PROPOSE's batches when every one is gatherable (rule 2).

        Args:
            sender: the replica that forwarded it (the message's ``src``).
            entries: its entries.
            now: monotonic seconds.
            state: the committed state machine.

        Returns:
            True when kept (the caller does not step the message into Raft);
            False when the message must be stepped as before (nothing kept).
        """
        batches: list[ObserveBatch] = []
        for e in entries:
            if e.type is not EntryType.NORMAL or not e.data:
                return False
            try:
                command = decode(e.data)
            except CommandDecodeError:
                return False  # Raft appends it; the tally reports it (as before)
            if not isinstance(command, ObserveBatch) or not gatherable(command, sender, state):
                return False
            batches.append(command)
        if not batches:
            return False
        if self._oldest is None:
            self._oldest = now
        kept = self._kept.setdefault(sender, {})
        for b in batches:
            for o in b.observations:
                old = kept.get(o.node_id)
                if old is None or (o.incarnation, o.seq) > (old.incarnation, old.seq):
                    kept[o.node_id] = o
        return True

    def take(self) -> list[ObserveBatch]:
        """One batch per replica kept, in the order they first arrived, its observations by
        node id; the gather is empty afterwards (rule 3)."""
        out = [
            ObserveBatch(replica_id=r, observations=tuple(obs[n] for n in sorted(obs)))
            for r, obs in self._kept.items()
        ]
        self._kept, self._oldest = {}, None
        return out

    def drop(self) -> int:
        """Drops every kept batch (rule 5: this replica no longer leads); returns how many
        replicas' batches were dropped."""
        n = len(self._kept)
        self.dropped += n
        self._kept, self._oldest = {}, None
        return n
