"""The heartbeat interval a replica suggests to nodes: load kept within a budget.

Sans-I/O and pure (the measured load is an argument; the measuring is
``arbiter/server/load/monitor.py``). Every node heartbeats every replica, so a
replica tracking ``N`` nodes at interval ``H`` handles ``N / H`` heartbeats
per second.

Rules:

1. Ladder. Every interval suggested is a step of geometric ladders with ratio
   ``STEP`` (1.25), so the suggestion does not move with every node that
   joins or leaves, nor with every wobble of the load.
2. Count (the prior). Given a per-replica budget ``B`` (heartbeats per
   second), the count rule suggests ``H(N) = min(cap(N), H0 * 1.25**k)``,
   for the smallest integer ``k >= 0`` with ``H0 * 1.25**k >= N / B``: the
   configured interval ``H0`` while ``N <= B * H0``, then the next step that
   brings the load back under the budget (:func:`suggest_interval`).
3. Cap that grows. ``cap(N) = H_max * 1.25**j`` for the smallest ``j >= 0``
   with ``cap(N) >= N / B`` (:func:`interval_cap`): ``H_max`` (0.6 s) up to
   ``B * H_max`` nodes (3,000), then rising with N so that the budget still
   holds at the cap. Detection time is what grows instead of the load.
4. Load. The replica's measured utilisation ``u`` (the fraction of the time
   its event loop was busy, 0 to 1: :mod:`arbiter.server.load.monitor`) moves the
   suggestion off the count rule by whole steps (:class:`IntervalGovernor`):
   above ``high`` it goes up at once by enough steps to bring ``u`` back to
   ``target`` (assuming load proportional to 1 / H), never below the count
   rule's interval; below ``low`` for ``down_after`` seconds it comes back
   down one step, and may go up to ``down_steps`` steps below the count rule
   when the replica has room (the budget is a prior, the measurement decides).
   Hysteresis: ``low * STEP < high``, so one step down cannot by itself push
   ``u`` over ``high``; a step up waits ``up_after`` seconds after the last
   change (nodes adopt a new interval at their next ack, and the measurement
   window must see it) so the suggestion does not oscillate.
5. Load cap. The load rule never goes past ``load_cap(N)`` (the cap of rule
   3 computed at ``B / STEP**2``, 56 % more): ``H_max`` up to 1,920 nodes.
   The longest interval a replica ever suggests or accepts (the *ceiling*)
   is ``load_cap(max_nodes)``: no replica tracks more than ``max_nodes``.
6. Leases. The lease granted scales with the node's interval (``lease_for``):
   the longest is the lease at the ceiling, and the replicas' restart grace
   is derived to cover it (``ArbiterConfig.grace``; observer rule 5): a
   lease granted before a crash is still honoured after it, at any N.

At the defaults (H0 = 0.15 s, B = 5000/s, 5 missed, H_max = 0.6 s):

    ======== ========== ========= ============ =============== =========
    nodes    H(N) (s)   D (s)     per replica  load cap (s)    D at cap
    ======== ========== ========= ============ =============== =========
    <= 750   0.15       0.75      <= 5,000/s   0.6             3.0
    1,000    0.234      1.17      4,267/s      0.6             3.0
    2,000    0.458      2.29      4,369/s      0.75            3.75
    3,000    0.6        3.0       5,000/s      0.94            4.69
    5,000    1.118      5.59      4,474/s      1.83            9.16
    10,000   2.18       10.9      4,581/s      3.58            17.9
    30,000   6.66       33.3      4,504/s      10.9            54.6
    100,000  20.3       102       4,919/s      33.3            167
    ======== ========== ========= ============ =============== =========

The table scales with the budget: a replica given ``K`` ingest cores and
``B = K * 5000`` serves ``K`` times the nodes at the same interval. D at
10,000 nodes and 1 s intervals (5 s) needs ``B = 10,000/s``; 100,000 nodes
at 2 s need ``B = 50,000/s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "STEP",
    "IntervalGovernor",
    "LoadPolicy",
    "interval_cap",
    "load_cap",
    "suggest_interval",
]

STEP = 1.25
"""Ratio between two consecutive suggested intervals."""

_EPS = 1e-9


def _steps_to(ratio: float) -> int:
    """The smallest integer k >= 0 with STEP**k >= ratio (0 when ratio <= 1)."""
    if ratio <= 1.0:
        return 0
    if not math.isfinite(ratio):
        return 64
    return max(0, math.ceil(math.log(ratio, STEP) - _EPS))


def interval_cap(nodes: int, *, budget: float, maximum: float, headroom: float = 1.0) -> float:
    """The longest interval suggested with ``nodes`` tracked nodes (rule 3), seconds.

    Args:
        nodes: nodes tracked (>= 0).
        budget: heartbeats per second a replica should handle (> 0; inf: ``maximum``).
        maximum: H_max, the cap of small clusters, seconds (> 0).
        headroom: the cap is computed for a budget ``budget / headroom`` (>= 1):
            :func:`load_cap` passes ``STEP**2``.

    Returns:
        ``maximum * STEP**j`` for the smallest ``j >= 0`` with
        ``maximum * STEP**j >= headroom * nodes / budget``.

    Raises:
        ValueError: a negative node count, budget or maximum not > 0, headroom < 1.
    """
    if nodes < 0 or not (budget > 0 and maximum > 0 and headroom >= 1):
        raise ValueError(
            f"need nodes >= 0, budget > 0, maximum > 0, headroom >= 1; "
            f"got {nodes}, {budget}, {maximum}, {headroom}"
        )
    return maximum * STEP ** _steps_to(headroom * nodes / budget / maximum)


def load_cap(nodes: int, *, budget: float, maximum: float) -> float:
    """The longest interval the load rule may suggest with ``nodes`` nodes (rule 5), seconds."""
    return interval_cap(nodes, budget=budget, maximum=maximum, headroom=STEP**2)


def suggest_interval(nodes: int, *, base: float, budget: float, maximum: float) -> float:
    """The count rule's interval with ``nodes`` tracked nodes (rule 2; no load), seconds.

    Args:
        nodes: nodes this replica tracks (>= 0).
        base: the configured interval H0, seconds (> 0).
        budget: heartbeats per second this replica should handle at most
            (> 0; ``math.inf`` always suggests ``base``).
        maximum: the cap, seconds (>= base); pass :func:`interval_cap` for
            the growing cap of rule 3.

    Returns:
        Seconds, in ``[base, maximum]``.

    Raises:
        ValueError: a negative node count, base or budget not > 0, or
            maximum < base.
    """
    if nodes < 0:
        raise ValueError(f"nodes must be >= 0, got {nodes}")
    if not (base > 0 and budget > 0 and maximum >= base):
        raise ValueError(
            f"need base > 0, budget > 0 and maximum >= base; got {base}, {budget}, {maximum}"
        )
    return min(maximum, base * STEP ** _steps_to(nodes / budget / base))


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadPolicy:
    """How the measured utilisation moves the interval (rule 4).

    Attributes:
        target: utilisation (0 to 1) a step up aims at.
        high: above it, the interval goes up (> target).
        low: below it for ``down_after`` seconds, one step down
            (``low * STEP < high``: the hysteresis band).
        up_after: seconds after a change before the next step up.
        down_after: seconds below ``low`` before one step down.
        down_steps: how many steps below the count rule the load rule may go.

    Raises:
        ValueError: from :meth:`validate`, naming the relation broken.
    """

    target: float = 0.6
    high: float = 0.75
    low: float = 0.4
    up_after: float = 2.0
    down_after: float = 10.0
    down_steps: int = 3

    def validate(self) -> LoadPolicy:
        """Checks ``0 < low < target < high <= 1``, ``low * STEP < high``, times > 0.

        Returns:
            self.

        Raises:
            ValueError: naming the relation broken.
        """
        if not 0 < self.low < self.target < self.high <= 1:
            raise ValueError(
                f"need 0 < low < target < high <= 1, got {self.low}, {self.target}, {self.high}"
            )
        if not self.low * STEP < self.high:
            raise ValueError(
                f"need low x {STEP} < high (hysteresis: one step down must not cross high), "
                f"got low {self.low}, high {self.high}"
            )
        if not (self.up_after > 0 and self.down_after > 0 and self.down_steps >= 0):
            raise ValueError("need up_after > 0, down_after > 0, down_steps >= 0")
        return self


class IntervalGovernor:
    """The suggested interval: the count rule moved by the measured load (rules 2 to 5).

    Sans-I/O: the utilisation and ``now`` are arguments of :meth:`observe`;
    :meth:`suggest` is cheap and pure (called for every ack).

    Args:
        base: H0, seconds (> 0).
        budget: heartbeats per second per replica (> 0; inf: always ``base``).
        maximum: H_max, the cap of small clusters (>= base).
        ceiling: the longest interval ever suggested, seconds (>= maximum;
            ``load_cap(max_nodes)``, rule 5).
        policy: the load rule's thresholds.

    Raises:
        ValueError: bad arguments (see :meth:`LoadPolicy.validate`).
    """

    def __init__(
        self,
        *,
        base: float,
        budget: float,
        maximum: float,
        ceiling: float,
        policy: LoadPolicy | None = None,
    ) -> None:
        if not (base > 0 and budget > 0 and maximum >= base and ceiling >= maximum):
            raise ValueError(
                f"need base > 0, budget > 0, base <= maximum <= ceiling; "
                f"got {base}, {budget}, {maximum}, {ceiling}"
            )
        self.base, self.budget, self.maximum, self.ceiling = base, budget, maximum, ceiling
        self.policy = (policy or LoadPolicy()).validate()
        self.steps = 0  # the load rule's steps off the count rule (negative: faster)
        self.utilisation = 0.0  # the latest observed
        self._changed_at = -math.inf
        self._low_since: float | None = None
        self._cached = (-1, 0, base)  # (nodes, steps, suggestion): one per ack, mostly the same

    def nominal(self, nodes: int) -> float:
        """The count rule's interval (rule 2 with the cap of rule 3), seconds."""
        if math.isinf(self.budget):
            return self.base
        cap = min(self.ceiling, interval_cap(nodes, budget=self.budget, maximum=self.maximum))
        return suggest_interval(nodes, base=self.base, budget=self.budget, maximum=cap)

    def limit(self, nodes: int) -> float:
        """The longest interval the load rule may reach with ``nodes`` nodes (rule 5), seconds."""
        if math.isinf(self.budget):
            return self.base
        return min(self.ceiling, load_cap(nodes, budget=self.budget, maximum=self.maximum))

    def suggest(self, nodes: int) -> float:
        """The interval to suggest in acks now, seconds, in ``[base, limit(nodes)]``
        (cached: the same node count and steps cost a tuple compare)."""
        n, k, h = self._cached
        if n == nodes and k == self.steps:
            return h
        h = min(self.limit(nodes), max(self.base, self.nominal(nodes) * STEP**self.steps))
        self._cached = (nodes, self.steps, h)
        return h

    def observe(self, utilisation: float, nodes: int, now: float) -> bool:
        """Takes one load measurement (rule 4).

        Args:
            utilisation: the fraction of the recent past the replica was busy
                (>= 0; values above 1 are taken as 1).
            nodes: nodes tracked now.
            now: monotonic seconds.

        Returns:
            True when the suggestion moved.

        Raises:
            ValueError: ``utilisation`` is negative or NaN.
        """
        if not utilisation >= 0:
            raise ValueError(f"utilisation must be >= 0, got {utilisation!r}")
        u = self.utilisation = min(1.0, utilisation)
        p = self.policy
        before = self.suggest(nodes)
        lo, hi = self._bounds(nodes)
        steps = min(hi, max(lo, self.steps))
        if u > p.high:
            self._low_since = None
            if now - self._changed_at >= p.up_after:
                # At once by enough steps (load ~ 1 / H), never below the count rule.
                steps = min(hi, max(steps, 0) + max(1, _steps_to(u / p.target)))
        elif u < p.low:
            if self._low_since is None:
                self._low_since = now
            elif now - self._low_since >= p.down_after and now - self._changed_at >= p.down_after:
                steps = max(lo, steps - 1)
                self._low_since = now
        else:
            self._low_since = None
        if steps != self.steps:
            self.steps = steps
        after = self.suggest(nodes)
        if after != before:
            self._changed_at = now
            return True
        return False

    def _bounds(self, nodes: int) -> tuple[int, int]:
        """The range of :attr:`steps` that still changes the suggestion with ``nodes`` nodes."""
        nominal = self.nominal(nodes)
        down = -min(self.policy.down_steps, _steps_to(nominal / self.base))
        up = _steps_to(self.limit(nodes) / nominal)
        return down, up
