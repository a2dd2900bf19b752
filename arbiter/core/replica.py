"""One arbiter replica as a sans-I/O whole: Raft, the state machine and the observer.

The asyncio driver and the deterministic simulator both run exactly this
composition; they differ only in where time, messages and storage come from.

Rules:

1. Inputs: ``heartbeat`` (a node's heartbeat received at ``now``), ``step`` (a
   Raft message from a peer), ``tick`` (time passes), ``propose_leave``.
2. ``tick`` ticks Raft and the observer, then proposes every owed observation
   as one batch (DESIGN.md section 5, rule 1). Without a leader the batch is
   dropped; the observer proposes it again after its retry interval.
3. Output follows etcd's Ready: the caller takes ``ready()``, persists its hard
   state and entries, sends its messages, then calls ``advance(ready)``, which
   applies the committed entries to the state machine and returns the results
   in log order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from arbiter.core.commands import Leave, ObserveBatch, encode
from arbiter.core.detector import FailureDetector
from arbiter.core.observer import HeartbeatVerdict, Observer
from arbiter.core.raft import (
    Entry,
    HardState,
    Message,
    ProposalDropped,
    RaftConfig,
    RaftNode,
    RaftStatus,
    Ready,
    Rng,
)
from arbiter.core.state import ApplyResult, MembershipState

__all__ = ["Replica", "ReplicaSettings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaSettings:
    """What a replica core needs besides Raft's own configuration.

    Attributes:
        lease: seconds of lease granted per accepted heartbeat (<= detection time).
        observation_retry: seconds before an uncommitted observation is proposed again.
        restart_grace: seconds after start without casting suspicion (one maximum lease).
        heartbeat_interval: seconds between heartbeats suggested to nodes; the
            detector scales its timeout with it.
    """

    lease: float
    observation_retry: float
    restart_grace: float
    heartbeat_interval: float


class Replica:
    """Raft + membership state machine + observer of one replica.

    Args:
        replica_id: this replica's id.
        replica_ids: every configured replica id, this one included.
        raft_config: Raft timings and features.
        settings: lease, retry and grace timings.
        detector: the failure detector (owned from now on).
        rng: randomness for Raft's election timeouts.
        now: monotonic seconds at start.
        seq_base: first observation sequence number (above any used before a restart).
        hard_state: restored Raft hard state, if any.
        entries: restored Raft log entries (contiguous from index 1), if any.
    """

    def __init__(
        self,
        *,
        replica_id: str,
        replica_ids: Sequence[str],
        raft_config: RaftConfig,
        settings: ReplicaSettings,
        detector: FailureDetector,
        rng: Rng,
        now: float,
        seq_base: int,
        hard_state: HardState | None = None,
        entries: Sequence[Entry] = (),
    ) -> None:
        self.replica_id = replica_id
        self.settings = settings
        self.state = MembershipState(list(replica_ids))
        self.raft = RaftNode(
            node_id=replica_id,
            peers=list(replica_ids),
            config=raft_config,
            rng=rng,
            now=now,
            hard_state=hard_state,
            entries=entries,
        )
        self.observer = Observer(
            replica_id=replica_id,
            detector=detector,
            lease=settings.lease,
            retry_after=settings.observation_retry,
            seq_base=seq_base,
            now=now,
            restart_grace=settings.restart_grace,
        )
        self.proposals_dropped = 0

    # --- inputs ---------------------------------------------------------------------

    def heartbeat(
        self, node_id: str, incarnation: int, labels: Mapping[str, str], now: float
    ) -> HeartbeatVerdict:
        """Takes a validated heartbeat received at ``now``; returns the verdict for the ack."""
        return self.observer.heartbeat(
            node_id, incarnation, labels, now, self.state, interval=self.settings.heartbeat_interval
        )

    def step(self, msg: Message, now: float) -> None:
        """Steps one Raft message from a peer (a forwarded proposal with no leader is dropped)."""
        try:
            self.raft.step(msg, now)
        except ProposalDropped:
            self.proposals_dropped += 1

    def tick(self, now: float) -> None:
        """Lets time pass: Raft timers, detector suspicions, owed observations (rule 2)."""
        self.raft.tick(now)
        self.observer.tick(now, self.state)
        owed = self.observer.observations(now, self.state)
        if owed:
            try:
                self.raft.propose(
                    encode(ObserveBatch(replica_id=self.replica_id, observations=owed)), now
                )
            except ProposalDropped:
                self.proposals_dropped += 1

    def propose_leave(self, node_id: str, incarnation: int, request_id: str, now: float) -> None:
        """Proposes a graceful leave.

        Raises:
            ProposalDropped: no leader is known.
        """
        self.raft.propose(
            encode(Leave(node_id=node_id, incarnation=incarnation, request_id=request_id)), now
        )

    # --- outputs --------------------------------------------------------------------

    def has_ready(self) -> bool:
        """True when :meth:`ready` has something to persist, send or apply."""
        return self.raft.has_ready()

    def ready(self) -> Ready:
        """What to persist, then send; pass it back to :meth:`advance` afterwards."""
        return self.raft.ready()

    def advance(self, ready: Ready) -> list[ApplyResult]:
        """Applies ``ready``'s committed entries and acknowledges it (rule 3).

        Call only after ``ready``'s hard state and entries are durable and its
        messages are sent.

        Returns:
            One result per committed entry, in log order.
        """
        results = [self.state.apply(e.index, e.data) for e in ready.committed_entries]
        self.raft.advance(ready)
        return results

    def next_deadline(self) -> float:
        """The earliest monotonic time at which :meth:`tick` has work."""
        d = self.observer.next_deadline()
        r = self.raft.next_deadline()
        return r if d is None else min(r, d)

    def in_quorum(self, now: float) -> bool:
        """True while this replica has a leader it can reach (itself included)."""
        return self.raft.in_quorum(now)

    def status(self) -> RaftStatus:
        """Raft's role, term, leader and indexes."""
        return self.raft.status()
