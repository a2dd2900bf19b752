"""The node side of a client (private): a session with the arbiters while the node lives.

- :mod:`~membership._node.session`: the sans-I/O core (sequence numbers, leases
  counted from the send, fencing, rejoin) and its events;
- :mod:`~membership._node.agent`: :class:`NodeAgent`, its asyncio shell (one
  heartbeat link per arbiter, the fence timer, leave, following the arbiter set);
- :mod:`~membership._node.heartbeats` and :mod:`~membership._node.linkrules`:
  one link's streams, and the sans-I/O rules of slow start, hedging and stalls;
- :mod:`~membership._node.collector` and :mod:`~membership._node.probes`: the
  node's status, probed off the heartbeat path;
- :mod:`~membership._node.graces`: grace windows, client side;
- :mod:`~membership._node.eventlog`: one log line per session event.
"""
