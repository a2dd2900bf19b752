"""How a node's session events are logged (one line each; never silent about an eviction).

Split from :mod:`membership._node.agent`, which calls :func:`log_session_event`
for every event before it passes it to the application, and asks its
:class:`LeaseLog` after every ack and fence tick whether the leases it holds
changed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from membership._node.session import (
    Evicted,
    Fenced,
    Rejoined,
    SessionEvent,
    StateChanged,
    Superseded,
)
from membership.shared.view import MemberState

__all__ = ["LeaseLog", "eviction_text", "log_session_event"]

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


class LeaseLog:
    """Logs, at INFO and only when it changed, which voters' leases a node holds:
    ``n1 holds leases from 2 of 3 arbiters (a1, a2; a quorum is 2)``. A node that
    holds only a quorum is fenced when one of those arbiters goes.

    Args:
        node_id: the node's id.
        voters: how many arbiters' leases count at the start (none is held yet: the
            first line comes with the first lease).
    """

    def __init__(self, node_id: str, voters: int) -> None:
        self.node_id = node_id
        self._last: tuple[tuple[str, ...], int] = ((), voters)

    def note(self, held: Sequence[str], voters: int, quorum: int, names: Mapping[str, str]) -> bool:
        """Takes the session's :meth:`~membership.session.NodeSession.holders` now.

        Args:
            held: the voters whose leases the node holds (addresses, sorted).
            voters: how many arbiters' leases count.
            quorum: how many the node must hold not to be fenced.
            names: address -> arbiter id, for those known (others go by address).

        Returns:
            True when the holders or the number of voters changed (a line was logged).
        """
        current = (tuple(held), voters)
        if current == self._last:
            return False
        self._last = current
        ids = ", ".join(sorted(names.get(a, a) for a in held))
        log.info(
            "%s holds leases from %d of %d arbiters (%sa quorum is %d)",
            self.node_id,
            len(held),
            voters,
            f"{ids}; " if ids else "",
            quorum,
        )
        return True
