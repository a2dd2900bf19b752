"""What a replica proposes besides its observations: leaves, removals, grace windows,
configuration changes, and a leader's Bootstrap.

A mixin of :class:`arbiter.core.replica.Replica` (its rules 1, 6 and 7 are the
ones these follow), kept apart by concept and so that the composition stays
within the module size the layering test sets. Sans-I/O: ``now`` and ``wall``
are arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arbiter.core.commands import Bootstrap, Grace, Leave, Remove, encode
from arbiter.core.raft import (
    ConfChange,
    ConfChangeOp,
    InvalidInput,
    ProposalDropped,
    RaftNode,
    Rng,
    Role,
)
from arbiter.core.ranks import RULES

if TYPE_CHECKING:
    from arbiter.core.observer import Observer
    from arbiter.core.replica_settings import ReplicaSettings
    from arbiter.core.tally import MembershipState

__all__ = ["Proposals"]


class Proposals:
    """The proposing half of a replica (see the module docstring)."""

    replica_id: str
    raft: RaftNode
    observer: Observer
    settings: ReplicaSettings
    state: MembershipState
    proposals_dropped: int
    _rng: Rng
    _bootstrap_term: int

    def _bootstrap(self, now: float) -> None:
        """Replica rule 6: a leader proposes an instance id while the applied state has
        none, or its rules version while the state's is lower (the state's instance
        id then), once per term (a second one applied changes nothing)."""
        st = self.raft.status()
        state = self.state
        if st.role is not Role.LEADER or self._bootstrap_term == st.term:
            return
        if state.instance and state.rules >= RULES:
            return
        self._bootstrap_term = st.term
        # 104 random bits from the injected source, as hex (reproducible in the simulator).
        instance = state.instance or "".join(
            f"{int(self._rng.random() * 2**52):013x}" for _ in range(2)
        )
        try:
            self.raft.propose(encode(Bootstrap(instance=instance, rules=RULES)), now)
        except ProposalDropped:
            self.proposals_dropped += 1

    def propose_leave(self, node_id: str, incarnation: int, request_id: str, now: float) -> None:
        """Proposes a graceful leave; the command says whether this replica's
        detector hears the node at ``incarnation`` (tally rule 5: it is joining).

        Raises:
            ProposalDropped: no leader is known.
        """
        heard_by = self.replica_id if self.observer.heard(node_id) == incarnation else ""
        command = Leave(
            node_id=node_id, incarnation=incarnation, request_id=request_id, heard_by=heard_by
        )
        self.raft.propose(encode(command), now)

    def propose_remove(
        self, node_id: str, incarnation: int, by: str, request_id: str, now: float
    ) -> None:
        """Proposes an administrator's removal of a member (tally rule 5a).

        Args:
            node_id: the member.
            incarnation: the incarnation to remove; 0 for the recorded one.
            by: who asked (non-empty).
            request_id: matches the applied outcome to the waiting call.
            now: monotonic seconds.

        Raises:
            ProposalDropped: no leader is known.
        """
        command = Remove(node_id=node_id, incarnation=incarnation, by=by, request_id=request_id)
        self.raft.propose(encode(command), now)

    def propose_grace(
        self,
        node_id: str,
        incarnation: int,
        seconds: float,
        reason: str,
        request_id: str,
        now: float,
        wall: float,
        by: str = "",
    ) -> float:
        """Proposes a node's grace window, or its end (``seconds == 0``; tally rule 13).

        Args:
            node_id: the node.
            incarnation: the incarnation asking.
            seconds: the window asked for, >= 0; capped at ``settings.max_grace``.
            reason: why, in words (``arbiter/core/grace.py`` rule 5).
            request_id: matches the applied outcome to the waiting call.
            now: monotonic seconds.
            wall: this replica's wall clock, Unix seconds (the window's ``until``
                is ``wall`` plus the seconds granted: grace_windows rule 1).
            by: "" when the node asks, else the administrator (grace rule 2).

        Returns:
            The seconds proposed (``seconds`` capped).

        Raises:
            ProposalDropped: no leader is known.
            ValueError: ``seconds`` is not a finite number >= 0, or a bad reason.
        """
        granted = float(min(seconds, self.settings.max_grace))
        command = Grace(
            node_id=node_id,
            incarnation=incarnation,
            seconds=granted,
            until=float(wall) + granted if granted > 0 else 0.0,
            reason=reason,
            request_id=request_id,
            by=by,
        )
        self.raft.propose(encode(command), now)
        return granted

    def propose_config_change(
        self, op: str, replica_id: str, address: str | None, now: float
    ) -> None:
        """Proposes one change of the arbiter group (rule 7; Raft membership rules 1-2).

        Args:
            op: ``"add_learner"`` (needs ``address``), ``"promote"`` or ``"remove"``.
            replica_id: the replica the change is about.
            address: its ``host:port`` for ``add_learner``; ignored otherwise.
            now: monotonic seconds.

        The change is in force on this leader at once (:attr:`configuration`)
        and committed like any entry; the tally follows it once it is applied
        (:attr:`applied_configuration`). Automatic promotion of a caught-up
        learner is ``RaftConfig.auto_promote`` (on by default).

        Raises:
            ProposalDropped: this replica is not the leader, another change
                is not committed yet, or this leader has not committed an
                entry of its term yet; retry later (or at the leader).
            InvalidInput: an unknown ``op``, or a change that does not apply:
                adding an existing id, an address already in use or none,
                promoting a replica that is not a learner, removing an
                unknown id or the last voter.
        """
        try:
            kind = ConfChangeOp(op)
        except ValueError:
            ops = ", ".join(o.value for o in ConfChangeOp)
            raise InvalidInput(f"unknown configuration change {op!r} (one of {ops})") from None
        addr = (address or "") if kind is ConfChangeOp.ADD_LEARNER else ""
        self.raft.propose_conf_change(ConfChange(op=kind, replica_id=replica_id, address=addr), now)
