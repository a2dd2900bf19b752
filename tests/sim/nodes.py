"""Simulated nodes: the real ``NodeSession`` core, heartbeating every replica.

Rules:

1. A running node sends a heartbeat to every replica every heartbeat
   interval (from a per-node phase), and takes each ack into its session as
   the SDK does. The ack is built from the replica's ``HeartbeatVerdict``
   exactly as ``arbiter/server/api/servicers.py`` builds it.
2. A paused node (SIGSTOP) sends nothing; acks that reach it wait in its
   socket buffer and are taken, in arrival order, when it resumes, at the
   resume time. It then sends a heartbeat at once (its timer is overdue).
3. A crashed node loses its session; acks to it are lost. It restarts at a
   higher incarnation than any it used; in a world with ``stale_restarts``
   (the short-retention seeds), one restart in two is from an old
   checkpoint, at incarnation 1, which the cluster must refuse (its records
   may have been forgotten: invariant S8) and the session rejoins above.
4. Session deadlines (the fence closing) are timers like any other: the node
   calls ``session.tick`` when its quorum-th lease runs out.
5. Each node has its own clock, running at ``rate`` (1 +- the world's drift
   bound): the session only ever sees node-local time ``t * rate``. Leases are
   safe as long as lease x drift stays below the smallest one-way latency,
   because the node counts them from the send time (membership/_node/session.py,
   rule 2).
6. The arbiter set: a node starts with the voters and learners of the
   latest committed configuration (what its operator lists), heartbeats to
   every arbiter its session knows, and follows the configuration its acks
   carry (the highest log index seen; ``NodeSession.configure``, session rule
   9, as the SDK's ``membership/_node/agent.py`` does). Its lease quorum is
   then that configuration's voters'. The assumption the simulator checks:
   a node at most one single-server change behind is safe, because two
   consecutive configurations' majorities intersect.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from membership._node.session import Fenced, NodeSession, Rejoined, SessionEvent, StateChanged
from membership.shared.view import MemberState

if TYPE_CHECKING:
    from tests.sim.world import World

__all__ = ["Ack", "Heartbeat", "NodeStatus", "SimNode"]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A node's heartbeat on the wire (the fields the replica core reads)."""

    node_id: str
    incarnation: int
    seq: int
    replica_id: str
    sent_at: float = 0.0  # virtual seconds at sending (its send_time_unix: clocks agree here)


@dataclass(frozen=True, slots=True)
class Ack:
    """A replica's answer to one heartbeat (HeartbeatAck)."""

    replica_id: str
    node_id: str
    seq: int
    lease: float
    state: MemberState
    incarnation: int
    epoch: int
    in_quorum: bool
    voters: tuple[str, ...] = ()
    learners: tuple[str, ...] = ()
    config_index: int = 0
    grace: float = 0.0
    grace_id: int = 0


class NodeStatus(enum.Enum):
    """Whether the node's process runs."""

    UP = "up"
    PAUSED = "paused"
    CRASHED = "crashed"


_LABELS = {"job": "j1", "rack": "a"}


class SimNode:
    """One node process: a ``NodeSession`` and its heartbeat timer.

    Args:
        world: the simulation it lives in.
        node_id: its id.
        phase: seconds after start of its first heartbeat (spreads nodes out).
    """

    def __init__(self, world: World, node_id: str, phase: float, rate: float = 1.0) -> None:
        self.world = world
        self.id = node_id
        self.phase = phase
        self.rate = rate
        self.status = NodeStatus.CRASHED
        self.session: NodeSession | None = None
        self.last_incarnation = 0
        self.inbox: list[Ack] = []
        self._beat_token = 0
        self._fence_token = 0
        self._fence_at = math.inf
        self.interval = world.config.heartbeat_interval

    def local(self, t: float) -> float:
        """This node's clock at virtual time ``t`` (rule 5)."""
        return t * self.rate

    def virtual(self, local: float) -> float:
        """The first virtual time at which this node's clock reads ``local`` or later."""
        t = local / self.rate
        while t * self.rate < local:  # float rounding: never wake before the deadline
            t = math.nextafter(t, math.inf)
        return t

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Starts (or restarts) the process at a new, higher incarnation (rule 3)."""
        self.last_incarnation += 1
        incarnation = self.last_incarnation
        stale = self.world.stale_restarts
        if stale is not None and incarnation > 1 and stale.random() < 0.5:
            incarnation = 1
        self.session = NodeSession(
            node_id=self.id,
            incarnation=incarnation,
            arbiters=self.world.listed_arbiters(),
            auto_rejoin=True,
        )
        self.status = NodeStatus.UP
        self.inbox.clear()
        self.world.trace(f"{self.id} starts at incarnation {incarnation}")
        self._schedule_beat(self.world.q.now + self.phase)

    def crash(self) -> None:
        """Kills the process: the session and its unread acks are gone."""
        self.status = NodeStatus.CRASHED
        self.session = None
        self.inbox.clear()
        self._beat_token += 1
        self._fence_token += 1
        self._fence_at = math.inf

    def pause(self) -> None:
        """SIGSTOP: no sends; acks queue up (rule 2)."""
        if self.status is NodeStatus.UP:
            self.status = NodeStatus.PAUSED
            self._beat_token += 1
            self._fence_token += 1
            self._fence_at = math.inf

    def resume(self) -> None:
        """SIGCONT: takes the queued acks now, then heartbeats at once (rule 2)."""
        if self.status is not NodeStatus.PAUSED:
            return
        self.status = NodeStatus.UP
        inbox, self.inbox = self.inbox, []
        for ack in inbox:
            self.on_ack(ack)
        if self.session is not None:
            self._session_events(self.session.tick(self.local(self.world.q.now)))
        self._beat(self._beat_token)
        self._schedule_fence()

    def ask_grace(self) -> int:
        """Before asking for a grace window (or its end): stops counting every grant it
        knows (session rule 10). Returns the incarnation asking."""
        assert self.session is not None
        self._session_events(self.session.end_grace(self.local(self.world.q.now)))
        return self.session.incarnation

    # --- heartbeats -----------------------------------------------------------------------

    def _schedule_beat(self, when: float) -> None:
        self._beat_token += 1
        self.world.q.at(when, self._beat, self._beat_token)

    def _beat(self, token: int) -> None:
        if token != self._beat_token or self.status is not NodeStatus.UP:
            return
        session = self.session
        assert session is not None
        w = self.world
        now = w.q.now
        local = now * self.rate
        send = w.net.send
        deliver = w.deliver_heartbeat
        for rid in sorted(session.leases(local)):  # rule 6: the arbiters it knows
            seq, inc = session.heartbeat(rid, local)
            send(self.id, rid, deliver, Heartbeat(self.id, inc, seq, rid, now))
        self._schedule_beat(now + self.interval)

    def on_ack(self, ack: Ack) -> None:
        """Takes one ack into the session (rule 1), or queues it while paused."""
        if self.status is NodeStatus.PAUSED:
            self.inbox.append(ack)
            return
        session = self.session
        if session is None:
            return
        now = self.local(self.world.q.now)
        events = session.on_ack(
            ack.replica_id,
            seq=ack.seq,
            lease=ack.lease,
            state=ack.state,
            recorded_incarnation=ack.incarnation,
            epoch=ack.epoch,
            now=now,
            grace=ack.grace,
            grace_id=ack.grace_id,
        )
        if events:
            self._session_events(events)
        if ack.voters and ack.config_index > session.config_index:  # rule 6
            if ack.config_index > 0:
                self.world.trace(
                    f"{self.id} follows the configuration at {ack.config_index}: "
                    f"voters {','.join(ack.voters)} learners {','.join(ack.learners) or '-'}"
                )
            self._session_events(session.configure(ack.voters, ack.learners, ack.config_index, now))
        self.world.checker.after_ack(self, ack.replica_id, now)
        self._schedule_fence()

    # --- fencing timer ----------------------------------------------------------------------

    def _schedule_fence(self) -> None:
        session = self.session
        if session is None:
            return
        d = session.next_deadline()
        if d is not None:
            d = self.virtual(d)
        if d is not None and d < self._fence_at:
            self._fence_at = d
            self._fence_token += 1
            self.world.q.at(d, self._fence, self._fence_token)

    def _fence(self, token: int) -> None:
        if token != self._fence_token or self.session is None:
            return
        self._fence_at = math.inf
        self._session_events(self.session.tick(self.local(self.world.q.now)))
        self._schedule_fence()

    def _session_events(self, events: list[SessionEvent]) -> None:
        w = self.world
        for e in events:
            if isinstance(e, Fenced):
                w.trace(f"{self.id} {'fenced' if e.fenced else 'unfenced'} (token {e.epoch})")
            elif isinstance(e, StateChanged):
                w.trace(f"{self.id}#{e.incarnation} is told {e.state.value.upper()}")
            elif isinstance(e, Rejoined):
                w.trace(
                    f"{self.id} rejoins {e.old_incarnation} -> {e.new_incarnation} ({e.reason})"
                )
        if self.session is not None:
            self.last_incarnation = max(self.last_incarnation, self.session.incarnation)

    # --- introspection ------------------------------------------------------------------------

    def describe(self, now: float) -> str:
        """One line: status, incarnation, fenced, state."""
        s = self.session
        if s is None:
            return f"{self.id}: {self.status.value}"
        fenced = "fenced" if s.fenced(self.local(now)) else "holds quorum"
        return f"{self.id}: {self.status.value} #{s.incarnation} {s.state.value.upper()} {fenced}"

    @property
    def labels(self) -> dict[str, str]:
        """The node's static labels."""
        return _LABELS
