"""The events a replica writes to its subscribers, each serialised once (hub.py, fan-out rule 1).

Every ``MembershipEvent`` carries this replica's id, its cluster identity and
the cluster's instance (arbiter/server/api/servicers.py). A committed change, a
snapshot of a view, a quorum status and the progress marker are the same for
every subscriber of a replica, so :class:`EventFrames` serialises each once
and every stream writes the same bytes: ``Subscribe`` is registered with a
pass-through response serializer (:func:`add_membership_service`), so gRPC
sends them as they are. A client reads the same messages as when each
stream serialised its own.

Each cache is exact (what a fresh encoding would give now), keyed by what
the event is made of:

* a change: its epoch and the instance (the last ``_CHANGES_KEPT``; a stream
  behind by more encodes its own);
* a snapshot: the view's epoch, the instance, and the state machine's
  applied index (the suspicions a snapshot lists change only when an entry
  is applied);
* a quorum status: the status, the instance and the arbiter set in force;
* the progress marker: the epoch, quorum, instance and arbiter set.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import message_factory

from arbiter.core.tally import ViewChange
from arbiter.server.consensus.arbiterset import ArbiterSet, to_protos
from arbiter.server.consensus.driver import Driver
from arbiter.server.fanout.encoding import ViewEncoder
from arbiter.server.fanout.hub import HubStatus
from membership.shared import convert
from membership.shared.view import View
from membership.v1 import membership_pb2 as pb

__all__ = ["SERVICE", "EventFrames", "add_membership_service"]

SERVICE = "membership.v1.Membership"
# Change events kept for subscribers still behind (a replica's history is longer:
# a stream behind by more than this encodes the change itself).
_CHANGES_KEPT = 64


class EventFrames:
    """The serialised events of one replica's subscriber streams.

    Args:
        driver: the replica's driver (its applied state and standing).
        views: the view encoder (snapshots with each member's suspicions).
        cluster: the replica's cluster identity (``name@digest``, or "").
        arbiters: returns the arbiter configuration in force (the same object
            until it changes: arbiter/server/consensus/arbiterset.py).
        progress_interval: seconds between progress markers on an idle
            stream, announced in each (``progress_interval_seconds``).
    """

    def __init__(
        self,
        driver: Driver,
        views: ViewEncoder,
        cluster: str,
        arbiters: Callable[[], ArbiterSet],
        progress_interval: float,
    ) -> None:
        self._driver = driver
        self._views = views
        self._cluster = cluster
        self.arbiters = arbiters
        self._progress_interval = progress_interval
        self._wire: tuple[ArbiterSet, list[pb.Arbiter]] = (ArbiterSet(voters={}), [])
        self._changes: collections.OrderedDict[tuple[int, str], bytes] = collections.OrderedDict()
        self._snapshot: tuple[tuple[int, str, int], bytes] | None = None
        self._quorum: tuple[tuple[HubStatus, str, ArbiterSet], bytes] | None = None
        self._progress: tuple[tuple[int, bool, str, ArbiterSet], bytes] | None = None

    def arbiter_set(self) -> tuple[list[pb.Arbiter], int]:
        """The configuration in force on the wire and its index (arbiterset.py rule 2)."""
        now = self.arbiters()
        if self._wire[0] is not now:
            self._wire = (now, to_protos(now))
        return self._wire[1], now.index

    def event(self, **event: Any) -> pb.MembershipEvent:
        """An event to a subscriber, stamped with this replica, its cluster and instance."""
        return pb.MembershipEvent(
            arbiter_id=self._driver.replica_id,
            cluster=self._cluster,
            instance=self._driver.state.instance,
            **event,
        )

    def change(self, change: ViewChange) -> bytes:
        """The event of the committed ``change``."""
        key = (change.epoch, self._driver.state.instance)
        data = self._changes.get(key)
        if data is None:
            changes = [convert.change_to_pb(c) for c in change.changes]
            ranks = convert.jobs_to_pb(change.ranks)
            event = self.event(
                change=pb.ViewChange(epoch=change.epoch, changes=changes, ranks=ranks)
            )
            data = event.SerializeToString()
            self._changes[key] = data
            if len(self._changes) > _CHANGES_KEPT:
                self._changes.popitem(last=False)
        return data

    def snapshot(self, view: View) -> bytes:
        """The snapshot event of ``view`` (each member with the suspicions applied now)."""
        state = self._driver.state
        key = (view.epoch, state.instance, state.applied_index)
        if self._snapshot is None or self._snapshot[0] != key:
            event = self.event(snapshot=pb.ViewSnapshot(view=self._views.view_pb(view)))
            self._snapshot = (key, event.SerializeToString())
        return self._snapshot[1]

    def quorum(self, status: HubStatus) -> bytes:
        """The quorum status event of ``status``."""
        key = (status, self._driver.state.instance, self.arbiters())
        if self._quorum is None or self._quorum[0] != key:
            arbiters, index = self.arbiter_set()
            event = self.event(
                quorum=pb.QuorumStatus(
                    in_quorum=status.in_quorum,
                    leader_id=status.leader_id or "",
                    epoch=status.epoch,
                    arbiters=arbiters,
                    config_index=index,
                )
            )
            self._quorum = (key, event.SerializeToString())
        return self._quorum[1]

    def progress(self, in_quorum: bool) -> bytes:
        """The progress marker: this replica's epoch now, and ``in_quorum``."""
        state = self._driver.state
        key = (state.epoch, in_quorum, state.instance, self.arbiters())
        if self._progress is None or self._progress[0] != key:
            arbiters, index = self.arbiter_set()
            event = self.event(
                progress=pb.Progress(
                    epoch=state.epoch,
                    in_quorum=in_quorum,
                    progress_interval_seconds=self._progress_interval,
                    arbiters=arbiters,
                    config_index=index,
                )
            )
            self._progress = (key, event.SerializeToString())
        return self._progress[1]


def add_membership_service(servicer: Any, server: grpc.aio.Server) -> None:
    """Registers the Membership service as the generated ``add_MembershipServicer_to_server``
    does, except that ``Subscribe`` and ``Heartbeat`` write bytes that gRPC sends as
    they are: Subscribe its events, serialised once per replica by
    :class:`EventFrames`; Heartbeat its acks (:class:`arbiter.server.api.heartbeat_path.
    AckBuilder`: bytes cost less memory per stream than the message grpc.aio keeps).

    The handlers are built from the service's descriptor, so every RPC the proto
    declares is registered (a method added to the proto needs no change here).
    """
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["Membership"].methods:
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        make = _HANDLER_KINDS[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=request.FromString,
            # bytes that gRPC sends as they are
            response_serializer=None if method.name in _BYTES else response.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


# The methods whose handlers write serialised responses.
_BYTES = frozenset({"Subscribe", "Heartbeat", "HostHeartbeat"})

# (client streaming, server streaming) -> gRPC's handler constructor.
_HANDLER_KINDS: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}
