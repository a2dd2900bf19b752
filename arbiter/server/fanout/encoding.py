"""What a replica sends about its view: members with their suspicions and status, encoded.

Shared by ``Subscribe`` (snapshots, status updates) and ``GetView``. A life
that is over (DEAD, or LEFT) is suspected of nothing and reports no status.
With its status, an ALIVE member carries this replica's DEGRADED marks
(arbiter/server/fanout/degradation.py) and its detector's suspicion level; a status
report is sent again when the marks change.
"""

from __future__ import annotations

import time

from arbiter.server.consensus.driver import Driver
from arbiter.server.fanout.degradation import DegradedMarks
from arbiter.server.fanout.statusboard import StatusBoard
from membership.shared import convert
from membership.shared.view import Degradation, MemberState, View
from membership.v1 import membership_pb2 as pb

__all__ = ["ViewEncoder"]

# Nodes per StatusUpdate message: keeps each well under the 4 MiB gRPC default
# receive limit (a report is at most a few KiB with 64 gauges).
_STATUS_CHUNK = 256


class ViewEncoder:
    """Encodes one replica's view and its nodes' status for subscribers and GetView.

    Args:
        driver: the replica's driver (its applied state).
        board: the latest status each node reported to this replica.
        marks: this replica's DEGRADED marks.
    """

    def __init__(self, driver: Driver, board: StatusBoard, marks: DegradedMarks) -> None:
        self._driver = driver
        self._board = board
        self._marks = marks

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
        """``view`` as sent, with the jobs' ranks (each ranked member with its rank and its
        job's world size); with ``with_status`` each ALIVE member has its status, its
        DEGRADED marks, the detector's suspicion level, the silence since heard and its
        grace window."""
        members = []
        now = time.monotonic()
        marks = self._marks.marks(now) if with_status else {}
        windows = self._driver.observer.windows if with_status else None
        for m in view.members:
            job = view.job(m.job) if m.rank is not None else None
            size = job.world_size if job is not None else 0
            msg = convert.member_to_pb(m, self.suspected_by(m.node_id), size)
            if with_status and m.state is MemberState.ALIVE:
                entry = self._board.get(m.node_id)
                if entry is not None and entry.incarnation == m.incarnation:
                    msg.status.CopyFrom(entry.status)
                    msg.silence_seconds = round(max(0.0, now - entry.heard), 3)
                msg.degraded.extend(_marks_pb(marks.get(m.node_id, ())))
                level = self._marks.suspicion(m.node_id, m.incarnation, now)
                if level is not None:
                    msg.suspicion, msg.detector = round(level[0], 3), level[1]
                if windows is not None and len(windows):
                    msg.grace_seconds, msg.grace_reason = self.grace(m.node_id)
            members.append(msg)
        return pb.View(epoch=view.epoch, members=members, jobs=convert.jobs_to_pb(view.jobs))

    def status_updates(self, sent: dict[str, tuple[object, ...]]) -> list[pb.StatusUpdate]:
        """Reports of the nodes whose status, suspicions, DEGRADED marks or grace window
        changed since ``sent`` (updated)."""
        now = time.monotonic()
        reports = []
        state = self._driver.state
        marks = self._marks.marks(now)
        for node_id, entry in self._board.items():
            member = state.member(node_id)
            if member is not None and (
                member.incarnation > entry.incarnation
                or (member.incarnation == entry.incarnation and member.state.is_final)
            ):
                continue  # a life that is over reports nothing more
            suspected = self.suspected_by(node_id)
            degraded = marks.get(node_id, ())
            grace, reason = self.grace(node_id)
            key = (entry.version, suspected, degraded, grace > 0)  # a window opening or ending
            if sent.get(node_id) == key:
                continue
            sent[node_id] = key
            report = pb.NodeStatusReport(
                node_id=node_id,
                incarnation=entry.incarnation,
                status=entry.status,
                suspected_by=suspected,
                silence_seconds=round(max(0.0, now - entry.heard), 3),
                degraded=_marks_pb(degraded),
                grace_seconds=round(grace, 3),
                grace_reason=reason,
            )
            level = self._marks.suspicion(node_id, entry.incarnation, now)
            if level is not None:
                report.suspicion, report.detector = round(level[0], 3), level[1]
            reports.append(report)
        return [
            pb.StatusUpdate(nodes=reports[i : i + _STATUS_CHUNK])
            for i in range(0, len(reports), _STATUS_CHUNK)
        ]


def _marks_pb(marks: tuple[Degradation, ...]) -> list[pb.Degradation]:
    return [pb.Degradation(cause=d.cause, reason=d.reason) for d in marks]
