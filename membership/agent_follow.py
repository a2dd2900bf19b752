"""The node agent follows the arbiter set its acks carry (membership/arbiterset.py).

A new configuration (a higher ``config_index``) opens a heartbeat link to
each arbiter added, closes the link of each one removed, and hands the
voters to the session, whose lease quorum is then theirs
(membership/session.py rule 9). Split from :mod:`membership.agent`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from membership.heartbeats import HeartbeatLink
from membership.v1 import membership_pb2 as pb

if TYPE_CHECKING:
    from membership.agent import NodeAgent

__all__ = ["follow"]

log = logging.getLogger("membership.client")


def follow(agent: NodeAgent, address: str, ack: pb.HeartbeatAck, now: float) -> None:
    """Takes the arbiter set of one ack from ``address``; acts on a newer one."""
    agent.follower.heard(address, ack.arbiter_id)
    plan = agent.follower.offer(
        ((a.id, a.address, a.voter) for a in ack.arbiters), ack.config_index
    )
    if plan is None:
        return
    log.info(
        "%s follows the arbiter configuration at log index %d: voters %s; learners %s",
        agent.node_id,
        plan.index,
        ",".join(plan.voters),
        ",".join(plan.learners) or "none",
    )
    for addr in plan.close:
        agent.links.pop(addr, None)
        task = agent.link_tasks.pop(addr, None)
        if task is not None:
            task.cancel()
    for addr in plan.open:
        link = HeartbeatLink(addr, owner=agent, channels=agent.channels, backoff=agent.backoff)
        agent.links[addr] = link
        if agent.settled is not None:
            agent.start_link(link)
    agent.arbiters = list(agent.links)
    agent.dispatch(agent.session.configure(plan.voters, plan.learners, plan.index, now))
