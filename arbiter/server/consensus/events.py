"""The replica's decision log lines, as structured events
(:func:`membership.shared.logfmt.log_event`).

One line per membership decision and per election, so that ``--log-format
json`` gives a machine-readable record of what the replica decided and why:

* ``membership_change``: a member entered a state at an epoch (``epoch``,
  ``node``, ``incarnation``, ``state``), with the ``evidence`` of the quorum
  that suspected it for DEAD (one ``{"arbiter", "silence_seconds",
  "suspicion", "detector"}`` per suspecting replica, as ``membership watch
  --json`` prints it) and ``removed_by`` for a LEFT an administrator asked
  for. Logged by every replica when it applies the change (not while it
  replays its log after a restart).
* ``raft_role``: this replica's Raft standing changed: a new term, leader or
  role (an election), or in_quorum (``term``, ``leader``, ``role``,
  ``previous_role``, ``in_quorum``).
* ``config_change``: the arbiter group's configuration changed
  (:func:`log_config_change`, for the online reconfiguration).
"""

from __future__ import annotations

import logging
from typing import Any

from arbiter.core.tally import ViewChange
from membership.shared.logfmt import log_event
from membership.shared.view import Evidence, MemberState, evidence_json

__all__ = ["RaftStanding", "log_config_change", "log_raft_standing", "log_view_change"]

log = logging.getLogger("arbiter.events")

# (in_quorum, leader, term, role): what a raft_role line reports.
RaftStanding = tuple[bool, str | None, int, str]


def _evidence_text(e: Evidence) -> str:
    if e.silence is None:
        return e.arbiter_id
    return f"{e.arbiter_id} after {e.silence:.2f}s silent"


def log_view_change(replica_id: str, change: ViewChange) -> int:
    """Logs one ``membership_change`` line per member of ``change`` and one ``ranks_change``
    line per job it re-ranked; returns the deaths in it.

    A forgotten tombstone (``forgotten``) is logged with that field and is no death.
    """
    deaths = 0
    for c in change.changes:
        fields: dict[str, Any] = {
            "arbiter": replica_id,
            "epoch": change.epoch,
            "node": c.node_id,
            "incarnation": c.incarnation,
            "state": c.state.value,
        }
        what = f"epoch {change.epoch}: {c.node_id} incarnation {c.incarnation} is {c.state.value}"
        if c.forgotten:  # a tombstone's retention passed (arbiter/core/retention.py)
            fields["forgotten"] = True
            log_event(log, "membership_change", what + ", forgotten (bounded history)", **fields)
            continue
        if c.state is MemberState.DEAD:
            deaths += 1
            fields["evidence"] = [evidence_json(e) for e in c.evidence]
            if c.evidence:
                what += " (suspected by " + ", ".join(_evidence_text(e) for e in c.evidence) + ")"
        if c.removed_by:
            fields["removed_by"] = c.removed_by
            what += f" (removed by {c.removed_by})"
        log_event(log, "membership_change", what, **fields)
    for j in change.ranks:  # one line per job re-ranked (arbiter/core/ranks.py), not per member
        log_event(
            log,
            "ranks_change",
            f"epoch {change.epoch}: job {j.job} has {j.world_size} ranked member(s)",
            arbiter=replica_id,
            epoch=change.epoch,
            job=j.job,
            world_size=j.world_size,
        )
    return deaths


def log_raft_standing(
    replica_id: str, standing: RaftStanding, previous: RaftStanding | None
) -> None:
    """Logs a ``raft_role`` line: this replica's new quorum, leader, term and role."""
    in_quorum, leader, term, role = standing
    log_event(
        log,
        "raft_role",
        f"{replica_id}: in_quorum={in_quorum} leader={leader} term={term} role={role}",
        arbiter=replica_id,
        term=term,
        leader=leader,
        role=role,
        previous_role=None if previous is None else previous[3],
        in_quorum=in_quorum,
    )


def log_config_change(
    replica_id: str, message: str, level: int = logging.WARNING, **fields: Any
) -> None:
    """Logs a ``config_change`` line (the online reconfiguration's changes).

    Args:
        replica_id: the replica logging it.
        message: what changed, in words (``"a4 added as a learner"``).
        level: the line's level: WARNING for the change an administrator made
            (on the leader), INFO for every replica's new configuration in force.
        fields: the change's details (``change="add_learner"``, ``arbiter="a4"``,
            ``index=812``, ``voters=[...]``, ``learners=[...]``).
    """
    log_event(log, "config_change", message, level=level, arbiter=replica_id, **fields)
