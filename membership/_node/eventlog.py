"""How a node's session events are logged (one line each; never silent about an eviction).

Split from :mod:`membership._node.agent`, which calls :func:`log_session_event`
for every event before it passes it to the application.
"""

from __future__ import annotations

import logging

from membership._node.session import (
    Evicted,
    Fenced,
    Rejoined,
    SessionEvent,
    StateChanged,
    Superseded,
)
from membership.shared.view import MemberState

__all__ = ["eviction_text", "log_session_event"]

log = logging.getLogger("membership.client")


def eviction_text(node_id: str, ev: Evicted) -> str:
    """The node's ERROR line for an eviction: what happened, and what it does now."""
    if ev.state is MemberState.LEFT:
        return (
            f"{node_id} incarnation {ev.incarnation} was removed from the cluster: it is LEFT "
            "without having asked (an administrator removed it, or another process left in "
            "its name); it stops heartbeating and does not rejoin"
        )
    then = "it rejoins at a higher incarnation" if ev.rejoining else "auto_rejoin is off: it stops"
    return (
        f"{node_id} incarnation {ev.incarnation} was declared DEAD by the cluster without "
        f"having asked (a quorum of arbiters stopped hearing it); {then}"
    )


def log_session_event(node_id: str, ev: SessionEvent) -> None:
    """Logs one session event of ``node_id``: INFO, or ERROR for an eviction."""
    if isinstance(ev, StateChanged):
        log.info("%s incarnation %d is %s", node_id, ev.incarnation, ev.state.value)
    elif isinstance(ev, Fenced):
        log.info(
            "%s %s (epoch %d)",
            node_id,
            "fenced" if ev.fenced else "holds a quorum of leases",
            ev.epoch,
        )
    elif isinstance(ev, Superseded):
        # Also in end_reason, ended and on_event: said once, at info.
        log.info(
            "%s: incarnation %d was taken over by incarnation %d (another process "
            "with the same node id?); this client stops heartbeating",
            node_id,
            ev.incarnation,
            ev.by,
        )
    elif isinstance(ev, Evicted):
        # Never silent: the application may still believe it is a member.
        log.error("%s", eviction_text(node_id, ev))
    elif isinstance(ev, Rejoined):
        log.info(
            "%s: incarnation %d is over (%s); rejoining as %d",
            node_id,
            ev.old_incarnation,
            ev.reason,
            ev.new_incarnation,
        )
