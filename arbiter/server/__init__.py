"""The arbiter's asyncio and grpc.aio shell: the only place with clocks, sockets, files and tasks.

It reads the clock, moves bytes and keeps state on disk. Every decision is
made by :mod:`arbiter.core`, fed by the driver loop. Modules:

* ``app.py``: ``ArbiterServer``, one replica's lifecycle (``start()`` to
  ``stop(grace)``). It wires the pieces below together and binds the port.
* ``driver.py``: ``Driver``, the single loop that calls the core with
  ``now``. It takes heartbeats (``on_heartbeat``) and peer messages
  (``on_raft_message``), ticks the replica, and handles each Raft Ready in
  order: persist, send, apply, advance. ``proposing.py``: the proposals a
  call waits for (leave, removal, grace window).
* ``servicers.py``: the public gRPC API (``Heartbeat``, ``Subscribe``,
  ``GetView``, ``Leave``, ``Grace``: ``grace_api.py``). It decodes, hands over
  to the driver or the hub, and encodes.
* ``admin.py``: the Admin service (``RemoveNode``), an administrator's
  removal of another node, asked of the ``Authorizer`` first; ``Status``,
  the replica's standing (``status.py`` builds it) for admins and observers.
* ``metrics.py``: Prometheus metrics (``--metrics-listen``), plain integer
  counters on the hot path read by a collector at scrape time;
  ``events.py``: the decision log lines as structured events
  (``membership_change``, ``raft_role``, ``config_change``).
* ``authz.py``: who may do what (``AllowAll`` for ``--insecure``, ``MutualTLS``
  reading identities from certificates); ``security.py``: the replica's own
  TLS files, their check at start and their reload on SIGHUP.
* ``limits.py``: the wire contract of every stream (seq, rate, slots, sizes);
  ``decoding.py``: undecodable or oversized requests end with a status.
* ``encoding.py``: views and status reports as sent to subscribers and GetView.
* ``surfaces.py``: the standard gRPC surfaces, health per service (SERVING
  only in a quorum) and server reflection.
* ``peers.py``: the replica-to-replica transport for Raft messages.
* ``storage.py``: the durable Raft state (SQLite, fsynced before a message
  that depends on it leaves).
* ``hub.py``: fan-out of committed view changes to subscribers, bounded and
  resumable by epoch: the queues and wake-ups around the rules of
  ``arbiter/core/history.py``; ``frames.py``: each subscriber event
  serialised once per replica, the same bytes written to every stream.
* ``statusboard.py``: the latest status each node reported (informational,
  never used for liveness).
* ``ingest/``: ``--ingest-workers K``, heartbeat streams held by K worker
  processes sharing the port; Raft and the detectors stay in this process.

A heartbeat: ``servicers.py`` -> ``Driver.on_heartbeat`` ->
``Replica.heartbeat`` (core) -> the ack. A view change: ``Driver._turn`` ->
Raft Ready -> ``storage.py`` (persist) and ``peers.py`` (send) ->
``Replica.advance`` (apply, tally) -> ``ViewChange`` -> ``app.py`` ->
``Hub.publish`` -> each subscriber's ``Subscribe`` stream (``frames.py``).
``arbiter/__init__.py`` gives the whole path, death included.

``ArbiterServer`` is imported on first use, so importing this package loads
no grpc.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

__all__ = ["ArbiterServer"]

if TYPE_CHECKING:
    from arbiter.server.app import ArbiterServer


def __getattr__(name: str) -> Any:
    if name == "ArbiterServer":
        value = import_module("arbiter.server.app").ArbiterServer
        globals()[name] = value
        return value
    raise AttributeError(f"module 'arbiter.server' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
