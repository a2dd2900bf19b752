"""The tally's records and the questions asked of them (the state of :mod:`arbiter.core.tally`).

:class:`TallyRecords` holds what :class:`arbiter.core.tally.MembershipState`
records (the arbiter configuration in force, the epoch, member records, each
voter's latest observation of each node, retired incarnations, the floors of
forgotten records, the instance id, the rules version, the jobs' ranks, the
grace windows), stores observations (tally rules 1 and 2) and answers
read-only questions about them; the rules that decide changes are in
:mod:`arbiter.core.tally`, the snapshot's layout in
:mod:`arbiter.core.tally_snapshot`. Split from the tally by concept: records
and reads here, decisions there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from arbiter.core import tally_snapshot
from arbiter.core.commands import ObserveBatch, Opinion
from arbiter.core.floors import Floors
from arbiter.core.grace import GraceRecord
from arbiter.core.labelsets import LabelSets
from arbiter.core.raft.configuration import ArbiterConfiguration
from arbiter.core.tally_snapshot import ObservationRecord, TallyImage
from membership.shared.view import JobRanks, Member, View

__all__ = ["TallyRecords"]


class TallyRecords:
    """The records of one replicated membership state (see the module docstring)."""

    def __init__(self, arbiters: Sequence[str] | ArbiterConfiguration) -> None:
        """Creates the empty state (epoch 0, nothing applied).

        Args:
            arbiters: the initial arbiter configuration, or the ids of its
                voters (no addresses, index 0). The quorum is a strict
                majority of the voters (rule 11 changes them).

        Raises:
            ValueError: no voter, an empty id or a duplicate id.
        """
        if not isinstance(arbiters, ArbiterConfiguration):
            ids = list(arbiters)
            if not all(isinstance(a, str) and a for a in ids) or len(set(ids)) < len(ids):
                raise ValueError(f"arbiters must be distinct non-empty ids, got {ids!r}")
            arbiters = ArbiterConfiguration.initial(dict.fromkeys(ids, ""))
        if not arbiters.voters:
            raise ValueError(f"an arbiter configuration needs a voter, got {arbiters!r}")
        self._set_configuration(arbiters)
        self._epoch = 0
        self._applied = 0
        self._members: dict[str, Member] = {}
        self._obs: dict[str, dict[str, ObservationRecord]] = {}  # node -> replica -> latest
        # node -> highest incarnation retired by a leave before it joined (rule 5)
        self._retired: dict[str, int] = {}
        self._floors = Floors()  # rule 12
        self._instance = ""  # rule 10
        self._rules = 1  # rule 10: the rules version in force (ranks from 2 on)
        self._jobs: dict[str, JobRanks] = {}  # job -> its ranks (arbiter/core/ranks.py)
        # job -> (node -> rank, rank -> node): the working copy ranks.update changes in
        # place (O(changes) per entry); _jobs holds frozen copies. Rebuilt on load.
        self._ranks: dict[str, tuple[dict[str, int], list[str | None]]] = {}
        self._graces: dict[str, GraceRecord] = {}  # node -> its grace window (rule 13)
        self._grace_version = 0  # bumped whenever a window is granted, ended or dropped
        self._view: View | None = View()
        # One copy of each distinct label set in the records (labelsets.py): the
        # observations' pairs and the member records' mappings.
        self._labelsets = LabelSets()

    def _set_configuration(self, configuration: ArbiterConfiguration) -> None:
        self._configuration = configuration
        self._arbiters = tuple(configuration.voters)  # sorted
        self._quorum = configuration.quorum

    @property
    def arbiters(self) -> tuple[str, ...]:
        """The voter ids of the configuration in force, sorted (their observations count)."""
        return self._arbiters

    @property
    def configuration(self) -> ArbiterConfiguration:
        """The arbiter configuration as of :attr:`applied_index` (rule 11)."""
        return self._configuration

    @property
    def epoch(self) -> int:
        """The epoch of the current view (0 before any change)."""
        return self._epoch

    @property
    def applied_index(self) -> int:
        """Log index of the last applied entry (0 before any)."""
        return self._applied

    @property
    def quorum(self) -> int:
        """How many replicas make a strict majority of the voters in force."""
        return self._quorum

    def view(self) -> View:
        """The current view: every member with a record, sorted by node_id, and the jobs'
        ranks, sorted by job."""
        if self._view is None:
            members = tuple(self._members[n] for n in sorted(self._members))
            jobs = tuple(self._jobs[j] for j in sorted(self._jobs))
            self._view = View(epoch=self._epoch, members=members, jobs=jobs)
        return self._view

    @property
    def rules(self) -> int:
        """The rules version in force (rule 10): ranks are kept from 2 on."""
        return self._rules

    def job(self, name: str) -> JobRanks | None:
        """Job ``name``'s rank assignment, or None when it has no ALIVE member."""
        return self._jobs.get(name)

    def graces(self) -> Mapping[str, GraceRecord]:
        """node_id -> its committed grace window (rule 13), read-only."""
        return MappingProxyType(self._graces)

    def grace(self, node_id: str) -> GraceRecord | None:
        """The node's committed grace window, or None (rule 13)."""
        return self._graces.get(node_id)

    @property
    def grace_version(self) -> int:
        """Grows whenever a grace window is granted, ended or dropped (not in snapshots:
        a restored state starts again from 0)."""
        return self._grace_version

    def member(self, node_id: str) -> Member | None:
        """The node's record in the view, or None if it has none."""
        return self._members.get(node_id)

    @property
    def instance(self) -> str:
        """The cluster's instance id (rule 10); "" until a leader's Bootstrap is applied."""
        return self._instance

    def retired(self, node_id: str) -> int:
        """The highest incarnation of the node retired by a leave before it joined
        the view (rule 5); 0 for none. Incarnations at or below it never join."""
        return self._retired.get(node_id, 0)

    @property
    def floors(self) -> Floors:
        """The floors of forgotten records (rule 12); read ``member(n) or floors.record(n)``."""
        return self._floors

    def observation(self, replica_id: str, node_id: str) -> ObservationRecord | None:
        """The replica's latest committed observation of the node, or None."""
        return self._obs.get(node_id, {}).get(replica_id)

    def suspected_by(self, node_id: str) -> tuple[str, ...]:
        """Replicas whose latest observation of the node's current incarnation is SUSPECT.

        The current incarnation is the record's; for a node without a record
        (JOINING) it is the highest one observed. Sorted by replica id.
        """
        record = self._members.get(node_id)
        incarnation = record.incarnation if record else self.highest_incarnation(node_id)
        obs = self._obs.get(node_id, {})
        return tuple(
            r
            for r in sorted(obs)
            if obs[r].incarnation == incarnation and obs[r].opinion is Opinion.SUSPECT
        )

    def death_votes(self, node_id: str) -> tuple[str, ...]:
        """Voters whose latest observation is SUSPECT at the record's incarnation or a
        later one (rule 4), sorted; empty for a node without a record."""
        record = self._members.get(node_id)
        if record is None:
            return ()
        obs = self._obs.get(node_id, {})
        return tuple(
            r
            for r in sorted(obs)
            if obs[r].incarnation >= record.incarnation
            and obs[r].opinion is Opinion.SUSPECT
            and r in self._arbiters  # voters only (rule 9: a learner's are never counted)
        )

    def highest_incarnation(self, node_id: str) -> int | None:
        """The highest incarnation known for the node (record, retired incarnation or
        any observation), or None."""
        # Read on every heartbeat: no list built (the same maximum as of a list).
        best: int | None = None
        obs = self._obs.get(node_id)
        if obs:
            best = max(o.incarnation for o in obs.values())
        member = self._members.get(node_id)
        if member is not None and (best is None or member.incarnation > best):
            best = member.incarnation
        retired = self._retired.get(node_id)
        if retired is not None and (best is None or retired > best):
            best = retired
        if self._floors.has(node_id):
            floor = self._floors.incarnation(node_id)
            if best is None or floor > best:
                best = floor
        return best

    # -- snapshots --------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """A canonical snapshot of the whole state (for log compaction).

        The same state gives the same bytes on every replica; the layout is
        in :mod:`arbiter.core.tally_snapshot`.
        """
        return tally_snapshot.encode(self._image())

    def _image(self) -> TallyImage:
        """This state as plain records, in canonical order."""
        return TallyImage(
            configuration=self._configuration,
            epoch=self._epoch,
            applied_index=self._applied,
            members=tuple(self._members[n] for n in sorted(self._members)),
            observations=tuple(
                (n, r, o) for n in sorted(self._obs) for r, o in sorted(self._obs[n].items())
            ),
            retired=tuple((n, self._retired[n]) for n in sorted(self._retired)),
            instance=self._instance,
            forgotten=self._floors.rows(),
            rules=self._rules,
            jobs=tuple(self._jobs[j] for j in sorted(self._jobs)),
            graces=tuple((n, self._graces[n]) for n in sorted(self._graces)),
        )

    def _load(self, image: TallyImage) -> None:
        """Fills this empty state with ``image``'s records (a later duplicate wins;
        :meth:`from_bytes` then refuses the snapshot as not canonical)."""
        self._epoch, self._applied = image.epoch, image.applied_index
        shared = self._labelsets
        for m in image.members:
            self._members[m.node_id] = (
                dataclasses.replace(m, labels=shared.mapping(m.labels)) if m.labels else m
            )
        for node, replica, record in image.observations:
            if record.labels:
                record = dataclasses.replace(record, labels=shared.pairs(record.labels))
            self._obs.setdefault(node, {})[replica] = record
        for node, incarnation in image.retired:
            self._retired[node] = incarnation
        self._instance = image.instance
        self._floors = Floors(image.forgotten)
        self._rules = image.rules
        for j in image.jobs:
            self._jobs[j.job] = j
            by_rank: list[str | None] = [None] * j.world_size
            self._ranks[j.job] = (dict(j.ranks), by_rank)
            for node_id, rank in j.ranks.items():
                by_rank[rank] = node_id
                m = self._members[node_id]
                self._members[node_id] = dataclasses.replace(m, rank=rank)
        self._graces.update(image.graces)
        self._view = None

    def _store(self, batch: ObserveBatch) -> set[str]:
        """Stores the batch's newer observations (tally rules 1, 2); returns the nodes
        touched."""
        touched: set[str] = set()
        for o in batch.observations:
            record = self._members.get(o.node_id)
            if record is not None and (
                o.incarnation < record.incarnation
                or (o.incarnation == record.incarnation and record.state.is_final)
            ):
                continue
            floor = max(self._retired.get(o.node_id, 0), self._floors.incarnation(o.node_id))
            if o.incarnation <= floor:
                continue
            held = self._obs.get(o.node_id)
            stored = held.get(batch.replica_id) if held is not None else None
            if stored is not None and (o.incarnation, o.seq) <= (stored.incarnation, stored.seq):
                continue
            # What the node's records repeat is kept once (memory per node): the labels
            # one tuple for the node's records and every node with the same ones
            # (labelsets.py), the incarnation one int for the node's records at it.
            labels, incarnation = None, o.incarnation
            if held:
                for r in held.values():
                    if r.labels == o.labels:
                        labels = r.labels
                    if r.incarnation == incarnation:
                        incarnation = r.incarnation
            else:
                held = self._obs[o.node_id] = {}
            if record is not None and record.incarnation == incarnation:
                incarnation = record.incarnation
            held[batch.replica_id] = ObservationRecord(
                incarnation=incarnation,
                opinion=o.opinion,
                seq=o.seq,
                labels=self._labelsets.pairs(o.labels) if labels is None else labels,
                silence=o.silence,
                suspicion=o.suspicion,
                detector=o.detector,
            )
            touched.add(o.node_id)
        return touched
