"""Raft tunables and the injected randomness.

The defaults follow etcd's relation between the two timers (election
timeout = 10 x heartbeat interval) and the rule of thumb in Ongaro &
Ousterhout, "In Search of an Understandable Consensus Algorithm", 2014, §5.6
(broadcast time << election timeout << mean time between failures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

__all__ = ["RaftConfig", "Rng"]


class Rng(Protocol):
    """Any source of uniform floats in [0, 1); ``random.Random`` fits.

    Injected so the core imports no randomness and a simulator can derive
    every replica's stream from one seed.
    """

    def random(self) -> float:
        """Returns a float uniform in [0, 1)."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RaftConfig:
    """Raft timers and switches for one replica.

    Attributes:
        heartbeat_interval: seconds between the leader's heartbeats to each
            follower. Lower detects a dead leader no sooner (that is the
            election timeout) but keeps CheckQuorum and commit propagation
            fresh, at the cost of 2 x (n - 1) messages per interval.
        election_timeout: seconds T. A follower that hears no leader for a
            timeout drawn uniformly from [T, 2T) starts an election (Raft
            §5.2); a leader that has not heard from a quorum for T steps down
            (CheckQuorum, thesis §6.2); a follower that heard from its leader
            less than T ago refuses (pre-)votes (thesis §9.6 and §4.2.3).
            Must exceed 2 x heartbeat_interval so that one lost heartbeat
            does not start an election.
        pre_vote: run the PreVote phase before a real election (thesis §9.6):
            a replica that cannot win does not raise its term, so a healed
            partition does not depose a working leader.
        check_quorum: a leader without a quorum for T steps down, and
            followers in touch with a leader ignore vote requests (thesis
            §6.2 and §4.2.3; etcd's CheckQuorum).
        max_append_entries: the most entries in one APPEND message; bounds
            message size while a lagging follower catches up.
        auto_promote: the leader promotes a learner to voter once it has
            caught up (``arbiter.core.raft.membership`` rule 4); False leaves
            promotion to an explicit ``promote`` change.
    """

    heartbeat_interval: float = 0.1
    election_timeout: float = 1.0
    pre_vote: bool = True
    check_quorum: bool = True
    max_append_entries: int = 64
    auto_promote: bool = True

    def validate(self) -> None:
        """Checks each field and the relation between the timers.

        Raises:
            ValueError: naming the first field that is out of range.
        """
        for name in ("heartbeat_interval", "election_timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.election_timeout <= 2 * self.heartbeat_interval:
            raise ValueError(
                "election_timeout must be > 2 x heartbeat_interval, got "
                f"{self.election_timeout!r} s and {self.heartbeat_interval!r} s"
            )
        if self.max_append_entries < 1:
            raise ValueError(f"max_append_entries must be >= 1, got {self.max_append_entries!r}")
