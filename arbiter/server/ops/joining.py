"""``membership arbiter --join``: what a new replica learns from the group before it starts.

Rules:

1. A replica started with ``--join ADDR[,ADDR...]`` and an empty data dir
   asks the replicas given (GetView, summary only: any certificate of the
   cluster may, an arbiter's included) for the cluster identity and the
   configuration in force, and takes the answer of the highest
   ``config_index`` (a replica in quorum preferred).
2. It must find itself in that configuration, as a learner (``membership
   admin arbiters add ID=HOST:PORT`` put it there) or already a voter. If
   not, it refuses to start (exit 1) and says exactly which ``admin arbiters
   add`` to run: a replica that is not in the configuration would receive
   nothing, and one that started a group of its own would split it.
3. Its own address in the configuration must be its ``--listen`` (checked
   as for ``--peers``: :func:`arbiter.server.app.check_listen`).
4. It records the group's identity in its data dir (storage rule 5a) and
   starts empty (Raft ``join``): it never campaigns, the leader sends it a
   snapshot and the log, and it votes once promoted (automatically once
   caught up, or ``admin arbiters promote``).
5. A data dir that already holds state needs none of this: the replica
   restarts from its stored configuration (arbiter/server/consensus/stored.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from arbiter.errors import ArbiterError
from arbiter.server.consensus.arbiterset import ArbiterSet
from arbiter.server.consensus.stored import describe
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc

__all__ = ["GroupInfo", "JoinRefused", "ask_group"]

log = logging.getLogger("arbiter.join")


class JoinRefused(ArbiterError, OSError):
    """The group cannot be joined as asked (rule 2), or could not be reached."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupInfo:
    """What a joining replica learned (rule 1).

    Attributes:
        identity: the cluster identity, ``name@digest``.
        arbiters: the configuration in force at the replica that answered.
        answered_by: that replica's id.
    """

    identity: str
    arbiters: ArbiterSet
    answered_by: str


def _info(resp: pb.GetViewResponse) -> GroupInfo:
    return GroupInfo(
        identity=resp.cluster,
        arbiters=ArbiterSet(
            voters={a.id: a.address for a in resp.arbiters if a.voter},
            learners={a.id: a.address for a in resp.arbiters if not a.voter},
            index=resp.config_index,
        ),
        answered_by=resp.arbiter_id,
    )


async def ask_group(
    replica_id: str,
    listen: str,
    addresses: Sequence[str],
    credentials: grpc.ChannelCredentials | None,
    timeout: float = 5.0,
) -> GroupInfo:
    """Rules 1 and 2: asks the replicas at ``addresses``; returns what the best answer says.

    Args:
        replica_id: the joining replica's id.
        listen: its ``--listen`` (named in the refusal's advice).
        addresses: ``--join``'s replicas, ``host:port``.
        credentials: TLS client credentials (this replica's certificate), or None.
        timeout: seconds for each replica to answer.

    Raises:
        JoinRefused: no replica answered, or this replica is not in the configuration.
    """

    async def one(address: str) -> pb.GetViewResponse | str:
        if credentials is None:
            channel = grpc.aio.insecure_channel(address)
        else:
            channel = grpc.aio.secure_channel(address, credentials)
        try:
            stub = pb_grpc.MembershipStub(channel)
            resp: pb.GetViewResponse = await stub.GetView(
                pb.GetViewRequest(summary=True), timeout=timeout
            )
            return resp
        except grpc.aio.AioRpcError as e:
            return f"{address}: {e.code().name} {e.details() or ''}".strip()
        finally:
            await channel.close(grace=None)

    answers = await asyncio.gather(*(one(a) for a in addresses))
    good = [a for a in answers if isinstance(a, pb.GetViewResponse) and a.arbiters]
    if not good:
        why = "; ".join(
            a if isinstance(a, str) else f"{a.arbiter_id}: no arbiter set" for a in answers
        )
        raise JoinRefused(f"--join: no replica of the group answered ({why})")
    best = max(good, key=lambda r: (r.config_index, r.in_quorum))
    info = _info(best)
    role = info.arbiters.role(replica_id)
    if role is None:
        raise JoinRefused(
            f"arbiter {replica_id} is not in the group's configuration (voters "
            f"{describe(info.arbiters.voters)}; learners "
            f"{describe(info.arbiters.learners) or 'none'}, at log index {info.arbiters.index}): "
            f"add it first with 'membership admin arbiters add {replica_id}={listen} "
            f"--arbiters {','.join(addresses)}', then start it again"
        )
    log.info(
        "arbiter %s: joining cluster %s as a %s (configuration at log index %d from %s: voters %s)",
        replica_id,
        info.identity,
        role,
        info.arbiters.index,
        info.answered_by,
        describe(info.arbiters.voters),
    )
    return info
