"""Following and changing the arbiter configuration on one replica (the shell side).

The core (:class:`arbiter.core.replica.Replica`) holds the configuration
in its log and makes the changes (single-server changes with a learner
phase first: Ongaro 2014, section 4.2.1, and section 4.2.1's catch-up
rounds as etcd's learners). This module is what the shell does with it.

Rules:

1. After every driver turn :meth:`Reconfiguration.refresh` compares the
   configuration in force (:func:`arbiter.server.consensus.arbiterset.in_force`)
   with the last one seen (a change is logged at INFO: voters, learners,
   index), and the replicas to exchange Raft traffic with (:attr:`peers`:
   the configuration in force and the applied one, so that a replica being
   removed gets the log until its removal commits and learns it, the core's
   membership rule 3); on a change of either it calls ``on_change`` (the
   transport opens and closes streams, the peer servicer's known set
   follows, subscribers are told).
2. A replica that a *committed* configuration no longer has (the core's
   ``Replica.removed``; an uncommitted removal may still be undone) logs it
   at WARNING and calls ``on_removed`` once: the server stops and the
   command exits 0, as an etcd member removed from its cluster does. A
   replica that joins is not removed before its log holds a configuration
   that has it (the leader's snapshot it gets first may predate its
   add_learner).
3. A change (:meth:`Reconfiguration.change`) is proposed on the leader only;
   elsewhere it fails with :class:`NotLeader` naming the leader and its
   address (the Admin service answers FAILED_PRECONDITION, and the CLI asks
   the leader). It returns once the configuration in force *applied* here
   shows the change, or raises TimeoutError.
4. Promotion (on the leader, after every turn): a learner is promoted once
   its replicated log has reached the leader's commit index and stayed
   caught up for ``restart_grace`` raised to the lease at STEP**3 times the
   interval this leader suggests now (a node heartbeats at the longest
   suggestion of its replicas, and the load rule moves a replica's by at most
   3 steps from another's), never beyond ``config.grace``: long enough for
   the learner to grant its lease to every node, without waiting the lease at
   the interval ceiling of a cluster of max_nodes (17.9 s at the lan
   defaults) in a small one. The Raft core's own promotion (on log catch-up alone) is
   off: a learner promoted the moment it caught up has granted no lease yet,
   and every node would count one voter more without its lease, fenced (a
   group of 3 with one replica gone needs 3 of 4 leases once a fourth votes).
   ``membership admin arbiters promote`` forces it at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from arbiter.core.detection.interval import STEP
from arbiter.core.raft import ProposalDropped, TermNotCommitted
from arbiter.server.consensus.arbiterset import ArbiterSet, in_force
from arbiter.server.consensus.driver import Driver, ReplicaStatus
from arbiter.server.consensus.events import log_config_change
from arbiter.server.consensus.stored import describe

__all__ = ["NotLeader", "Reconfiguration", "ReplicaProgress"]

log = logging.getLogger("arbiter.reconfig")

OPS = ("add_learner", "promote", "remove")


class NotLeader(Exception):
    """A change was asked of a replica that does not lead (rule 3).

    Attributes:
        leader_id: the leader this replica knows, or None.
        address: the leader's ``host:port`` (None when unknown).
    """

    def __init__(self, leader_id: str | None, address: str | None) -> None:
        self.leader_id = leader_id
        self.address = address
        if leader_id is None:
            text = "no leader known to this arbiter; try another, or wait for an election"
        else:
            text = f"not the leader: the leader is {leader_id} at {address or 'unknown address'}"
        super().__init__(text)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaProgress:
    """Replication progress of one replica as the leader sees it.

    Attributes:
        match_index: highest log index known replicated on it.
        lag: the leader's last log index minus ``match_index`` (entries).
        last_heard: seconds since the leader last heard it (None: never).
    """

    match_index: int
    lag: int
    last_heard: float | None


class Reconfiguration:
    """Follows the configuration in force at one replica and proposes changes (rules).

    Args:
        driver: the replica's driver (its replica and loop).
        first: the first arbiter set (the data dir's; empty when joining).
        on_change: called with each new configuration in force.
        on_removed: called once when this replica finds itself removed (rule 2).
        joining: this is the first start of a replica that joins (``--join``):
            it is not taken for removed before its log has it (rule 2).
    """

    def __init__(
        self,
        driver: Driver,
        first: Mapping[str, str],
        on_change: Callable[[ArbiterSet], None],
        on_removed: Callable[[ArbiterSet], None],
        joining: bool = False,
    ) -> None:
        self._driver = driver
        self._first = dict(first)
        self._on_change = on_change
        self._on_removed = on_removed
        self._changed = asyncio.Event()
        self.current = in_force(driver.replica, self._first)
        # The replicas to exchange Raft traffic with: the configuration in force and
        # the applied one (a replica being removed gets the log until its removal
        # commits, so that it learns it: the core's membership rule 3).
        self.peers = {**self.applied().members, **self.current.members}
        self.removed = False
        # Rule 2: this replica was in a configuration of its own log once (a
        # joining one is not, until the leader's log reaches its add_learner:
        # the snapshot it gets first may be older than that).
        self._member = not joining
        # Rule 4: learner id -> when it was first seen caught up (monotonic seconds).
        self._caught_up: dict[str, float] = {}

    def applied(self) -> ArbiterSet:
        """The configuration as of the applied index (the one every quorum uses there)."""
        return ArbiterSet.of(self._driver.replica.applied_configuration)

    def refresh(self) -> None:
        """Rule 1 and 2: called after every driver turn."""
        self._changed.set()
        now = in_force(self._driver.replica, self._first)
        peers = {**self.applied().members, **now.members}
        if now != self.current or peers != self.peers:
            if now != self.current:
                self._changed_to(now)
            self.peers = peers
            self._on_change(now)
        self._maybe_promote()
        me = self._driver.replica_id
        if me in self._driver.replica.configuration:
            self._member = True
        if self._member and not self.removed and self._driver.replica.removed:
            self.removed = True
            log.warning(
                "%s: this replica was removed from the arbiter group (committed at log index "
                "%d; voters now %s): stopping",
                me,
                now.index,
                describe(now.voters),
            )
            self._on_removed(now)

    def _promotion_wait(self) -> float:
        """Seconds a learner stays caught up before it is promoted (rule 4)."""
        cfg, replica = self._driver.config, self._driver.replica
        wanted = replica.settings.lease_for(replica.suggested_interval() * STEP**3)
        return min(cfg.grace, max(cfg.restart_grace, wanted))

    def _maybe_promote(self) -> None:
        """Rule 4: promotes a learner caught up for :meth:`_promotion_wait` (leader only)."""
        learners = self.current.learners
        if not learners or not self._driver.is_leader:
            self._caught_up.clear()
            return
        now = time.monotonic()
        st = self._driver.raft.status(now)
        for rid in list(self._caught_up):
            if rid not in learners:
                del self._caught_up[rid]
        for rid in sorted(learners):
            pr = st.progress.get(rid)
            if pr is None or pr.match < st.commit:
                self._caught_up.pop(rid, None)
                continue
            since = self._caught_up.setdefault(rid, now)
            if now - since < self._promotion_wait():
                continue
            try:
                self._driver.replica.propose_config_change("promote", rid, None, now)
            except ProposalDropped:
                return  # another change is pending: the next turn tries again
            log.info(
                "%s: promoting learner %s (caught up for %.1fs)",
                self._driver.replica_id,
                rid,
                now - since,
            )
            self._caught_up.pop(rid, None)
            self._driver.wake()
            return

    def _changed_to(self, now: ArbiterSet) -> None:
        self.current = now
        me = self._driver.replica_id
        log_config_change(
            me,
            f"{me}: arbiter configuration at log index {now.index}: voters "
            f"{describe(now.voters) or 'none'}; learners {describe(now.learners) or 'none'}",
            level=logging.INFO,
            index=now.index,
            voters=dict(now.voters),
            learners=dict(now.learners),
        )

    def driver_status(self) -> ReplicaStatus:
        """The replica's leader, quorum, term and role now."""
        return self._driver.status()

    def commit_index(self) -> int:
        """The replica's Raft commit index."""
        return int(self._driver.raft.status().commit)

    def leader_address(self) -> tuple[str | None, str | None]:
        """The leader this replica knows and its ``host:port`` (None, None when unknown)."""
        leader = self._driver.status().leader_id
        if leader is None:
            return None, None
        return leader, self.current.members.get(leader)

    async def change(self, op: str, replica_id: str, address: str, timeout: float) -> ArbiterSet:
        """Proposes one change and waits until it is applied here (rule 3).

        Args:
            op: ``add_learner``, ``promote`` or ``remove``.
            replica_id: the replica the change is about.
            address: its ``host:port`` (``add_learner``; "" otherwise).
            timeout: seconds to wait for it to be applied here.

        Returns:
            The configuration applied with the change.

        Raises:
            NotLeader: this replica does not lead.
            ProposalDropped: another change is pending (not yet committed).
            TimeoutError: not applied within ``timeout``.
        """
        async with asyncio.timeout(timeout):
            while True:
                if not self._driver.is_leader:
                    raise NotLeader(*self.leader_address())
                try:
                    self._driver.replica.propose_config_change(
                        op, replica_id, address, time.monotonic()
                    )
                    break
                except TermNotCommitted:
                    # A new leader's no-op commits within a round (Raft thesis
                    # §4.1): the change goes once it has, within the timeout.
                    await asyncio.sleep(self._driver.config.raft_heartbeat_interval / 4)
        self._driver.wake()
        async with asyncio.timeout(timeout):
            while not _shows(self.applied(), op, replica_id):
                self._changed.clear()
                await self._changed.wait()
        return self.applied()

    def is_leader(self) -> bool:
        """Whether this replica leads now (only a leader proposes changes, rule 3)."""
        return self._driver.is_leader

    def election_timeout(self) -> float:
        """The Raft election timeout, seconds (a peer silent longer is not answering)."""
        return self._driver.config.election_timeout

    def progress(self) -> dict[str, ReplicaProgress]:
        """Each replica's progress as this leader sees it (empty on a follower)."""
        if not self._driver.is_leader:
            return {}
        st = self._driver.raft.status(time.monotonic())
        out = {
            rid: ReplicaProgress(
                match_index=pr.match,
                lag=max(0, st.last_index - pr.match),
                last_heard=pr.last_heard,
            )
            for rid, pr in st.progress.items()
        }
        out[self._driver.replica_id] = ReplicaProgress(
            match_index=st.last_index, lag=0, last_heard=0.0
        )
        return out


def _shows(conf: ArbiterSet, op: str, replica_id: str) -> bool:
    if op == "add_learner":
        return replica_id in conf.members
    if op == "promote":
        return replica_id in conf.voters
    return replica_id not in conf.members


__all__ += ["OPS", "ProposalDropped"]
