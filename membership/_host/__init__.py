"""The host agent (``membership agent``): one host stream per arbiter carries every local node id.

- :mod:`membership._host.table`: what the agent vouches for toward one arbiter
  (sans-I/O: the local links, the entries, the acks passed back);
- :mod:`membership._host.agent`: the agent itself, its unix socket and its host
  streams (docs/agent.md).
"""
