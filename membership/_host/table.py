"""What a host agent vouches for, toward one arbiter: its local links and their entries (sans-I/O).

A local process heartbeats the agent on one local link per arbiter it
follows, as it would heartbeat that arbiter (``membership node --via-agent``).
The agent's host stream to that arbiter (``HostHeartbeat``) carries, once per
interval, one entry per local link it still vouches for; the arbiter's ack of
each entry goes back on that link as the ack of the process's heartbeat.

Rules:

1. Vouching. A link is vouched for while its process's last heartbeat is at
   most ``vouch_factor`` (1.5) of its declared interval old, so a process that
   stops heartbeating the agent (SIGSTOP, a GIL held, a hang) leaves the
   entries within half an interval of its missed heartbeat, and the arbiters'
   detectors see its id go silent and decide as for any node. A link whose
   process went away (its stream ended: SIGKILL closes the socket) is removed
   at once (:meth:`HostTable.close`).
2. Seqs. Each entry has a seq of the agent's, increasing per node id within
   the host stream (the process's own seq may repeat across two entries when
   it has not heartbeaten between them). The table remembers which process
   seq each entry seq vouched for.
3. Acks. An entry's ack is passed to the process as the ack of the process
   seq that entry vouched for, once: a second entry that vouched for the same
   process seq is not acked again (the process counts its lease from that
   heartbeat's send time, so a later ack could not lengthen it). The lease is
   therefore never longer than the process's last heartbeat to the agent plus
   the lease: a hung process is fenced as if it heartbeat the arbiter itself.
4. Refusals. An entry the arbiter refuses (``error_code``) ends that link with
   the code and message (the process sees what it would see on a Heartbeat
   stream refused with them); the other links go on.
5. A link replaced by a new stream of the same node id (a reconnect, a new
   incarnation) is closed: only the newest stream of an id is vouched for.

Time is an argument (monotonic seconds); nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from membership.v1 import membership_pb2 as pb

__all__ = ["VOUCH_FACTOR", "HostTable", "LocalLink"]

VOUCH_FACTOR = 1.5
"""Rule 1: a link is vouched for while its last heartbeat is at most this many of its
declared intervals old."""

# Entry seq -> process seq memories per link: the acks of older entries are lost.
_MEMORY = 64


@dataclass(eq=False)
class LocalLink:
    """One local process's heartbeat link toward one arbiter, as the agent holds it.

    Attributes:
        node_id: the process's node id.
        deliver: called with each ack for the process (serialised ``HeartbeatAck``)
            or, to end the link (rule 4, 5), with ``(status code number, message)``.
        request: the process's last heartbeat (None before its first).
        heard_at: monotonic seconds when it came.
        entry_seq: the last entry seq of this link in the host stream (rule 2).
        vouched: entry seq -> process seq, for the entries not acked yet.
        acked: the highest process seq acked (rule 3).
        closed: ended (refused, replaced or gone).
    """

    node_id: str
    deliver: Callable[[bytes | tuple[int, str]], None]
    request: pb.HeartbeatRequest | None = None
    heard_at: float = 0.0
    entry_seq: int = 0
    vouched: dict[int, int] = field(default_factory=dict)
    acked: int = -1
    closed: bool = False

    def interval(self, default: float) -> float:
        """The interval the process declared (``default`` seconds when it declared 0)."""
        req = self.request
        return req.interval_seconds if req is not None and req.interval_seconds else default


class HostTable:
    """The local links toward one arbiter and the entries of its host stream.

    Args:
        vouch_factor: rule 1's factor.
    """

    def __init__(self, vouch_factor: float = VOUCH_FACTOR) -> None:
        self.links: dict[str, LocalLink] = {}
        self._factor = vouch_factor

    def open(self, link: LocalLink) -> None:
        """A new local link; an older one of the same node id is closed (rule 5)."""
        old = self.links.get(link.node_id)
        if old is not None and old is not link:
            self._end(old, 10, "replaced by a newer stream of this node id at the agent")  # ABORTED
            link.entry_seq = old.entry_seq  # the host stream's seqs of this id go on rising
        self.links[link.node_id] = link

    def heard(self, link: LocalLink, request: pb.HeartbeatRequest, now: float) -> None:
        """The process sent ``request`` on ``link`` at ``now``."""
        link.request, link.heard_at = request, now

    def close(self, link: LocalLink) -> None:
        """The link's stream ended (rule 1): it is vouched for no more."""
        link.closed = True
        if self.links.get(link.node_id) is link:
            del self.links[link.node_id]

    def entries(self, now: float, default_interval: float) -> list[pb.HeartbeatEntry]:
        """The entries of the next request of the host stream (rules 1, 2).

        Args:
            now: monotonic seconds.
            default_interval: seconds, for a process that declared 0.
        """
        out = []
        for link in self.links.values():
            req = link.request
            if req is None or link.closed:
                continue
            if now - link.heard_at > self._factor * link.interval(default_interval):
                continue  # rule 1: silent too long, the arbiter must see the silence
            link.entry_seq += 1
            link.vouched[link.entry_seq] = req.seq
            if len(link.vouched) > _MEMORY:
                del link.vouched[next(iter(link.vouched))]
            out.append(
                pb.HeartbeatEntry(
                    node_id=link.node_id,
                    incarnation=req.incarnation,
                    seq=link.entry_seq,
                    labels=req.labels,
                    status=req.status,
                    interval_seconds=req.interval_seconds,
                )
            )
        return out

    def on_ack(self, ack: pb.HeartbeatAck) -> int:
        """Passes each entry ack of the host stream's ``ack`` to its link (rules 3, 4).

        Returns:
            How many acks were delivered.
        """
        shared = pb.HeartbeatAck()
        shared.CopyFrom(ack)
        shared.ClearField("entries")
        shared.ClearField("seq")
        wire = shared.SerializeToString()
        delivered = 0
        for e in ack.entries:
            link = self.links.get(e.node_id)
            if link is None:
                continue  # gone meanwhile
            process_seq = link.vouched.pop(e.seq, None)
            for old in [s for s in link.vouched if s < e.seq]:
                del link.vouched[old]  # their acks will not come (one stream, in order)
            if e.error_code:
                self._end(link, e.error_code, e.error_message)
                continue
            if process_seq is None or process_seq <= link.acked:
                continue  # rule 3: that heartbeat was acked already
            link.acked = process_seq
            own = pb.HeartbeatAck(
                seq=process_seq,
                lease_seconds=e.lease_seconds,
                state=e.state,
                incarnation=e.incarnation,
                grace_seconds=e.grace_seconds,
                grace_id=e.grace_id,
            )
            link.deliver(wire + own.SerializeToString())
            delivered += 1
        return delivered

    def fail_all(self) -> None:
        """The host stream was lost: the entries in flight will not be acked."""
        for link in self.links.values():
            link.vouched.clear()

    def _end(self, link: LocalLink, code: int, message: str) -> None:
        link.closed = True
        if self.links.get(link.node_id) is link:
            del self.links[link.node_id]
        link.deliver((code, message))
