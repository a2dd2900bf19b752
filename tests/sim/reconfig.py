"""The operator of the simulated group: membership changes, proposed as an admin would.

An operation is a list of steps (add, promote, remove, wipe), run one after
the other through the leader in quorum, as ``membership admin arbiters``
does through the Admin service (Raft single-server changes with learners:
``arbiter/core/raft/membership.py``).

Rules:

1. ``add R``: starts replica R with an empty disk (``join=True``) and
   proposes ``add_learner`` at the leader; the step is done once a committed
   configuration has R. The leader promotes R itself once it has caught up
   (``RaftConfig.auto_promote``); the step that follows an add waits until a
   committed configuration has R as a voter, and proposes ``promote`` by
   hand after ``PROMOTE_AFTER`` seconds without one (automatic promotion
   needs a quorum that answers, which faults may deny).
2. ``remove R``: proposes ``remove`` at the leader; done once a committed
   configuration no longer has R, which the operator then retires (stops
   for good, as the shell stops a removed replica).
3. ``wipe R``: R's machine is gone (killed, disk lost), before its
   replacement is added (the replacement test of the issue).
4. A proposal the leader drops (no leader, a change pending, the leader's
   no-op not committed) is retried every ``RETRY`` seconds; one refused as
   invalid because the leader's log already has it waits for its commit;
   one refused otherwise skips the step (the fault schedule raced it).
   Operations queue: one runs at a time.
5. Only committed configurations count (``Checker.conf``): what an admin
   sees in ``arbiters list`` after the change returns.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from arbiter.core.raft import InvalidInput, ProposalDropped

if TYPE_CHECKING:
    from tests.sim.world import World

__all__ = ["Operator"]

RETRY = 0.25
PROMOTE_AFTER = 6.0


class Operator:
    """Runs membership operations on a world, one at a time (module rules)."""

    def __init__(self, world: World) -> None:
        self.w = world
        self.queue: deque[deque[tuple[str, str]]] = deque()
        self.current: deque[tuple[str, str]] | None = None
        self.done: list[str] = []
        self._since = 0.0
        self._armed = False

    @property
    def busy(self) -> bool:
        """True while an operation runs or waits."""
        return self.current is not None or bool(self.queue)

    def submit(self, steps: list[tuple[str, str]]) -> None:
        """Queues one operation (its steps run in order, rule 4)."""
        self.w.trace("operator: " + ", ".join(f"{op} {rid}" for op, rid in steps))
        self.queue.append(deque(steps))
        if not self._armed:
            self._armed = True
            self.w.q.at(self.w.q.now, self._tick)

    def _tick(self) -> None:
        w = self.w
        self._armed = False
        while True:
            if self.current is None:
                if not self.queue:
                    return
                self.current = self.queue.popleft()
                self._since = w.q.now
            op, rid = self.current[0]
            if not self._step(op, rid):
                break
            self.done.append(f"{op} {rid}")
            self.current.popleft()
            self._since = w.q.now
            if not self.current:
                self.current = None
        self._armed = True
        w.q.at(w.q.now + RETRY, self._tick)

    def _step(self, op: str, rid: str) -> bool:
        """Works on one step; True once it is done (rules 1 to 3)."""
        w = self.w
        conf = w.checker.conf
        if op == "wipe":
            w.wipe_replica(rid)
            return True
        if op == "add":
            if rid in conf:
                return True
            if rid not in w.replicas:
                w.add_replica(rid)
            return self._propose("add_learner", rid)
        if op == "voter":
            if conf.is_voter(rid) or rid not in conf:
                return True
            return w.q.now - self._since >= PROMOTE_AFTER and self._propose("promote", rid)
        if op == "remove":
            if rid not in conf:
                w.retire_replica(rid)
                return True
            return self._propose("remove", rid)
        raise ValueError(f"unknown operator step {op!r}")

    def _propose(self, op: str, rid: str) -> bool:
        """Proposes at the leader in quorum; True if the step must be skipped (rule 4)."""
        w = self.w
        lead = w.leader()
        if lead is None or lead.core is None:
            return False
        try:
            lead.core.propose_config_change(op, rid, w.addresses.get(rid), w.q.now)
        except ProposalDropped:
            return False
        except InvalidInput as e:
            conf = lead.core.configuration
            pending = {
                "add_learner": rid in conf,
                "promote": conf.is_voter(rid),
                "remove": rid not in conf,
            }[op]
            if pending:  # in the leader's log, not committed yet: wait for it
                return False
            w.trace(f"operator: {op} {rid} refused: {e}")
            return True
        w.trace(f"operator: {op} {rid} proposed at {lead.id}")
        lead._after_input()  # the Ready loop, as after any input
        return False
