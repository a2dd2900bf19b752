"""The invariants checked after every step of a simulation (docs/architecture.md,
"Correctness rules" and "Testing").

Safety, checked where the state they are about changes (so each step costs
O(what changed), never O(cluster) or worse):

S1 Election safety: at most one leader per term.
S2 Durability: a message leaves only when the term, vote and entries it
   depends on are on the sender's disk (rule 6).
S3 Log matching: every replica applies, at each index, the entry first
   applied there by anyone; a committed entry is never removed from a disk
   that holds it; a new leader's disk holds every committed entry.
S4 Same views: every replica's apply of an index gives the same view change
   at the same epoch; a replica's epoch never goes back within one life.
S5 Quorum of suspicion: DEAD(n, k) is committed only by an entry after which
   a quorum of the voters of the configuration in force at that log index
   have latest observations of n SUSPECT at k or at a later incarnation
   (tally.py rules 4 and 11), or the same entry starts a later incarnation
   of n. The latest observations and the configuration are kept here from
   the committed entries, independently of the state machine (a removed
   replica's observations are dropped when its removal is applied; a
   learner's are kept and count once it is a voter, tally rule 9).
S6 Leases: a node that holds an unexpired lease from replica r (as its own
   session counts it) never has r's latest committed observation SUSPECT at
   its incarnation; a node holding unexpired leases from a quorum of the
   voters of the configuration in force at the DEAD entry's index is never
   DEAD at its incarnation in a committed view, and neither is a node that
   believes it holds a quorum (its session is not fenced, under the
   configuration it last heard: ``nodes`` rule 6). Leases are judged on the
   node's own clock, which may drift (see ``nodes`` rule 5).
S7 Subscribers: contiguous epochs, once each; every view a subscriber holds
   equals the committed view at that epoch.
S8 Forgotten lives: once a DEAD or LEFT record of n at k is forgotten (tally
   rule 12: only a record still in the view, DEAD or LEFT, is forgotten), no
   committed change names n at an incarnation <= k again, and no replica
   that applied the forgetting grants a lease to n at an incarnation <= k.
S9 Ranks (arbiter/core/ranks.py): none before the first committed Bootstrap
   that carries the ranks rules (a join may commit before it: its ranks are
   derived in that entry, ranks rule 6); from then on, in every committed view each job's ranks
   are dense 0..world_size-1 and held by exactly its ALIVE members (each
   member's rank is its job's); a job's assignment changes
   only in an entry that changes the view, at that epoch; a member that
   stays in its job keeps its rank unless the job shrank to it or below
   (ranks rule 2). S4 and S7 compare the ranks too: every replica and every
   subscriber holds the same ranks at the same epoch.
S10 No false death under starvation (runs of ``starvation``, issue 24): a
   node that never stopped sending on time, over links that lose nothing,
   is never DEAD in a committed view, however long its replicas are starved
   (``replicas`` rule 7). Checked for the nodes in ``Checker.sending`` when
   a run sets it (other runs' faults make such silences legitimate).
S11 No suspicion for a stream the replica has not accepted (slow-accept runs of
   ``starvation``, issue 24): no replica suspects a node in
   ``Checker.sending`` while that node's stream waits in the replica's own
   accept queue (``replicas`` rule 8; checked by the replica after each tick).

Liveness (checked by ``World`` at set times, bounds in ``faults``):

L1 If the replicas' topology (up replicas, the cuts between them, and the
   configuration) has not changed for ``leader_bound`` seconds and, for the
   committed configuration and every one in force on an up replica, a
   majority of its voters are up and pairwise connected both ways, some
   replica is leader and in quorum.
L2 After the last fault has healed for ``liveness_bound`` seconds, every
   replica holds the same view at the same epoch, every running node is ALIVE
   there at its incarnation, no crashed node is ALIVE, and every subscriber
   holds that view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arbiter.core.commands import Bootstrap, ObserveBatch, ObserveBatches, Opinion, decode
from arbiter.core.raft import (
    ArbiterConfiguration,
    Entry,
    EntryType,
    Message,
    MessageType,
    Role,
    decode_change,
)
from arbiter.core.ranks import RANKS_RULES
from arbiter.core.tally import ApplyResult, ViewChange
from membership.shared.view import MemberChange, MemberState, View

if TYPE_CHECKING:
    from tests.sim.nodes import SimNode
    from tests.sim.replicas import Disk, SimReplica
    from tests.sim.world import World

__all__ = ["Checker", "InvariantViolation"]


class InvariantViolation(AssertionError):
    """An invariant does not hold; the message names it."""


_VOTE_REQUESTS = (MessageType.VOTE, MessageType.PRE_VOTE)


class Checker:
    """Global knowledge of the run, and the checks of the module docstring."""

    def __init__(self, world: World) -> None:
        self.world = world
        # The configuration as of the highest index applied anywhere (committed).
        self.conf = ArbiterConfiguration.initial(dict(world.addresses))
        self.leaders: dict[int, str] = {}
        self.log: dict[int, Entry] = {}
        self.changes: dict[int, ViewChange | None] = {}
        self.views: dict[int, View] = {0: View()}
        self.epoch = 0
        # node -> replica -> (incarnation, seq, opinion): latest committed observation
        self.obs: dict[str, dict[str, tuple[int, int, Opinion]]] = {}
        self.dead: set[tuple[str, int]] = set()
        self.suspected: set[tuple[str, str, int]] = set()  # (node, replica, incarnation)
        self.top = 0  # highest index applied anywhere
        self.floors: dict[str, tuple[int, int]] = {}  # node -> (forgotten incarnation, epoch)
        self.forgotten = 0  # records forgotten in the run
        self.ranks_on = False  # S9: a Bootstrap with the ranks rules is committed
        self.sending: set[str] | None = None  # S10: nodes that keep sending (None: unchecked)

    def fail(self, what: str) -> None:
        """Raises :class:`InvariantViolation` with the virtual time."""
        raise InvariantViolation(f"t={self.world.q.now:.4f}: {what}")

    def expect(self, ok: bool, what: str) -> None:
        """Fails with ``what`` unless ``ok``."""
        if not ok:
            self.fail(what)

    # --- S1 --------------------------------------------------------------------------------

    def role(self, rid: str, role: Role, term: int) -> None:
        """A replica's role or term changed."""
        if role is Role.LEADER:
            holder = self.leaders.setdefault(term, rid)
            if holder != rid:
                self.fail(f"S1: two leaders in term {term}: {holder} and {rid}")

    # --- S2, S3 ------------------------------------------------------------------------------

    def sent(self, rid: str, disk: Disk, msg: Message) -> None:
        """A replica sends ``msg``: what it depends on must be durable (S2)."""
        t = msg.type
        if t is MessageType.PROPOSE:
            return
        hs = disk.hard_state
        granted_pre_vote = t is MessageType.PRE_VOTE_RESP and not msg.reject
        if t is MessageType.PRE_VOTE or granted_pre_vote:
            ok = msg.term > hs.term
        else:
            ok = msg.term == hs.term
        if not ok:
            self.fail(f"S2: {rid} sends {t.value} at term {msg.term}, disk has {hs.term}")
        if t is MessageType.VOTE_RESP and not msg.reject and hs.vote != msg.dst:
            self.fail(f"S2: {rid} grants its vote to {msg.dst} before it is on disk ({hs.vote})")
        if t is MessageType.VOTE and hs.vote != rid:
            self.fail(f"S2: {rid} asks for votes before its own vote is on disk")
        if t is MessageType.APPEND_RESP and not msg.reject and msg.index > disk.last_index:
            self.fail(f"S2: {rid} acknowledges index {msg.index}, disk has {disk.last_index}")

    def persisting(self, rid: str, disk: Disk, entries: tuple[Entry, ...]) -> None:
        """Entries are about to reach ``disk``: none may replace a committed entry on it (S3)."""
        log = self.log
        first = entries[0].index
        last = disk.last_index
        for i in range(max(first, disk.first_index), min(last, first + len(entries) - 1) + 1):
            have = disk.entry(i)
            if have != entries[i - first] and log.get(i) == have:
                self.fail(f"S3: {rid} overwrites committed entry {i} on disk")
        beyond = first + len(entries)
        if beyond <= last and log.get(beyond) == disk.entry(beyond):
            self.fail(f"S3: {rid} truncates committed entry {beyond} from its disk")

    def elected(self, rid: str, disk: Disk) -> None:
        """A new leader's disk holds every committed entry (Leader Completeness, S3)."""
        top = self.top
        if top and (disk.last_index < top or disk.entry(top) not in (None, self.log[top])):
            self.fail(f"S3: {rid} is elected without committed entry {top}")

    def restored(self, replica: SimReplica, view: View) -> None:
        """A replica's state machine was restored from a snapshot (or started empty) (S4)."""
        committed = self.views.get(view.epoch)
        if committed is None or committed != view:
            self.fail(f"S4: {replica.id} restores epoch {view.epoch}, not the committed view")
        if view.epoch < replica.epoch:
            self.fail(f"S4: {replica.id} goes back from epoch {replica.epoch} to {view.epoch}")
        replica.epoch = view.epoch

    # --- S3, S4, S5, S6 at apply ------------------------------------------------------------------

    def applied(self, replica: SimReplica, entry: Entry, result: ApplyResult) -> None:
        """``replica`` applied ``entry`` with ``result``."""
        i = entry.index
        known = self.log.get(i)
        change = result.change
        if known is None:
            self.log[i] = entry
            self.changes[i] = change
            self.top = max(self.top, i)
            if entry.type is EntryType.CONFIG:
                self._config_applied(entry, change)
            elif entry.data:
                self._first_apply(entry, change)
        else:
            if known != entry:
                self.fail(f"S3: {replica.id} applies at {i} an entry other than the committed one")
            if self.changes[i] != change:
                self.fail(f"S4: {replica.id} applies {i} as {change}, first as {self.changes[i]}")
        if change is not None:
            if change.epoch != replica.epoch + 1:
                self.fail(f"S4: {replica.id} goes from epoch {replica.epoch} to {change.epoch}")
            replica.epoch = change.epoch

    def _config_applied(self, entry: Entry, change: ViewChange | None) -> None:
        """A configuration change is committed: S5's quorum and voters follow it."""
        _, conf = decode_change(entry.data, entry.index)
        self.conf = conf
        w = self.world
        w.trace(
            f"configuration {entry.index} committed: voters {','.join(conf.voters)} "
            f"learners {','.join(conf.learners) or '-'}"
        )
        w.topology_since = w.q.now
        for latest in self.obs.values():
            for r in [r for r in latest if r not in conf]:  # a learner's are kept (rule 9)
                del latest[r]
        self._view_changed(change)

    def _first_apply(self, entry: Entry, change: ViewChange | None) -> None:
        w = self.world
        cmd = decode(entry.data)
        if isinstance(cmd, Bootstrap) and cmd.rules >= RANKS_RULES:
            self.ranks_on = True
        batches = cmd.batches if isinstance(cmd, ObserveBatches) else (cmd,)  # rule 2b
        for batch in batches:
            if not isinstance(batch, ObserveBatch) or batch.replica_id not in self.conf:
                continue  # tally rule 9
            r = batch.replica_id
            for o in batch.observations:
                latest = self.obs.setdefault(o.node_id, {})
                old = latest.get(r)
                if old is None or (o.incarnation, o.seq) > old[:2]:
                    latest[r] = (o.incarnation, o.seq, o.opinion)
                    if w.verbose and (
                        o.opinion is Opinion.SUSPECT or (old and old[2] is not o.opinion)
                    ):
                        w.trace(f"{r}'s {o.opinion.value} of {o.node_id}#{o.incarnation} committed")
                    if o.opinion is Opinion.SUSPECT:
                        self.suspected.add((o.node_id, r, o.incarnation))
                        self._suspect_committed(o.node_id, r, o.incarnation)
        self._view_changed(change)

    def _view_changed(self, change: ViewChange | None) -> None:
        w = self.world
        if change is None:
            return
        if change.epoch != self.epoch + 1:
            self.fail(f"S4: epoch {change.epoch} committed after epoch {self.epoch}")
        self.epoch = change.epoch
        base = self.views[change.epoch - 1]
        self.views[change.epoch] = view = base.with_changes(
            change.epoch, change.changes, change.ranks
        )
        self._ranks(base, view, change)
        later = {(c.node_id) for c in change.changes if c.state is not MemberState.DEAD}
        for c in change.changes:
            if self._forgotten(change.epoch, c, base):
                continue
            w.trace(f"epoch {change.epoch}: {c.node_id}#{c.incarnation} {c.state.value.upper()}")
            if c.state is not MemberState.DEAD:
                continue
            self.dead.add((c.node_id, c.incarnation))
            if self.sending is not None and c.node_id in self.sending:
                self.fail(
                    f"S10: {c.node_id}#{c.incarnation} DEAD at epoch {change.epoch} though it "
                    "never stopped sending on time"
                )
            if c.node_id in later:
                continue  # retired by its next incarnation (rules 3 and 5)
            obs = self.obs.get(c.node_id, {})
            suspects = sorted(
                r
                for r, (inc, _, op) in obs.items()
                if inc >= c.incarnation and op is Opinion.SUSPECT and r in self.conf.voters
            )
            if len(suspects) < self.conf.quorum:
                self.fail(
                    f"S5: {c.node_id}#{c.incarnation} DEAD at epoch {change.epoch} "
                    f"suspected only by {suspects}"
                )
            node = w.nodes.get(c.node_id)
            if node is not None:
                self._lease_quorum(node, node.local(w.q.now))

    def _ranks(self, base: View, view: View, change: ViewChange) -> None:
        """S9 for one committed view change."""
        epoch = change.epoch
        if any(j.epoch != epoch for j in change.ranks):
            self.fail(f"S9: epoch {epoch} carries an assignment of another epoch")
        jobs: dict[str, dict[str, int]] = {}
        for m in view.members:
            job = m.labels.get("job", "") if m.state is MemberState.ALIVE else ""
            job = job if self.ranks_on else ""  # no ranks before the rules carry them
            if (m.rank is not None) != bool(job):
                self.fail(f"S9: epoch {epoch}: {m.node_id} ({m.state.value}) has rank {m.rank}")
            if job:
                jobs.setdefault(job, {})[m.node_id] = m.rank  # type: ignore[assignment]
        for j in view.jobs:
            if dict(j.ranks) != jobs.get(j.job) or sorted(j.ranks.values()) != list(
                range(j.world_size)
            ):
                self.fail(f"S9: epoch {epoch}: job {j.job} ranks {dict(j.ranks)}, members {jobs}")
            before = base.job(j.job)
            if before is not None and j.epoch != epoch and before != j:
                self.fail(f"S9: job {j.job}'s ranks changed at epoch {epoch} without a change")
            for n, r in before.ranks.items() if before is not None else ():
                if n in j.ranks and j.ranks[n] != r and r < j.world_size:
                    self.fail(f"S9: {n} moved from rank {r} in {j.job} at epoch {epoch}")
        if set(jobs) != {j.job for j in view.jobs}:
            self.fail(f"S9: epoch {epoch}: ranked members of a job the view does not list")
        if self.world.verbose and change.ranks and self.world.trace_ranks:
            for j in change.ranks:
                ranks = " ".join(f"{n}={r}" for n, r in sorted(j.ranks.items(), key=lambda x: x[1]))
                self.world.trace(f"epoch {epoch}: job {j.job} ranks {ranks or '(none)'}")

    def _forgotten(self, epoch: int, c: MemberChange, base: View) -> bool:
        """S8 for one committed change; True when it is a forgotten record."""
        floor = self.floors.get(c.node_id, (None, 0))[0]
        if c.forgotten:
            was = base.get(c.node_id)
            if was is None or (was.incarnation, was.state) != (c.incarnation, c.state):
                self.fail(f"S8: epoch {epoch} forgets {c.node_id}#{c.incarnation}, not a record")
            if not c.state.is_final:
                self.fail(f"S8: epoch {epoch} forgets {c.node_id}, {c.state.value}")
            self.floors[c.node_id] = (max(floor or 0, c.incarnation), epoch)
            self.forgotten += 1
            self.world.trace(f"epoch {epoch}: {c.node_id}#{c.incarnation} forgotten")
            return True
        if floor is not None and c.incarnation <= floor:
            self.fail(
                f"S8: {c.node_id}#{c.incarnation} {c.state.value} at epoch {epoch}, "
                f"after incarnation {floor} was forgotten"
            )
        return False

    def granted(self, replica: SimReplica, node_id: str, incarnation: int, lease: float) -> None:
        """``replica`` answered a heartbeat of ``node_id`` at ``incarnation``, granting ``lease``
        (S8)."""
        floor, epoch = self.floors.get(node_id, (0, 0))
        if lease > 0 and incarnation <= floor and replica.epoch >= epoch:
            self.fail(
                f"S8: {replica.id} grants {node_id}#{incarnation} a lease after incarnation "
                f"{floor} was forgotten"
            )

    def _suspect_committed(self, node_id: str, rid: str, incarnation: int) -> None:
        node = self.world.nodes.get(node_id)
        s = node.session if node is not None else None
        if s is None or s.incarnation != incarnation:
            return
        assert node is not None
        left = s.leases(node.local(self.world.q.now)).get(rid, 0.0)  # 0: it never heard of rid
        if left > 0:
            self.fail(
                f"S6: {rid}'s SUSPECT of {node_id}#{incarnation} is committed while the "
                f"node holds its lease for {left:.4f}s more"
            )

    # --- S6 at the node ----------------------------------------------------------------------

    def after_ack(self, node: SimNode, rid: str, now: float) -> None:
        """A node took an ack from ``rid`` into its session (``now`` on the node's clock)."""
        s = node.session
        if s is None:
            return
        k = s.incarnation
        latest = self.obs.get(node.id, {}).get(rid)
        if latest is not None and latest[0] == k and latest[2] is Opinion.SUSPECT:
            left = s.leases(now).get(rid, 0.0)
            if left > 0:
                self.fail(
                    f"S6: {node.id}#{k} holds a lease from {rid} ({left:.4f}s) while {rid}'s "
                    f"latest committed observation of it is SUSPECT"
                )
        if (node.id, k) in self.dead:
            self._lease_quorum(node, now)

    def _lease_quorum(self, node: SimNode, now: float) -> None:
        """S6 for a node at its own clock's ``now``."""
        s = node.session
        if s is None or (node.id, s.incarnation) not in self.dead:
            return
        held = {r: round(x, 4) for r, x in s.leases(now).items() if x > 0}
        if not s.fenced(now):
            self.fail(f"S6: {node.id}#{s.incarnation} is DEAD while it holds leases {held}")
        conf = self.conf
        if sum(r in conf.voters for r in held) >= conf.quorum:
            self.fail(
                f"S6: {node.id}#{s.incarnation} is DEAD while it holds leases {held}, a quorum "
                f"of the voters {','.join(conf.voters)} in force"
            )

    # --- S7 ---------------------------------------------------------------------------------

    def subscriber_view(self, sub_id: str, view: View) -> None:
        """A subscriber's view after an item must be the committed one at its epoch."""
        committed = self.views.get(view.epoch)
        if committed is None:
            self.fail(f"S7: {sub_id} holds epoch {view.epoch}, never committed")
        elif committed != view:
            self.fail(f"S7: {sub_id}'s view at epoch {view.epoch} differs from the committed one")
