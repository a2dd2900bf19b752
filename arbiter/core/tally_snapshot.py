"""The tally's snapshot: its canonical byte encoding, and the checks on the way back.

Raft compacts the log by replacing its applied prefix with a snapshot of the
state machine (Raft §7). A replica that restarts, or that a leader brings up
to date, rebuilds :class:`arbiter.core.tally.MembershipState` from these
bytes, so they must mean the same thing on every replica and for ever.

Rules:

1. The encoding is canonical: the same state always gives the same bytes
   (JSON with sorted keys, no spaces, records sorted by node id then replica
   id), so replicas can compare snapshots byte for byte.
2. Layout, version 1: ``{"v": 1, "arbiters": [...], "epoch": e,
   "applied_index": i, "members": [[node, incarnation, state, epoch,
   [[key, value], ...]], ...], "obs": [[node, replica, incarnation, opinion,
   seq, [[key, value], ...]], ...]}``. An observation row with suspicion
   evidence has a 7th column ``[silence, suspicion, detector]``; one without
   has six, as before evidence existed. ``"retired": [[node, incarnation],
   ...]`` is present only when some incarnation was retired, and
   ``"instance": id`` only once the cluster has one, and ``"forgotten":
   [[node, incarnation, state], ...]`` (the floors of forgotten records, tally
   rule 12, state ``"DEAD"`` or ``"LEFT"``) only when there is one, so a state
   without them encodes as it did before they existed. ``"config": {"voters": {id:
   address}, "learners": {...}, "index": i}`` is the arbiter configuration
   in force (tally rule 11); it is left out while that is the initial one
   with no addresses (``arbiters`` says it all), and ``"arbiters"`` always
   lists its voters. ``"rules": r`` is the rules version (tally rule 10),
   present only above 1; ``"jobs": [[job, epoch, [[node, rank], ...]], ...]``
   the jobs' ranks (:mod:`arbiter.core.ranks`; sorted by job, then node),
   present only when there is one; ``"graces": [[node, incarnation,
   seconds, until, reason, grant], ...]`` the grace windows (tally rule 13),
   present only when there is one. A snapshot written before they existed
   has none of them: it loads with rules 1 and no ranks, which a leader's
   Bootstrap then derives for every replica at once (ranks rule 6).
3. Decoding refuses, with :class:`SnapshotDecodeError`, anything this
   module could not have written: another version, a wrong type (a bool is
   not an int), a negative number, an empty id, unsorted or duplicate
   labels, a JOINING member, a member epoch outside ``1..epoch``, an
   observation from a replica that is not a voter, a ``config`` whose voters
   are not ``arbiters`` or whose index is above ``applied_index``, a forgotten
   floor that is not DEAD or LEFT or whose node has a record, ranks below
   rules 2, a rank of a node that is not an ALIVE member of that job, ranks
   that are not dense, an ALIVE member of a job without a rank (rules >= 2),
   a grace window of a node not ALIVE at its incarnation. The state checks the
   rest (distinct arbiters, no duplicate records) by encoding what it
   restored and comparing with the input.

This module knows the layout, not the tally's rules: it turns a
:class:`TallyImage` (plain records) into bytes and back.
"""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass
from typing import Any

from arbiter.core.commands import Opinion
from arbiter.core.grace import GraceRecord, check_reason
from arbiter.core.raft.configuration import ArbiterConfiguration
from arbiter.core.raft.errors import InvalidInput
from arbiter.core.ranks import RANKS_RULES, job_of
from arbiter.errors import ArbiterError
from membership.shared.view import Evidence, JobRanks, Member, MemberState

__all__ = [
    "SNAPSHOT_VERSION",
    "ObservationRecord",
    "SnapshotDecodeError",
    "TallyImage",
    "decode",
    "encode",
]

SNAPSHOT_VERSION = 1


class SnapshotDecodeError(ArbiterError, ValueError):
    """The bytes are not a valid snapshot of a :class:`~arbiter.core.tally.MembershipState`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ObservationRecord:
    """A replica's latest committed observation of a node (tally rule 1).

    The tally stores one per (node, replica) and the snapshot holds them, so
    the type lives here, below both; :mod:`arbiter.core.tally` re-exports it.
    ``labels`` are those the observation carried (sorted pairs); ``silence``,
    ``suspicion`` and ``detector`` its suspicion evidence (commands rule 2a).
    """

    incarnation: int
    opinion: Opinion
    seq: int
    labels: tuple[tuple[str, str], ...] = ()
    silence: float | None = None
    suspicion: float | None = None
    detector: str = ""

    def evidence(self, replica_id: str) -> Evidence:
        """This observation as the evidence of ``replica_id``'s suspicion."""
        return Evidence(
            arbiter_id=replica_id,
            silence=self.silence,
            suspicion=self.suspicion,
            detector=self.detector,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TallyImage:
    """Everything a tally holds, as plain records in canonical order.

    Attributes:
        configuration: the arbiter configuration in force (its voters are
            the snapshot's ``arbiters``).
        epoch: the epoch of the view.
        applied_index: log index of the last applied entry.
        members: every member record, sorted by node id.
        observations: (node id, replica id, its latest observation of the
            node), sorted by node id, then replica id.
        retired: (node id, highest retired incarnation), sorted by node id.
        instance: the cluster's instance id ("" before its Bootstrap).
        forgotten: (node id, incarnation, DEAD or LEFT) of each floor of a
            forgotten record (tally rule 12), sorted by node id.
        rules: the rules version in force (tally rule 10).
        jobs: every job's ranks, sorted by job (members carry no rank here).
        graces: (node id, its grace window), sorted by node id.
    """

    configuration: ArbiterConfiguration
    epoch: int
    applied_index: int
    members: tuple[Member, ...] = ()
    observations: tuple[tuple[str, str, ObservationRecord], ...] = ()
    retired: tuple[tuple[str, int], ...] = ()
    instance: str = ""
    forgotten: tuple[tuple[str, int, MemberState], ...] = ()
    rules: int = 1
    jobs: tuple[JobRanks, ...] = ()
    graces: tuple[tuple[str, GraceRecord], ...] = ()


def encode(image: TallyImage) -> bytes:
    """The canonical bytes of ``image`` (rules 1 and 2)."""
    members = [
        [m.node_id, m.incarnation, m.state.value, m.epoch, sorted(map(list, m.labels.items()))]
        for m in image.members
    ]
    obs = [
        [n, r, o.incarnation, o.opinion.value, o.seq, [list(p) for p in o.labels], *_ev_row(o)]
        for n, r, o in image.observations
    ]
    snapshot: dict[str, Any] = {
        "v": SNAPSHOT_VERSION,
        "arbiters": list(image.configuration.voters),
        "epoch": image.epoch,
        "applied_index": image.applied_index,
        "members": members,
        "obs": obs,
    }
    if image.retired:  # absent when empty: older snapshots stay canonical
        snapshot["retired"] = [[n, i] for n, i in image.retired]
    if image.instance:
        snapshot["instance"] = image.instance
    if image.forgotten:
        snapshot["forgotten"] = [[n, i, s.value] for n, i, s in image.forgotten]
    conf = image.configuration
    if conf.index or conf.learners or any(conf.voters.values()):
        snapshot["config"] = conf.to_json()
    if image.rules > 1:
        snapshot["rules"] = image.rules
    if image.jobs:
        snapshot["jobs"] = [
            [j.job, j.epoch, sorted(map(list, j.ranks.items()))] for j in image.jobs
        ]
    if image.graces:
        snapshot["graces"] = [
            [n, g.incarnation, g.seconds, g.until, g.reason, g.grant] for n, g in image.graces
        ]
    return json.dumps(snapshot, sort_keys=True, separators=(",", ":")).encode()


def decode(data: bytes) -> TallyImage:
    """The records in ``data``, checked value by value (rule 3).

    Args:
        data: bytes from :func:`encode`.

    Returns:
        The records, in the order the bytes list them; the caller checks
        that order by encoding its state again.

    Raises:
        SnapshotDecodeError: the bytes are not JSON of the version 1 layout,
            or a value is of the wrong type or out of range.
    """
    try:
        return _image(json.loads(bytes(data).decode("utf-8")))
    except SnapshotDecodeError:
        raise
    except (ValueError, TypeError, KeyError) as e:
        raise SnapshotDecodeError(f"invalid snapshot: {e!r}") from None


def _image(snap: Any) -> TallyImage:
    if not isinstance(snap, dict) or snap.get("v") != SNAPSHOT_VERSION:
        raise SnapshotDecodeError("not a version 1 membership snapshot")
    arbiters = tuple(snap["arbiters"])
    epoch, applied = _int(snap["epoch"]), _int(snap["applied_index"])
    conf = _configuration(snap, arbiters, applied)
    members = []
    for node, inc, st, member_epoch, labels in snap["members"]:
        member = Member(
            node_id=_str(node, empty=False),
            incarnation=_int(inc),
            state=MemberState(st),
            labels=dict(_pairs(labels)),
            epoch=_int(member_epoch),
        )
        if member.state is MemberState.JOINING or not 0 < member.epoch <= epoch:
            raise SnapshotDecodeError(f"bad member record {member!r}")
        members.append(member)
    observations = []
    last: tuple[Any, tuple[tuple[str, str], ...]] = (None, ())
    for row in snap["obs"]:
        node, replica, inc, op, seq, labels = row[:6]
        if replica not in arbiters and replica not in conf:  # a learner's: tally rule 9
            raise SnapshotDecodeError(f"observation from unknown replica {replica!r}")
        silence, suspicion, detector = _evidence(row[6:])
        pairs = _pairs(labels)
        if last[0] == node and last[1] == pairs:  # rows of a node are together: share
            pairs = last[1]
        last = (node, pairs)
        record = ObservationRecord(
            incarnation=_int(inc),
            opinion=Opinion(op),
            seq=_int(seq),
            labels=pairs,
            silence=silence,
            suspicion=suspicion,
            detector=detector,
        )
        observations.append((_str(node, empty=False), replica, record))
    retired = tuple((_str(node, empty=False), _int(inc)) for node, inc in snap.get("retired", ()))
    forgotten = []
    recorded = {m.node_id for m in members}
    for node, inc, st in snap.get("forgotten", ()):
        state = MemberState(st)
        if not state.is_final:
            raise SnapshotDecodeError(f"a forgotten record is DEAD or LEFT, not {st!r}")
        if node in recorded:
            raise SnapshotDecodeError(f"{node!r} has both a record and a forgotten floor")
        forgotten.append((_str(node, empty=False), _int(inc), state))
    rules = _int(snap.get("rules", 1))
    if rules < 1:
        raise SnapshotDecodeError(f"bad rules version {rules}")
    by_id = {m.node_id: m for m in members}
    return TallyImage(
        configuration=conf,
        epoch=epoch,
        applied_index=applied,
        members=tuple(members),
        observations=tuple(observations),
        retired=retired,
        instance=_str(snap.get("instance", "")),
        forgotten=tuple(forgotten),
        rules=rules,
        jobs=_jobs(snap.get("jobs", ()), by_id, rules, epoch),
        graces=_graces(snap.get("graces", ()), by_id, applied),
    )


def _jobs(rows: Any, members: dict[str, Member], rules: int, epoch: int) -> tuple[JobRanks, ...]:
    """The ``jobs`` rows, checked against the members (rule 3)."""
    jobs = []
    ranked: set[str] = set()
    for job, job_epoch, pairs in rows:
        ranks = {_str(n, empty=False): _int(r) for n, r in pairs}
        if rules < RANKS_RULES or not _str(job, empty=False) or not 0 < _int(job_epoch) <= epoch:
            raise SnapshotDecodeError(f"bad ranks of job {job!r} (rules {rules})")
        if sorted(ranks.values()) != list(range(len(ranks))) or not ranks:
            raise SnapshotDecodeError(f"ranks of job {job!r} are not dense: {ranks}")
        for n in ranks:
            if job_of(members.get(n)) != job:
                raise SnapshotDecodeError(f"{n!r} has a rank in {job!r} but is no ALIVE member")
        ranked |= set(ranks)
        jobs.append(JobRanks(job=job, epoch=job_epoch, ranks=ranks))
    if rules >= RANKS_RULES:
        missing = sorted(n for n, m in members.items() if job_of(m) and n not in ranked)
        if missing:
            raise SnapshotDecodeError(f"members of a job without a rank: {missing}")
    return tuple(jobs)


def _graces(
    rows: Any, members: dict[str, Member], applied: int
) -> tuple[tuple[str, GraceRecord], ...]:
    """The ``graces`` rows, checked against the members (rule 3)."""
    out = []
    for node, inc, seconds, until, reason, grant in rows:
        m = members.get(node)
        if m is None or m.state is not MemberState.ALIVE or m.incarnation != _int(inc):
            raise SnapshotDecodeError(f"grace window of {node!r} not ALIVE at {inc!r}")
        for v in (seconds, until):
            if type(v) is not float or not v >= 0 or v == float("inf"):
                raise SnapshotDecodeError(f"bad grace window value {v!r}")
        try:
            check_reason(reason)
        except ValueError as e:
            raise SnapshotDecodeError(f"bad grace window reason: {e}") from None
        if not 0 < _int(grant) <= applied:
            raise SnapshotDecodeError(f"grace window of {node!r} granted at {grant!r}")
        record = GraceRecord(
            incarnation=inc, seconds=seconds, until=until, reason=reason, grant=grant
        )
        out.append((node, record))
    return tuple(out)


def _configuration(
    snap: dict[str, Any], arbiters: tuple[str, ...], applied: int
) -> ArbiterConfiguration:
    """The snapshot's configuration (rule 2): ``config``, else ``arbiters`` at index 0."""
    if not all(isinstance(a, str) for a in arbiters):
        raise SnapshotDecodeError(f"bad arbiters {arbiters!r}")
    try:
        if "config" not in snap:
            return ArbiterConfiguration.initial(dict.fromkeys(arbiters, ""))
        conf = ArbiterConfiguration.from_json(snap["config"])
    except InvalidInput as e:
        raise SnapshotDecodeError(f"invalid snapshot configuration: {e}") from None
    if tuple(conf.voters) != arbiters or conf.index > applied:
        raise SnapshotDecodeError(f"configuration {conf!r} disagrees with arbiters {arbiters!r}")
    return conf


def _ev_row(o: ObservationRecord) -> list[Any]:
    """The optional 7th column of an observation row (rule 2)."""
    has = o.silence is not None or o.suspicion is not None or o.detector
    return [[o.silence, o.suspicion, o.detector]] if has else []


def _evidence(rest: list[Any]) -> tuple[float | None, float | None, str]:
    """The optional 7th column of an observation row: [silence, suspicion, detector]."""
    if not rest:
        return None, None, ""
    if len(rest) != 1 or not isinstance(rest[0], list) or len(rest[0]) != 3:
        raise SnapshotDecodeError(f"bad observation evidence {rest!r}")
    silence, suspicion, detector = rest[0]
    for v in (silence, suspicion):
        if v is not None and (type(v) is not float or not v >= 0):
            raise SnapshotDecodeError(f"bad evidence value {v!r}")
    return silence, suspicion, _str(detector)


def _int(value: Any) -> int:
    if type(value) is not int or value < 0:  # exact: a bool is not an int
        raise SnapshotDecodeError(f"expected an int >= 0, got {value!r}")
    return value


def _str(value: Any, *, empty: bool = True) -> str:
    """``value``, a string, interned: node ids and labels are kept per node
    (commands rule 6)."""
    if not isinstance(value, str) or not (empty or value):
        raise SnapshotDecodeError(f"expected a string, got {value!r}")
    return sys.intern(value)


def _pairs(value: Any) -> tuple[tuple[str, str], ...]:
    pairs = tuple((_str(k), _str(v)) for k, v in value)
    if any(a[0] >= b[0] for a, b in itertools.pairwise(pairs)):
        raise SnapshotDecodeError(f"labels must be sorted by unique key, got {value!r}")
    return pairs
