"""When a replica proposes its owed observations: few log entries for a join storm.

Sans-I/O: time is an argument (monotonic seconds). The observer sorts what it
owes into the three kinds below; the :class:`BatchPacer` says when the third
kind may go out; the replica proposes whatever is chosen in one
``ObserveBatch`` per tick (replica rule 2).

Why: a node becomes ALIVE in the entry that brings a quorum of replicas'
ALIVE observations together (tally rule 3), and every entry that changes the
view is an epoch (tally rule 6). Proposing every owed observation on every
turn of the driver made a join storm of 1,000 nodes within a second commit in
50 to 150 entries and 35 to 86 epochs (issue 12). Rate-limiting each replica
alone is not enough: three replicas cutting their batches at unrelated
moments each complete the quorum for the slice between their cuts, so the
epochs grow with the number of cuts of all replicas. Here one replica sets
the cuts and the others follow the log.

Rules:

1. Kinds. An owed observation ready to be proposed (new, or due for a retry:
   observer rule 2) is *urgent* when it is SUSPECT: a death is never held
   back (time to DEAD is the product). It *follows* when it is ALIVE at an
   incarnation for which the committed state already holds another voter's
   ALIVE observation: it completes (or adds to) what the log has, and goes
   out at once (a suspicion of this replica refuted goes out so too). Any
   other ALIVE observation is *held*: a node nobody has reported yet at that
   incarnation (typically a join), or a *late echo*, a node already ALIVE at
   it without this replica ever having reported that life (a replica behind
   on its heartbeats would otherwise add one entry per turn; its own lease
   to the node waits, the others' already hold a quorum).
2. The leader cuts. On the Raft leader, held observations go out at once
   when no held batch went out in the last ``interval`` seconds (leading
   edge: a lone join is not delayed), otherwise all together ``interval``
   seconds after the previous one (trailing edge). This is a leading-edge
   rate limit, as in Nagle's algorithm (RFC 896) and etcd raft's batching
   of proposals per Ready, applied to the one replica whose log order decides.
3. The others follow. On any other replica, held observations wait for the
   leader's batch to commit (they then *follow*, rule 1, and go out in the
   next tick); so every replica's observations of a storm's slice commit
   right after the leader's, and about one epoch is cut per leader batch. A
   held observation that did not come to follow within ``2 x interval``
   seconds of being ready (the leader does not hear that node, or there is no
   leader) goes out then, with every other held one.
4. ``interval = 0`` proposes everything at once on every tick (rules 1 to 3
   off): the behaviour before this module.
5. Retries (observer rule 2) are owed observations like new ones: a whole
   batch that was not committed becomes ready again at one moment and goes
   out again as one batch, never one entry per node.
6. One batch in flight. While an ALIVE observation of this replica is
   proposed and neither committed nor due for a retry, no other ALIVE
   observation goes out (following or held): they wait for that commit and
   then go out together, as Nagle's algorithm (RFC 896) holds small segments
   while one is unacknowledged. A replica behind on its heartbeats (a loaded
   one reads a storm's first heartbeats one driver turn at a time) otherwise
   proposed one entry per turn, each with one observation, each one more to
   replicate, fsync and apply while commits were already slow; with the rule
   its entries come no faster than its commits, however late it is. SUSPECT
   observations, and an ALIVE one that refutes this replica's committed
   suspicion (:func:`refutes`), are never held.

Costs: the followers propose a join only once the leader's observation is
committed, so a join is ALIVE one Raft round later than if every replica
proposed at once (a commit and an append: milliseconds on a LAN, more on a
starved machine); a join in a storm also waits up to ``interval`` for the
leader's cut; a node the leader does not hear joins up to ``2 x interval``
later. A SUSPECT is never delayed. Measured in the simulator
(``tests/sim/storm.py``): 1,000 joins within 1 s are ALIVE after 1.02 s in 6
epochs and 18 entries (1.01 s, 1,000 epochs, 3,000 entries at ``interval =
0``); with 3 % of messages lost (and duplicates, spikes), 17 to 20 epochs and
32 to 35 entries against 1,000 and about 3,540.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from arbiter.core.commands import Opinion
from arbiter.core.tally import MembershipState
from membership.shared.view import MemberState

__all__ = ["BatchPacer", "follows", "refutes"]


class BatchPacer:
    """The release time of held observations on one replica (rules 2 to 4).

    Args:
        interval: seconds between two held batches of the leader (rule 2);
            0 releases everything at once (rule 4).

    Attributes:
        leading: True while this replica is the Raft leader (set by the
            replica before each tick).

    Raises:
        ValueError: ``interval`` is negative or not finite.
    """

    __slots__ = ("_last", "interval", "leading")

    def __init__(self, interval: float) -> None:
        if not (math.isfinite(interval) and interval >= 0):
            raise ValueError(f"interval must be a finite number >= 0 seconds, got {interval!r}")
        self.interval = interval
        self.leading = False
        self._last = -math.inf

    @property
    def follow_wait(self) -> float:
        """Seconds a follower holds an observation that never comes to follow (rule 3)."""
        return 2 * self.interval

    def release_at(self, oldest: float) -> float:
        """The monotonic time at which held observations may go out.

        Args:
            oldest: when the oldest held observation became ready (seconds).

        Returns:
            ``oldest`` itself when pacing is off; on the leader the later of
            ``oldest`` and the previous held batch plus ``interval``; on any
            other replica ``oldest + 2 x interval``.
        """
        if self.interval <= 0:
            return oldest
        if self.leading:
            return max(oldest, self._last + self.interval)
        return oldest + self.follow_wait

    def released(self, now: float) -> None:
        """Records that held observations went out at ``now`` (the leader's next cut is
        ``interval`` later)."""
        self._last = now


def follows(
    opinion: Opinion,
    incarnation: int,
    node_id: str,
    me: str,
    voters: Sequence[str],
    state: MembershipState,
) -> bool:
    """True when an owed observation *follows* (rule 1): it is ALIVE, another voter's
    committed observation is ALIVE at its incarnation, and the node is not ALIVE at it
    already without replica ``me`` having reported that life (a late echo: held).

    Args:
        opinion: the owed observation's opinion.
        incarnation: its incarnation.
        node_id: the node observed.
        me: the observing replica.
        voters: the other voters of the configuration in force.
        state: the committed state machine.
    """
    if opinion is not Opinion.ALIVE:
        return False
    m, mine = state.member(node_id), state.observation(me, node_id)
    late = mine is None or mine.incarnation < incarnation  # never reported this life
    if late and m is not None and (m.incarnation, m.state) == (incarnation, MemberState.ALIVE):
        return False  # ALIVE without this replica: a late echo, held
    for r in voters:
        rec = state.observation(r, node_id)
        if rec is not None and rec.opinion is Opinion.ALIVE and rec.incarnation == incarnation:
            return True
    return False


def refutes(node_id: str, incarnation: int, me: str, state: MembershipState) -> bool:
    """True when an owed ALIVE observation of ``node_id`` at ``incarnation`` refutes
    replica ``me``'s committed SUSPECT observation of that life (rule 6: never held).

    Args:
        node_id: the node observed.
        incarnation: the owed observation's incarnation.
        me: the observing replica.
        state: the committed state machine.
    """
    rec = state.observation(me, node_id)
    return rec is not None and rec.opinion is Opinion.SUSPECT and rec.incarnation == incarnation
