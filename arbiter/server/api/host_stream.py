"""A host stream (``HostHeartbeat``): one stream per (host, replica) heartbeats for many node ids.

An agent (``membership agent``) on each host sends one request per interval
carrying a :class:`HeartbeatEntry` for every local node id it still vouches for,
and reads one ack carrying a ``HeartbeatEntryAck`` per entry. This divides the
replica's per-message cost (about 100 to 250 us in grpc.aio, whatever a message
carries) by the ids per host. The detection semantics are the Heartbeat
stream's: each entry is one heartbeat of its node id, given to the same driver
call, so each replica suspects each id on its own and DEAD still needs a quorum.

Rules (docs/protocol.md, "Host streams"):

1. Form. Every request of a host stream carries ``entries`` and no ``node_id``;
   a request without entries, or with a node id, is INVALID_ARGUMENT and ends
   the stream. The request's ``cluster`` is checked as a Heartbeat request's
   (FAILED_PRECONDITION for another cluster, ending the stream).
2. Each entry is checked by its own :class:`arbiter.server.api.heartbeat_path.
   HeartbeatChecks`, the one a Heartbeat stream of that node id would have
   (labels, status, interval, seq increasing per node id, max_nodes, shedding),
   and answered by the driver's verdict for it. A refusal refuses that entry
   alone: its ack's ``error_code`` and ``error_message``, no lease; the
   stream and the other entries go on, and the id's state in the stream is
   dropped (its next entry starts afresh, at any seq).
3. Identity: under mutual TLS each node id is checked once per stream against
   the caller's certificate (:meth:`arbiter.server.net.authz.Authorizer.node`:
   an agent's ``node/<prefix>*`` certificate bounds the ids it may carry); a
   refused id is PERMISSION_DENIED in its entry's ack, on every request that
   carries it.
4. A node id absent from a request is silent to the failure detector (nothing
   is heartbeaten for it), and its state in the stream is dropped; a new
   incarnation of an id starts it afresh (a Heartbeat stream would be a new
   stream). Memory per stream is therefore bounded by the entries of its last
   request.
5. At most ``max_host_entries`` entries per request: the rest are refused
   alone (RESOURCE_EXHAUSTED). A node id twice in one request: the second is
   refused (INVALID_ARGUMENT).
6. The stream's rate: the throttle of each entry's checks admits one entry per
   id per request, so the stream waits the longest of them (limits rule 3).

Sans-I/O apart from the authorizer's look at the call's certificate: time is an
argument, the verdicts come from the driver passed in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from arbiter.config import ArbiterConfig
from arbiter.core.labelsets import LabelSets
from arbiter.server.api import limits
from arbiter.server.api.heartbeat_path import ClusterMismatch, HeartbeatChecks
from arbiter.server.api.limits import LimitExceeded
from arbiter.server.api.replies import cluster_mismatch
from arbiter.server.api.shedding import check_shedding
from membership.shared import convert
from membership.shared.errors import InvalidArgument
from membership.v1 import membership_pb2 as pb

__all__ = ["HostEntries", "SlowStart"]

log = logging.getLogger(__name__)

_INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]
_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]

# (node_id, incarnation, interval or None) of an entry accepted without a lease:
# the driver is told once its ack is sent (slow start, as for a Heartbeat stream).
SlowStart = tuple[str, int, float | None]


class HostEntries:
    """The per-node-id state of one host stream and the handling of its requests.

    Args:
        config: the replica's configuration (limits, interval bounds).
        cluster: this replica's cluster identity.
        replica_id: this replica's id, for messages.
        labelsets: the label sets every stream of the replica shares.
        may_speak: ``node_id -> refusal message or None`` (rule 3; None for
            ``--insecure``: anyone may speak for any id).
    """

    __slots__ = ("_cluster", "_config", "_labelsets", "_may", "_replica_id", "denied", "nodes")

    def __init__(
        self,
        config: ArbiterConfig,
        cluster: str,
        replica_id: str,
        labelsets: LabelSets,
        may_speak: Callable[[str], str | None] | None,
    ) -> None:
        self._config = config
        self._cluster = cluster
        self._replica_id = replica_id
        self._labelsets = labelsets
        self._may = may_speak
        self.nodes: dict[str, HeartbeatChecks] = {}
        """node id -> its checks, for the ids of the last request (rule 4)."""
        self.denied: dict[str, str] = {}
        """node id -> why the certificate may not speak for it (rule 3, once per stream)."""

    def check_request(self, req: pb.HeartbeatRequest) -> None:
        """Rule 1.

        Raises:
            InvalidArgument: no entries, or a node id on the request.
            ClusterMismatch: the request names another cluster.
        """
        if req.node_id or not req.entries:
            raise InvalidArgument(
                "entries: a HostHeartbeat request carries entries and no node_id "
                f"(got node_id {req.node_id!r} and {len(req.entries)} entries); a single "
                "node heartbeats on Heartbeat"
            )
        if req.cluster:
            refusal = cluster_mismatch(self._cluster, self._replica_id, req.cluster, "host")
            if refusal is not None:
                raise ClusterMismatch(refusal)

    def check_entries(
        self, req: pb.HeartbeatRequest, driver: Any, now: float
    ) -> tuple[list[tuple[pb.HeartbeatEntry, HeartbeatChecks | None, pb.HeartbeatEntryAck]], float]:
        """Checks every entry of ``req`` read at ``now`` (monotonic seconds), rules 2 to 6.

        Returns:
            (one ``(entry, checks or None when refused, its ack so far)`` per entry, in
            order; seconds to wait before the verdicts, the longest throttle's).
        """
        limit = self._config.max_host_entries
        out: list[tuple[pb.HeartbeatEntry, HeartbeatChecks | None, pb.HeartbeatEntryAck]] = []
        seen: set[str] = set()
        nodes, old = {}, self.nodes
        wait = 0.0
        for i, entry in enumerate(req.entries):
            nid = entry.node_id
            ack = pb.HeartbeatEntryAck(node_id=nid, seq=entry.seq)
            out.append((entry, None, ack))
            if i >= limit:
                _refuse(ack, _EXHAUSTED, f"max_host_entries: at most {limit} entries per "
                        f"request on {self._replica_id} (--max-host-entries)")  # fmt: skip
                continue
            if nid in seen:
                _refuse(ack, _INVALID, f"node_id: {nid!r} twice in one request")
                continue
            seen.add(nid)
            why = self._refusal(nid)
            if why is not None:
                ack.error_code, ack.error_message = grpc.StatusCode.PERMISSION_DENIED.value[0], why
                continue
            checks = old.get(nid)
            if checks is None or checks.incarnation not in (0, entry.incarnation):
                checks = HeartbeatChecks(
                    self._config, self._cluster, self._replica_id, self._labelsets
                )  # rule 4: a new id, or a new incarnation of it, starts afresh
            try:
                w, first = checks.check(entry, now)
                if first:
                    limits.check_new_node(driver, self._config.max_nodes, nid)
                    check_shedding(driver, nid, now)
            except InvalidArgument as e:
                _refuse(ack, _INVALID, str(e))
                continue
            except LimitExceeded as e:
                _refuse(ack, e.code.value[0], str(e))
                continue
            wait = max(wait, w)
            nodes[nid] = checks
            out[-1] = (entry, checks, ack)
        self.nodes = nodes  # rule 4: the ids absent from this request are dropped
        return out, wait

    def _refusal(self, node_id: str) -> str | None:
        """Rule 3: why the caller may not speak for ``node_id`` (None: it may)."""
        if self._may is None:
            return None
        if node_id in self.denied:
            return self.denied[node_id]
        if node_id in self.nodes:
            return None  # allowed when it first came, and a certificate does not change
        why = self._may(node_id)
        if why is not None:
            if len(self.denied) < self._config.max_host_entries:
                self.denied[node_id] = why
            log.info("host stream entry refused: %s", why)
        return why

    @staticmethod
    def answer(ack: pb.HeartbeatEntryAck, verdict: Any) -> None:
        """Fills an entry's ack from the driver's verdict (a HeartbeatVerdict)."""
        ack.lease_seconds = verdict.lease
        ack.state = convert.state_to_pb(verdict.state)
        ack.incarnation = verdict.incarnation
        if verdict.grace_id:  # grace_windows.py rule 3; 0 is not on the wire
            ack.grace_seconds, ack.grace_id = verdict.grace, verdict.grace_id


def _refuse(ack: pb.HeartbeatEntryAck, code: int, message: str) -> None:
    ack.error_code, ack.error_message = code, message
