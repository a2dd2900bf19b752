"""Sans-I/O core of a node's membership session: sequence numbers, leases, fencing, rejoin.

Time is the ``now`` argument (monotonic seconds); this module never reads a
clock, opens a socket or sleeps. :class:`membership._node.agent.NodeAgent` drives
it for :class:`membership._client.MembershipClient`. Its rules are the node's
half of the rules Leases and Fencing in docs/architecture.md ("Correctness
rules").

Rules:

1. Every heartbeat gets a new sequence number; the session remembers when
   (and at which incarnation) it sent each of the recent ones.
2. A lease in an ack is counted from the *send* time of the heartbeat it
   answers, which is no later than the arbiter's receipt, and ends
   ``lease_guard`` seconds early: the node's lease always ends before the
   arbiter's promise does (bounded clock-rate drift aside), by at least the
   guard, so that the node knows it is fenced before a quorum can even
   suspect it, also when its own process runs late by up to the guard.
   Acks for an older incarnation grant nothing.
3. The node is *fenced* while fewer than a quorum of arbiters have granted
   it an unexpired lease. It starts fenced. A node that is fenced cannot be
   relied on to be a member, whatever the last view said.
4. An ack saying the node's incarnation is DEAD (or that the cluster records a
   higher incarnation) ends that incarnation: with ``auto_rejoin`` the
   session continues at ``max(recorded, own) + 1``; its old leases are void.
   DEAD at its own incarnation is an eviction the node did not ask for: an
   :class:`Evicted` event comes before the :class:`Rejoined` one.
5. LEFT is final: after a graceful leave the session never rejoins. An ack
   saying LEFT for an incarnation the node did not leave itself (an
   administrator's removal, or someone else's Leave) ends the session too:
   it was removed, and says so (an :class:`Evicted` event).
6. Within one incarnation the state only moves forward (JOINING, ALIVE, then
   DEAD or LEFT): an ack from a replica that lags behind the commit cannot
   take an ALIVE node back to JOINING.
7. A node that was a member and learns that the cluster records a *higher*
   incarnation of its id was taken over (another process started with the
   same id): it is superseded and ends, without rejoining. Only a node
   that never became a member at its incarnation picks a higher one (rule 4).
8. A session ends for one :class:`EndReason` (``end_reason``): it left
   (:meth:`NodeSession.leave`), was removed (LEFT without asking), was
   declared DEAD with ``auto_rejoin`` off, or was superseded. An ended
   session sends nothing more and takes no ack.
9. The arbiter group changes (Raft single-server changes with learners):
   acks carry the configuration in force and its ``config_index``, and
   :meth:`NodeSession.configure` follows the highest index seen, never an
   older one. From then on the lease quorum is a strict majority of that
   configuration's *voters*, and only voters' leases count (a learner's
   never; a removed arbiter's no longer). This is safe for a node at most
   one single-server change behind the group: the majorities of two
   consecutive configurations intersect (Ongaro 2014, "Consensus: Bridging
   Theory and Practice", section 4.2), so a quorum of leases under the
   node's configuration and a quorum of suspicions under the group's share
   a replica that promised not to suspect it before its lease ran out. Once
   configured, ``cluster_size`` no longer raises the quorum (it is the
   voters' count of the answering replica's configuration, which may lag).
10. Grace windows (``arbiter/core/grace_windows.py``): an ack that grants a
   lease may carry the seconds left of the node's grace window at that
   arbiter and the window's grant (a log index). The node counts it as it
   counts a lease (rule 2: from the send time, ``lease_guard`` early), for
   that grant; an arbiter covers the node while its lease or its grace runs
   (rule 3). The arbiters withdraw a window that is ended or replaced, which
   only the node itself may ask for (``arbiter/core/grace.py`` rule 2), so
   counting a withdrawn one could outlive their promise: before the node
   asks for a window or for the end of one, it stops counting every grant
   (:meth:`NodeSession.end_grace`) and counts none until the answer names
   the entry committed (:meth:`NodeSession.grace_answered`): from then on
   only that grant and later ones (after an end: only later ones). An ask
   left unanswered (its entry may have committed unseen) leaves the node
   counting none until a later ask is answered.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from membership.shared.view import MemberState

__all__ = [
    "EndReason",
    "Evicted",
    "Fenced",
    "NodeSession",
    "Rejoined",
    "SessionEvent",
    "StateChanged",
    "Superseded",
]

_SENT_MEMORY = 64


@dataclass(slots=True)
class _Arbiter:
    sent: collections.OrderedDict[int, tuple[float, int]]
    lease_until: float = float("-inf")
    grace_until: float = float("-inf")  # rule 10
    grace_id: int = 0
    # The last ack's round trip (seconds, from the heartbeat's send) and when it came.
    rtt: float = 0.0
    rtt_at: float = float("-inf")

    def until(self) -> float:
        return max(self.lease_until, self.grace_until)


class NodeSession:
    """One node's view of its own membership.

    Args:
        node_id: the node's id (validated by the caller).
        incarnation: the starting incarnation (>= 1); a restarted process must
            use a higher one (the SDK uses wall-clock milliseconds).
        arbiters: every arbiter the node heartbeats to; quorum is a strict
            majority of them.
        auto_rejoin: continue at a higher incarnation when told DEAD.
        lease_guard: seconds by which each lease ends early (rule 2), >= 0.

    Raises:
        ValueError: for an incarnation < 1 or no arbiters.
    """

    def __init__(
        self,
        *,
        node_id: str,
        incarnation: int,
        arbiters: Sequence[str],
        auto_rejoin: bool = True,
        lease_guard: float = 0.0,
    ) -> None:
        if incarnation < 1:
            raise ValueError("incarnation must be >= 1")
        if not arbiters:
            raise ValueError("at least one arbiter is needed")
        self.node_id = node_id
        self.incarnation = incarnation
        self.auto_rejoin = auto_rejoin
        if lease_guard < 0:
            raise ValueError("lease_guard must be >= 0")
        self.lease_guard = lease_guard
        self.quorum = len(arbiters) // 2 + 1
        self.state = MemberState.JOINING
        self._arbiters = {a: _Arbiter(sent=collections.OrderedDict()) for a in arbiters}
        # Rule 9: the arbiters whose leases count, and the config_index followed (-1: none yet).
        self._voters = set(arbiters)
        self.config_index = -1
        self._seq = 0
        self._fenced = True
        self.fencing_epoch = 0
        self.grace_floor: float = 0  # rule 10: grants at or below it are not counted
        self.end_reason: EndReason | None = None
        # Set by the shell once it asked the cluster to let this node leave.
        self.leaving = False
        # Whether any arbiter ever answered (an ack at any incarnation).
        self.heard = False

    @property
    def ended(self) -> bool:
        """True once the session ended (rule 8): nothing more to send."""
        return self.end_reason is not None

    @property
    def left(self) -> bool:
        """True once the node is LEFT (it left, or was removed)."""
        return self.end_reason in (EndReason.LEFT, EndReason.REMOVED)

    @property
    def superseded(self) -> bool:
        """True once another process took this node id over (rule 7)."""
        return self.end_reason is EndReason.SUPERSEDED

    def reset(self, now: float) -> list[SessionEvent]:
        """The cluster was started again on fresh state (a new instance id): the leases
        and the fencing epoch were the old cluster's. Voids the leases (a Fenced event)
        and starts the fencing epoch again from the new cluster's epochs.

        Returns:
            The events (Fenced, when the node held a quorum of leases).
        """
        events = self._void_leases(now)
        self.fencing_epoch = 0
        return events

    def leave(self, now: float, joined: bool = True) -> list[SessionEvent]:
        """Records that the node left gracefully (its Leave was committed): rules 5, 8.

        Args:
            now: monotonic seconds.
            joined: the incarnation had joined the view (False: it was retired
                before it did; its state stays JOINING, as it never was a member).

        Returns:
            The events: leases void (Fenced) and, if it had joined, the state LEFT.
        """
        if self.ended:
            return []
        self.end_reason = EndReason.LEFT
        events = self._void_leases(now)
        return events + self._set_state(MemberState.LEFT) if joined else events

    def heartbeat(self, arbiter: str, now: float) -> tuple[int, int]:
        """Records a heartbeat about to be sent to ``arbiter`` at ``now`` (rule 1).

        Returns:
            ``(seq, incarnation)`` to put in the request.

        Raises:
            KeyError: for an arbiter not given at construction.
        """
        a = self._arbiters[arbiter]
        self._seq += 1
        a.sent[self._seq] = (now, self.incarnation)
        while len(a.sent) > _SENT_MEMORY:
            a.sent.popitem(last=False)
        return self._seq, self.incarnation

    def on_ack(
        self,
        arbiter: str,
        *,
        seq: int,
        lease: float,
        state: MemberState,
        recorded_incarnation: int,
        epoch: int,
        now: float,
        cluster_size: int = 0,
        grace: float = 0.0,
        grace_id: int = 0,
    ) -> list[SessionEvent]:
        """Takes one ack (rules 2 to 5, 10).

        Args:
            arbiter: which arbiter answered.
            seq: the sequence number the ack answers.
            lease: seconds granted, 0 for none.
            state: the node's state at the heartbeat's incarnation, per the arbiter.
            recorded_incarnation: the highest incarnation the cluster records.
            epoch: the arbiter's applied view epoch.
            now: monotonic seconds at receipt.
            cluster_size: the number of arbiters the cluster is configured
                with (0: unknown). The lease quorum is a majority of the
                larger of this and the arbiters given at construction, so a
                node that lists too few arbiters never believes it holds a
                quorum (rule 3).
            grace: seconds left of the node's grace window at the arbiter (rule 10).
            grace_id: the grant of that window (0: none).

        Returns:
            The events this ack caused, in order.
        """
        a = self._arbiters.get(arbiter)
        sent = None if a is None else a.sent.get(seq)  # None: an arbiter removed since (rule 9)
        if a is None or sent is None or self.ended:
            return []
        send_time, incarnation = sent
        self.heard = True
        a.rtt, a.rtt_at = max(0.0, now - send_time), now
        if cluster_size > 0 and self.config_index < 0:
            self.quorum = max(self.quorum, cluster_size // 2 + 1)
        if incarnation != self.incarnation:
            return []  # about an incarnation that is over (rule 2)
        events: list[SessionEvent] = []
        if state is MemberState.LEFT:
            # Its own leave, committed before the call answered (an ack came
            # first), or someone else's.
            self.end_reason = EndReason.LEFT if self.leaving else EndReason.REMOVED
            events = self._void_leases(now) + self._set_state(MemberState.LEFT)
            if not self.leaving:
                events.append(
                    Evicted(incarnation=self.incarnation, state=MemberState.LEFT, rejoining=False)
                )
            return events
        if recorded_incarnation > self.incarnation and self.state is not MemberState.JOINING:
            # Rule 7: a newer life of this id exists while this one was a
            # member. Fighting back with yet another incarnation would make
            # both processes flap; this one steps aside.
            self.end_reason = EndReason.SUPERSEDED
            events += self._void_leases(now)
            events += self._set_state(MemberState.DEAD)
            events.append(Superseded(incarnation=self.incarnation, by=recorded_incarnation))
            return events
        if state is MemberState.DEAD or recorded_incarnation > self.incarnation:
            reason = (
                "declared DEAD"
                if state is MemberState.DEAD
                else (f"the cluster records incarnation {recorded_incarnation}")
            )
            # Fencing is reported first: the application must stop acting as a
            # member before it hears anything else about this incarnation.
            events += self._void_leases(now)
            if state is MemberState.DEAD:
                events += self._set_state(MemberState.DEAD)
                if recorded_incarnation <= self.incarnation:  # its own life, not a newer one's
                    events.append(
                        Evicted(
                            incarnation=self.incarnation,
                            state=MemberState.DEAD,
                            rejoining=self.auto_rejoin,
                        )
                    )
            if self.auto_rejoin:
                old = self.incarnation
                self.incarnation = max(recorded_incarnation, self.incarnation) + 1
                events.append(
                    Rejoined(old_incarnation=old, new_incarnation=self.incarnation, reason=reason)
                )
                events += self._set_state(MemberState.JOINING)
            elif state is MemberState.DEAD:
                self.end_reason = EndReason.DEAD
            return events
        if lease > 0:
            a.lease_until = max(a.lease_until, send_time + lease - self.lease_guard)
            if grace > 0 and grace_id > self.grace_floor and grace_id >= a.grace_id:
                was = a.grace_until if grace_id == a.grace_id else float("-inf")
                a.grace_until = max(was, send_time + grace - self.lease_guard)
                a.grace_id = grace_id
        if not (state is MemberState.JOINING and self.state is MemberState.ALIVE):
            # A replica that has not applied the admission yet says JOINING:
            # committed states only move forward (rule 6).
            events += self._set_state(state)
        events += self._update_fence(now, epoch)
        return events

    def _set_state(self, state: MemberState) -> list[SessionEvent]:
        if state is self.state:
            return []
        self.state = state
        return [StateChanged(state=state, incarnation=self.incarnation)]

    def _void_leases(self, now: float) -> list[SessionEvent]:
        for a in self._arbiters.values():
            a.lease_until = a.grace_until = float("-inf")
        return self._update_fence(now, None)

    def _holding(self, now: float) -> int:
        return len(self.holders(now))

    def holders(self, now: float) -> list[str]:
        """The voters (as the shell names them, sorted) whose unexpired lease or grace
        window (rule 10) covers the node at ``now`` (monotonic seconds): the node is
        fenced while they are fewer than :attr:`quorum` (rule 3). Each ack renews its
        arbiter's lease well before it runs out, so the list changes only when an
        arbiter starts or stops granting (or the voters change), not at each renewal."""
        return sorted(k for k, a in self._arbiters.items() if k in self._voters and a.until() > now)

    @property
    def voters(self) -> int:
        """How many arbiters' leases count (rule 9: the configuration's voters)."""
        return len(self._voters)

    def next_expiry(self, now: float) -> float | None:
        """When (monotonic seconds) the first lease or grace window that covers the node
        at ``now`` runs out unless renewed: when :meth:`holders` may next shrink; None
        while none covers it."""
        return min(
            (a.until() for k, a in self._arbiters.items() if k in self._voters and a.until() > now),
            default=None,
        )

    def end_grace(self, now: float) -> list[SessionEvent]:
        """Stops counting every grace window (rule 10) until :meth:`grace_answered`: call
        before asking for a window or for the end of one.

        Returns:
            The events (Fenced, when only a window held the node's quorum).
        """
        self.grace_floor = float("inf")
        for a in self._arbiters.values():
            a.grace_until = float("-inf")
        return self._update_fence(now, None)

    def grace_answered(self, index: int, granted: bool) -> None:
        """The node's ask was committed at log ``index`` (rule 10): a window (``granted``,
        then ``index`` is its grant) is counted, and later ones; after an end, later ones."""
        self.grace_floor = index - 1 if granted else index

    def grace(self, grant: int, now: float) -> float:
        """Seconds of window ``grant`` (0: of any it counts) the node holds at ``now`` from a
        quorum of voters (rule 10: the quorum-th longest); 0.0 while fewer acked it."""
        ends = sorted(
            (
                a.grace_until
                for k, a in self._arbiters.items()
                if k in self._voters
                and a.grace_id > self.grace_floor
                and a.grace_id == (grant or a.grace_id)
            ),
            reverse=True,
        )
        return max(0.0, ends[self.quorum - 1] - now) if len(ends) >= self.quorum else 0.0

    def configure(
        self, voters: Sequence[str], learners: Sequence[str], index: int, now: float
    ) -> list[SessionEvent]:
        """Follows the arbiter configuration of log index ``index`` (rule 9).

        Args:
            voters: the arbiters (as the shell names them) whose leases count.
            learners: arbiters heartbeated to whose leases do not count.
            index: the configuration's ``config_index``; one not above the
                one followed is ignored.
            now: monotonic seconds.

        Returns:
            The events (Fenced, when the node no longer holds a quorum of the
            new configuration's voters, or now does).

        Raises:
            ValueError: no voters.
        """
        if index <= self.config_index:
            return []
        if not voters:
            raise ValueError("a configuration has at least one voter")
        self.config_index = index
        keep = set(voters) | set(learners)
        for key in list(self._arbiters):
            if key not in keep:
                del self._arbiters[key]
        for key in keep:
            self._arbiters.setdefault(key, _Arbiter(sent=collections.OrderedDict()))
        self._voters = set(voters)
        self.quorum = len(self._voters) // 2 + 1
        return self._update_fence(now, None)

    def _update_fence(self, now: float, epoch: int | None) -> list[SessionEvent]:
        fenced = self._holding(now) < self.quorum
        if not fenced and epoch is not None:
            self.fencing_epoch = max(self.fencing_epoch, epoch)
        if fenced == self._fenced:
            return []
        self._fenced = fenced
        return [Fenced(fenced=fenced, epoch=self.fencing_epoch)]

    def tick(self, now: float) -> list[SessionEvent]:
        """Reports leases that ran out by ``now`` (a Fenced event when the quorum is lost)."""
        return self._update_fence(now, None)

    def fenced(self, now: float) -> bool:
        """True unless a quorum of arbiters' leases are unexpired at ``now`` (rule 3)."""
        return self._holding(now) < self.quorum

    def leases(self, now: float) -> dict[str, float]:
        """Seconds of lease left per arbiter at ``now`` (0.0 for none)."""
        return {k: max(0.0, a.until() - now) for k, a in self._arbiters.items()}

    def round_trip(self, now: float, within: float) -> float | None:
        """The median heartbeat round trip, seconds: from a heartbeat's send to its
        ack's receipt, over the arbiters that acked one in the last ``within``
        seconds before ``now`` (the upper median of an even count); None if none did."""
        rtts = sorted(a.rtt for a in self._arbiters.values() if now - a.rtt_at <= within)
        return rtts[len(rtts) // 2] if rtts else None

    def next_deadline(self) -> float | None:
        """When the fence could next close: the quorum-th latest lease expiry (None if fenced)."""
        if self._fenced:
            return None
        ends = sorted(
            (a.until() for k, a in self._arbiters.items() if k in self._voters), reverse=True
        )
        return ends[self.quorum - 1]


@dataclass(frozen=True, slots=True, kw_only=True)
class StateChanged:
    """The node's state at ``incarnation`` in the committed view changed."""

    state: MemberState
    incarnation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Fenced:
    """The node lost (``fenced=True``) or regained a quorum of leases.

    ``epoch`` is the fencing token: the latest view epoch seen while the node
    held a quorum of leases.
    """

    fenced: bool
    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejoined:
    """The old incarnation ended (DEAD or superseded); the session goes on at a new one."""

    old_incarnation: int
    new_incarnation: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Superseded:
    """Another process took this node id over with a higher incarnation; the session ended."""

    incarnation: int
    by: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Evicted:
    """The cluster ended this incarnation without the node's asking (rules 4, 5).

    Attributes:
        incarnation: the incarnation that was ended.
        state: DEAD (a quorum of arbiters suspected the node) or LEFT (an
            administrator removed it, or someone else's Leave named it).
        rejoining: the session goes on at a higher incarnation (DEAD with
            ``auto_rejoin``; a :class:`Rejoined` event follows); False: the
            session has ended.
    """

    incarnation: int
    state: MemberState
    rejoining: bool


SessionEvent = StateChanged | Fenced | Rejoined | Superseded | Evicted


class EndReason(enum.Enum):
    """Why a session ended (rule 8)."""

    LEFT = "left"  # the node left gracefully (it asked)
    REMOVED = "removed"  # the cluster records it LEFT, without its asking
    DEAD = "dead"  # declared DEAD, and auto_rejoin is off
    SUPERSEDED = "superseded"  # another process took the node id over
