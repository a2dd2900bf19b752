"""Views out: what a replica tells subscribers and ``GetView`` callers about the view.

- :mod:`~arbiter.server.fanout.hub`: committed changes fanned out to every
  subscriber, bounded, resumable by epoch;
- :mod:`~arbiter.server.fanout.frames`: each event serialised once, the same
  bytes written to every stream;
- :mod:`~arbiter.server.fanout.encoding`: the view's members with their
  suspicions, status and DEGRADED marks, encoded;
- :mod:`~arbiter.server.fanout.statusboard`: the latest status each node
  reported (informational, never liveness);
- :mod:`~arbiter.server.fanout.degradation`: this replica's DEGRADED marks.
"""
