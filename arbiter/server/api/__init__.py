"""The public gRPC API of a replica: each call checked, handed on, answered.

- :mod:`~arbiter.server.api.servicers`: ``Heartbeat``, ``Subscribe``, ``GetView``,
  ``Leave`` (thin: decode, hand to the driver or the hub, encode);
- :mod:`~arbiter.server.api.heartbeat_path`: one heartbeat's checks
  (:class:`HeartbeatChecks`) and its ack (:class:`AckBuilder`), shared with the
  ingest workers;
- :mod:`~arbiter.server.api.limits`: the wire contract's per-stream rules
  (rates, slots, node count);
- :mod:`~arbiter.server.api.decoding`, :mod:`~arbiter.server.api.replies`: requests
  that do not decode, and the statuses every refusal shares;
- :mod:`~arbiter.server.api.shedding`: new streams refused while the replica is loaded;
- :mod:`~arbiter.server.api.grace_api`: ``Membership.Grace``;
- :mod:`~arbiter.server.api.surfaces`: the health service and server reflection.
"""
