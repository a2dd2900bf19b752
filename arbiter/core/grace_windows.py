"""Grace windows, the replica's half: each replica enforces the committed windows on its clock.

The state machine records a node's window (:mod:`arbiter.core.grace`, tally
rule 13) but has no clock; the :class:`~arbiter.core.observer.Observer` of
every replica holds a :class:`GraceWindows` that turns each committed window
into an end on the replica's own monotonic clock, holds back its detector's
suspicions of the node until then, and tells the node in every ack how much
of the window it may count on. Sans-I/O: ``now`` (monotonic seconds) and
``wall`` (Unix seconds) are arguments.

Rules:

1. Clock. A replica learns a window (a committed record it has not seen, at
   its tick at ``now``, wall clock ``wall``) and ends it here at ``now +
   min(seconds, max_grace, until - wall)`` (nothing when that is <= 0).
   ``until`` is the proposing replica's wall clock at the proposal plus
   ``seconds``: a replica that replays the grant after a restart, or learns it
   late, holds it only for what is left of it, and never for longer than
   ``seconds`` after it learnt it, so a restart never extends a window. Wall
   clocks differ between machines: a replica whose clock is ahead of the
   proposer's by d ends the window d early (behind: up to d late, within
   ``seconds``). The node counts only what each replica promised in its
   acks (rule 3), so a skew costs the node some of its window, never safety.
   Without a wall clock (``wall`` None: unit tests) a window lasts its
   ``seconds`` from when the replica learns it. ``max_grace`` is this
   replica's own cap: it never holds a node longer, whatever was committed.
2. Deferral. While a node's window is open here (its end is after the
   silence being judged, ``heard_until``), a suspicion by the detector is
   held back: no SUSPECT observation. When the window ends (its end passes,
   or its record goes: ended by ``grace(0)``, replaced, or the node is no
   longer ALIVE at that incarnation), a node still silent is tracked as if
   heard at that moment: the detector suspects it one detection time D
   later, as usual, unless it heartbeats meanwhile. A heartbeat ends the
   deferral (the detector turns the node healthy). The suspicion's evidence
   names the real silence, since the node was last heard.
3. Leases. An ack that grants a lease (observer rule 4) also carries the
   seconds left of the node's window here, counted from the heartbeat's
   receipt, and the window's ``grant`` (the log index that granted it): the
   replica promises not to suspect the node before then, and rule 2 keeps
   the promise (it suspects D after the end at the earliest, or D after an
   end the node asked for). The node counts it from its send time, as a
   lease (``membership/_node/session.py`` rule 10), and stops counting a grant
   before it asks for another window or for the end of this one, and ignores
   every later ack naming it: withdrawing a window the node still counted on
   would break the fencing rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from arbiter.core.detection import DetectorState, FailureDetector
from arbiter.core.tally import MembershipState

__all__ = ["GraceWindows"]


@dataclass(slots=True)
class _Window:
    grant: int
    incarnation: int
    end: float  # monotonic seconds on this replica (rule 1)
    reason: str


class GraceWindows:
    """The committed grace windows as one replica enforces them (see the module rules).

    Args:
        max_grace: seconds this replica holds a node at most (rule 1), > 0.

    Raises:
        ValueError: ``max_grace`` is not a number > 0.
    """

    def __init__(self, max_grace: float) -> None:
        if not max_grace > 0:
            raise ValueError(f"max_grace must be > 0 seconds, got {max_grace!r}")
        self._max = max_grace
        self._windows: dict[str, _Window] = {}
        # node -> when it was last really heard, while a suspicion of it is held back
        self._deferred: dict[str, float] = {}
        # node -> when it was last really heard, once tracked again after its window
        self._rearmed: dict[str, float] = {}
        self._seen: tuple[MembershipState | None, int] = (None, -1)

    @property
    def active(self) -> bool:
        """True while any window, deferral or re-armed node is tracked (a cheap test
        for the heartbeat path)."""
        return bool(self._windows or self._deferred or self._rearmed)

    def needs_sync(self, state: MembershipState) -> bool:
        """True when the committed windows changed since the last :meth:`sync` (or the
        state object was replaced by a snapshot)."""
        return self._seen[0] is not state or self._seen[1] != state.grace_version

    def sync(self, state: MembershipState, now: float, wall: float | None) -> list[str]:
        """Learns the committed windows (rule 1) and forgets the ones that went.

        Args:
            state: the committed state machine.
            now: monotonic seconds.
            wall: Unix seconds now, or None (rule 1).

        Returns:
            The nodes whose suspicion was held back and whose window went:
            the caller tracks them again as heard at ``now`` (rule 2).
        """
        self._seen = (state, state.grace_version)
        records = state.graces()
        for node_id, w in list(self._windows.items()):
            r = records.get(node_id)
            if r is None or r.grant != w.grant:
                del self._windows[node_id]
        for node_id, r in records.items():
            if node_id in self._windows:
                continue
            left = r.seconds if wall is None else r.until - wall
            left = min(r.seconds, self._max, left)
            if left > 0:
                self._windows[node_id] = _Window(r.grant, r.incarnation, now + left, r.reason)
        return [n for n in list(self._deferred) if n not in self._windows]

    def lease(self, node_id: str, incarnation: int, now: float) -> tuple[float, int]:
        """(seconds left of the node's window from ``now``, its grant) for an ack (rule 3);
        (0.0, 0) without an open window at ``incarnation``."""
        w = self._windows.get(node_id)
        if w is None or w.incarnation != incarnation or w.end <= now:
            return 0.0, 0
        return w.end - now, w.grant

    def window(self, node_id: str, now: float) -> tuple[float, str]:
        """(seconds left of the node's window here, its reason), (0.0, "") without one."""
        w = self._windows.get(node_id)
        if w is None or w.end <= now:
            return 0.0, ""
        return w.end - now, w.reason

    def defer(
        self, node_id: str, incarnation: int, heard_until: float, detector: FailureDetector
    ) -> bool:
        """True when a suspicion of the node at ``heard_until`` is held back (rule 2).

        Args:
            node_id: the node ``detector`` suspects.
            incarnation: the life the detector tracks (a window is for one life).
            heard_until: the end of the silence judged (observer rule 6).
            detector: the replica's detector (when it last heard the node, for the
                evidence of a later suspicion).
        """
        w = self._windows.get(node_id)
        if w is None or w.end <= heard_until or w.incarnation != incarnation:
            return False
        last = self.last_heard(node_id, detector)
        self._rearmed.pop(node_id, None)
        self._deferred[node_id] = heard_until if last is None else last
        return True

    def ended(self, heard_until: float) -> list[tuple[str, float]]:
        """The held-back nodes whose window ended by ``heard_until``, with its end (rule
        2: the caller tracks each again as heard then); windows past are forgotten."""
        out = []
        for node_id, w in list(self._windows.items()):
            if w.end > heard_until:
                continue
            del self._windows[node_id]
            if node_id in self._deferred:
                out.append((node_id, w.end))
        return out

    def rearm(self, node_id: str, at: float, detector: FailureDetector) -> None:
        """Rule 2: a node whose suspicion was held back is tracked again as heard ``at``
        (its window's end) by ``detector``, so that it is suspected D later if still
        silent; its real last-heard time is kept for that suspicion's evidence."""
        since = self._deferred.pop(node_id, None)
        last = detector.last_heard(node_id)
        if since is None or last is None or detector.state(node_id) is not DetectorState.SUSPECT:
            return
        detector.heartbeat(node_id, max(at, last))
        self._rearmed[node_id] = since

    def last_heard(self, node_id: str, detector: FailureDetector) -> float | None:
        """When the node was last really heard: before its window if it was tracked again
        after one (rule 2), else as ``detector`` has it."""
        since = self._rearmed.get(node_id)
        return since if since is not None else detector.last_heard(node_id)

    def heard(self, node_id: str) -> None:
        """A heartbeat of the node arrived: no deferral or re-arming is pending for it."""
        self._deferred.pop(node_id, None)
        self._rearmed.pop(node_id, None)

    def next_deadline(self) -> float | None:
        """The earliest end of a window with a suspicion held back, or None."""
        ends = [self._windows[n].end for n in self._deferred if n in self._windows]
        return min(ends) if ends else None

    def forget(self, node_id: str) -> None:
        """The node is no longer tracked (DEAD, LEFT, a new life): nothing pending for it."""
        self._deferred.pop(node_id, None)
        self._rearmed.pop(node_id, None)

    def __len__(self) -> int:
        """Open windows (past ones are forgotten at the next :meth:`ended`)."""
        return len(self._windows)
