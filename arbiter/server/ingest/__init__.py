"""Heartbeat ingest in K worker processes per replica (``--ingest-workers K``).

A replica with K >= 1 is one *consensus process* (Raft, the tally, the
driver with every failure detector, the hub, Admin) and K *workers* that
share its ``--listen`` port (SO_REUSEPORT). A worker holds the heartbeat
streams that land on it, checks them as the in-process servicer does, and
asks the consensus process for the verdicts in batches over a private
socketpair; it forwards every other RPC to the consensus process's gRPC
server, which listens on a unix socket in a 0700 directory only. The
detectors stay in the consensus process because a lease is a promise of the
detector that holds the node (arbiter/core/observer.py rule 4); what moves
out is what costs: gRPC, HTTP/2, TLS and protobuf, per heartbeat.

Modules (each states its rules):

* ``frames.py``: the socketpair's frames (length-prefixed marshal tuples);
* ``batcher.py``: a worker's heartbeats out in batches, verdicts back;
* ``lateness.py``: the consensus process's horizon per worker (Lifeguard:
  no suspicion for a heartbeat still in a worker's batch);
* ``worker.py``: the worker process (``python -m arbiter.server.ingest``);
  ``lifetime.py``: it dies with the consensus process;
* ``proxy.py``: the generic forwarding of every other RPC, and the caller's
  identity across it;
* ``pool.py``: the consensus process's side: spawn, answer, supervise, stop.

Nothing here is imported unless ``--ingest-workers`` is >= 1.
"""
