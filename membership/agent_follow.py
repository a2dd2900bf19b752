"""The node agent follows the arbiter set its acks carry (membership/arbiterset.py).

A new configuration (a higher ``config_index``) opens a heartbeat link to
each arbiter added, closes the link of each one removed, and hands the
voters to the session, whose lease quorum is then theirs
(membership/session.py rule 9). Split from :mod:`membership.agent`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from membership.arbiterset import ArbiterFollower
from membership.backoff import Backoff
from membership.heartbeats import HeartbeatLink, LinkOwner
from membership.session import NodeSession, SessionEvent
from membership.transport import Channels
from membership.v1 import membership_pb2 as pb

__all__ = ["FollowingAgent", "follow"]


class FollowingAgent(LinkOwner, Protocol):
    """What :func:`follow` changes of the node agent (:class:`membership.agent.NodeAgent`)."""

    node_id: str
    arbiters: list[str]
    follower: ArbiterFollower
    links: dict[str, HeartbeatLink]
    link_tasks: dict[str, asyncio.Task[None]]
    channels: Channels
    backoff: Backoff
    settled: asyncio.Event | None
    session: NodeSession

    def start_link(self, link: HeartbeatLink) -> asyncio.Task[None]:
        """Supervises ``link`` in a task of its own."""
        ...

    def dispatch(self, events: list[SessionEvent]) -> None:
        """Hands the session's events on (callbacks, logs, the fencing state)."""
        ...


log = logging.getLogger("membership.client")


def follow(agent: FollowingAgent, address: str, ack: pb.HeartbeatAck, now: float) -> None:
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
