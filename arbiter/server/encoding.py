"""What a replica sends about its view: members with their suspicions and status, encoded.

Shared by ``Subscribe`` (snapshots, status updates) and ``GetView``. A life
that is over (DEAD, or LEFT) is suspected of nothing and reports no status.
"""

from __future__ import annotations

import time

from arbiter.server.driver import Driver
from arbiter.server.statusboard import StatusBoard
from membership import convert
from membership.v1 import membership_pb2 as pb
from membership.view import MemberState, View

__all__ = ["ViewEncoder"]

# Nodes per StatusUpdate message: keeps each well under the 4 MiB gRPC default
# receive limit (a report is at most a few KiB with 64 gauges).
_STATUS_CHUNK = 256


class ViewEncoder:
    """Encodes one replica's view and its nodes' status for subscribers and GetView.

    Args:
        driver: the replica's driver (its applied state).
        board: the latest status each node reported to this replica.
    """

    def __init__(self, driver: Driver, board: StatusBoard) -> None:
        self._driver = driver
        self._board = board

    def suspected_by(self, node_id: str) -> tuple[str, ...]:
        """Replicas suspecting ``node_id`` now (none for a life that is over)."""
        member = self._driver.state.member(node_id)
        # A life that is over (DEAD, or LEFT by choice) is suspected of nothing more.
        if member is not None and member.state.is_final:
            return ()
        return self._driver.state.suspected_by(node_id)

    def view_pb(self, view: View, with_status: bool = False) -> pb.View:
        """``view`` as sent, each ALIVE member with its status when ``with_status``."""
        members = []
        for m in view.members:
            msg = convert.member_to_pb(m, self.suspected_by(m.node_id))
            entry = self._board.get(m.node_id) if with_status else None
            if (
                entry is not None
                and entry.incarnation == m.incarnation
                and m.state is MemberState.ALIVE
            ):
                msg.status.CopyFrom(entry.status)
            members.append(msg)
        return pb.View(epoch=view.epoch, members=members)

    def status_updates(self, sent: dict[str, tuple[int, tuple[str, ...]]]) -> list[pb.StatusUpdate]:
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
            key = (entry.version, suspected)
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
                )
            )
        return [
            pb.StatusUpdate(nodes=reports[i : i + _STATUS_CHUNK])
            for i in range(0, len(reports), _STATUS_CHUNK)
        ]
