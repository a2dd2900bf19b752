"""The consensus shell: the loop that drives the sans-I/O cores, and what Raft needs around it.

- :mod:`~arbiter.server.consensus.driver`: :class:`Driver`, the single loop that
  feeds the core with ``now`` and handles each Ready (persist, send, apply,
  advance), and the proposals an RPC waits for;
- :mod:`~arbiter.server.consensus.storage`, :mod:`~arbiter.server.consensus.writer`,
  :mod:`~arbiter.server.consensus.stored`: durable Raft state in SQLite,
  written off the loop, and the stored configuration;
- :mod:`~arbiter.server.consensus.peers`, :mod:`~arbiter.server.consensus.peercodec`:
  replica-to-replica transport and its wire form;
- :mod:`~arbiter.server.consensus.standing`: what every ack shares at a moment;
- :mod:`~arbiter.server.consensus.arbiterset`: the configuration in force, on the wire;
- :mod:`~arbiter.server.consensus.events`: the decision log lines;
- :mod:`~arbiter.server.consensus.counters`: the hot-path counters the metrics read.
"""
