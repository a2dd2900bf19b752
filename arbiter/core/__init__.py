"""The arbiter's sans-I/O core: deterministic state machines, with time and messages as arguments.

Nothing here reads a clock, opens a socket or file, starts a thread or task,
sleeps, logs or draws random numbers (an ``Rng`` is passed in). The asyncio
driver (``arbiter/server/consensus/driver.py``) and the simulator (``tests/sim``)
drive the same objects. They differ only in where ``now``, messages and
storage come from.

Modules, in the order a heartbeat reaches them:

* ``replica.py``: ``Replica``, one replica as a whole, the only object a
  shell drives. ``heartbeat``, ``step`` (a Raft message), ``tick`` and
  ``propose_leave`` / ``propose_remove`` / ``propose_grace`` go in (``proposals.py``);
  ``ready()`` and ``advance()`` come out, in etcd's Ready order.
* ``observer.py``: this replica's opinion of each node (ALIVE or SUSPECT),
  the observations it owes the log and the leases it grants;
  ``grace_windows.py``: the committed grace windows on this replica's clock.
* ``detection/``: the failure detectors (missed heartbeats, phi accrual), the
  timing wheel of their deadlines and the interval suggested to nodes.
* ``batching.py``: when owed ALIVE observations go out (the leader cuts a
  join storm into few batches); ``gathering.py``: the leader gathers the
  others' forwarded ALIVE batches into its cut's entry (one epoch per cut).
* ``commands.py``: the log entries (``ObserveBatch``, ``ObserveBatches``,
  ``Leave``, ``Remove``, ``Bootstrap``, ``Forget``, ``Grace``) and their encoding. Raft carries them
  as opaque bytes. ``grace.py``: the Grace command, its record and rules.
* ``raft/``: Raft consensus (``RaftNode``: tick, step and propose in;
  ``Ready`` out).
* ``tally.py``: ``MembershipState``, the replicated state machine. It applies
  committed entries, tallies the replicas' observations into the view (a
  quorum makes a node ALIVE or DEAD) and numbers each change with an epoch
  (``ViewChange``).
* ``leaves.py``: how the tally judges a Leave and an administrator's Remove
  (its rules 5 and 5a); the API asks the same question before proposing.
* ``ranks.py``: the rule that gives the ALIVE members of each job their ranks
  on every view change (stable, dense, the same on every replica).
* ``tally_snapshot.py``: the tally's canonical snapshot encoding (Raft
  compacts its log with it) and the checks that refuse anything else.
* ``history.py``: the recent view changes kept for subscribers and the
  rule for resuming by epoch (the changes after it, a snapshot, or nothing
  yet), run by the server's hub and by the simulator alike.

A heartbeat: ``Replica.heartbeat`` -> ``Observer.heartbeat`` ->
``FailureDetector.heartbeat`` and ``hold`` (the lease): the node's deadline
moves. Time passing: ``Replica.tick`` -> ``Observer.tick`` ->
``FailureDetector.tick`` reports the nodes whose deadline passed. Each gets
a SUSPECT opinion, and the owed observations go as one ``ObserveBatch`` to
``RaftNode.propose``. Once committed, ``Replica.advance`` hands the entries
to ``MembershipState.apply``. A quorum of SUSPECT observations makes the
node DEAD: a ``ViewChange`` at the next epoch, which the shell publishes.
``arbiter/__init__.py`` gives the whole path, shell included.

The names a shell or simulator needs are in ``__all__``, imported on first use.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

__all__ = ["MembershipState", "Replica", "ReplicaSettings", "RestoreError", "ViewChange"]

_SOURCES = {
    "MembershipState": "arbiter.core.tally",
    "Replica": "arbiter.core.replica",
    "ReplicaSettings": "arbiter.core.replica",
    "RestoreError": "arbiter.core.replica",
    "ViewChange": "arbiter.core.tally",
}

if TYPE_CHECKING:
    from arbiter.core.replica import Replica, ReplicaSettings, RestoreError
    from arbiter.core.tally import MembershipState, ViewChange


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'arbiter.core' has no attribute {name!r}")
    value = getattr(import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
