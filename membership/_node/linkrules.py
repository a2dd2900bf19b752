"""When a heartbeat stream takes a heartbeat, is hedged or is abandoned: the link's rules, sans-I/O.

Time is the ``now`` argument (monotonic seconds); nothing here reads a clock,
opens a connection or sleeps. :class:`membership._node.heartbeats.HeartbeatLink`
keeps one :class:`StreamClock` per stream and asks these functions what to
do; a link's ``others`` argument says whether another arbiter's link answers
(:func:`answering`), which the node agent knows.

Why these rules: in a join storm every joining node heartbeats every replica
at the base interval until its first ack brings the suggested one, so the
replicas' acks fall behind; nodes that then open second streams (hedging)
and reconnect (abandoning) add the very load that made the acks late, and
the cluster stays overloaded after the storm has passed (a metastable
failure: Bronson, Aghayev, Charapko and Zhu, "Metastable Failures in
Distributed Systems", HotOS 2021). A stream therefore asks no more of a
replica than that replica has shown it answers (rule 1), and a new
connection is opened only where one connection is the odd one out (rules 3
and 4).

Rules:

1. Slow start. Until an ack on it grants a lease, a stream carries one
   heartbeat at a time: the next is handed to it once the last one was
   acked, at the interval or later (as TCP's slow start puts no more in
   flight than the path has shown it carries, RFC 5681). Nothing is lost by
   waiting: the node holds no lease of that arbiter to keep (session rule
   2), and a replica grants none before the node's join committed (its
   observation alive and committed), so this lasts while the node is
   JOINING there, and one round trip on a new stream of a node already a
   member. What it saves: in a join storm every joining node used to send
   at the base interval (0.15 s) to replicas whose acks were seconds late,
   and its first ack, suggesting the interval for the nodes counted so far,
   could set it to that short interval for another late round trip. A
   hedge stream (rule 3) carries the heartbeat that opened it and then
   waits the same way.
2. Silence. A stream's silence at ``now`` is the time since the later of the
   send of its oldest unacked heartbeat and the latest ack it brought; 0
   while nothing is unacked. A replica whose acks come late but keep coming
   (each for an older heartbeat) is slow, not wedged: a new connection
   would queue behind the same backlog, so its silence stays short. A
   connection that wedged (no FIN, no RST) brings nothing: its silence grows
   from the first heartbeat after the wedge, as the oldest unacked
   heartbeat's wait did before (the two are equal while acks come within an
   interval).
3. Hedging (kubernetes/kubernetes#48638: a wedged connection is reused by
   every retry until keepalive closes it). A link whose only stream holds a
   lease (rule 1) and is silent for more than ``hedge_after`` opens a second
   stream on a fresh connection, but only while this link is the odd one
   out (:func:`odd_one_out`): another arbiter's link answers, with an acked
   stream silent for at most half as long as this link's. When every link
   is silent alike, the cause is what they share: the replicas' load, or
   this node's own process running late; a new connection would only add
   load. (Half, not ``hedge_after``: on a loaded machine the other links are
   late too, only less; a wedged link's silence grows without bound and
   soon doubles theirs.)
4. Abandoning. A stream silent for more than ``ack_timeout`` is abandoned
   while another link answers, otherwise once it is silent for more than
   ``stall_timeout``: the bound within which a node whose every connection
   wedged at once still gets fresh ones (HTTP/2 keepalive may never close
   them: its ping waits behind blocked writes, grpc/grpc#15871). A stream
   in slow start that is not a hedge is abandoned after
   ``slow_start_timeout`` whatever the others do: no lease of that arbiter
   is at stake, and a replica working through a join storm answers its
   joining nodes late (often later than the others, as it may lead or carry
   more load); gRPC holds a stream its server has not taken yet in a queue,
   and cancels it after 30 s there
   (``grpc.server_max_unrequested_time_in_server``). A node that gave up
   sooner would lose its place in that queue and join it again at the back,
   with every other node that did the same: the queue would never drain.
   (In slow start one heartbeat is in flight, so a stream's silence is its
   round trip: a slow replica's looks as silent as a wedged one.)
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "LinkTimings",
    "StreamClock",
    "abandon_after",
    "answering",
    "hedge_due",
    "next_check",
    "odd_one_out",
]

# Unacked heartbeats remembered per stream (older ones are forgotten, oldest first).
_UNACKED_MEMORY = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkTimings:
    """The timings a link works with right now, seconds (they scale with the interval).

    Attributes:
        interval: between two heartbeats.
        hedge_after: a stream silent this long gets a second one beside it (rule 3).
        ack_timeout: a stream silent this long is abandoned while another
            link answers (rule 4).
        stall_timeout: a stream silent this long is abandoned in any case (rule 4).
        slow_start_timeout: a stream in slow start (not a hedge) silent this
            long is abandoned (rule 4).
    """

    interval: float
    hedge_after: float
    ack_timeout: float
    stall_timeout: float
    slow_start_timeout: float


class StreamClock:
    """What the rules know of one stream: its acks and its unacked heartbeats.

    Attributes:
        hedge: the stream was opened beside a silent one (rule 3).
        acked: the stream brought at least one ack.
        leased: one of its acks granted a lease (rule 1: slow start is over).
        heard: monotonic seconds of its latest ack (-inf before the first).
        unacked: (seq, monotonic send time) of heartbeats not yet acked, oldest first.
    """

    __slots__ = ("acked", "heard", "hedge", "leased", "unacked")

    def __init__(self, *, hedge: bool = False) -> None:
        self.hedge = hedge
        self.acked = False
        self.leased = False
        self.heard = -math.inf
        self.unacked: collections.deque[tuple[int, float]] = collections.deque()

    def takes_heartbeat(self) -> bool:
        """True when a heartbeat may be handed to the stream now (rule 1)."""
        return self.leased or not self.unacked

    def sent(self, seq: int, now: float) -> None:
        """Records heartbeat ``seq`` handed to the stream at ``now``."""
        self.unacked.append((seq, now))
        while len(self.unacked) > _UNACKED_MEMORY:
            self.unacked.popleft()

    def ack(self, seq: int, now: float, lease: float = 0.0) -> None:
        """Records an ack of ``seq`` (and of every earlier heartbeat) received at ``now``,
        granting ``lease`` seconds (0: none)."""
        self.acked = True
        self.leased = self.leased or lease > 0
        self.heard = now
        while self.unacked and self.unacked[0][0] <= seq:
            self.unacked.popleft()

    def silence(self, now: float) -> float:
        """Seconds the stream has been silent at ``now`` (rule 2; 0 with nothing unacked)."""
        if not self.unacked:
            return 0.0
        return max(0.0, now - max(self.unacked[0][1], self.heard))

    def silent_since(self) -> float:
        """Monotonic seconds from which :meth:`silence` counts (inf with nothing unacked)."""
        return max(self.unacked[0][1], self.heard) if self.unacked else math.inf


def answering(streams: Iterable[StreamClock], now: float, within: float) -> bool:
    """True when one of a link's streams has been acked and is silent for at most
    ``within`` seconds at ``now``: the link answers (rule 3)."""
    return any(st.acked and st.silence(now) <= within for st in streams)


def odd_one_out(
    mine: Iterable[StreamClock], others: Iterable[Iterable[StreamClock]], now: float
) -> bool:
    """True when another arbiter's link answers at ``now`` (:func:`answering`) within half
    the silence of this link's most silent stream (rule 3): this link is the odd one out.

    Args:
        mine: this link's streams.
        others: the streams of every other arbiter's link.
        now: monotonic seconds.
    """
    within = max((st.silence(now) for st in mine), default=0.0) / 2
    return any(answering(streams, now, within) for streams in others)


def abandon_after(st: StreamClock, timings: LinkTimings, others: bool) -> float:
    """Seconds of silence after which ``st`` is abandoned (rule 4).

    Args:
        st: the stream.
        timings: the link's timings now.
        others: this link is the odd one out (:func:`odd_one_out`).
    """
    if not (st.leased or st.hedge):
        return timings.slow_start_timeout
    return timings.ack_timeout if others else timings.stall_timeout


def hedge_due(streams: list[StreamClock], timings: LinkTimings, others: bool, now: float) -> bool:
    """True when the link must open a second stream beside its only one now (rule 3)."""
    if not others or len(streams) != 1:
        return False
    (st,) = streams
    return st.leased and st.silence(now) > timings.hedge_after


def next_check(streams: list[StreamClock], timings: LinkTimings, others: bool, now: float) -> float:
    """The earliest time after ``now`` at which rule 3 or 4 may act, given ``others``
    (monotonic seconds; inf: none). A deadline already passed that ``others`` holds
    back is left out: the caller looks again at its next heartbeat, when ``others``
    may have changed."""
    due = math.inf
    for st in streams:
        since = st.silent_since()
        if math.isinf(since):
            continue
        limits = [abandon_after(st, timings, others)]
        if others and len(streams) == 1 and st.leased:
            limits.append(timings.hedge_after)
        for limit in limits:
            if since + limit > now:
                due = min(due, since + limit)
    return due
