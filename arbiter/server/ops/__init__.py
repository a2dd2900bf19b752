"""Operating a replica: the Admin service, backups, reconfiguration, metrics, probes.

- :mod:`~arbiter.server.ops.admin`, :mod:`~arbiter.server.ops.admin_arbiters`,
  :mod:`~arbiter.server.ops.status`: the Admin service (remove a node, a
  replica's standing, the arbiter group's RPCs);
- :mod:`~arbiter.server.ops.backup`: ``SaveSnapshot`` and ``--restore``;
- :mod:`~arbiter.server.ops.reconfig`, :mod:`~arbiter.server.ops.joining`: following
  and changing the arbiter configuration, ``--join``;
- :mod:`~arbiter.server.ops.metrics`, :mod:`~arbiter.server.ops.operated`:
  Prometheus metrics;
- :mod:`~arbiter.server.ops.health_port`: the plaintext ``--health-listen`` port.
"""
