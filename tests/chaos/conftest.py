"""Chaos suite fixtures: a network-namespace lab per test, removed afterwards (also on failure).

The tests skip, with the reason, on a machine that cannot build a lab (not
root, no ``ip netns``, no iptables: ``apt-get install iptables``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos import netlab
from tests.chaos.cluster import ChaosCluster

_cleaned = False


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "chaos: real processes in network namespaces, partitions by iptables, pauses by "
        "SIGSTOP, crashes by SIGKILL (needs root and iptables)",
    )


def _new_lab(workdir: Path) -> netlab.Lab:
    """A lab in ``workdir``; skips the test when this machine cannot build one."""
    global _cleaned
    reason = netlab.unavailable()
    if reason is not None:
        pytest.skip(reason)
    if not _cleaned:  # namespaces left by earlier runs that were killed
        netlab.cleanup_leftovers()
        _cleaned = True
    return netlab.Lab(workdir)


@pytest.fixture
def lab(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[netlab.Lab]:
    """A fresh lab; closed after the test whatever happens."""
    lab = _new_lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()


@pytest.fixture(scope="module")
def module_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[netlab.Lab]:
    """One lab for a module's tests that share a cluster (each must leave it as it
    found it); closed after the module whatever happens."""
    lab = _new_lab(tmp_path_factory.mktemp("lab"))
    try:
        yield lab
    finally:
        lab.close()


@pytest.fixture
def cluster(lab: netlab.Lab, request: pytest.FixtureRequest) -> Iterator[ChaosCluster]:
    """A cluster on the lab; on failure its processes' logs are printed."""
    c = ChaosCluster(lab)
    try:
        yield c
    finally:
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(f"lab workdir: {lab.workdir}")
            print(c.dump())
