"""Grace windows, the replicated half: the Grace command, its record, and how the tally judges it.

A node about to pause (a checkpoint, a long collective, a debugger) asks
for a bounded window during which the replicas do not suspect it. The ask is
a log entry, so every replica records the same window for the same
incarnation and a leader change does not lose it; each replica enforces it on
its own clock (:mod:`arbiter.core.grace_windows`). Pure data and functions.

Rules (tally rule 13 applies them):

Rule 1. A :class:`Grace` names a node, the incarnation asking, the seconds
    granted (already capped by the proposing replica's ``max_grace``), the
    proposing replica's wall clock at the proposal plus those seconds
    (``until``, Unix seconds: the one clock the replicas share, used only to
    bound what is left of a window replayed later, grace_windows rule 1), a
    reason, and who asked (``by``: "" for the node itself, else an
    administrator's identity). ``seconds == 0`` ends the node's window.
Rule 2. Judged like a leave (:class:`~arbiter.core.leaves.LeaveRefusal`):
    the node must have a record ALIVE at the incarnation. No record:
    UNKNOWN; another incarnation: STALE; DEAD or LEFT: FINAL. Only the node
    itself ends or replaces its window (it stops counting the window before
    it asks: ``membership/_node/session.py`` rule 10; a window withdrawn behind its
    back could end while it still counts on it): an administrator's ask for a
    node that has a window is refused (WINDOW); an administrator may only
    open one (for a node that is stuck). Judged when the API receives the ask
    (a refused one is not proposed) and again when the entry is applied.
Rule 3. An accepted Grace with ``seconds > 0`` records the node's window
    (:class:`GraceRecord`), replacing any earlier one; its ``grant`` is the
    entry's log index, unique and growing, so replicas and the node name a
    window the same way. ``seconds == 0`` removes the record (accepted also
    when there is none). Neither is a view change: no epoch.
Rule 4. A window is for one incarnation: it goes when the node's record
    stops being ALIVE at it (DEAD, LEFT, a new incarnation, forgotten).
Rule 5. The encoding follows commands rule 4 and 5 (canonical JSON, strict
    decoding); ``seconds`` and ``until`` are finite floats >= 0, the reason
    at most :data:`MAX_REASON` printable characters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from arbiter.core.leaves import LeaveRefusal
from membership.shared.view import Member, MemberState

__all__ = [
    "MAX_REASON",
    "Grace",
    "GraceOutcome",
    "GraceRecord",
    "grace_from_json",
    "grace_to_json",
    "judge_grace",
]

MAX_REASON = 128
"""Characters of a grace window's reason, at most (rule 5)."""


def _check_seconds(name: str, value: float) -> None:
    if type(value) is not float or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite float >= 0, got {value!r}")


def check_reason(reason: str) -> None:
    """Raises ValueError unless ``reason`` is at most MAX_REASON printable characters."""
    if not isinstance(reason, str) or len(reason) > MAX_REASON or not reason.isprintable():
        raise ValueError(f"reason must be at most {MAX_REASON} printable characters")


@dataclass(frozen=True, slots=True, kw_only=True)
class Grace:
    """A node's ask for a grace window, or for the end of its window (rule 1).

    Attributes:
        node_id: the node.
        incarnation: the incarnation asking (>= 0).
        seconds: the window's length, seconds (0: end the window).
        until: the proposing replica's wall clock at the proposal plus
            ``seconds``, Unix seconds (0.0 with ``seconds == 0``).
        reason: why, in words ("checkpoint"); may be empty.
        request_id: opaque id the shell matches to the waiting RPC.
        by: "" when the node itself asks; else the administrator's identity.

    Raises:
        ValueError: an empty node_id, a negative or non-int incarnation,
            seconds or until that are not finite floats >= 0, a bad reason.
    """

    node_id: str
    incarnation: int
    seconds: float
    until: float
    reason: str
    request_id: str
    by: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.node_id, str) or not self.node_id:
            raise ValueError(f"node_id must be a non-empty string, got {self.node_id!r}")
        if type(self.incarnation) is not int or self.incarnation < 0:
            raise ValueError(f"incarnation must be an int >= 0, got {self.incarnation!r}")
        _check_seconds("seconds", self.seconds)
        _check_seconds("until", self.until)
        check_reason(self.reason)
        if not isinstance(self.request_id, str) or not isinstance(self.by, str):
            raise ValueError(f"request_id and by must be strings, got {self.request_id!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class GraceRecord:
    """A node's committed grace window (rule 3), as every replica records it.

    Attributes:
        incarnation: the incarnation it is for (rule 4).
        seconds: its length, seconds.
        until: the proposing replica's wall-clock end, Unix seconds.
        reason: why, in words.
        grant: the log index of the entry that granted it (names the window).
    """

    incarnation: int
    seconds: float
    until: float
    reason: str
    grant: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GraceOutcome:
    """What became of a Grace command (rules 2, 3), for the RPC waiting for it.

    Attributes:
        request_id: the command's request_id.
        node_id: the node.
        accepted: the window is recorded (or, for ``seconds == 0``, gone).
        refusal: why it was refused; None when accepted.
        reason: what the cluster records, in words (for a refusal).
        record: the window recorded (None when ended or refused).
        index: the log index of the entry (a window's grant, or its end).
    """

    request_id: str
    node_id: str
    accepted: bool
    index: int = 0
    refusal: LeaveRefusal | None = None
    reason: str = ""
    record: GraceRecord | None = None


def judge_grace(
    node_id: str,
    incarnation: int,
    record: Member | None,
    by: str = "",
    window: GraceRecord | None = None,
) -> tuple[LeaveRefusal | None, str]:
    """Rule 2: why Grace(node_id, incarnation) is refused (None: accepted), in words.

    Args:
        node_id: the node.
        incarnation: the incarnation asking.
        record: the node's member record (None: it has none).
        by: "" for the node itself, else the administrator asking.
        window: the node's current window (None: it has none).
    """
    if record is None:
        return LeaveRefusal.UNKNOWN, f"{node_id} is not a member (no record): it cannot pause"
    if record.incarnation != incarnation:
        return LeaveRefusal.STALE, (
            f"{node_id} incarnation {incarnation} is not the one the cluster records "
            f"({record.incarnation}, {record.state.value})"
        )
    if record.state is not MemberState.ALIVE:
        return LeaveRefusal.FINAL, (
            f"{node_id} incarnation {incarnation} is already {record.state.value}"
        )
    if by and window is not None:
        return LeaveRefusal.WINDOW, (
            f"{node_id} has a grace window ({window.reason or 'no reason'}): only the node "
            "itself may end or replace it"
        )
    return None, f"{node_id} incarnation {incarnation} is ALIVE"


def grace_to_json(command: Grace) -> dict[str, Any]:
    """The command's JSON object (rule 5; ``v`` and ``type`` added by the caller)."""
    return {
        "node": command.node_id,
        "inc": command.incarnation,
        "seconds": command.seconds,
        "until": command.until,
        "reason": command.reason,
        "request_id": command.request_id,
        **({"by": command.by} if command.by else {}),  # "" left out
    }


def grace_from_json(obj: dict[str, Any]) -> Grace:
    """The command from its JSON object's fields (rule 5).

    Raises:
        ValueError: a missing, unknown or mistyped field (the caller turns
            it into a CommandDecodeError).
    """
    names = {"v", "type", "node", "inc", "seconds", "until", "reason", "request_id"}
    if "by" in obj:
        names.add("by")
        if type(obj["by"]) is not str or not obj["by"]:
            raise ValueError("grace.by: a non-empty string (the node itself is no 'by')")
    if set(obj) != names:
        raise ValueError(f"grace: fields {sorted(obj)}, expected {sorted(names)}")
    for key, kind in (
        ("node", str),
        ("inc", int),
        ("seconds", float),
        ("until", float),
        ("reason", str),
        ("request_id", str),
    ):
        if type(obj[key]) is not kind:  # exact: a bool is not an int, an int not a float
            raise ValueError(f"grace.{key}: expected {kind.__name__}")
    return Grace(
        node_id=obj["node"],
        incarnation=obj["inc"],
        seconds=obj["seconds"],
        until=obj["until"],
        reason=obj["reason"],
        request_id=obj["request_id"],
        by=obj.get("by", ""),
    )
