"""The wire contract's per-stream rules, checked by the servicers (docs/protocol.md).

Every refusal is a :class:`LimitExceeded` or :class:`membership.shared.errors.InvalidArgument`
whose message starts with the name of the rule or limit (the
:class:`arbiter.config.ArbiterConfig` field, where it is one), so a client
can tell which one it broke; the servicer sends it with the status code it
carries, and ends only that call.

Rules of a heartbeat stream (:class:`HeartbeatStreamRules`):

1. ``seq`` increases strictly from one heartbeat to the next (the first may
   be any value): INVALID_ARGUMENT otherwise. A node numbers its heartbeats
   once for all its streams (membership/_node/session.py), so each stream sees a
   subsequence, increasing too.
2. ``node_id`` and ``incarnation`` are those of the first heartbeat:
   INVALID_ARGUMENT otherwise. A new incarnation opens a new stream.
3. Rate (:class:`Throttle`): a token bucket of ``max_heartbeat_rate`` tokens
   refilled at ``max_heartbeat_rate`` per second. A heartbeat without a token
   waits for one (throttled: its ack comes late, and nothing is read from
   the stream meanwhile, so gRPC's flow control holds the sender back). A
   stream throttled without a pause for more than ``heartbeat_rate_margin``
   seconds is ended with RESOURCE_EXHAUSTED.

Limits of the replica as a whole, RESOURCE_EXHAUSTED each:

4. Slots (:func:`stream_slot`): at most ``max_heartbeat_streams`` heartbeat
   streams and ``max_subscribers`` subscriptions are open at once; a call
   past either is refused when it starts.
5. Nodes (:func:`check_new_node`): once the replica tracks ``max_nodes``
   node ids, a stream whose first heartbeat names an id it does not know
   (no opinion of it, no record in the view) is refused; known ids go on.
6. Readers (:class:`arbiter.server.fanout.hub.NotReading`, raised by the hub):
   a subscriber whose event gRPC does not take within
   ``subscriber_write_timeout`` seconds is ended (the servicer frees its slot
   and queue at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from membership.shared.errors import InvalidArgument

if TYPE_CHECKING:
    from arbiter.config import ArbiterConfig
    from arbiter.server.consensus.driver import Driver

__all__ = [
    "HeartbeatStreamRules",
    "LimitExceeded",
    "Throttle",
    "check_new_node",
    "stream_slot",
]


class LimitExceeded(Exception):
    """A call went past a limit: end it with RESOURCE_EXHAUSTED and this message
    (and ``trailing``, the trailing metadata: a retry hint, arbiter/server/load/monitor.py)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    trailing: tuple[tuple[str, str], ...] = ()


class Throttle:
    """Token bucket of one heartbeat stream (module rule 3). Time is an argument.

    Args:
        rate: tokens per second, also the bucket's size (one second's worth).
        margin: seconds a stream may stay throttled without a pause.
    """

    # One per heartbeat stream, i.e. per node and replica: no __dict__.
    __slots__ = ("_last", "_throttled_since", "_tokens", "margin", "rate", "throttled")

    def __init__(self, rate: float, margin: float) -> None:
        self.rate = rate
        self.margin = margin
        self._tokens = max(1.0, rate)
        self._last: float | None = None
        self._throttled_since: float | None = None
        self.throttled = 0  # heartbeats that had to wait

    def admit(self, now: float) -> float:
        """Takes a token for a heartbeat read at ``now`` (monotonic seconds).

        Returns:
            Seconds to wait before handling it (0.0: at once).

        Raises:
            LimitExceeded: the stream has been throttled for more than ``margin``.
        """
        if self._last is not None:
            self._tokens = min(max(1.0, self.rate), self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= 1.0
        if self._tokens >= 0:
            self._throttled_since = None
            return 0.0
        if self._throttled_since is None:
            self._throttled_since = now
        elif now - self._throttled_since > self.margin:
            raise LimitExceeded(
                f"max_heartbeat_rate: more than {self.rate:g} heartbeats per second on one "
                f"stream for over {self.margin:g}s (heartbeat_rate_margin); send one every "
                "next_interval_seconds of the acks"
            )
        self.throttled += 1
        return -self._tokens / self.rate


@dataclass(slots=True)
class HeartbeatStreamRules:
    """What one heartbeat stream has sent so far (module rules 1 and 2)."""

    node_id: str | None = None
    incarnation: int = 0
    seq: int | None = None

    def check(self, node_id: str, incarnation: int, seq: int) -> bool:
        """Checks one heartbeat against the stream's earlier ones.

        Returns:
            True for the stream's first heartbeat.

        Raises:
            InvalidArgument: naming the rule and both values.
        """
        if self.node_id is None:
            self.node_id, self.incarnation, self.seq = node_id, incarnation, seq
            return True
        if node_id != self.node_id:
            raise InvalidArgument(
                f"node_id: changed from {self.node_id!r} to {node_id!r} within one stream "
                "(one stream speaks for one node)"
            )
        if incarnation != self.incarnation:
            raise InvalidArgument(
                f"incarnation: changed from {self.incarnation} to {incarnation} within one "
                "stream (open a new stream for a new incarnation)"
            )
        assert self.seq is not None
        if seq <= self.seq:
            raise InvalidArgument(
                f"seq: {seq} after {self.seq} (seq must increase strictly within a stream)"
            )
        self.seq = seq
        return False


_SLOTS = {
    "max_heartbeat_streams": ("heartbeat streams", "try another arbiter"),
    "max_subscribers": ("subscriptions", "subscribe to another arbiter"),
}


def stream_slot(limit: str, open_now: int, config: ArbiterConfig, replica: str) -> str | None:
    """The refusal of one more call counted by ``limit`` (None when there is room).

    Args:
        limit: ``max_heartbeat_streams`` or ``max_subscribers``.
        open_now: how many such calls are open.
        config: the replica's configuration (the limit's value).
        replica: this replica's id, for the message.
    """
    most = getattr(config, limit)
    if open_now < most:
        return None
    what, advice = _SLOTS[limit]
    return (
        f"{limit}: {open_now} {what} are open on arbiter {replica} (the limit is {most}); {advice}"
    )


def check_new_node(driver: Driver, max_nodes: int, node_id: str) -> None:
    """Refuses a node id the replica does not know once it tracks ``max_nodes``.

    Known: its failure detector has an opinion of the id, or the view records it.

    Raises:
        LimitExceeded: naming max_nodes.
    """
    tracked = driver.observer.tracked()
    if (
        tracked >= max_nodes
        and driver.observer.opinion(node_id) is None
        and driver.state.member(node_id) is None
    ):
        raise LimitExceeded(
            f"max_nodes: arbiter {driver.replica_id} tracks {tracked} nodes (the limit is "
            f"{max_nodes}) and does not know {node_id!r}"
        )
