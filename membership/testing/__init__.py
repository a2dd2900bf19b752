"""Real clusters on one machine, for tests, demos and benchmarks.

:class:`LocalCluster` runs arbiter replicas and nodes as child processes of
``python -m membership`` on free loopback ports (``membership demo``, the
project's integration and chaos tests, the benchmarks and the PyTorch example
use it); :mod:`membership.testing.pki` issues a development CA and its
members' certificates (``membership certs init`` writes the same files).
"""

from membership.testing.localcluster import (
    Child,
    LocalCluster,
    ViewFollower,
    free_ports,
    wait_leader,
)

__all__ = ["Child", "LocalCluster", "ViewFollower", "free_ports", "wait_leader"]
