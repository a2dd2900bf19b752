"""Conversions between the wire types (membership.v1) and the SDK's frozen dataclasses."""

from __future__ import annotations

from collections.abc import Iterable

from membership.v1 import membership_pb2 as pb
from membership.view import (
    Member,
    MemberChange,
    MemberState,
    QuorumChanged,
    View,
    ViewChanged,
    ViewEvent,
    ViewSnapshot,
)

__all__ = [
    "change_to_pb",
    "event_from_pb",
    "member_from_pb",
    "member_to_pb",
    "state_from_pb",
    "state_to_pb",
    "view_from_pb",
]

_TO_PB = {
    MemberState.JOINING: pb.MEMBER_STATE_JOINING,
    MemberState.ALIVE: pb.MEMBER_STATE_ALIVE,
    MemberState.DEAD: pb.MEMBER_STATE_DEAD,
    MemberState.LEFT: pb.MEMBER_STATE_LEFT,
}
_FROM_PB = {v: k for k, v in _TO_PB.items()}


def state_to_pb(state: MemberState) -> pb.MemberState.ValueType:
    """MemberState -> wire enum."""
    return _TO_PB[state]


def state_from_pb(value: int) -> MemberState:
    """Wire enum -> MemberState.

    Raises:
        ValueError: for UNSPECIFIED or an unknown value.
    """
    try:
        return _FROM_PB[value]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"unknown member state {value}") from None


def member_to_pb(member: Member, suspected_by: Iterable[str] = ()) -> pb.Member:
    """Member -> wire Member (with the replicas currently suspecting it)."""
    return pb.Member(
        node_id=member.node_id,
        incarnation=member.incarnation,
        state=state_to_pb(member.state),
        labels=dict(member.labels),
        epoch=member.epoch,
        suspected_by=list(suspected_by),
    )


def member_from_pb(m: pb.Member) -> Member:
    """Wire Member -> Member."""
    return Member(
        node_id=m.node_id,
        incarnation=m.incarnation,
        state=state_from_pb(m.state),
        labels=dict(m.labels),
        epoch=m.epoch,
    )


def view_from_pb(v: pb.View) -> View:
    """Wire View -> View (members sorted by node id)."""
    members = sorted((member_from_pb(m) for m in v.members), key=lambda m: m.node_id)
    return View(epoch=v.epoch, members=tuple(members))


def change_to_pb(change: MemberChange) -> pb.MemberChange:
    """MemberChange -> wire MemberChange."""
    return pb.MemberChange(
        node_id=change.node_id,
        incarnation=change.incarnation,
        state=state_to_pb(change.state),
        labels=dict(change.labels),
    )


def event_from_pb(ev: pb.MembershipEvent) -> ViewEvent | int | None:
    """Wire event -> SDK event; a progress marker becomes its epoch (int); None if empty."""
    kind = ev.WhichOneof("event")
    if kind == "snapshot":
        return ViewSnapshot(view=view_from_pb(ev.snapshot.view), arbiter_id=ev.arbiter_id)
    if kind == "change":
        return ViewChanged(
            epoch=ev.change.epoch,
            changes=tuple(
                MemberChange(
                    node_id=c.node_id,
                    incarnation=c.incarnation,
                    state=state_from_pb(c.state),
                    labels=dict(c.labels),
                )
                for c in ev.change.changes
            ),
            arbiter_id=ev.arbiter_id,
        )
    if kind == "quorum":
        return QuorumChanged(
            in_quorum=ev.quorum.in_quorum,
            arbiter_id=ev.arbiter_id,
            leader_id=ev.quorum.leader_id or None,
            epoch=ev.quorum.epoch,
        )
    if kind == "progress":
        return int(ev.progress.epoch)
    return None
