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
2a. Long storms space out (while gathering, :mod:`arbiter.core.gathering`:
   then every cut is one epoch). A storm is the run of cuts from a leading
   edge on, each of whose oldest observation was ready before the previous
   cut's spacing ran out. The spacing is ``interval`` for the first
   ``3 x interval`` seconds of a storm, then a third of the time the storm
   has lasted, at most ``5 x interval``: the tail of a join storm (nodes
   refused while the replicas were loaded, returning after their growing
   hints: docs/budget.md, "Shedding") was one epoch per ``interval`` for
   seconds. Measured with 1,000 joins, five runs each (docs/scale.md,
   "Gathering"): no growth, 9 to 14 epochs; a third up to ``3 x interval``,
   7 to 13; a third up to ``5 x interval``, 7 to 12 (9 of 10 runs at most
   10), the joins no slower than without gathering; half up to ``5 x
   interval``, 6 to 10 but one join of 8.4 s.
2b. One cut in flight (while gathering): the leader's next cut waits until
   its last one is applied here, as rule 6 holds a replica's own batches
   (Nagle's algorithm, RFC 896: one small segment unacknowledged). A cut
   then carries everything heard while the last one committed, so the cuts
   come no faster than the log commits them, however slow that is (the
   bench saw 0.4 to 0.7 s for one cut of 1,000 joins on 2 busy cores), and
   the epochs of a storm are about its length over the longer of
   ``interval`` and the commit time. The replica forgets the pending cut
   when it stops leading or once the observer's longest retry timeout
   passed (a safety net: a leader's entry commits or the leader steps down;
   what was lost is proposed again, observer rule 2).
3. The others follow. On any other replica, held observations wait for the
   leader's batch to commit (they then *follow*, rule 1, and go out in the
   next tick); so every replica's observations of a storm's slice commit
   right after the leader's, and about one epoch is cut per leader batch. A
   held observation that did not come to follow within ``2 x interval``
   seconds of being ready (the leader does not hear that node, or there is no
   leader) goes out then, with every other held one.
3a. While the leader gathers (:mod:`arbiter.core.gathering`, from rules
   version 3): a follower holds nothing (rule 3 off; its batches wait in the
   leader's gather instead), and the leader holds what *follows* too (rule
   1), a refutation excepted: every entry that can move the view is the
   leader's cut.
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
32 to 35 entries against 1,000 and about 3,540. With gathering (rules 2a,
2b, 3a): after 1.48 s in 7 epochs and 7 entries.
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
        gathering: True while the leader gathers the replicas' batches
            (:mod:`arbiter.core.gathering`, rule 1; set by the replica before
            each tick): the leader's cuts then wait the gather window after a
            quiet spell and space out in a long storm (rule 2a).
        pending: the log index of the gathering leader's last cut until this
            replica applied it (rule 2b; set and cleared by the replica), else None.

    Raises:
        ValueError: ``interval`` is negative or not finite.
    """

    __slots__ = ("_last", "_storm", "gathering", "interval", "leading", "pending")

    def __init__(self, interval: float) -> None:
        if not (math.isfinite(interval) and interval >= 0):
            raise ValueError(f"interval must be a finite number >= 0 seconds, got {interval!r}")
        self.interval = interval
        self.leading = False
        self.gathering = False
        self._last = -math.inf
        self._storm = -math.inf  # the first cut of the storm the last cut belongs to
        # The log index of the gathering leader's last cut until it is applied (rule 2b).
        self.pending: int | None = None

    @property
    def follow_wait(self) -> float:
        """Seconds a follower holds an observation that never comes to follow (rule 3)."""
        return 2 * self.interval

    @property
    def gather_window(self) -> float:
        """Seconds a gathering leader's cut after a quiet spell waits for the others'
        batches of the same heartbeats (``interval / 4``; gathering rule 3)."""
        return self.interval / 4

    @property
    def spacing(self) -> float:
        """Seconds from the leader's last cut to its next one (rules 2, 2a): ``interval``;
        while gathering, a third of the time the storm has lasted when that is longer, at
        most ``5 x interval``."""
        if not self.gathering:
            return self.interval
        lasted = self._last - self._storm
        return max(self.interval, min(5 * self.interval, lasted / 3))

    @property
    def last(self) -> float:
        """When held observations last went out (monotonic seconds; -inf: never)."""
        return self._last

    def release_at(self, oldest: float) -> float:
        """The monotonic time at which held observations may go out.

        Args:
            oldest: when the oldest held observation became ready (seconds).

        Returns:
            ``oldest`` itself when pacing is off; on the leader the later of
            ``oldest`` (plus the gather window while gathering) and the previous
            cut plus :attr:`spacing`, or ``inf`` while gathering and the last cut
            is :attr:`pending`; on any other replica ``oldest + 2 x interval``.
        """
        if self.interval <= 0:
            return oldest
        if self.leading:
            if self.gathering and self.pending is not None:
                return math.inf  # rule 2b: the last cut is not applied yet
            first = oldest + self.gather_window if self.gathering else oldest
            return max(first, self._last + self.spacing)
        return oldest + self.follow_wait

    def reset(self) -> None:
        """Forgets the last release: the next held batch goes out on a leading edge
        (gathering rule 3: gathering came into force)."""
        self._last = self._storm = -math.inf

    def released(self, now: float, oldest: float) -> None:
        """Records a cut at ``now`` whose oldest observation became ready at ``oldest``
        (seconds). It continues the storm when that observation was ready before the
        spacing ran out (it waited: a trailing edge); otherwise a storm starts (rule 2a).
        A second call for the same cut changes nothing."""
        if now == self._last:
            return
        if oldest >= self._last + self.spacing:
            self._storm = now  # a leading edge
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
