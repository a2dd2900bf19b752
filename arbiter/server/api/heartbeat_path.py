"""The per-heartbeat path of a replica: check a request, build its ack from a verdict.

Split from the servicer so that anything serving heartbeat streams (the
in-process ``MembershipServicer.Heartbeat``, or an ingest worker given its
verdicts by the consensus process) runs the same checks and builds the same
acks. The verdict itself comes from elsewhere: :meth:`arbiter.server.consensus.driver.
Driver.heartbeat` (one call per heartbeat, returning the core's
:class:`~arbiter.core.observer.HeartbeatVerdict` and the replica's
:class:`arbiter.server.consensus.standing.Standing`).

Rules:

1. Every rule of a heartbeat stream holds on every heartbeat, in this order
   (so a refusal names the same rule as before): the rate
   (:class:`arbiter.server.api.limits.Throttle`), the node id and incarnation,
   the labels, the status, the declared interval (:func:`check_interval`: 0 or
   within :func:`interval_bounds`, ``[heartbeat_interval, interval_ceiling]``
   seconds, the bounds docs/protocol.md states), then seq and the stream's
   identity (:class:`arbiter.server.api.limits.HeartbeatStreamRules`).
2. A field is validated when it differs from the same stream's previous
   heartbeat: the node id and incarnation on the first heartbeat (rule 1's
   stream rules refuse any change after it), the labels when their content
   changed, the status when it is not equal (protobuf ``==``) to the
   previous heartbeat's, the interval when it is another number. What was
   checked once is not checked again while it stays the same; what changed
   is checked by the same functions as ever (:mod:`membership.shared.validation`),
   with the same messages.
5. Memory: a stream holds one node's heartbeats for as long as the node
   lives, so what it keeps is kept per node. It keeps no part of an earlier
   request (the previous status is the current request's once compared: a
   protobuf submessage holds its whole request's memory), and the node id,
   incarnation and labels it hands on (:attr:`HeartbeatChecks.node_id`,
   :attr:`HeartbeatChecks.incarnation`, :attr:`HeartbeatChecks.labels`) are
   one copy each, which the driver's records share: the node id interned
   (``sys.intern``), the incarnation the int of the stream's first
   heartbeat (protobuf makes a new int at every read of a field: 32 bytes
   per record for a millisecond timestamp), and the labels one dict shared
   by every stream with the same labels (:class:`arbiter.core.labelsets.
   LabelSets`), whose keys and values are interned.
3. The cluster a heartbeat names is compared with this replica's when it is
   not empty (the SDK sets it on the first heartbeat of a stream):
   :class:`ClusterMismatch` (FAILED_PRECONDITION) otherwise.
4. An ack is bytes: a template holding what every ack of the replica
   shares at the time (its id, cluster, instance, epoch, quorum, leader,
   interval, the arbiter set and its index), serialised once, followed by
   the heartbeat's own fields (``seq``, ``lease_seconds``, ``state``,
   ``incarnation``, the grace window's) serialised from one message the
   builder reuses; protobuf's wire format merges concatenated messages, so
   the bytes decode to the ack built in full (as an ingest worker's do).
   The template is rebuilt when the :class:`Standing` or the arbiter set is
   another object. Bytes, not a message, because grpc.aio keeps the last
   response of every stream until the next one (its handler's loop
   variable): a message copied from the template holds a protobuf arena of
   about 1.2 KiB per node with three arbiters, the bytes about 0.2 KiB
   (docs/scale.md, "Memory per node"). ``Heartbeat`` is registered with a
   pass-through response serializer (:func:`arbiter.server.fanout.frames.
   add_membership_service`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from arbiter.config import ArbiterConfig
from arbiter.core.labelsets import LabelSets
from arbiter.core.observer import HeartbeatVerdict
from arbiter.server.api.limits import HeartbeatStreamRules, Throttle
from arbiter.server.api.replies import cluster_mismatch
from arbiter.server.consensus.arbiterset import ArbiterSet, to_protos
from arbiter.server.consensus.standing import Standing
from membership.shared import convert
from membership.shared.errors import InvalidArgument
from membership.shared.validation import (
    validate_gpus,
    validate_health_reason,
    validate_incarnation,
    validate_labels,
    validate_node_id,
    validate_status,
)
from membership.v1 import membership_pb2 as pb

__all__ = [
    "AckBuilder",
    "ClusterMismatch",
    "HeartbeatChecks",
    "IntervalBounds",
    "check_interval",
    "interval_bounds",
]


# HeartbeatChecks.labels before a stream's first heartbeat (never handed on).
_UNCHECKED: Mapping[str, str] = MappingProxyType({})


class ClusterMismatch(Exception):
    """A heartbeat names another cluster: FAILED_PRECONDITION with this message (rule 3)."""


class IntervalBounds(NamedTuple):
    """The ``interval_seconds`` a replica accepts besides 0 (docs/protocol.md, Heartbeat rule 3).

    Attributes:
        lowest: ``heartbeat_interval``, seconds: the interval of a small cluster.
        highest: the interval ceiling, seconds: the load cap at ``max_nodes``
            (interval rule 5), the longest interval any ack of the replica ever
            suggests (``next_interval_seconds``), so a node that declares what the
            acks suggest is always inside.
        why: what sets them, with their flags, for the refusal's message.
    """

    lowest: float
    highest: float
    why: str


@functools.lru_cache(maxsize=8)
def interval_bounds(config: ArbiterConfig) -> IntervalBounds:
    """The bounds of a declared interval under ``config``: one shared tuple per
    configuration (a stream keeps a reference, not two floats of its own: rule 5)."""
    lowest, highest = config.heartbeat_interval, config.interval_ceiling
    why = (
        f"from heartbeat_interval {lowest!r} s (--heartbeat-interval) to the interval "
        f"ceiling {highest!r} s, the longest interval any ack suggests: the load cap at "
        f"max_nodes {config.max_nodes} (--max-nodes) with heartbeat_budget "
        f"{config.heartbeat_budget:g}/s (--heartbeat-budget), never below "
        f"max_heartbeat_interval {config.max_heartbeat_interval!r} s (--max-heartbeat-interval)"
    )
    return IntervalBounds(lowest, highest, why)


def check_interval(interval: float, bounds: IntervalBounds) -> None:
    """Checks a declared ``interval_seconds``: 0 (the arbiter's default, ``heartbeat_interval``)
    or in ``[bounds.lowest, bounds.highest]`` seconds (docs/protocol.md, Heartbeat rule 3).

    Raises:
        InvalidArgument: ``interval_seconds: got ...``, naming both bounds (seconds, exact:
            a client may declare either) and what sets them.
    """
    lowest, highest, why = bounds
    if not (interval == 0 or lowest <= interval <= highest):
        raise InvalidArgument(
            f"interval_seconds: got {interval!r}, outside [{lowest!r}, {highest!r}] seconds; "
            f"send 0 (the arbiter's default) or an interval {why}"
        )


class HeartbeatChecks:
    """The checks of one heartbeat stream (module rules 1 to 3). Time is an argument.

    Args:
        config: the replica's configuration (rate, interval bounds: :func:`interval_bounds`).
        cluster: this replica's cluster identity ("" checks nothing).
        replica_id: this replica's id, for messages.
        labelsets: the label sets every stream of the replica shares (rule 5);
            None: this stream's own.
    """

    __slots__ = (
        "_bounds",
        "_cluster",
        "_interval",
        "_labelsets",
        "_replica_id",
        "_status",
        "labels",
        "node_id",
        "rules",
        "throttle",
    )

    def __init__(
        self,
        config: ArbiterConfig,
        cluster: str,
        replica_id: str,
        labelsets: LabelSets | None = None,
    ) -> None:
        self._labelsets = LabelSets() if labelsets is None else labelsets
        self.rules = HeartbeatStreamRules()
        self.throttle = Throttle(config.max_heartbeat_rate, config.heartbeat_rate_margin)
        self._bounds = interval_bounds(config)  # interval rule 5
        self._cluster = cluster
        self._replica_id = replica_id
        # The stream's node id and the labels last validated, shared (rule 5); set
        # by the first heartbeat (before it: "" and _UNCHECKED).
        self.node_id = ""
        self.labels: Mapping[str, str] = _UNCHECKED
        self._status: pb.NodeStatus | None = None
        self._interval: float | None = None

    @property
    def incarnation(self) -> int:
        """The stream's incarnation, as the int of its first heartbeat (rule 5; 0 before)."""
        return self.rules.incarnation

    def check(self, req: pb.HeartbeatRequest | pb.HeartbeatEntry, now: float) -> tuple[float, bool]:
        """Checks one heartbeat read at ``now`` (monotonic seconds): a Heartbeat stream's
        request, or one entry of a host stream (which names no cluster: its request does,
        :mod:`arbiter.server.api.host_stream`).

        Returns:
            (seconds to wait before handling it, the throttle's; True for the
            stream's first heartbeat).

        Raises:
            InvalidArgument: a field breaks a limit, or a stream rule is broken.
            LimitExceeded: the stream was throttled for too long.
            ClusterMismatch: the heartbeat names another cluster.
        """
        wait = self.throttle.admit(now)
        rules = self.rules
        node_id, incarnation = req.node_id, req.incarnation
        if node_id != rules.node_id or incarnation != rules.incarnation:
            validate_node_id(node_id)
            validate_incarnation(incarnation)
        labels = req.labels
        known = self.labels
        if known is _UNCHECKED or len(labels) != len(known) or dict(labels) != known:
            validate_labels(labels)
            self.labels = self._labelsets.mapping(labels)
        status = req.status
        if self._status is None or status != self._status:
            validate_status(status.phase, status.gauges, convert.status_numbers(status))
            validate_health_reason(status.health_reason)
            if status.gpus:
                validate_gpus(convert.gpu_figures(status))
        self._status = status  # this request's, never an older one's (rule 5)
        if req.interval_seconds != self._interval:
            check_interval(req.interval_seconds, self._bounds)
            self._interval = req.interval_seconds
        first = rules.check(node_id, incarnation, req.seq)
        if first:
            self.node_id = rules.node_id = sys.intern(node_id)
        if isinstance(req, pb.HeartbeatRequest) and req.cluster:
            refusal = cluster_mismatch(
                self._cluster, self._replica_id, req.cluster, f"node {node_id}"
            )
            if refusal is not None:
                raise ClusterMismatch(refusal)
        return wait, first


class AckBuilder:
    """Heartbeat acks of one replica, as bytes built from cached parts (module rule 4).

    Not thread-safe: one builder serves the streams of one event loop (it
    reuses one message for the per-heartbeat fields).

    Args:
        arbiter_id: this replica's id.
        cluster: this replica's cluster identity.
    """

    __slots__ = ("_arbiter_id", "_arbiters", "_cluster", "_own", "_standing", "_template", "_wire")

    def __init__(self, arbiter_id: str, cluster: str) -> None:
        self._arbiter_id = arbiter_id
        self._cluster = cluster
        self._standing: Standing | None = None
        self._arbiters: ArbiterSet | None = None
        self._template = pb.HeartbeatAck()
        self._wire = b""  # the template, serialised
        self._own = pb.HeartbeatAck()  # the per-heartbeat fields, reused

    def template(self, standing: Standing, arbiters: ArbiterSet) -> pb.HeartbeatAck:
        """The shared part of every ack now (rebuilt when either argument is another object)."""
        if standing is not self._standing or arbiters is not self._arbiters:
            wire = to_protos(arbiters)
            self._template = pb.HeartbeatAck(
                epoch=standing.epoch,
                next_interval_seconds=standing.interval,
                in_quorum=standing.in_quorum,
                arbiter_id=self._arbiter_id,
                leader_id=standing.leader_id,
                cluster_size=sum(a.voter for a in wire),
                cluster=self._cluster,
                instance=standing.instance,
                arbiters=wire,
                config_index=arbiters.index,
            )
            self._wire = self._template.SerializeToString()
            self._standing, self._arbiters = standing, arbiters
        return self._template

    def host_ack(
        self,
        seq: int,
        entries: list[pb.HeartbeatEntryAck],
        standing: Standing,
        arbiters: ArbiterSet,
    ) -> bytes:
        """The ack of a host stream's request ``seq``: the template's shared fields and
        one ``HeartbeatEntryAck`` per entry, serialised (module rule 4)."""
        if standing is not self._standing or arbiters is not self._arbiters:
            self.template(standing, arbiters)
        return self._wire + pb.HeartbeatAck(seq=seq, entries=entries).SerializeToString()

    def ack(
        self, seq: int, verdict: HeartbeatVerdict, standing: Standing, arbiters: ArbiterSet
    ) -> bytes:
        """The ack of heartbeat ``seq`` given its verdict, the replica's standing and the
        arbiter set in force: a serialised ``HeartbeatAck`` (module rule 4)."""
        if standing is not self._standing or arbiters is not self._arbiters:
            self.template(standing, arbiters)
        own = self._own
        own.seq = seq
        own.lease_seconds = verdict.lease
        own.state = convert.state_to_pb(verdict.state)
        own.incarnation = verdict.incarnation
        # a grace window (arbiter/core/grace_windows.py rule 3); 0 is not on the wire
        own.grace_seconds = verdict.grace if verdict.grace_id else 0.0
        own.grace_id = verdict.grace_id
        return self._wire + own.SerializeToString()
