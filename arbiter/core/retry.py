"""When a replica proposes an uncommitted observation again: a retransmission timer.

Sans-I/O: durations are arguments (seconds); nothing here reads a clock.

Why: an observation is proposed again until the committed state holds it
(observer rule 2), because a proposal can be lost (a follower forwards it to
a leader that is deposed, a message is dropped). With a fixed retry time, a
replica whose commits take longer than that time (its loop starved of CPU,
its fsyncs slow, a join storm in the log) proposed every pending observation
again before the first proposal could commit: entries of hundreds of
duplicate observations every half second, each one more to replicate, write
and apply, which slowed the commits further (measured: 3,000 nodes joining
on two shared cores, one replica proposing the same 250 SUSPECT and 350 ALIVE
observations again every 0.5 to 1 s, about a thousand entries in a minute).
A retry that comes faster as the system gets slower is a positive feedback
loop; TCP met the same problem and solved it with an adaptive timer.

Rules (the retransmission timer of RFC 6298, "Computing TCP's
Retransmission Timer", applied to proposals; Karn and Partridge, "Improving
Round-Trip Time Estimates in Reliable Transport Protocols", SIGCOMM 1987):

1. Samples. The time from proposing an observation to seeing it committed
   is a sample of the commit time, taken only for observations proposed
   once (Karn's rule: a retried one cannot tell which proposal committed).
2. Estimate. The first sample ``R`` sets ``srtt = R`` and ``rttvar = R / 2``;
   later ones ``rttvar = 3/4 rttvar + 1/4 |srtt - R|`` and ``srtt = 7/8 srtt
   + 1/8 R`` (RFC 6298 section 2).
3. Timeout. ``max(floor, srtt + 4 rttvar)`` times the backoff, at most
   ``ceiling``: the configured retry time while commits are fast (a
   commit in tens of milliseconds leaves the floor in force), longer while
   they are slow.
4. Backoff. Each time retries go out, the backoff doubles (RFC 6298 section
   5.5), up to ``ceiling``; the next sample resets it to 1, and so does a
   new leader or a proposal dropped for want of one (the replica calls
   :meth:`RetryTimer.reset`): those say nothing of how slow commits are, and
   what went to a deposed leader must go again soon. A retry of what was
   last proposed before the newest leader (the observer counts leader eras)
   is such a re-send: it does not double the backoff.

Cost: an observation whose proposal really was lost is proposed again up to
``ceiling`` seconds later instead of ``floor``. A SUSPECT of a node whose
proposal was lost in a leader change is delayed by that much; a replica that
stays leader never loses its own proposals, and the others' proposals are
lost only with a leader change or a dropped message.
"""

from __future__ import annotations

import math

__all__ = ["RetryTimer"]


class RetryTimer:
    """The seconds after which an uncommitted proposal is proposed again (rules 1 to 4).

    Args:
        floor: the shortest timeout (seconds, > 0): the configured retry time.
        ceiling: the longest (seconds, >= ``floor``).

    Raises:
        ValueError: ``floor`` is not > 0 or ``ceiling`` is below it (or either is
            not finite).
    """

    __slots__ = ("_backoff", "_rttvar", "_srtt", "ceiling", "floor")

    def __init__(self, floor: float, ceiling: float) -> None:
        if not (math.isfinite(floor) and math.isfinite(ceiling) and 0 < floor <= ceiling):
            raise ValueError(f"need 0 < floor <= ceiling, both finite; got {floor!r}, {ceiling!r}")
        self.floor = floor
        self.ceiling = ceiling
        self._srtt: float | None = None
        self._rttvar = 0.0
        self._backoff = 1.0

    @property
    def timeout(self) -> float:
        """The current timeout, seconds (rule 3)."""
        base = self.floor if self._srtt is None else max(self.floor, self._srtt + 4 * self._rttvar)
        return min(self.ceiling, base * self._backoff)

    @property
    def estimate(self) -> tuple[float, float] | None:
        """(srtt, rttvar) in seconds, or None before the first sample."""
        return None if self._srtt is None else (self._srtt, self._rttvar)

    def sample(self, seconds: float) -> None:
        """Takes one commit time of an observation proposed once (rules 1, 2); resets
        the backoff (rule 4). A negative or non-finite value is ignored."""
        if not (math.isfinite(seconds) and seconds >= 0):
            return
        if self._srtt is None:
            self._srtt, self._rttvar = seconds, seconds / 2
        else:
            self._rttvar = 0.75 * self._rttvar + 0.25 * abs(self._srtt - seconds)
            self._srtt = 0.875 * self._srtt + 0.125 * seconds
        self._backoff = 1.0

    def retried(self) -> None:
        """Retries went out: the backoff doubles (rule 4), up to what reaches ``ceiling``."""
        if self.timeout < self.ceiling:
            self._backoff *= 2

    def reset(self) -> None:
        """Ends the backoff (rule 4: a new leader, or no leader to propose to)."""
        self._backoff = 1.0
