"""The arbiter: one replica of the group of 3 or 5 that decides who is in the cluster.

Layers (``tests/unit/test_layering.py`` checks them):

* :mod:`arbiter.core` is sans-I/O and deterministic: time, messages and
  randomness are arguments. No clock, socket, file, thread, task or log
  there, so the server and the simulator (``tests/sim``) run the same code.
* :mod:`arbiter.server` is the asyncio and grpc.aio shell, the only place with
  clocks, sockets, files and tasks. It feeds the core and carries out what the
  core hands back.
* Beside them: :mod:`arbiter.config` (``ArbiterConfig``: every setting and its
  default), :mod:`arbiter.errors` (``ArbiterError``, the root of the errors
  raised on purpose), :mod:`arbiter.cli` (``membership arbiter``) and
  ``arbiter/v1`` (generated replica-to-replica protocol code). The arbiter
  uses :mod:`membership` for the view, the errors and the public protocol. The
  client never imports the arbiter.

A heartbeat, on every replica the node streams to:

1. ``server/api/servicers.py`` (``MembershipServicer.Heartbeat``) decodes and
   checks the request, then calls
2. ``server/consensus/driver.py`` (``Driver.on_heartbeat``) with the clock's ``now``,
   which calls
3. ``core/replica.py`` (``Replica.heartbeat``), then ``core/observer.py``
   (``Observer.heartbeat``). The replica's opinion of the node is ALIVE at
   that incarnation (a change of opinion is an observation owed to the
   log). Once that opinion is committed, the node gets a lease.
4. ``core/detection/`` (``FailureDetector.heartbeat`` and ``hold``) records
   the arrival and the lease, which moves the node's deadline in the timing
   wheel (``detection/wheel.py``).
5. The verdict goes back to the servicer, which acks with the lease, the
   interval to heartbeat at (``detection/interval.py``), the node's state
   and whether this replica is in a quorum.

Each turn of the driver's loop (``Driver._turn``):

1. ``Replica.tick(now)`` runs Raft's timers and turns the detector's
   suspicions into opinions.
2. The owed observations go into an ``ObserveBatch`` (``core/commands.py``),
   which goes to ``RaftNode.propose`` (``core/raft/``; a follower forwards
   it to the leader).
3. Raft's ``Ready`` is handled in order: persist (``server/consensus/storage.py``,
   fsync), send (``server/consensus/peers.py``), apply.
4. ``Replica.advance`` applies the committed entries to ``MembershipState``
   (``core/tally.py``, the tally). An entry that changes the view makes a
   ``ViewChange`` at the next epoch.
5. The change goes through ``Driver`` ``on_change`` and ``server/app.py`` to
   ``server/fanout/hub.py`` (``Hub.publish``), which queues it for every
   subscription. The servicer's ``Subscribe`` streams it to the subscribers.

A death: the node goes silent, so no heartbeat moves its deadline. Once the
deadline and the last lease have passed, ``FailureDetector.tick`` reports the
node and the observer makes a SUSPECT observation, with its evidence. That
observation is proposed and committed like any other. On every replica the
tally declares the node DEAD when a quorum of replicas' latest observations
of it are SUSPECT (one opinion never is enough), and the hub publishes the
new epoch. The node, which lost its acks, was fenced by its own SDK
(``membership/_node/session.py``) as soon as it held leases from fewer than a
quorum of replicas, before the cluster could declare it dead.

Public names are in ``__all__``. They are imported on first use, because
every core module imports this package: it must pull in no grpc.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

__all__ = ["ArbiterConfig", "ArbiterError", "ArbiterServer"]

_SOURCES = {
    "ArbiterConfig": "arbiter.config",
    "ArbiterError": "arbiter.errors",
    "ArbiterServer": "arbiter.server.app",
}

if TYPE_CHECKING:
    from arbiter.config import ArbiterConfig
    from arbiter.errors import ArbiterError
    from arbiter.server.app import ArbiterServer


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'arbiter' has no attribute {name!r}")
    value = getattr(import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
