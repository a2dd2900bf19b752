"""Filters of ``membership view`` and ``membership watch``: ``--state`` and ``--label``.

Pure functions and one small class over :mod:`membership.shared.view`; the filtering
is client-side (the arbiters send every member). Rules:

1. ``--state S`` keeps members, and changes, whose state is S; S is ALIVE,
   DEAD or LEFT, any case, repeatable or a comma list (``--state DEAD,LEFT``
   is how to see tombstones). No ``--state``: every state.
2. ``--label key=value`` keeps members whose labels hold that pair; several
   must all match (an empty value matches a label set to ""). A change is
   judged by the labels it carries (DEAD, LEFT and forgotten changes repeat
   the member's labels, tally rule 6).
3. ``watch``: a snapshot keeps its matching members; a change event keeps
   its matching changes and is not printed when none is left; a status event
   keeps the nodes whose member, in the view the watcher has folded so far,
   matches; other events (quorum, contact, reset) are printed as they are.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from membership.shared.view import (
    JOB_LABEL,
    Member,
    MemberChange,
    MemberState,
    StatusUpdated,
    View,
    ViewChanged,
    ViewSnapshot,
)

__all__ = ["MemberFilter", "WatchFilter", "label_arg", "states_arg"]

_STATES = {s.value: s for s in (MemberState.ALIVE, MemberState.DEAD, MemberState.LEFT)}


def states_arg(value: str) -> frozenset[MemberState]:
    """argparse type of ``--state``: a comma list of ALIVE, DEAD, LEFT (rule 1).

    Raises:
        argparse.ArgumentTypeError: an empty list or another word.
    """
    words = [w.strip().upper() for w in value.split(",") if w.strip()]
    bad = [w for w in words if w not in _STATES]
    if not words or bad:
        raise argparse.ArgumentTypeError(
            f"expected ALIVE, DEAD or LEFT (a comma list), got {value!r}"
        )
    return frozenset(_STATES[w] for w in words)


def label_arg(value: str) -> tuple[str, str]:
    """argparse type of ``--label``: ``key=value`` (rule 2).

    Raises:
        argparse.ArgumentTypeError: no ``=`` or an empty key.
    """
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {value!r}")
    return key, val


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberFilter:
    """What ``--state`` and ``--label`` keep (rules 1 and 2).

    Attributes:
        states: states kept; empty keeps every state.
        labels: label pairs a member must all have.
    """

    states: frozenset[MemberState] = frozenset()
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        states: Iterable[frozenset[MemberState]] | None,
        labels: Iterable[tuple[str, str]] | None,
    ) -> MemberFilter:
        """The filter of the parsed flags (each may be None: not given)."""
        return cls(states=frozenset().union(*(states or ())), labels=dict(labels or ()))

    @property
    def active(self) -> bool:
        """Whether it filters anything out at all."""
        return bool(self.states or self.labels)

    def _keeps(self, state: MemberState, labels: Mapping[str, str]) -> bool:
        if self.states and state not in self.states:
            return False
        return all(k in labels and labels[k] == v for k, v in self.labels.items())

    def member(self, m: Member) -> bool:
        """Whether the member is kept."""
        return self._keeps(m.state, m.labels)

    def change(self, c: MemberChange) -> bool:
        """Whether the change is kept (judged by its state and the labels it carries)."""
        return self._keeps(c.state, c.labels)

    def job(self, job: str) -> bool:
        """Whether a job's ranks are kept: all, unless a ``job`` label is filtered on."""
        return self.labels.get(JOB_LABEL, job) == job

    def view(self, view: View) -> View:
        """``view`` with only the members (and jobs) kept (same epoch)."""
        if not self.active:
            return view
        members = tuple(m for m in view.members if self.member(m))
        return View(
            epoch=view.epoch, members=members, jobs=tuple(j for j in view.jobs if self.job(j.job))
        )


class WatchFilter:
    """Rule 3: filters a watcher's events, folding the view it was sent to judge status events."""

    def __init__(self, keep: MemberFilter) -> None:
        self.keep = keep
        self._view = View()

    def event(self, ev: object) -> object | None:
        """The event to print, filtered, or None to print nothing."""
        if isinstance(ev, ViewSnapshot):
            self._view = ev.view
        elif isinstance(ev, ViewChanged):
            self._view = self._view.with_changes(ev.epoch, ev.changes, ev.ranks)
        if not self.keep.active:
            return ev
        if isinstance(ev, ViewSnapshot):
            return dataclasses.replace(ev, view=self.keep.view(ev.view))
        if isinstance(ev, ViewChanged):
            changes = tuple(c for c in ev.changes if self.keep.change(c))
            ranks = tuple(j for j in ev.ranks if self.keep.job(j.job))
            return (
                dataclasses.replace(ev, changes=changes, ranks=ranks) if changes or ranks else None
            )
        if isinstance(ev, StatusUpdated):
            reports = []
            for r in ev.reports:
                m = self._view.get(r.node_id)
                if m is not None and self.keep.member(m):
                    reports.append(r)
            return dataclasses.replace(ev, reports=tuple(reports)) if reports else None
        return ev
