"""The single loop that feeds the sans-I/O cores with the clock and the network.

Everything runs on one asyncio event loop, so the cores are only ever touched
from one thread. Servicers call the ``on_*`` methods directly (they are
synchronous and fast); the loop task ticks the cores, proposes owed
observations, and handles Raft's Ready in the documented order: persist
(fsync, in :mod:`arbiter.server.consensus.storage`), send, apply, advance. The write
runs on the thread of :mod:`arbiter.server.consensus.writer`, so heartbeats are acked
and Raft messages stepped while the disk is slow; the Ready's messages leave
only once it is done. The replica starts from what the storage recovered and
replays the committed log before it serves anything; it snapshots its state
machine every ``config.snapshot_every`` applied entries. The loop's own lag
is watched by :mod:`arbiter.server.load.looplag`; its load and lateness by
:mod:`arbiter.server.load.monitor` (the adaptive interval, shedding, and local
health: each tick tells the core how late the replica is). What it decides is logged as
structured events (:mod:`arbiter.server.consensus.events`: one line per view change
and per change of its Raft standing), and counted on ``counters``
(:class:`arbiter.server.ops.metrics.Counters`, plain integers) for the metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from arbiter.config import ArbiterConfig
from arbiter.core.observer import Carrier, HeartbeatVerdict
from arbiter.core.raft import ConflictingState, Message, RaftError, Ready, Role
from arbiter.core.replica import Replica, must_persist
from arbiter.core.tally import ApplyResult, GraceOutcome, LeaveOutcome, MembershipState, ViewChange
from arbiter.server.consensus.counters import Counters
from arbiter.server.consensus.events import RaftStanding, log_raft_standing, log_view_change
from arbiter.server.consensus.standing import Standing, Standings
from arbiter.server.consensus.storage import DurableState, Storage
from arbiter.server.consensus.writer import DiskWriter
from arbiter.server.load.looplag import LoopLagMonitor
from arbiter.server.load.monitor import LoadMonitor, LocalHealth

__all__ = ["Driver", "ReplicaStatus"]

log = logging.getLogger("arbiter.driver")
Interval = float | None  # seconds a node heartbeats at; None: the configured interval


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaStatus:
    """What a replica knows of its place in the group right now."""

    arbiter_id: str
    leader_id: str | None
    in_quorum: bool
    term: int
    role: str
    epoch: int


def _has_state(durable: DurableState) -> bool:
    """True when a replica restarts with Raft state (it may have granted leases)."""
    hs = durable.hard_state
    return bool(durable.entries or durable.snapshot or (hs is not None and hs.term > 0))


class Proposing:
    """Proposals a caller waits for (see the module docstring)."""

    replica: Replica
    _wake: asyncio.Event
    _waiting: dict[str, asyncio.Future[Any]]

    async def leave(self, node_id: str, incarnation: int, timeout: float) -> LeaveOutcome:
        """Proposes a graceful leave and waits until it is applied.

        Raises:
            ProposalDropped: no leader is known to take the proposal.
            TimeoutError: not applied within ``timeout`` seconds.
        """
        outcome: LeaveOutcome = await self._await_outcome(
            lambda rid: self.replica.propose_leave(node_id, incarnation, rid, time.monotonic()),
            timeout,
        )
        return outcome

    async def remove(self, node_id: str, incarnation: int, by: str, timeout: float) -> LeaveOutcome:
        """Proposes an administrator's removal (tally rule 5a) and waits until it is applied.

        Args:
            node_id: the member to remove.
            incarnation: the incarnation to remove; 0 for the recorded one.
            by: who asked (non-empty).
            timeout: seconds to wait for the entry to be applied here.

        Raises:
            ProposalDropped: no leader is known to take the proposal.
            TimeoutError: not applied within ``timeout`` seconds.
        """
        outcome: LeaveOutcome = await self._await_outcome(
            lambda rid: self.replica.propose_remove(
                node_id, incarnation, by, rid, time.monotonic()
            ),
            timeout,
        )
        return outcome

    async def grace(
        self,
        node_id: str,
        incarnation: int,
        seconds: float,
        reason: str,
        timeout: float,
        by: str = "",
    ) -> tuple[GraceOutcome, float]:
        """Proposes a node's grace window, or its end (``seconds == 0``; tally rule 13), and
        waits until it is applied here; ``by``: "" for the node itself, else the
        administrator asking (grace rule 2).

        Returns:
            What became of it, and the seconds proposed (capped by ``max_grace``).

        Raises:
            ProposalDropped: no leader is known to take the proposal.
            TimeoutError: not applied within ``timeout`` seconds.
            ValueError: ``seconds`` not finite and >= 0, or a bad reason.
        """
        granted: list[float] = []

        def propose(rid: str) -> None:
            granted.append(
                self.replica.propose_grace(
                    node_id, incarnation, seconds, reason, rid, time.monotonic(), time.time(), by
                )
            )

        outcome: GraceOutcome = await self._await_outcome(propose, timeout)
        return outcome, granted[0]

    async def _await_outcome(self, propose: Callable[[str], None], timeout: float) -> Any:
        """Proposes with a fresh request id and waits for the applied outcome."""
        request_id = uuid.uuid4().hex
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = fut
        try:
            propose(request_id)
            self._wake.set()
            async with asyncio.timeout(timeout):
                return await fut
        finally:
            self._waiting.pop(request_id, None)

    def _resolve(self, result: ApplyResult) -> None:
        """Answers the call waiting for ``result``'s leave, removal or grace window."""
        outcome = result.leave or result.grace
        if outcome is not None:
            fut = self._waiting.get(outcome.request_id)
            if fut is not None and not fut.done():
                fut.set_result(outcome)


class Driver(Proposing):
    """Owns the cores of one replica and drives them from one asyncio task.

    Args:
        replica_id: this replica's id.
        replica_ids: the first arbiter set, id -> ``host:port`` (or ids only), this one included.
        join: start empty to join a running group (the core's ``Replica(join=True)``).
        config: validated configuration.
        send: called with each outgoing Raft message (must not block).
        on_change: called with each committed view change, in epoch order.
        on_quorum: called with the new status when in_quorum or the leader changes.
        storage: the replica's durable Raft state; read here, then written
            with every Ready (the driver does not close it).
        on_reset: called when the state machine was replaced by a leader's
            snapshot (its view jumped; changes in between are unknown).
        on_fatal: called once, with the reason, when this replica must stop
            taking part: a peer's message contradicts its durable Raft state
            (its data dir was lost or replaced while the others kept running;
            etcd stops such a member too). From then on it steps no Raft
            message and reports no quorum.

    Raises:
        RestoreError: the stored snapshot is not of this group's arbiters.
        StorageError: the stored hard state or snapshot is corrupt.
    """

    def __init__(
        self,
        *,
        replica_id: str,
        replica_ids: Mapping[str, str] | list[str],
        config: ArbiterConfig,
        send: Callable[[Message], None],
        on_change: Callable[[ViewChange], None],
        on_quorum: Callable[[ReplicaStatus], None],
        storage: Storage,
        on_reset: Callable[[], None] = lambda: None,
        on_fatal: Callable[[str], None] = lambda reason: None,
        join: bool = False,
    ) -> None:
        self.replica_id = replica_id
        self._on_fatal = on_fatal
        self.fatal: str | None = None
        self.config = config
        self._send = send
        self._on_change = on_change
        self._on_quorum = on_quorum
        self._on_reset = on_reset
        self._storage = storage
        self._writer = DiskWriter(storage, name=replica_id)
        t0 = time.monotonic()
        durable = storage.load()
        now = time.monotonic()
        self.replica = Replica(
            replica_id=replica_id,
            replica_ids=list(replica_ids),
            addresses=replica_ids if isinstance(replica_ids, Mapping) else None,
            join=join and not _has_state(durable),
            raft_config=dataclasses.replace(config.raft(), auto_promote=False),  # reconfig.py 4
            settings=dataclasses.replace(
                config.replica_settings(),
                # A replica with no durable state never granted a lease and
                # tracks no member: it has no promise to keep and nobody to
                # wait for, so a first start needs no grace.
                restart_grace=config.grace if _has_state(durable) else 0.0,
            ),
            detector=config.detector(),
            rng=random.Random(),
            now=now,
            seq_base=time.time_ns(),
            hard_state=durable.hard_state,
            entries=durable.entries,
            snapshot=durable.snapshot,
        )
        self.raft = self.replica.raft
        self.observer = self.replica.observer
        self._wake = asyncio.Event()
        self._waiting: dict[str, asyncio.Future[Any]] = {}  # proposing.py
        self._task: asyncio.Task[None] | None = None
        self._last_status: RaftStanding | None = None
        self.loop_lag = 0.0
        # Counted as it goes, read when metrics are scraped (arbiter/server/ops/metrics.py).
        self.counters = Counters()
        self.lag_monitor = LoopLagMonitor(name=replica_id, warn_after=config.loop_lag_warning)
        self.lag_monitor.observe = self.counters.loop_lag.observe
        self.load = LoadMonitor(name=replica_id, on_sample=self.replica.observe_load)
        self.health = LocalHealth(self.lag_monitor, listen_after=config.heartbeat_interval)
        self.persist_seconds, self.persists = 0.0, 0  # fsync seconds, Readies written
        self._replaying = False
        # Term of the entry at raft.status().applied (a backup's term;
        # arbiter/server/ops/backup.py).
        self.applied_term = self.raft.snapshot().term
        self.after_turn: Callable[[], None] = lambda: None
        # What every ack shares (arbiter/server/consensus/standing.py).
        self.standings = Standings(self.replica, config, lambda: self.fatal is None)
        self._recover(t0, durable)

    @property
    def state(self) -> MembershipState:
        """The applied state machine (a new object after a snapshot is restored)."""
        return self.replica.state

    def _recover(self, t0: float, durable: DurableState) -> None:
        """Replays the committed log after the snapshot, then logs what was recovered."""
        st = self.raft.status()
        snapshot_epoch = self.state.epoch
        self._replaying = True
        try:
            # Before the loop serves anything: written here, on the loop thread.
            while self.replica.has_ready():
                rd = self.replica.ready()
                if must_persist(rd):
                    self._storage.save(rd)
                self._send_and_apply(rd)
        finally:
            self._replaying = False
        end = self.raft.status()
        if st.last_index == 0 and st.term == 0:
            log.info("%s: no raft state on disk: starting fresh", self.replica_id)
            return
        log.info(
            "%s: recovered raft state in %.0f ms: term %d, vote %s, snapshot index %d "
            "(epoch %d), last index %d, commit %d%s; applied epoch %d after replaying %d entries",
            self.replica_id,
            (time.monotonic() - t0) * 1000,
            end.term,
            durable.hard_state.vote if durable.hard_state and durable.hard_state.vote else "none",
            end.snapshot_index,
            snapshot_epoch,
            end.last_index,
            end.commit,
            f", {durable.truncated} corrupt tail entries dropped" if durable.truncated else "",
            self.state.epoch,
            end.applied - st.snapshot_index,
        )

    def heartbeat(
        self,
        node_id: str,
        incarnation: int,
        labels: Mapping[str, str],
        interval: Interval,
        now: float,
        carrier: Carrier | None = None,
    ) -> tuple[HeartbeatVerdict, Standing]:
        """Takes a validated heartbeat received at ``now``: everything its ack needs, in
        one call (arbiter/server/api/heartbeat_path.py).

        Args:
            node_id, incarnation, labels: the node's, validated.
            interval: seconds the node heartbeats at (None: the configured one).
            now: monotonic seconds at receipt (the caller's one clock reading).
            carrier: the host stream that carried it (observer rule 8).

        Returns:
            The core's verdict, and the :class:`Standing` now
            (arbiter/server/consensus/standing.py).

        Raises ValueError when ``interval`` is outside (0, max_heartbeat_interval].
        """
        observer = self.observer
        owed = observer.owed()
        verdict = self.replica.heartbeat(node_id, incarnation, labels, now, interval, carrier)
        if observer.owed() != owed:
            self._wake.set()
        return verdict, self.standings.now(now)

    def acked(self, node_id: str, incarnation: int, interval: Interval, now: float) -> None:
        """The ack of a heartbeat that earned no lease went out at ``now`` (monotonic
        seconds): the node, in slow start, was waiting for it (``Replica.acked``)."""
        self.replica.acked(node_id, incarnation, now, interval)

    def on_heartbeat(
        self, node_id: str, incarnation: int, labels: Mapping[str, str], interval: Interval = None
    ) -> HeartbeatVerdict:
        """:meth:`heartbeat` received now, its verdict only (ValueError as there)."""
        return self.heartbeat(node_id, incarnation, labels, interval, time.monotonic())[0]

    def on_raft_message(self, msg: Message) -> None:
        """Steps one Raft message from a peer into the core."""
        if msg.dst != self.replica_id:
            log.warning("dropping raft message for %s (this is %s)", msg.dst, self.replica_id)
            return
        if self.fatal is not None:
            return
        try:
            self.replica.step(msg, time.monotonic())
        except ConflictingState as e:
            # The peer's message contradicts this replica's Raft state: its
            # durable state was lost or damaged (data dir wiped or replaced
            # while the others kept running). It must not take part: with its
            # votes forgotten it could vote twice in one term.
            self.fatal = (
                f"raft message {msg.type.value} from {msg.src} contradicts this replica's raft "
                f"state ({e}): its data dir was lost or replaced while the other replicas kept "
                "running. A replica must not take part with lost state (it could vote twice in "
                "a term). Put its data dir back, or restart every replica on fresh data dirs "
                "(a new cluster)"
            )
            log.critical("%s: %s", self.replica_id, self.fatal)
            self._on_fatal(self.fatal)
        except RaftError as e:
            # A malformed message must not end the peer's stream (and with it
            # every message queued behind it): drop this one, say so.
            log.error("raft message %s from %s refused: %s", msg.type.value, msg.src, e)
        self._wake.set()

    def wake(self) -> None:
        """Runs a turn soon (the core was given an input from outside the loop)."""
        self._wake.set()

    def report_unreachable(self, peer: str) -> None:
        """Transport hint: ``peer`` could not be reached."""
        self.raft.report_unreachable(peer)

    def heard(self, node_id: str) -> int | None:
        """The incarnation of ``node_id`` this replica's detector heard last, or None."""
        return self.observer.heard(node_id)

    def status(self) -> ReplicaStatus:
        """This replica's leader, quorum, term, role and applied epoch."""
        st = self.raft.status()
        return ReplicaStatus(
            arbiter_id=self.replica_id,
            leader_id=st.leader,
            in_quorum=self.fatal is None and self.raft.in_quorum(time.monotonic()),
            term=st.term,
            role=st.role.name.lower(),
            epoch=self.state.epoch,
        )

    def suggested_interval(self) -> float:
        """Seconds between heartbeats to suggest in acks (grows with the node count;
        a change is logged: arbiter/server/consensus/standing.py)."""
        return self.standings.interval()

    def add_lateness_source(self, fn: Callable[[float], float], backlog: bool = True) -> None:
        """Adds ``fn(now) -> seconds`` this replica is late (an ingest backlog): no
        node is suspected for that silence (observer rule 6; monitor.py rule 3).
        ``backlog=False``: not read by shedding (monitor.py rule 4)."""
        self.health.add_source(fn, backlog)

    def lateness(self, now: float) -> float:
        """Seconds of the recent past this replica could not hear (monitor.py rule 3)."""
        return self.health.lateness(now, self.loop_lag)

    def local_suspects(self) -> list[str]:
        """Node ids this replica's own latest opinion is SUSPECT of (sorted)."""
        return self.observer.suspects()

    def start(self) -> None:
        """Starts the loop task, and the loop-lag monitor, on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="arbiter-driver")
        self.lag_monitor.start()
        self.load.start()

    async def stop(self) -> None:
        """Stops the loop task, waits for it and for the write in flight; logs the loop lag."""
        st = self.lag_monitor.statistics()
        if st.samples:
            log.info("%s: %s", self.replica_id, st.describe(self.lag_monitor.warn_after))
        await self.lag_monitor.stop()
        await self.load.stop()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        # A Ready being written when the task was cancelled is still written
        # (never sent): the storage must not be closed under it.
        await self._writer.drain()
        self._writer.close()

    async def _run(self) -> None:
        while True:
            # Cleared before the turn: an input that arrives while a Ready is
            # being written wakes the next wait at once.
            self._wake.clear()
            now = time.monotonic()
            try:
                # Lateness: this replica was deaf (its loop ran late, the
                # process did not run, its ingest has a backlog): heartbeats
                # sent meanwhile are still queued. The core measures silence
                # only up to now - lateness (observer rule 6, Lifeguard's local
                # health): a really dead node is suspected that much later.
                await self._turn(now, self.lateness(now))
            except Exception:
                # A bug in one turn must not stop detection for everyone (failure
                # class "death never declared", docs/architecture.md): log it
                # loudly and go on with the next turn.
                log.exception("driver turn failed; continuing")
                self.counters.turn_failures += 1
            t = time.monotonic()
            due = self.replica.next_deadline(self.lateness(t))
            timeout = max(0.0, min(due, now + 0.05) - t)
            if timeout > 0 and not self._wake.is_set():
                try:
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
                except TimeoutError:
                    pass
            # How much later than asked the loop came back (0 when woken early).
            self.loop_lag = max(0.0, time.monotonic() - (t + timeout))

    async def _turn(self, now: float, lateness: float = 0.0) -> None:
        self.replica.tick(now, lateness, time.time())  # wall: grace windows' clock
        while self.replica.has_ready():
            rd = self.replica.ready()
            if must_persist(rd):
                # 1. persist (fsync) before any message that depends on it
                # leaves (arbiter/server/consensus/storage.py, rule 1), on the writer
                # thread: the loop keeps acking heartbeats and stepping Raft
                # messages into the core meanwhile (they wait for the next
                # Ready; arbiter/server/consensus/writer.py).
                self._persisted(rd, await self._writer.save(rd))
            self._send_and_apply(rd)
        await self._maybe_compact()
        now = time.monotonic()  # the writes above may have taken a while
        self._check_quorum(now)
        self.standings.refresh(now)
        self.after_turn()

    def _persisted(self, rd: Ready, took: float) -> None:
        """Accounts for one Ready's write of ``took`` seconds; warns when the disk was slow."""
        self.persist_seconds += took
        self.persists += 1
        self.counters.fsync.observe(took)
        if took > self.config.loop_lag_warning:
            log.warning(
                "%s: persisting one Ready took %.3fs (fsync; %d entries); its messages waited",
                self.replica_id,
                took,
                len(rd.entries),
            )
        elif took > 0.02:
            log.debug("%s: persisting one Ready took %.3fs", self.replica_id, took)

    def _send_and_apply(self, rd: Ready) -> None:
        """Steps 2 to 4 of a persisted Ready: send, apply (a leader's snapshot first), advance."""
        done = self.replica.deliver(rd, self._send)
        if done.restored is not None:
            log.info(
                "%s: state machine restored from the leader's snapshot at index %d (epoch %d)",
                self.replica_id,
                done.restored.index,
                self.state.epoch,
            )
            self._on_reset()
            self.applied_term = done.restored.term
        for entry, result in done.applied:
            self.applied_term = entry.term
            if result.error:
                log.error("log entry %d not applied: %s", result.index, result.error)
            if result.change is not None:
                if not self._replaying:  # one line per decision; deaths counted once
                    self.counters.deaths += log_view_change(self.replica_id, result.change)
                    self.counters.applied(result.change.epoch, time.monotonic())
                self._on_change(result.change)
            self._resolve(result)

    async def _maybe_compact(self) -> None:
        """Snapshots the state machine every ``config.snapshot_every`` applied entries."""
        snap = self.replica.maybe_compact()
        if snap is None:
            return
        took = await self._writer.compact(snap)
        log.info(
            "%s: log compacted up to index %d (snapshot of %d bytes, %.1f ms)",
            self.replica_id,
            snap.index,
            len(snap.data),
            took * 1000,
        )

    def _check_quorum(self, now: float) -> None:
        st = self.raft.status()
        standing = (self.raft.in_quorum(now), st.leader, st.term, st.role.name.lower())
        last, self._last_status = self._last_status, standing
        if standing != last:
            log_raft_standing(self.replica_id, standing, last)  # elections, role changes
            if last is None or standing[:2] != last[:2]:
                self._on_quorum(self.status())

    @property
    def is_leader(self) -> bool:
        """True while this replica is the Raft leader."""
        return self.raft.status().role is Role.LEADER
