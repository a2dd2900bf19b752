"""What the SDK and the arbiter share: the wire's data, rules and identities.

The arbiter imports only this package and the generated ``membership.v1``
from the client side (tests/unit/test_layering.py checks it), and nothing
here imports the SDK's client, node agent or command line:

- :mod:`~membership.shared.view`: the view, its members and events (frozen data);
- :mod:`~membership.shared.errors`: the one exception hierarchy;
- :mod:`~membership.shared.validation`: the wire's limits (ids, labels,
  incarnations, addresses, the keepalive contract), raised as InvalidArgument;
- :mod:`~membership.shared.status`: what a node reports about itself, and its bounds;
- :mod:`~membership.shared.convert`: protobuf messages to and from the frozen data;
- :mod:`~membership.shared.tls` and :mod:`~membership.shared.grants`: mutual TLS,
  and the identities certificates name with what each may do;
- :mod:`~membership.shared.snapshot_file`: the backup file both sides read;
- :mod:`~membership.shared.backoff`: the one jittered backoff, and the
  retry-pushback metadata;
- :mod:`~membership.shared.logfmt`, :mod:`~membership.shared.exits`,
  :mod:`~membership.shared.interrupt`: log formats, exit codes and signal
  handling of every long-running command, the arbiter's included.

This file imports nothing, so that the sans-I/O cores can import the view
without loading anything else.
"""
