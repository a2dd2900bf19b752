"""How a node's session events are logged (one line each; never silent about an eviction).

Split from :mod:`membership.agent`, which calls :func:`log_session_event`
for every event before it passes it to the application.
"""

from __future__ import annotations

import logging

from membership.session import (
    Evicted,
    Fenced,
    Rejoined,
    SessionEvent,
    StateChanged,
    Superseded,
    eviction_text,
)

__all__ = ["log_session_event"]

log = logging.getLogger("membership.client")


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
