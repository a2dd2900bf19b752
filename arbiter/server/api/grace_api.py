"""``Membership.Grace``: a node's grace window, asked of any replica.

Thin, as the other servicers are: checks, then the driver proposes the Grace
command (:mod:`arbiter.core.grace`) and the call answers once it is applied
here. Who may ask: the node itself (its certificate under mutual TLS, as for
Leave) or an administrator, who may only open a window for a node that has
none (``arbiter/core/grace.py`` rule 2). Statuses: the authorizer's refusal;
INVALID_ARGUMENT for a bad node id, incarnation, seconds (not finite, or
negative) or reason; FAILED_PRECONDITION for another cluster, or an
incarnation the cluster does not record ALIVE (STALE, FINAL); NOT_FOUND for an
id it has no record of; UNAVAILABLE when it cannot commit in time.
"""

from __future__ import annotations

import logging
import math

import grpc

from arbiter.core.grace import check_reason
from arbiter.server.api.replies import cluster_mismatch, committed, deny, refusal_status
from arbiter.server.consensus.driver import Driver
from arbiter.server.net.authz import Authorizer
from membership.shared.errors import InvalidArgument
from membership.shared.validation import validate_incarnation, validate_node_id
from membership.v1 import membership_pb2 as pb

__all__ = ["grace_call"]

log = logging.getLogger("arbiter.api")


async def grace_call(
    driver: Driver,
    authz: Authorizer,
    cluster: str,
    request: pb.GraceRequest,
    context: grpc.aio.ServicerContext,
) -> pb.GraceResponse:
    """Answers one ``Grace`` call (module docstring).

    Args:
        driver: the replica's driver.
        authz: who may do what.
        cluster: this replica's cluster identity ("" checks nothing).
        request: the call's request.
        context: the call's context (ended with a status on a refusal).

    Returns:
        The window committed (``granted_seconds``, ``grace_id``: its log index), or for
        an end 0 seconds and the end's log index.
    """
    by = ""  # the node itself
    refusal = authz.node(context, request.node_id)
    if refusal is not None and authz.admin(context) is None:
        refusal, by = None, authz.identity(context) or "admin"  # an administrator's ask
    await deny(context, refusal)
    me = driver.replica_id
    try:
        validate_node_id(request.node_id)
        validate_incarnation(request.incarnation)
        if not (math.isfinite(request.seconds) and request.seconds >= 0):
            raise InvalidArgument(f"seconds must be a finite number >= 0, got {request.seconds}")
        try:
            check_reason(request.reason)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
    except InvalidArgument as e:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    mismatch = cluster_mismatch(cluster, me, request.cluster, f"node {request.node_id}")
    if mismatch is not None:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, mismatch)
    node_id, incarnation = request.node_id, request.incarnation
    judged, reason = driver.state.judge_grace(node_id, incarnation, by)
    if judged is not None:
        log.info("grace window of %s refused: %s", node_id, reason)
        await context.abort(refusal_status(judged), f"arbiter {me}: {reason}")
    outcome, _ = await committed(
        context,
        driver.grace(
            node_id,
            incarnation,
            float(request.seconds),
            request.reason,
            timeout=driver.config.election_timeout * 3,
            by=by,
        ),
        "grace window",
    )
    if outcome.refusal is not None:
        await context.abort(refusal_status(outcome.refusal), f"arbiter {me}: {outcome.reason}")
    record = outcome.record
    log.info(
        "%s incarnation %d: grace window %s",
        node_id,
        incarnation,
        f"of {record.seconds:g}s ({record.reason or 'no reason'})" if record else "ended",
    )
    return pb.GraceResponse(
        granted_seconds=record.seconds if record else 0.0,
        # The entry's log index, a window's grant or its end (docs/protocol.md): the
        # node counts no grant up to an end's index (membership/_node/session.py rule 10).
        grace_id=outcome.index,
        epoch=driver.state.epoch,
    )
