"""How the SDK reaches the arbiter group (private), for the node side and the watch alike.

- :mod:`~membership._arbiters.transport`: gRPC channels, one TCP connection each;
- :mod:`~membership._arbiters.calls`: unary calls (the identity question, GetView,
  Leave) asked of several arbiters at once;
- :mod:`~membership._arbiters.identity`: one client talks to one cluster, each
  replica once;
- :mod:`~membership._arbiters.arbiterset`: following the arbiter configuration the
  acks carry (sans-I/O).
"""
