"""Failure detection on one replica: per-node detectors, their timing wheel, the interval.

Sans-I/O like the rest of :mod:`arbiter.core`: ``now`` is an argument.

* ``base.py``: ``FailureDetector``, the interface the observer uses, and
  ``DeadlineDetector``, the machinery both detectors share (per-node
  tracks, one deadline each in the wheel; rules 1 to 6).
* ``missed.py``: ``MissedHeartbeatDetector``, which suspects after a fixed
  number of silent intervals.
* ``phi.py``: ``PhiAccrualDetector``, phi accrual (Hayashibara et al. 2004,
  as in Akka), which suspects when a silence this long becomes unlikely.
* ``wheel.py``: ``TimingWheel``, a hashed timing wheel (Varghese and Lauck
  1987). A heartbeat costs O(1) and a tick O(expired), not O(nodes).
* ``interval.py``: ``IntervalGovernor``, the heartbeat interval the replica
  suggests in its acks: a budget per node count, a cap that grows with it,
  moved by the replica's measured load (``suggest_interval`` is the count rule).

Data flow: a heartbeat reaches ``FailureDetector.heartbeat`` through
``arbiter/core/observer.py`` (``Observer.heartbeat``). It moves the node's
deadline in the wheel, and ``hold`` pushes the deadline to the end of the
lease granted. On every turn, ``Observer.tick`` calls
``FailureDetector.tick(now)``, which expires the wheel's due entries and
returns the nodes that turned SUSPECT, once each. The observer turns each
into a SUSPECT observation for the log. One replica's suspicion is never a
death: the tally in ``arbiter/core/tally.py`` needs a quorum.
"""

from arbiter.core.detection.base import DetectorState, FailureDetector, InterArrival
from arbiter.core.detection.interval import (
    IntervalGovernor,
    LoadPolicy,
    interval_cap,
    load_cap,
    suggest_interval,
)
from arbiter.core.detection.missed import MissedHeartbeatDetector
from arbiter.core.detection.phi import PhiAccrualDetector, threshold_sigmas
from arbiter.core.detection.wheel import TimingWheel

__all__ = [
    "DetectorState",
    "FailureDetector",
    "InterArrival",
    "IntervalGovernor",
    "LoadPolicy",
    "MissedHeartbeatDetector",
    "PhiAccrualDetector",
    "TimingWheel",
    "interval_cap",
    "load_cap",
    "suggest_interval",
    "threshold_sigmas",
]
