"""The Admin service of a replica: removing another node (``membership admin remove``),
each replica's standing (``Status``, ``membership admin status``), and saving a
backup (``SaveSnapshot``: arbiter/server/ops/backup.py).

Removing a node is an administrative act, apart from a node's own Leave: the
caller must be an administrator (:meth:`Authorizer.admin`; under mutual TLS
an ``admin`` certificate, under ``--insecure`` anyone), and the removal is
committed through the replicas' log like any view change (tally rule 5a):
the member becomes LEFT at its recorded incarnation, the change carrying who
removed it. The removed node's heartbeats are then answered LEFT, and it
stops without rejoining (membership/_node/session.py rule 5).

The arbiter RPCs (ListArbiters, AddArbiter, RemoveArbiter, PromoteArbiter)
are :mod:`arbiter.server.ops.admin_arbiters`'s; this servicer hands them over.

Status codes of RemoveNode: PERMISSION_DENIED (or the refusal's own code) when the caller
may not administer; INVALID_ARGUMENT for a malformed node id;
FAILED_PRECONDITION for another cluster's identity, a member already DEAD
or LEFT, or one not at the incarnation asked for; NOT_FOUND for a node the
cluster has no record of; UNAVAILABLE when nothing could be committed (no
leader, no quorum). A refused removal is refused before it is proposed: it
commits nothing.

``Status`` only reads (:mod:`arbiter.server.ops.status`): allowed to admin and
observer identities (:meth:`Authorizer.operator`), FAILED_PRECONDITION for
another cluster's identity. It answers also out of quorum, since that is
when an operator asks.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import grpc

from arbiter.server.api.replies import cluster_mismatch, committed, deny, refusal_status
from arbiter.server.consensus.driver import Driver
from arbiter.server.net.authz import AllowAll, Authorizer
from arbiter.server.ops.admin_arbiters import ArbiterAdmin
from arbiter.server.ops.backup import stream_snapshot
from membership.shared.errors import InvalidArgument
from membership.shared.validation import validate_node_id
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc

__all__ = ["AdminServicer"]

log = logging.getLogger("arbiter.admin")


class AdminServicer(pb_grpc.AdminServicer):
    """RemoveNode for one replica (module docstring).

    Args:
        driver: the replica's driver.
        cluster: this replica's cluster identity, ``name@digest``; "" checks nothing.
        authz: who may administer; :class:`AllowAll` (``--insecure``) by default.
            Its ``identity`` of the caller is recorded as ``removed_by``; the
            caller's address when it knows none.
        status: builds this replica's ``StatusResponse``
            (:func:`arbiter.server.ops.status.describe`); None answers UNIMPLEMENTED.
    """

    def __init__(
        self,
        driver: Driver,
        cluster: str = "",
        authz: Authorizer | None = None,
        status: Callable[[], pb.StatusResponse] | None = None,
    ) -> None:
        self._driver = driver
        self.cluster = cluster
        self._authz: Authorizer = authz if authz is not None else AllowAll()
        self._status = status
        # The arbiter RPCs, set by the server once its configuration follower exists.
        self.arbiters: ArbiterAdmin | None = None

    async def _arbiters(self, context: grpc.aio.ServicerContext) -> ArbiterAdmin:
        if self.arbiters is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "arbiter starting; try again")
        assert self.arbiters is not None
        return self.arbiters

    async def ListArbiters(
        self, request: pb.ListArbitersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListArbitersResponse:
        """The configuration in force (admin_arbiters.py rule 2)."""
        return await (await self._arbiters(context)).list(request, context)

    async def AddArbiter(
        self, request: pb.AddArbiterRequest, context: grpc.aio.ServicerContext
    ) -> pb.ArbiterChangeResponse:
        """A new learner (admin_arbiters.py rules 3, 4)."""
        admin = await self._arbiters(context)
        return await admin.change(
            "add_learner", request.id, request.address, request.cluster, context
        )

    async def RemoveArbiter(
        self, request: pb.RemoveArbiterRequest, context: grpc.aio.ServicerContext
    ) -> pb.ArbiterChangeResponse:
        """A voter or learner leaves the configuration (admin_arbiters.py rules 3, 4)."""
        admin = await self._arbiters(context)
        return await admin.change("remove", request.id, "", request.cluster, context)

    async def PromoteArbiter(
        self, request: pb.PromoteArbiterRequest, context: grpc.aio.ServicerContext
    ) -> pb.ArbiterChangeResponse:
        """A learner votes from now on (admin_arbiters.py rules 3, 4)."""
        admin = await self._arbiters(context)
        return await admin.change("promote", request.id, "", request.cluster, context)

    def _caller(self, context: grpc.aio.ServicerContext) -> str:
        """Who is asking, for ``removed_by``: the authorizer's identity, else the peer address."""
        return self._authz.identity(context) or (
            f"unauthenticated client {context.peer() or 'unknown'}"
        )

    async def RemoveNode(
        self, request: pb.RemoveNodeRequest, context: grpc.aio.ServicerContext
    ) -> pb.RemoveNodeResponse:
        """Commits LEFT for the member (tally rule 5a); answers once applied here."""
        await deny(context, self._authz.admin(context), logging.WARNING)
        try:
            validate_node_id(request.node_id)
        except InvalidArgument as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        me = self._driver.replica_id
        mismatch = cluster_mismatch(self.cluster, me, request.cluster, "administrator")
        if mismatch is not None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, mismatch)
        node_id, incarnation = request.node_id, request.incarnation
        judged, reason = self._driver.state.judge_remove(node_id, incarnation)
        if judged is not None:
            await context.abort(refusal_status(judged), f"arbiter {me}: {reason}")
        by = self._caller(context)
        outcome = await committed(
            context,
            self._driver.remove(
                node_id, incarnation, by, timeout=self._driver.config.election_timeout * 3
            ),
            "removal",
        )
        if outcome.refusal is not None:
            await context.abort(refusal_status(outcome.refusal), f"arbiter {me}: {outcome.reason}")
        log.warning(
            "%s incarnation %d removed by %s (epoch %d)",
            node_id,
            outcome.incarnation,
            by,
            outcome.epoch,
        )
        return pb.RemoveNodeResponse(
            epoch=outcome.epoch, incarnation=outcome.incarnation, removed_by=by
        )

    async def Status(
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        """This replica's standing (module docstring; :mod:`arbiter.server.ops.status`)."""
        await deny(context, self._authz.operator(context), logging.WARNING)
        mismatch = cluster_mismatch(
            self.cluster, self._driver.replica_id, request.cluster, "operator"
        )
        if mismatch is not None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, mismatch)
        if self._status is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no status on this replica")
        assert self._status is not None
        return self._status()

    async def SaveSnapshot(
        self, request: pb.SaveSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.SnapshotChunk]:
        """Streams a consistent snapshot for a backup (arbiter/server/ops/backup.py, rules 1, 2)."""
        async for chunk in stream_snapshot(
            self._driver, request, context, cluster=self.cluster, authz=self._authz
        ):
            yield chunk
