"""The node-state half of :class:`membership.client.MembershipClient`: where this node stands.

A mixin (split by concept, and so that the client stays within the module size
the layering test sets): the node's state, incarnation, fencing, health,
status reports, its rank and world size in its job, and its grace windows.
Every member here needs a ``node_id`` (a watch-only client raises
InvalidArgument) except the read-only properties, which answer for "no node".

Ranks and the fencing token (``arbiter/core/ranks.py``; README "Ranks"):
:attr:`NodeState.assignment` is the rank assignment of this node's job in the
latest view the client holds, and its ``epoch`` is the fencing token of a
process group of exactly those members and ranks. Re-form the group once per
assignment epoch, and only while :attr:`NodeState.is_member`::

    formed = 0
    async for event in client.watch():
        job = client.assignment
        if job is not None and job.epoch > formed and client.is_member:
            formed = job.epoch
            reform(rank=job.ranks[client.node_id], world_size=job.world_size, token=formed)

Every worker of the job sees the same assignment at the same epoch (each
from its own arbiter), so each re-forms exactly once per change, with the
same ranks, whatever else the cluster does (other jobs' changes do not move
the epoch of this one).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from membership.errors import ClosedError, InvalidArgument, MembershipError
from membership.graces import GraceWindow, ask_grace
from membership.session import EndReason
from membership.view import JobRanks, MemberState, View

if TYPE_CHECKING:
    from membership.agent import NodeAgent
    from membership.config import ClientConfig

__all__ = ["NodeState"]


class NodeState:
    """Where this node stands (see the module docstring)."""

    node_id: str | None
    config: ClientConfig
    error: MembershipError | None
    _agent: NodeAgent | None
    _view: View
    _closed: bool

    def _need_node(self, what: str, open_: bool = False) -> NodeAgent:
        if self._agent is None:
            raise InvalidArgument(f"{what} needs a node_id (this client only watches)")
        if open_ and self._closed:
            raise ClosedError(f"{what} on a closed client")
        return self._agent

    @property
    def interval(self) -> float:
        """Seconds between this node's heartbeats: the longest interval any arbiter
        suggested in its latest ack, ``config.heartbeat_interval`` until one did."""
        return self._agent.interval if self._agent else self.config.heartbeat_interval

    def report(
        self,
        *,
        phase: str | None = None,
        step: int | None = None,
        progress: float | None = None,
        gpu_utilization: float | None = None,
        healthy: bool | None = None,
        reason: str | None = None,
        **gauges: float,
    ) -> None:
        """Sets live status values sent with the next heartbeats (they stay until changed).

        Example: ``client.report(phase="allreduce", step=1200, loss=0.31)``, or
        ``report(healthy=False, reason="ECC errors")``. Never blocks nor delays a heartbeat.

        Args:
            phase: training phase, up to 64 characters.
            step: training step, >= 0 (its rate is compared within the ``job``).
            progress: 0..1.
            gpu_utilization: 0..1 (overrides the NVML probe).
            healthy: ``False`` marks the node DEGRADED (README "Degraded nodes").
            reason: why it is unhealthy (with ``healthy=False``), <= 256 characters.
            **gauges: free-form numeric gauges (finite; at most 32).

        Raises:
            InvalidArgument: a value breaks a bound (nothing is changed then),
                or the client has no node_id (it sends no heartbeats).
            ClosedError: the client is closed.
        """
        values: dict[str, Any] = {"phase": phase, "step": step, "progress": progress, **gauges}
        self._need_node("report()", open_=True).status.report(
            **values, gpu_utilization=gpu_utilization, healthy=healthy, reason=reason
        )

    def clear(self, *names: str) -> None:
        """Unsets reported status values (``phase``, ``step``, ``progress``,
        ``gpu_utilization``, ``healthy`` or gauge names); no names clears everything reported.

        Raises:
            InvalidArgument: a name is not a string, or the client has no node_id.
            ClosedError: the client is closed.
        """
        self._need_node("clear()", open_=True).status.clear(*names)

    @property
    def state(self) -> MemberState:
        """This node's state at its current incarnation (JOINING until admitted)."""
        return self._agent.session.state if self._agent else MemberState.JOINING

    @property
    def incarnation(self) -> int | None:
        """This node's current incarnation (None for a watch-only client)."""
        return self._agent.session.incarnation if self._agent else None

    @property
    def end_reason(self) -> EndReason | None:
        """Why the session ended (left, removed, dead, superseded), None while it runs."""
        return self._agent.session.end_reason if self._agent else None

    @property
    def fenced(self) -> bool:
        """True while the node holds unexpired leases from fewer than a quorum of arbiters."""
        return self._agent.session.fenced(time.monotonic()) if self._agent else True

    @property
    def stream_healthy(self) -> dict[str, bool]:
        """Arbiter address -> whether its heartbeat link had an ack within the ack timeout."""
        return {a: ln.up for a, ln in self._agent.links.items()} if self._agent else {}

    @property
    def healthy(self) -> bool:
        """True while heartbeat streams to at least a quorum of arbiters are up (acked)."""
        return self._agent is not None and self._agent.healthy

    @property
    def is_member(self) -> bool:
        """True only while the node is ALIVE in the view it knows AND holds a quorum of leases.

        This is the "am I a member" answer to act on: it turns False as soon as
        the leases run out (before the cluster can have declared the node DEAD).
        """
        return self.state is MemberState.ALIVE and not self.fenced

    @property
    def fencing_epoch(self) -> int:
        """The latest view epoch seen while holding a quorum of leases (a fencing token)."""
        return self._agent.session.fencing_epoch if self._agent else 0

    @property
    def view(self) -> View:
        """The latest committed view this client has seen (empty before the first)."""
        return self._view

    def reachability(self) -> str:
        """Which arbiters this node's heartbeats reach, and why the others fail, in words.

        Raises:
            InvalidArgument: on a watch-only client.
        """
        return self._need_node("reachability()").reachability()

    async def wait_fenced(self, fenced: bool = True, timeout: float | None = None) -> None:
        """Waits until :attr:`fenced` equals ``fenced``.

        Raises:
            InvalidArgument: on a watch-only client.
            TimeoutError: after ``timeout`` seconds.
        """
        await self._need_node("wait_fenced").wait_fenced(fenced, timeout)

    # --- ranks (arbiter/core/ranks.py) and grace windows (membership/graces.py) -------

    def _me(self) -> tuple[str, int] | None:
        agent = self._agent
        return None if agent is None else (agent.node_id, agent.session.incarnation)

    @property
    def assignment(self) -> JobRanks | None:
        """The rank assignment of this node's job in the latest view this client holds
        (its ``epoch`` is the fencing token); None while the node is not an ALIVE member
        of a job (no ``job`` label, not admitted yet, or the view lags)."""
        me = self._me()
        m = None if me is None else self._view.get(me[0])
        if m is None or me is None or m.incarnation != me[1] or m.rank is None:
            return None
        return self._view.job(m.job)

    @property
    def rank(self) -> int | None:
        """This node's rank in its job (``job`` label) in the latest view, or None."""
        job = self.assignment
        return None if job is None or self.node_id is None else job.ranks.get(self.node_id)

    @property
    def world_size(self) -> int:
        """How many ALIVE members this node's job has in the latest view (0: no rank)."""
        job = self.assignment
        return 0 if job is None else job.world_size

    async def grace(
        self, seconds: float, reason: str = "", timeout: float | None = None
    ) -> GraceWindow:
        """Asks the cluster not to suspect this node for ``seconds`` (a checkpoint...).

        The window is committed through the arbiters' log (a leader change keeps
        it), capped by their ``max_grace`` (300 s by default), and for this
        incarnation only; when the call returns the node holds it from a quorum
        of arbiters (:attr:`GraceWindow.covered`), so pausing for that long
        fences nothing. A node still silent when the window ends is declared
        DEAD one detection time later, as usual. ``grace(0)`` ends the window
        early. Rules: :mod:`membership.graces`.

        Args:
            seconds: the window, >= 0 (0: end it).
            reason: why, in words, at most 128 printable characters (shown in
                ``membership view`` and status events).
            timeout: seconds to wait at most (default ``config.leave_timeout``).

        Returns:
            The window committed and how long it covers the node.

        Raises:
            InvalidArgument: a bad argument, or a watch-only client.
            ClosedError: the client is closed.
            RejectedError: the node is not ALIVE at its incarnation (or its session ended).
            UnavailableError: no arbiter could commit it within ``timeout``.
        """
        agent = self._need_node("grace()", open_=True)
        wait = self.config.leave_timeout if timeout is None else timeout
        return await ask_grace(agent, seconds, reason, wait)

    @property
    def grace_left(self) -> float:
        """Seconds of its latest grace window the node holds from a quorum of arbiters now
        (0.0 without one)."""
        agent = self._agent
        if agent is None:
            return 0.0
        return agent.session.grace(0, time.monotonic())
