"""The Admin service's arbiter RPCs: list, add (a learner), remove and promote arbiters.

Rules:

1. A change needs an administrator (:meth:`Authorizer.admin`: an ``admin``
   certificate under mutual TLS); listing is a read, as etcd's ``member
   list`` is, and needs what Admin.Status needs (:meth:`Authorizer.operator`:
   an ``admin`` or an ``observer`` certificate, which sees the configuration
   in ``admin status`` already). Any other certificate (a node's, an
   arbiter's) gets PERMISSION_DENIED. A request naming another cluster
   identity gets FAILED_PRECONDITION.
2. ListArbiters answers on any replica: the configuration in force there,
   and each arbiter's replication progress when that replica leads.
3. A change is proposed by the leader only (arbiter/server/ops/reconfig.py rule
   3). A follower answers FAILED_PRECONDITION "not the leader: the leader is
   ID at HOST:PORT" (the client asks it next), or UNAVAILABLE when it knows no
   leader. The answer comes once the change is applied on the leader.
4. Refused before anything is proposed: INVALID_ARGUMENT for a malformed id or
   address (or an address another arbiter has); ALREADY_EXISTS for adding an
   id in the configuration; NOT_FOUND for removing or promoting one that is
   not; FAILED_PRECONDITION for promoting a voter, removing the last voter, or
   while another change is pending (not yet committed). UNAVAILABLE when the
   change was not applied in time (no quorum).
5. ``promote`` by hand is refused (FAILED_PRECONDITION, saying how far
   behind) unless the learner holds the leader's commit index and answered
   within an election timeout, as etcd refuses to promote a learner that is
   not in sync: an absent or lagging voter raises the quorum without adding
   a working replica (four voters with one absent survive no more failure).
"""

from __future__ import annotations

import logging

import grpc

from arbiter.core.raft import InvalidInput
from arbiter.server.api.replies import cluster_mismatch, deny
from arbiter.server.consensus.arbiterset import ArbiterSet, to_protos
from arbiter.server.consensus.events import log_config_change
from arbiter.server.net.authz import Authorizer
from arbiter.server.ops.reconfig import NotLeader, ProposalDropped, Reconfiguration
from membership.shared.errors import InvalidArgument
from membership.shared.validation import parse_address, validate_node_id
from membership.v1 import membership_pb2 as pb

__all__ = ["ArbiterAdmin"]

log = logging.getLogger("arbiter.admin")


class ArbiterAdmin:
    """The arbiter RPCs of one replica's Admin service (module rules).

    Args:
        reconfig: the replica's configuration follower.
        replica_id: this replica's id.
        cluster: its cluster identity ("" checks nothing).
        authz: who may administer.
        timeout: seconds a change may take to be applied.
    """

    def __init__(
        self,
        reconfig: Reconfiguration,
        replica_id: str,
        cluster: str,
        authz: Authorizer,
        timeout: float,
    ) -> None:
        self._reconfig = reconfig
        self._me = replica_id
        self._cluster = cluster
        self._authz = authz
        self._timeout = timeout

    async def _admit(
        self, context: grpc.aio.ServicerContext, expected: str, read: bool = False
    ) -> None:
        """Rule 1 (``read``: listing, which an observer may do too)."""
        authz = self._authz
        refusal = authz.operator(context, "list the arbiters") if read else authz.admin(context)
        await deny(context, refusal, logging.WARNING)
        mismatch = cluster_mismatch(self._cluster, self._me, expected, "administrator")
        if mismatch is not None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, mismatch)

    async def list(
        self, request: pb.ListArbitersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListArbitersResponse:
        """Rule 2."""
        await self._admit(context, request.cluster, read=True)
        conf = self._reconfig.current
        progress = self._reconfig.progress()
        out = []
        for arbiter in to_protos(conf):
            pr = progress.get(arbiter.id)
            status = pb.ArbiterStatus(arbiter=arbiter, progress_known=pr is not None)
            if pr is not None:
                status.match_index, status.lag = pr.match_index, pr.lag
                status.last_heard_seconds = -1.0 if pr.last_heard is None else pr.last_heard
            out.append(status)
        st = self._reconfig.driver_status()
        return pb.ListArbitersResponse(
            arbiters=out,
            config_index=conf.index,
            leader_id=st.leader_id or "",
            arbiter_id=self._me,
            commit_index=self._reconfig.commit_index(),
        )

    def _not_caught_up(self, replica_id: str) -> tuple[grpc.StatusCode, str] | None:
        """Rule 5: a learner is promoted by hand only once it holds the committed log
        and answers (as etcd's ``member promote``): a voter that is absent or far behind
        would raise the quorum without adding a working replica. Judged on the leader
        (a follower's call fails with NotLeader anyway)."""
        if not self._reconfig.is_leader():
            return None
        progress = self._reconfig.progress().get(replica_id)
        commit = self._reconfig.commit_index()
        within = self._reconfig.election_timeout()
        last = None if progress is None else progress.last_heard
        heard = last is not None and 0 <= last <= within
        if progress is not None and heard and progress.match_index >= commit:
            return None
        detail = (
            "never heard from it"
            if progress is None or not heard
            else f"its log reaches index {progress.match_index}, the commit index is {commit}"
        )
        return (
            grpc.StatusCode.FAILED_PRECONDITION,
            f"learner {replica_id} is not caught up ({detail}): start it with "
            "'membership arbiter --join ...' and wait; it is promoted by itself once caught up",
        )

    async def change(
        self,
        op: str,
        replica_id: str,
        address: str,
        expected: str,
        context: grpc.aio.ServicerContext,
    ) -> pb.ArbiterChangeResponse:
        """Rules 3 and 4 for one change (``add_learner``, ``remove`` or ``promote``)."""
        await self._admit(context, expected)
        try:
            validate_node_id(replica_id)
            if op == "add_learner":
                address = parse_address(address)
        except InvalidArgument as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"arbiter: {e}")
        refusal = _judge(self._reconfig.current, op, replica_id, address)
        if refusal is None and op == "promote":
            refusal = self._not_caught_up(replica_id)
        if refusal is not None:
            await context.abort(refusal[0], f"arbiter {self._me}: {refusal[1]}")
        who = self._authz.identity(context) or f"client {context.peer() or 'unknown'}"
        try:
            conf = await self._reconfig.change(op, replica_id, address, self._timeout)
        except NotLeader as e:
            code = grpc.StatusCode.UNAVAILABLE
            if e.leader_id is not None:
                code = grpc.StatusCode.FAILED_PRECONDITION
            await context.abort(code, f"arbiter {self._me}: {e}")
        except InvalidInput as e:  # the configuration moved since it was judged
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"arbiter {self._me}: {e}")
        except ProposalDropped as e:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"arbiter {self._me}: change not proposed ({e}): another change is pending, "
                "or leadership moved; try again",
            )
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"arbiter {self._me}: the change was not applied in {self._timeout:g}s "
                "(no quorum?); 'admin arbiters list' shows whether it took effect",
            )
        log_config_change(
            self._me,
            f"arbiter configuration change {op} {replica_id}"
            f"{'=' + address if address else ''} by {who}: now index {conf.index}, voters "
            f"{','.join(sorted(conf.voters))}, learners "
            f"{','.join(sorted(conf.learners)) or 'none'}",
            change=op,
            replica=replica_id,
            address=address or None,
            by=who,
            index=conf.index,
            voters=dict(conf.voters),
            learners=dict(conf.learners),
        )
        return pb.ArbiterChangeResponse(arbiters=to_protos(conf), config_index=conf.index)


def _judge(
    conf: ArbiterSet, op: str, replica_id: str, address: str
) -> tuple[grpc.StatusCode, str] | None:
    """Rule 4: the refusal of a change the configuration in force cannot take, or None."""
    role = conf.role(replica_id)
    if op == "add_learner":
        if role is not None:
            return grpc.StatusCode.ALREADY_EXISTS, f"{replica_id} is already a {role}"
        owner = next((rid for rid, a in conf.members.items() if a == address), None)
        if owner is not None:
            return grpc.StatusCode.INVALID_ARGUMENT, f"address {address} is {owner}'s"
        return None
    if role is None:
        return grpc.StatusCode.NOT_FOUND, (
            f"{replica_id} is not in the configuration (voters {', '.join(sorted(conf.voters))})"
        )
    if op == "promote" and role == "voter":
        return grpc.StatusCode.FAILED_PRECONDITION, f"{replica_id} is already a voter"
    if op == "remove" and role == "voter" and len(conf.voters) == 1:
        return grpc.StatusCode.FAILED_PRECONDITION, f"{replica_id} is the last voter"
    return None
