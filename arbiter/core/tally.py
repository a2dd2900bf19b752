"""The replicated membership state machine: observations in, views and epochs out.

Every replica applies the same committed log entries in the same order to a
:class:`MembershipState`, and so holds the same view at the same epoch
(docs/architecture.md, "Correctness rules"). Nothing here depends on time, dict order
or which replica runs it; outputs are sorted by node_id / replica id. Quorum:
a strict majority of the voters of the arbiter configuration in force at the
entry's log index (rule 11); one opinion is never enough.

Rules of the tally, applied to each entry:

Rule 1. Of replica r's observations of node n only the latest is kept, latest
    meaning highest (incarnation, seq). An observation not newer than the
    stored one is ignored, so applying a command twice changes nothing and a
    re-proposed old observation never overrides a newer one.
Rule 2. An observation below the incarnation of n's record is ignored; so is
    one at the record's incarnation when the record is DEAD or LEFT (final),
    one at or below n's retired incarnation (rule 5) or its floor (rule 12).
Rule 2b. An ObserveBatches entry (several replicas' batches, commands rule
    2b) stores every batch's observations in order (rules 1, 2, against the
    records as they stand before the entry), skipping a batch whose replica
    is not a member, then tallies every node touched once (rules 3, 4): one
    epoch for the whole entry (rule 6). The entry decides from each
    replica's newest observations, as if each had sent one batch: a life
    that a later batch of the entry supersedes (a restart within one gather)
    is never ALIVE on its own. Two ALIVE quorums still cannot coexist (each
    replica keeps one observation per node, and majorities intersect).
Rule 3. n becomes ALIVE at incarnation i when a quorum of replicas' latest
    observations of n are ALIVE at exactly i and n has no record, or a record
    at an incarnation below i (or, impossible in practice, a non-final record
    at i that is not ALIVE), and i is above n's retired incarnation. Its
    labels come from the ALIVE observation of the lowest replica id among
    those ALIVE at i. If n was ALIVE at a lower
    incarnation k, the same entry emits DEAD at k (the old life is retired)
    and then ALIVE at i.
Rule 4. ALIVE at k becomes DEAD at k when a quorum of replicas' latest
    observations of n are SUSPECT at k or at a later incarnation. A single
    suspicion never kills. (A replica suspecting n at k' > k hears neither
    life: it refuses k's heartbeats once it heard k'. Without this, a node
    that restarted as k', was heard while nothing could commit, then died,
    would stay ALIVE at k for ever: found by the simulator, seed 142.)
Rule 5. Leave(n, i) ends only a life the cluster knows: a record ALIVE at i
    becomes LEFT; a *joining* incarnation above the record is *retired* (no
    observation at or below i counts any more, rule 2); anything else
    changes nothing (:mod:`arbiter.core.leaves`, rule 5).
Rule 5a. Remove(n, i, by), an administrator's removal: a record ALIVE at i
    (0: at whatever incarnation it records) becomes LEFT, the change
    carrying ``removed_by``; LEFT, not DEAD (:mod:`arbiter.core.leaves`).
Rule 6. An entry that changes the view bumps the epoch by exactly one, however
    many member changes it carries; an entry that changes nothing leaves the
    epoch alone. Changes of one entry are ordered by node_id (a DEAD-then-
    ALIVE or DEAD-then-LEFT pair stays adjacent, in that order). Every change
    carries the member's labels: those it joined with (rule 3), which DEAD
    and LEFT changes repeat. From rules version 2 on (rule 10) the entry
    also gives every job it touched its new ranks (:mod:`arbiter.core.ranks`,
    its rules 1 to 5), in the same epoch.
Rule 4a. The DEAD change of rule 4 carries the evidence of the quorum that
    decided it: one :class:`~membership.shared.view.Evidence` per replica counted
    by rule 4 (sorted by replica id), from its stored SUSPECT observation.
Rule 7. SUSPECT is never a view state; it shows only in :meth:`suspected_by`.
Rule 8. The tally runs once per entry, after all the entry's observations are
    stored, over the nodes whose observations changed. A batch is one
    replica's opinions; only the latest of them counts (rule 1).
Rule 9. Raft no-ops (empty data), undecodable entries and batches from a
    replica that is not a member of the configuration in force (a removed or
    unknown replica) change nothing but the applied index; the last two
    return an error, the same on every replica. A learner's batch is stored
    but never counted (only voters' observations make a quorum, rules 3 and
    4): its opinions are committed, so it grants leases (observer rule 4)
    before it is promoted, and a node holds its lease by the time it votes.
Rule 10. A Bootstrap (commands rule 3a) sets the cluster's instance id if it
    has none; later ones change nothing. It raises the rules version in force
    to its own when that is higher (never lowers it). That never changes the
    view, except once: the entry that raises it to 2 derives the jobs' ranks
    from the view (:mod:`arbiter.core.ranks`, rule 6), a view change when
    some member has a job.
Rule 11. A configuration-change entry (Raft ``EntryType.CONFIG``, applied
    with :meth:`MembershipState.apply_configuration`) replaces the arbiter
    configuration from its index on: the quorum becomes a strict majority of
    its voters; the stored observations of every replica that is not a
    member (a removed one) are dropped, so they never count again; a
    promoted learner's stored observations count from this entry on; then every
    node with observations or an ALIVE record is tallied again (rules 3, 4),
    which may decide a pending ALIVE or DEAD in that entry (rule 6). A
    replica re-added later starts with no observations.
Rule 12. Forget (:mod:`arbiter.core.forget`) removes each named record that
    still matches exactly (node, incarnation, DEAD or LEFT), with a change
    marked ``forgotten``, and its observations at or below it; n keeps a
    floor by which all is judged as by the record (:mod:`arbiter.core.floors`).
Rule 13. Grace (:mod:`arbiter.core.grace`, its rules there) records or
    ends a node's grace window; never a view change. A member change of the
    node drops its window (DEAD, LEFT, a new incarnation, forgotten).
Records stay after DEAD and LEFT until the leader forgets them
(:mod:`arbiter.core.retention`). The whole state is snapshotted for log compaction
by :meth:`MembershipState.to_bytes` and restored by
:meth:`MembershipState.from_bytes`; the canonical encoding and its checks are
in :mod:`arbiter.core.tally_snapshot`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from arbiter.core import leaves, tally_snapshot
from arbiter.core.commands import (
    Bootstrap,
    CommandDecodeError,
    Forget,
    Grace,
    Leave,
    ObserveBatch,
    ObserveBatches,
    Opinion,
    Remove,
    decode,
)
from arbiter.core.grace import GraceOutcome, GraceRecord, judge_grace
from arbiter.core.leaves import LeaveOutcome, LeaveRefusal
from arbiter.core.raft.configuration import ArbiterConfiguration
from arbiter.core.ranks import RANKS_RULES, derive, job_of, update
from arbiter.core.tally_records import TallyRecords
from arbiter.core.tally_snapshot import ObservationRecord, SnapshotDecodeError
from membership.shared.view import JobRanks, Member, MemberChange, MemberState

__all__ = [
    "ApplyResult",
    "GraceOutcome",
    "LeaveOutcome",
    "LeaveRefusal",
    "MembershipState",
    "ObservationRecord",
    "SnapshotDecodeError",
    "ViewChange",
]


class MembershipState(TallyRecords):
    """The membership tally, replicated by applying the Raft log (see module rules).

    Args:
        arbiters: the initial arbiter configuration, or its voter ids
            (:class:`~arbiter.core.tally_records.TallyRecords`).

    Raises:
        ValueError: no voter, an empty id or a duplicate id.
    """

    def apply_configuration(self, index: int, configuration: ArbiterConfiguration) -> ApplyResult:
        """Applies the configuration-change entry at ``index`` (rule 11).

        Args:
            index: the entry's log index; greater than :attr:`applied_index`.
            configuration: the configuration the entry makes (its ``index``
                is ``index``; decoded by ``arbiter.core.raft.decode_change``).

        Returns:
            What the entry did: the view changes the new quorum decided, if any.
        """
        assert index > self._applied, f"apply({index}) after {self._applied}: log order broken"
        assert configuration.voters, "a committed configuration always has a voter"
        self._applied = index
        self._set_configuration(configuration)
        for n in list(self._obs):
            kept = {r: o for r, o in self._obs[n].items() if r in configuration}
            if kept:
                self._obs[n] = kept
            else:
                del self._obs[n]
        alive = [n for n, m in self._members.items() if m.state is MemberState.ALIVE]
        changes = [c for n in sorted(set(self._obs) | set(alive)) for c in self._tally(n)]
        return ApplyResult(index=index, change=self._commit(changes))

    def apply(self, index: int, data: bytes) -> ApplyResult:
        """Applies the committed entry at ``index`` (rules 1 to 9).

        Args:
            index: the entry's log index; greater than :attr:`applied_index`.
            data: the entry's payload: ``b""`` for a Raft no-op, otherwise
                bytes from :func:`arbiter.core.commands.encode`.

        Returns:
            What the entry did.
        """
        assert index > self._applied, f"apply({index}) after {self._applied}: log order broken"
        self._applied = index
        if not data:
            return ApplyResult(index=index)
        try:
            command = decode(data)
        except CommandDecodeError as e:
            return ApplyResult(index=index, error=f"undecodable entry: {e}")
        if isinstance(command, Bootstrap):
            # Rule 10: the first instance id applied names this cluster for good.
            if not self._instance:
                self._instance = command.instance
            before, self._rules = self._rules, max(self._rules, command.rules)
            if before < RANKS_RULES <= self._rules:  # ranks rule 6: derived, once
                return ApplyResult(
                    index=index, change=self._commit([], derive(self._members.values()))
                )
            return ApplyResult(index=index)
        if isinstance(command, Grace):
            return ApplyResult(index=index, grace=self._grace(index, command))
        if isinstance(command, ObserveBatch):
            if command.replica_id not in self._configuration:
                return ApplyResult(
                    index=index, error=f"observations from {command.replica_id!r}, not a member"
                )
            changes = [c for n in sorted(self._store(command)) for c in self._tally(n)]
            return ApplyResult(index=index, change=self._commit(changes))
        if isinstance(command, ObserveBatches):  # rule 2b
            touched: set[str] = set()
            strangers = []
            for batch in command.batches:
                if batch.replica_id in self._configuration:
                    touched |= self._store(batch)
                else:
                    strangers.append(batch.replica_id)
            changes = [c for n in sorted(touched) for c in self._tally(n)]
            error = f"observations from {sorted(set(strangers))}, not members"
            return ApplyResult(
                index=index, change=self._commit(changes), error=error if strangers else None
            )
        if isinstance(command, Forget):
            return ApplyResult(index=index, change=self._commit(self._forget(command)))
        if isinstance(command, Remove):
            changes, refusal, reason, incarnation = self._remove(command)
        else:
            changes, refusal, reason = self._leave(command)
            incarnation = command.incarnation
        change = self._commit(changes)
        leave = LeaveOutcome(
            request_id=command.request_id,
            node_id=command.node_id,
            accepted=refusal is None,
            reason=reason,
            epoch=self._epoch,
            joined=any(
                c.node_id == command.node_id
                and c.incarnation == incarnation
                and c.state is MemberState.LEFT
                for c in changes
            ),
            refusal=refusal,
            incarnation=incarnation,
        )
        return ApplyResult(index=index, change=change, leave=leave)

    # -- the tally -----------------------------------------------------------

    def _tally(self, node_id: str) -> list[MemberChange]:
        """The changes the node's stored observations call for (rules 3, 4)."""
        record = self._members.get(node_id)
        obs = self._obs.get(node_id, {})
        alive: dict[int, list[str]] = {}
        for r in sorted(obs):
            if obs[r].opinion is Opinion.ALIVE and r in self._arbiters:  # voters only
                alive.setdefault(obs[r].incarnation, []).append(r)
        winners = [i for i, rs in alive.items() if len(rs) >= self._quorum]
        assert len(winners) <= 1, f"two ALIVE quorums for {node_id!r}: {winners}"
        if winners:
            i = winners[0]
            same = record is not None and record.incarnation == i
            if (record is None or record.incarnation < i) or (
                same and not record.state.is_final and record.state is not MemberState.ALIVE
            ):
                changes = []
                if record is not None and record.state is MemberState.ALIVE:
                    changes.append(change(node_id, record.incarnation, MemberState.DEAD, record))
                # lowest replica id among them; one mapping for equal labels (labelsets.py)
                labels = self._labelsets.mapping(obs[alive[i][0]].labels)
                changes.append(change(node_id, i, MemberState.ALIVE, labels))
                return changes
        if record is not None and record.state is MemberState.ALIVE:
            votes = self.death_votes(node_id)
            if len(votes) >= self._quorum:
                dead = change(node_id, record.incarnation, MemberState.DEAD, record)
                evidence = tuple(obs[r].evidence(r) for r in votes)  # rule 4a
                return [dataclasses.replace(dead, evidence=evidence)]
        return []

    def judge_leave(
        self, node_id: str, incarnation: int, heard_by: str = ""
    ) -> tuple[LeaveRefusal | None, str]:
        """How rule 5 judges Leave(node_id, incarnation) now, without changing anything.

        The API asks it before proposing a leave, so that a refused one
        commits nothing; the tally asks it again when the entry is applied
        (the state may have moved in between). See
        :func:`arbiter.core.leaves.judge_leave`.
        """
        return leaves.judge_leave(
            node_id,
            incarnation,
            heard_by in self._arbiters,
            record=self._members.get(node_id) or self._floors.record(node_id),
            observed=[o.incarnation for o in self._obs.get(node_id, {}).values()],
            retired=self._retired.get(node_id, 0),
        )

    def _leave(self, command: Leave) -> tuple[list[MemberChange], LeaveRefusal | None, str]:
        """The changes a Leave calls for, why it is refused (None: accepted), and
        what it did or what the cluster records (rule 5)."""
        n, i = command.node_id, command.incarnation
        refusal, reason = self.judge_leave(n, i, command.heard_by)
        if refusal is not None:
            return [], refusal, reason
        record = self._members.get(n)
        if record is not None and record.incarnation == i:
            return [change(n, i, MemberState.LEFT, record)], None, reason
        if self._retired.get(n, 0) >= i:
            return [], None, reason
        changes = []
        if record is not None and record.state is MemberState.ALIVE:
            changes.append(change(n, record.incarnation, MemberState.DEAD, record))
        self._retired[n] = i
        self._drop_observations(n, i)  # the retired lives can never count again (rule 2)
        return changes, None, reason

    def _drop_observations(self, node_id: str, upto: int) -> None:
        """Forgets the node's observations at incarnations <= ``upto`` (rules 5, 11)."""
        kept = {r: o for r, o in self._obs.pop(node_id, {}).items() if o.incarnation > upto}
        if kept:
            self._obs[node_id] = kept

    def judge_remove(self, node_id: str, incarnation: int = 0) -> tuple[LeaveRefusal | None, str]:
        """How rule 5a judges Remove(node_id, incarnation) now, without changing anything
        (:func:`arbiter.core.leaves.judge_remove`)."""
        return leaves.judge_remove(
            node_id,
            incarnation,
            record=self._members.get(node_id) or self._floors.record(node_id),
            observed=[o.incarnation for o in self._obs.get(node_id, {}).values()],
        )

    def _remove(self, command: Remove) -> tuple[list[MemberChange], LeaveRefusal | None, str, int]:
        """Rule 5a: the changes, the refusal (None: accepted), the reason and the
        incarnation removed (the one asked when refused)."""
        refusal, reason = self.judge_remove(command.node_id, command.incarnation)
        record = self._members.get(command.node_id)
        if refusal is not None or record is None:
            return [], refusal, reason, command.incarnation
        left = change(command.node_id, record.incarnation, MemberState.LEFT, record)
        return [dataclasses.replace(left, removed_by=command.by)], None, reason, record.incarnation

    def _forget(self, command: Forget) -> list[MemberChange]:
        """Rule 12: forgotten changes of the records that still match; sets their floors."""
        changes = []
        for n, i, state in command.records:
            record = self._members.get(n)
            if record is None or (record.incarnation, record.state.value) != (i, state):
                continue
            self._floors.set(n, i, record.state)
            self._drop_observations(n, i)
            changes.append(dataclasses.replace(change(n, i, record.state, record), forgotten=True))
        return changes

    def judge_grace(
        self, node_id: str, incarnation: int, by: str = ""
    ) -> tuple[LeaveRefusal | None, str]:
        """How rule 13 judges Grace(node_id, incarnation, by) now, without changing
        anything (:func:`arbiter.core.grace.judge_grace`): the API asks before proposing."""
        window = self._graces.get(node_id)
        return judge_grace(node_id, incarnation, self._members.get(node_id), by, window)

    def _grace(self, index: int, command: Grace) -> GraceOutcome:
        """Rule 13: records or ends the node's window; what became of the ask."""
        n = command.node_id
        refusal, reason = self.judge_grace(n, command.incarnation, command.by)
        if refusal is not None:
            return GraceOutcome(
                request_id=command.request_id,
                node_id=n,
                accepted=False,
                refusal=refusal,
                reason=reason,
                index=index,
            )
        record = None
        if command.seconds > 0:
            record = GraceRecord(
                incarnation=command.incarnation,
                seconds=command.seconds,
                until=command.until,
                reason=command.reason,
                grant=index,
            )
            self._graces[n] = record
        else:
            self._graces.pop(n, None)
        self._grace_version += 1
        return GraceOutcome(
            request_id=command.request_id,
            node_id=n,
            accepted=True,
            reason=reason,
            record=record,
            index=index,
        )

    def _commit(
        self, changes: list[MemberChange], derived: dict[str, dict[str, int]] | None = None
    ) -> ViewChange | None:
        """Records the entry's changes under the next epoch (rule 6), with the ranks of
        the jobs they touch (rules 6, 10: ``derived`` ranks of an upgrade)."""
        if not changes and not derived:
            return None
        self._epoch += 1
        touched = set(derived or ())
        for c in changes:
            old = self._members.get(c.node_id)
            touched.add(job_of(old))
            grace = self._graces.get(c.node_id)
            same_life = grace is not None and grace.incarnation == c.incarnation
            if grace is not None and not (same_life and c.state is MemberState.ALIVE):
                del self._graces[c.node_id]  # rule 13: the window was for that life
                self._grace_version += 1
            if c.forgotten:  # rule 12
                del self._members[c.node_id]
                continue
            self._floors.drop(c.node_id)
            # Same label rule as View.with_changes, so that a subscriber folding
            # the changes into its view ends with exactly view().
            labels = c.labels if c.labels else (old.labels if old is not None else {})
            self._members[c.node_id] = Member(
                node_id=c.node_id,
                incarnation=c.incarnation,
                state=c.state,
                labels=labels,
                epoch=self._epoch,
            )
            touched.add(job_of(self._members[c.node_id]))
        touched.discard("")
        ranks: tuple[JobRanks, ...] = ()
        if self._rules >= RANKS_RULES:
            changed = {c.node_id for c in changes}
            ranks = tuple(self._rank(j, changed, (derived or {}).get(j)) for j in sorted(touched))
        self._view = None
        return ViewChange(epoch=self._epoch, changes=tuple(changes), ranks=ranks)

    def _rank(self, job: str, changed: set[str], derived: dict[str, int] | None) -> JobRanks:
        """The job's new ranks at this epoch (ranks rules 2 to 5), written into the records
        of its members that moved, joined or restarted; ``derived``: the ranks of an upgrade
        instead (ranks rule 6). O(changes) plus one copy of the job's ranks."""
        records = self._members
        if derived is not None:
            by_rank: list[str | None] = [None] * len(derived)
            for n, r in derived.items():
                by_rank[r] = n
            ranks, touch = dict(derived), list(derived)
            self._ranks[job] = (ranks, by_rank)
        else:
            ranks, by_rank = self._ranks.setdefault(job, ({}, []))
            stay = {n for n in changed if job_of(records.get(n)) == job}  # in it after the entry
            gone = [n for n in changed if n in ranks and n not in stay]
            moved = update(ranks, by_rank, gone, stay)  # those already in it are kept (rule 2)
            touch = [*moved, *(n for n in stay if n not in moved)]  # restarted: new records
        frozen = MappingProxyType(dict(ranks))  # the one O(job) step: a C-level copy
        assignment = JobRanks(job=job, epoch=self._epoch, ranks=frozen)
        if ranks:
            self._jobs[job] = assignment
        else:
            self._jobs.pop(job, None)  # ranks rule 5: an empty job is gone
            self._ranks.pop(job, None)
        for n in touch:
            m = records[n]
            if m.rank != ranks[n]:  # moved, new, or a new record of a member that stayed
                records[n] = dataclasses.replace(m, rank=ranks[n])
        return assignment

    # -- snapshots (the encoding is in arbiter.core.tally_snapshot) ------------

    @classmethod
    def from_bytes(cls, data: bytes) -> MembershipState:
        """Restores a state written by :meth:`to_bytes`.

        The configuration comes from the snapshot; the caller checks it
        against Raft's (``arbiter.core.replica.restore_state``).

        Raises:
            SnapshotDecodeError: the bytes are not a snapshot :meth:`to_bytes`
                could have written (its encoding is canonical, so anything
                unsorted, duplicated or mistyped is refused).
        """
        image = tally_snapshot.decode(data)
        try:
            state = cls(image.configuration)
        except ValueError as e:
            raise SnapshotDecodeError(f"invalid snapshot: {e!r}") from None
        state._load(image)
        if state.to_bytes() != bytes(data):
            raise SnapshotDecodeError("snapshot is not canonical (unsorted or duplicate records)")
        return state


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatVerdict:
    """What the replica answers to one heartbeat (:mod:`arbiter.core.observer`).

    Attributes:
        accepted: the heartbeat counted (refreshed the detector).
        state: the node's state at the heartbeat's incarnation in the committed
            view (JOINING when it is not a member at that incarnation).
        incarnation: the highest incarnation the cluster records for the node
            id (at least the heartbeat's own when accepted).
        lease: seconds of lease granted, counted by the node from its send
            time; 0.0 when none.
        grace: seconds left of the node's grace window on this replica,
            counted as the lease is (``arbiter/core/grace_windows.py`` rule
            3); 0.0 when none, or when no lease is granted.
        grace_id: the grant naming that window (its log index); 0 with none.
    """

    accepted: bool
    state: MemberState
    incarnation: int
    lease: float
    grace: float = 0.0
    grace_id: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewChange:
    """The view changes one committed entry made; ``epoch`` is the new epoch.

    ``ranks`` is the new assignment of every job the entry changed, sorted by
    job (:mod:`arbiter.core.ranks`, rule 5); ``changes`` may be empty when
    only ranks changed (ranks rule 6).
    """

    epoch: int
    changes: tuple[MemberChange, ...]
    ranks: tuple[JobRanks, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyResult:
    """The outcome of applying the entry at log index ``index``.

    ``change`` is set when the view changed, ``leave`` for Leave and Remove
    commands, ``grace`` for Grace commands, ``error`` when the entry was
    rejected (rule 9).
    """

    index: int
    change: ViewChange | None = None
    leave: LeaveOutcome | None = None
    grace: GraceOutcome | None = None
    error: str | None = None


def change(
    node_id: str,
    incarnation: int,
    state: MemberState,
    labels: Mapping[str, str] | Member | None = None,
) -> MemberChange:
    """A change; ``labels`` may be the member record whose labels it repeats (rule 6)."""
    if isinstance(labels, Member):
        labels = labels.labels
    return MemberChange(node_id=node_id, incarnation=incarnation, state=state, labels=labels or {})
