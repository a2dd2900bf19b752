"""What a replica sends about its view: members with their suspicions and status, encoded.

Shared by ``Subscribe`` (snapshots, status updates) and ``GetView``. A life
that is over (DEAD, or LEFT) is suspected of nothing and reports no status.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from arbiter.core.tally import ViewChange
from arbiter.server.driver import Driver
from arbiter.server.statusboard import StatusBoard
from membership import convert
from membership.v1 import membership_pb2 as pb
from membership.view import MemberState, View

__all__ = ["ViewEncoder"]

# Nodes per StatusUpdate message: keeps each well under the 4 MiB gRPC default
# receive limit (a report is at most a few KiB with 64 gauges).
_STATUS_CHUNK = 256
# Change events kept for subscribers still behind (ViewEncoder.change_event).
_CHANGES_KEPT = 64


class ViewEncoder:
    """Encodes one replica's view and its nodes' status for subscribers and GetView.

    Args:
        driver: the replica's driver (its applied state).
        board: the latest status each node reported to this replica.
    """

    def __init__(self, driver: Driver, board: StatusBoard) -> None:
        self._driver = driver
        self._board = board
        # The last committed changes as events: every subscriber is sent the same
        # object, converted once (1,000 subscribers of a 1,000-join epoch would
        # otherwise convert it 1,000 times on the loop).
        self._changes: dict[tuple[int, str], pb.MembershipEvent] = {}

    def change_event(
        self, change: ViewChange, stamp: Callable[..., pb.MembershipEvent]
    ) -> pb.MembershipEvent:
        """The event for a committed ``change``, made by ``stamp(change=...)`` once per
        epoch and instance and shared by every subscriber (it is never mutated)."""
        key = (change.epoch, self._driver.state.instance)
        event = self._changes.get(key)
        if event is None:
            if len(self._changes) >= _CHANGES_KEPT:
                del self._changes[next(iter(self._changes))]  # the oldest
            changes = [convert.change_to_pb(c) for c in change.changes]
            ranks = convert.jobs_to_pb(change.ranks)
            event = stamp(change=pb.ViewChange(epoch=change.epoch, changes=changes, ranks=ranks))
            self._changes[key] = event
        return event

    def suspected_by(self, node_id: str) -> tuple[str, ...]:
        """Replicas suspecting ``node_id`` now (none for a life that is over)."""
        member = self._driver.state.member(node_id)
        # A life that is over (DEAD, or LEFT by choice) is suspected of nothing more.
        if member is not None and member.state.is_final:
            return ()
        return self._driver.state.suspected_by(node_id)

    def grace(self, node_id: str) -> tuple[float, str]:
        """(seconds left of the node's grace window on this replica, its reason)."""
        return self._driver.observer.windows.window(node_id, time.monotonic())

    def view_pb(self, view: View, with_status: bool = False) -> pb.View:
        """``view`` as sent, each ALIVE member with its status and grace window when
        ``with_status``; the jobs' ranks."""
        members = []
        windows = self._driver.observer.windows
        for m in view.members:
            job = view.job(m.job) if m.rank is not None else None
            size = job.world_size if job is not None else 0
            msg = convert.member_to_pb(m, self.suspected_by(m.node_id), size)
            entry = self._board.get(m.node_id) if with_status else None
            alive = m.state is MemberState.ALIVE
            if entry is not None and entry.incarnation == m.incarnation and alive:
                msg.status.CopyFrom(entry.status)
            if with_status and alive and len(windows):
                msg.grace_seconds, msg.grace_reason = self.grace(m.node_id)
            members.append(msg)
        return pb.View(epoch=view.epoch, members=members, jobs=convert.jobs_to_pb(view.jobs))

    def status_updates(
        self, sent: dict[str, tuple[int, tuple[str, ...], bool]]
    ) -> list[pb.StatusUpdate]:
        """Reports of the nodes whose status or suspicions changed since ``sent`` (updated)."""
        now = time.monotonic()
        reports = []
        state = self._driver.state
        for node_id, entry in self._board.items():
            member = state.member(node_id)
            if member is not None and (
                member.incarnation > entry.incarnation
                or (member.incarnation == entry.incarnation and member.state.is_final)
            ):
                continue  # a life that is over reports nothing more
            suspected = self.suspected_by(node_id)
            grace, reason = self.grace(node_id)
            key = (entry.version, suspected, grace > 0)  # a window opening or ending is news
            if sent.get(node_id) == key:
                continue
            sent[node_id] = key
            reports.append(
                pb.NodeStatusReport(
                    node_id=node_id,
                    incarnation=entry.incarnation,
                    status=entry.status,
                    suspected_by=suspected,
                    silence_seconds=round(max(0.0, now - entry.heard), 3),
                    grace_seconds=round(grace, 3),
                    grace_reason=reason,
                )
            )
        return [
            pb.StatusUpdate(nodes=reports[i : i + _STATUS_CHUNK])
            for i in range(0, len(reports), _STATUS_CHUNK)
        ]
