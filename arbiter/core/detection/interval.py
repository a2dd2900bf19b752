"""The heartbeat interval a replica suggests to nodes: load kept within a budget.

Sans-I/O and pure. Every node heartbeats every replica, so a replica tracking
``N`` nodes at interval ``H`` handles ``N / H`` heartbeats per second. Given a
per-replica budget ``B`` (heartbeats per second), the replica suggests

    H(N) = min(H_max, H0 * 1.25**k), for the smallest integer k >= 0 with
           H0 * 1.25**k >= N / B

that is: the configured interval ``H0`` while ``N <= B * H0``, then the next
step of a geometric ladder (25 % steps, so the suggestion does not move with
every node that joins or leaves) that brings the load back under the budget,
capped at ``H_max`` (beyond which the budget is exceeded rather than
detection slowed further). The detection time scales with it: a replica
suspects a node after ``missed_heartbeats * H(N)`` seconds of silence, and
the lease it grants scales the same way.

At the defaults (H0 = 0.15 s, B = 5000/s, 5 missed, H_max = 0.6 s):

    ======== ========== =================== ==========
    nodes    H(N) (s)   load per replica    D (s)
    ======== ========== =================== ==========
    <= 750   0.15       <= 5,000/s          0.75
    1,000    0.234      4,267/s             1.17
    2,000    0.458      4,369/s             2.29
    3,000    0.6 (cap)  5,000/s             3.0
    5,000    0.6 (cap)  8,333/s (over)      3.0
    10,000   0.6 (cap)  16,667/s (over)     3.0
    ======== ========== =================== ==========

H_max is bounded by the replicas' restart grace: a lease granted at H_max
(``missed_heartbeats * H_max``) must be honoured by a replica that restarts
(``arbiter/core/observer.py``, rule 5), so raising H_max means raising the grace.
"""

from __future__ import annotations

import math

__all__ = ["STEP", "suggest_interval"]

STEP = 1.25
"""Ratio between two consecutive suggested intervals."""


def suggest_interval(nodes: int, *, base: float, budget: float, maximum: float) -> float:
    """The heartbeat interval to suggest with ``nodes`` tracked nodes (see the module docstring).

    Args:
        nodes: nodes this replica tracks (>= 0).
        base: the configured interval H0, seconds (> 0).
        budget: heartbeats per second this replica should handle at most
            (> 0; ``math.inf`` always suggests ``base``).
        maximum: the longest interval ever suggested, seconds (>= base).

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
    needed = nodes / budget
    if needed <= base:
        return base
    k = math.ceil(math.log(needed / base, STEP) - 1e-9)
    return min(maximum, base * STEP**k)
