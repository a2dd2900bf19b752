"""A replica's network edge: its addresses, gRPC options, TLS and who may call what.

- :mod:`~arbiter.server.net.addresses`: ``--peers`` parsed, ``--listen`` checked
  and bound before gRPC;
- :mod:`~arbiter.server.net.options`: the gRPC options of its server and of its
  channels to the other replicas (the keepalive contract);
- :mod:`~arbiter.server.net.security`: its own certificate checked, plaintext announced;
- :mod:`~arbiter.server.net.authz`: the authorization hook of every servicer.
"""
