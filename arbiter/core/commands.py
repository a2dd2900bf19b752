"""Commands of the replicated log and their byte encoding (the tally's input).

The Raft log carries opaque bytes; these are the only things written into it
(besides Raft's own empty no-op entries, ``b""``, which are not commands).
Every replica decodes the same bytes into the same command, and
:mod:`arbiter.core.tally` applies them.

Rules:

Rule 1. An :class:`Observation` is one replica's opinion of one node at one
    incarnation: ALIVE (it hears the node) or SUSPECT (its failure detector
    gave up on it). ``seq`` grows strictly over the replica's lifetime, across
    restarts, so (incarnation, seq) orders a replica's observations of a node.
Rule 2. An :class:`ObserveBatch` carries observations of one replica, in the
    order it made them; the leader appends them as one log entry.
Rule 2b. An :class:`ObserveBatches` carries the batches of several replicas
    (each as rule 2) in one log entry: the leader gathers the replicas' ALIVE
    batches into its cut (:mod:`arbiter.core.gathering`), so that a join
    storm's slice is one epoch, not one per replica (tally rule 2b).
Rule 2a. A SUSPECT observation may carry its evidence: seconds since the
    replica last heard the node (``silence``), the detector's level then
    (``suspicion``: phi or missed intervals) and kind; a DEAD change reports
    it, the tally never reads it.
Rule 3. A :class:`Leave` is a node's graceful departure at an incarnation;
    ``request_id`` lets the shell answer the RPC waiting for it. ``heard_by``
    names the proposing replica when its own failure detector hears the node
    at that incarnation (the incarnation is *joining*, tally rule 5); it is
    left out of the encoding when empty, so older entries decode unchanged.
Rule 3b. A :class:`Remove` is an administrator's removal of another node
    (the Admin service): the member becomes LEFT at its recorded incarnation,
    ``by`` says who asked (tally rule 5a).
Rule 3a. A :class:`Bootstrap` names the cluster's *instance*, a random id a
    leader proposes while the applied state has none; the first applied wins.
    A reset cluster (fresh data dirs) draws a new one, so a subscriber tells
    two histories apart, even at the same name and replicas. It carries the
    leader's *rules version* (``rules``; 1 is left out of the encoding): a
    leader whose applied state has a lower one proposes one with the state's
    instance (tally rule 10; ranks rule 6).
Rule 3c. :class:`Forget` (DEAD and LEFT records past retention) and
    :class:`Grace` (a node's grace window asked for or ended) live in
    :mod:`arbiter.core.forget` and :mod:`arbiter.core.grace`, rules there.
Rule 4. The encoding is JSON from the standard library, compact
    (no spaces) and canonical (sorted keys, ASCII only), with a version
    field ``"v": 1``: encoding the same command gives the same bytes on
    every replica and every Python version, and ``decode(encode(c)) == c``.
Rule 5. Decoding is strict: unknown versions, unknown or missing fields,
    duplicate keys, wrong types (a bool or a float is not an int) and values
    the constructors reject raise :class:`CommandDecodeError`: what decodes is valid.
Rule 6. An observation's node id and label strings decode interned
    (``sys.intern``), as the replica's shell interns them when it hears them:
    one string each in the process (docs/scale.md, "Memory per node").
"""

from __future__ import annotations

import enum
import itertools
import json
import math
import sys
from dataclasses import dataclass
from typing import Any

from arbiter.core.forget import Forget, records_from_json, records_to_json
from arbiter.core.grace import Grace, grace_from_json, grace_to_json
from arbiter.errors import ArbiterError

__all__ = [
    "RULES",
    "VERSION",
    "Bootstrap",
    "Command",
    "CommandDecodeError",
    "Forget",
    "Grace",
    "Leave",
    "Observation",
    "ObserveBatch",
    "ObserveBatches",
    "Opinion",
    "Remove",
    "decode",
    "encode",
]

VERSION = 1
"""The encoding version written by :func:`encode`; :func:`decode` accepts only it."""

RULES = 3
"""The highest rules version this code applies (rule 3a; a leader raises the state's to it):
2 keeps the jobs' ranks (``arbiter.core.ranks.RANKS_RULES``), 3 lets the leader gather the
replicas' batches into ObserveBatches entries (``arbiter.core.gathering.GATHER_RULES``)."""


class CommandDecodeError(ArbiterError, ValueError):
    """The bytes are not a valid command of a known version."""


class Opinion(enum.Enum):
    """What one replica thinks of one node."""

    ALIVE = "alive"
    SUSPECT = "suspect"


def _check_id(what: str, value: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")


def _check_count(what: str, value: int) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"{what} must be an int >= 0, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """One replica's opinion of one node (rule 1).

    Attributes:
        node_id: the node observed.
        incarnation: the node's incarnation the opinion is about (>= 0).
        opinion: ALIVE or SUSPECT.
        seq: the replica's observation sequence number (>= 0), strictly
            increasing over the replica's lifetime (the shell seeds it at boot
            from a value above any it used before).
        labels: the node's static labels as (key, value) pairs sorted by key,
            keys unique; sent with ALIVE observations, ignored otherwise.
        silence: SUSPECT only (rule 2a): seconds since the replica last
            heard the node when it suspected it; None if not recorded.
        suspicion: SUSPECT only: the detector's suspicion level then (phi,
            or missed heartbeat intervals); None if not recorded.
        detector: SUSPECT only: ``"phi"`` or ``"missed"``; "" if not recorded.

    Raises:
        ValueError: an empty node_id, a negative or non-int number, labels that
            are not sorted (str, str) pairs with unique keys, or evidence on an
            ALIVE observation or that is not a finite number >= 0.
    """

    node_id: str
    incarnation: int
    opinion: Opinion
    seq: int
    labels: tuple[tuple[str, str], ...] = ()
    silence: float | None = None
    suspicion: float | None = None
    detector: str = ""

    @property
    def has_evidence(self) -> bool:
        """True when the observation carries suspicion evidence (rule 2a)."""
        return self.silence is not None or self.suspicion is not None or bool(self.detector)

    def __post_init__(self) -> None:
        _check_id("node_id", self.node_id)
        _check_count("incarnation", self.incarnation)
        _check_count("seq", self.seq)
        if not isinstance(self.opinion, Opinion):
            raise ValueError(f"opinion must be an Opinion, got {self.opinion!r}")
        for name in ("silence", "suspicion"):
            value = getattr(self, name)
            if value is not None and (
                type(value) is not float or not math.isfinite(value) or value < 0
            ):
                raise ValueError(f"{name} must be a finite float >= 0 or None, got {value!r}")
        if not isinstance(self.detector, str):
            raise ValueError(f"detector must be a string, got {self.detector!r}")
        if self.has_evidence and self.opinion is not Opinion.SUSPECT:
            raise ValueError("only a SUSPECT observation carries evidence")
        if not isinstance(self.labels, tuple):
            raise ValueError(f"labels must be a tuple of pairs, got {self.labels!r}")
        for pair in self.labels:
            if not (
                isinstance(pair, tuple)
                and len(pair) == 2
                and isinstance(pair[0], str)
                and isinstance(pair[1], str)
            ):
                raise ValueError(f"a label must be a (str, str) pair, got {pair!r}")
        keys = [k for k, _ in self.labels]
        if any(a >= b for a, b in itertools.pairwise(keys)):
            raise ValueError(f"labels must be sorted by key with unique keys, got {keys!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ObserveBatch:
    """Observations made by one replica, applied in order as one log entry (rule 2).

    Attributes:
        replica_id: the arbiter replica that made the observations.
        observations: its observations, oldest first (may be empty).
    """

    replica_id: str
    observations: tuple[Observation, ...]

    def __post_init__(self) -> None:
        _check_id("replica_id", self.replica_id)
        if not isinstance(self.observations, tuple) or not all(
            isinstance(o, Observation) for o in self.observations
        ):
            raise ValueError("observations must be a tuple of Observation")


@dataclass(frozen=True, slots=True, kw_only=True)
class ObserveBatches:
    """Batches of several replicas in one log entry, applied in order (rule 2b).

    Attributes:
        batches: at least two :class:`ObserveBatch`, in the order the leader
            gathered them (a replica may appear more than once).

    Raises:
        ValueError: fewer than two batches, or not a tuple of ObserveBatch.
    """

    batches: tuple[ObserveBatch, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.batches, tuple) or not all(
            isinstance(b, ObserveBatch) for b in self.batches
        ):
            raise ValueError("batches must be a tuple of ObserveBatch")
        if len(self.batches) < 2:
            raise ValueError(f"ObserveBatches needs at least 2 batches, got {len(self.batches)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Leave:
    """A node's graceful leave at an incarnation (rule 3).

    Attributes:
        node_id: the node leaving.
        incarnation: the incarnation that leaves (>= 0).
        request_id: opaque id the shell uses to match the applied outcome to
            the RPC waiting for it.
        heard_by: the id of the proposing replica when its failure detector
            hears the node at ``incarnation`` (so the incarnation is joining:
            tally rule 5); "" otherwise.

    Raises:
        ValueError: an empty node_id, a negative or non-int incarnation, or a
            request_id or heard_by that is not a string.
    """

    node_id: str
    incarnation: int
    request_id: str
    heard_by: str = ""

    def __post_init__(self) -> None:
        _check_id("node_id", self.node_id)
        _check_count("incarnation", self.incarnation)
        if not isinstance(self.request_id, str):
            raise ValueError(f"request_id must be a string, got {self.request_id!r}")
        if not isinstance(self.heard_by, str):
            raise ValueError(f"heard_by must be a string, got {self.heard_by!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Remove:
    """An administrator's removal of a member (rule 3b; tally rule 5a).

    Attributes:
        node_id: the member to remove.
        incarnation: the incarnation to remove; 0 for whichever one the
            cluster records when the entry is applied.
        by: who asked (the administrator's identity, or where an
            unauthenticated request came from); non-empty.
        request_id: opaque id the shell uses to match the applied outcome to
            the RPC waiting for it.

    Raises:
        ValueError: an empty node_id or by, a negative or non-int
            incarnation, or a request_id that is not a string.
    """

    node_id: str
    incarnation: int
    by: str
    request_id: str

    def __post_init__(self) -> None:
        _check_id("node_id", self.node_id)
        _check_count("incarnation", self.incarnation)
        _check_id("by", self.by)
        if not isinstance(self.request_id, str):
            raise ValueError(f"request_id must be a string, got {self.request_id!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Bootstrap:
    """The cluster's instance id (rule 3a).

    Attributes:
        instance: 1 to 64 characters of lowercase hex digits.
        rules: the rules version the proposing leader applies (>= 1).
    """

    instance: str
    rules: int = 1

    def __post_init__(self) -> None:
        if type(self.rules) is not int or self.rules < 1:
            raise ValueError(f"rules must be an int >= 1, got {self.rules!r}")
        if (
            not isinstance(self.instance, str)
            or not 0 < len(self.instance) <= 64
            or any(c not in "0123456789abcdef" for c in self.instance)
        ):
            raise ValueError(f"instance must be 1 to 64 hex digits, got {self.instance!r}")


Command = ObserveBatch | ObserveBatches | Leave | Remove | Bootstrap | Forget | Grace


def encode(command: Command) -> bytes:
    """Encodes a command as canonical compact JSON (rule 4).

    Args:
        command: the command.

    Returns:
        UTF-8 (in fact ASCII) bytes, the same for equal commands.
    """
    obj: dict[str, Any]
    if isinstance(command, ObserveBatch):
        obj = {
            "v": VERSION,
            "type": "observe",
            "replica": command.replica_id,
            "obs": [_encode_observation(o) for o in command.observations],
        }
    elif isinstance(command, ObserveBatches):
        obj = {
            "v": VERSION,
            "type": "observe_batches",
            "batches": [
                {"replica": b.replica_id, "obs": [_encode_observation(o) for o in b.observations]}
                for b in command.batches
            ],
        }
    elif isinstance(command, Leave):
        obj = {
            "v": VERSION,
            "type": "leave",
            "node": command.node_id,
            "inc": command.incarnation,
            "request_id": command.request_id,
        }
        if command.heard_by:
            obj["heard"] = command.heard_by
    elif isinstance(command, Remove):
        obj = {
            "v": VERSION,
            "type": "remove",
            "node": command.node_id,
            "inc": command.incarnation,
            "by": command.by,
            "request_id": command.request_id,
        }
    elif isinstance(command, Bootstrap):
        obj = {"v": VERSION, "type": "bootstrap", "instance": command.instance}
        if command.rules > 1:  # rule 3a: left out at 1, so older entries decode unchanged
            obj["rules"] = command.rules
    elif isinstance(command, Grace):
        obj = {"v": VERSION, "type": "grace", **grace_to_json(command)}
    elif isinstance(command, Forget):
        obj = {"v": VERSION, "type": "forget", "records": records_to_json(command)}
    else:
        raise TypeError(f"not a command: {command!r}")
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _encode_observation(o: Observation) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "node": o.node_id,
        "inc": o.incarnation,
        "op": o.opinion.value,
        "seq": o.seq,
        "labels": o.labels,  # tuples encode as JSON arrays, byte for byte as lists
    }
    if o.has_evidence:
        obj["ev"] = [o.silence, o.suspicion, o.detector]
    return obj


def decode(data: bytes) -> Command:
    """Decodes bytes written by :func:`encode` (rule 5).

    Args:
        data: one log entry's payload.

    Returns:
        The command.

    Raises:
        CommandDecodeError: malformed JSON, unknown version or type, missing,
            unknown or duplicate fields, wrong types or invalid values.
    """
    try:
        text = bytes(data).decode("utf-8")
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (ValueError, TypeError, RecursionError) as e:  # ValueError covers JSON and UTF-8
        raise CommandDecodeError(f"not a JSON command: {e}") from None
    try:
        return _decode_obj(obj)
    except CommandDecodeError:
        raise
    except ValueError as e:
        raise CommandDecodeError(f"invalid command: {e}") from None


class _Reject(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Reject("duplicate key in object")
    return obj


def _no_constant(name: str) -> Any:
    raise _Reject(f"{name} is not allowed")


def _fields(obj: Any, where: str, names: set[str]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise CommandDecodeError(f"{where}: expected an object, got {type(obj).__name__}")
    keys = set(obj)
    if keys != names:
        missing, unknown = sorted(names - keys), sorted(keys - names)
        raise CommandDecodeError(f"{where}: missing fields {missing}, unknown fields {unknown}")
    return obj


def _get(obj: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = obj[key]
    if type(value) is not kind:  # exact: a bool is not an int
        raise CommandDecodeError(
            f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__}"
        )
    return value


def _decode_obj(obj: Any) -> Command:
    if not isinstance(obj, dict):
        raise CommandDecodeError(f"command: expected an object, got {type(obj).__name__}")
    version = obj.get("v")
    if type(version) is not int or version != VERSION:
        raise CommandDecodeError(
            f"command: unknown version {version!r} (this code reads {VERSION})"
        )
    kind = obj.get("type")
    if kind == "observe":
        f = _fields(obj, "observe", {"v", "type", "replica", "obs"})
        items = _get(f, "obs", list, "observe")
        return ObserveBatch(
            replica_id=_get(f, "replica", str, "observe"),
            observations=tuple(_decode_observation(o, i) for i, o in enumerate(items)),
        )
    if kind == "observe_batches":
        f = _fields(obj, "observe_batches", {"v", "type", "batches"})
        batches = []
        for i, b in enumerate(_get(f, "batches", list, "observe_batches")):
            where = f"observe_batches.batches[{i}]"
            g = _fields(b, where, {"replica", "obs"})
            items = _get(g, "obs", list, where)
            batches.append(
                ObserveBatch(
                    replica_id=_get(g, "replica", str, where),
                    observations=tuple(_decode_observation(o, j) for j, o in enumerate(items)),
                )
            )
        return ObserveBatches(batches=tuple(batches))
    if kind == "leave":
        names = {"v", "type", "node", "inc", "request_id"}
        f = _fields(obj, "leave", names | {"heard"} if "heard" in obj else names)
        heard = _get(f, "heard", str, "leave") if "heard" in f else ""
        if "heard" in f and not heard:
            raise CommandDecodeError("leave.heard: an empty heard_by is written as no 'heard'")
        return Leave(
            node_id=_get(f, "node", str, "leave"),
            incarnation=_get(f, "inc", int, "leave"),
            request_id=_get(f, "request_id", str, "leave"),
            heard_by=heard,
        )
    if kind == "remove":
        f = _fields(obj, "remove", {"v", "type", "node", "inc", "by", "request_id"})
        return Remove(
            node_id=_get(f, "node", str, "remove"),
            incarnation=_get(f, "inc", int, "remove"),
            by=_get(f, "by", str, "remove"),
            request_id=_get(f, "request_id", str, "remove"),
        )
    if kind == "bootstrap":
        names = {"v", "type", "instance"}
        f = _fields(obj, "bootstrap", names | {"rules"} if "rules" in obj else names)
        rules = _get(f, "rules", int, "bootstrap") if "rules" in f else 1
        if "rules" in f and rules <= 1:
            raise CommandDecodeError("bootstrap.rules: rules 1 is written as no 'rules'")
        return Bootstrap(instance=_get(f, "instance", str, "bootstrap"), rules=rules)
    if kind == "grace":
        return grace_from_json(obj)
    if kind == "forget":
        return records_from_json(_fields(obj, "forget", {"v", "type", "records"})["records"])
    raise CommandDecodeError(f"command: unknown type {kind!r}")


def _decode_observation(obj: Any, i: int) -> Observation:
    where = f"observe.obs[{i}]"
    names = {"node", "inc", "op", "seq", "labels"}
    f = _fields(obj, where, names | {"ev"} if isinstance(obj, dict) and "ev" in obj else names)
    op = _get(f, "op", str, where)
    try:
        opinion = Opinion(op)
    except ValueError:
        raise CommandDecodeError(f"{where}.op: unknown opinion {op!r}") from None
    labels: list[tuple[str, str]] = []
    for pair in _get(f, "labels", list, where):
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and isinstance(pair[1], str)
        ):
            raise CommandDecodeError(f"{where}.labels: expected [key, value] strings, got {pair!r}")
        labels.append((sys.intern(pair[0]), sys.intern(pair[1])))  # rule 6
    silence: float | None = None
    suspicion: float | None = None
    detector = ""
    if "ev" in f:
        ev = _get(f, "ev", list, where)
        if not (
            len(ev) == 3
            and all(v is None or type(v) is float for v in ev[:2])
            and isinstance(ev[2], str)
        ):
            raise CommandDecodeError(
                f"{where}.ev: expected [silence, suspicion, detector], got {ev!r}"
            )
        silence, suspicion, detector = ev
        if silence is None and suspicion is None and not detector:
            raise CommandDecodeError(f"{where}.ev: empty evidence is written as no 'ev' at all")
    return Observation(
        node_id=sys.intern(_get(f, "node", str, where)),  # rule 6
        incarnation=_get(f, "inc", int, where),
        opinion=opinion,
        seq=_get(f, "seq", int, where),
        labels=tuple(labels),
        silence=silence,
        suspicion=suspicion,
        detector=detector,
    )
