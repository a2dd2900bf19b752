from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from arbiter.config import ArbiterConfig
from arbiter.server.app import ArbiterServer
from membership.testing.localcluster import free_ports
from tests.integration.harness import ProcCluster, secure_env, wait_async


@pytest.fixture
async def replicas() -> AsyncIterator[list[ArbiterServer]]:
    """Three arbiter replicas in this process, real gRPC on loopback, a leader elected."""
    ports = free_ports(3)
    peers = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    servers = [
        ArbiterServer(replica_id=rid, peers=peers, listen=addr, config=ArbiterConfig.local())
        for rid, addr in peers.items()
    ]
    for s in servers:
        await s.start()
    try:
        await wait_async(lambda: any(s.driver.is_leader for s in servers), 15, "a leader")
        yield servers
    finally:
        for s in servers:
            await s.stop(grace=0)


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ProcCluster]:
    c = ProcCluster(tmp_path)
    try:
        yield c
    finally:
        c.close()
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(c.dump())


@pytest.fixture
def tls_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ProcCluster]:
    """Three replicas with mutual TLS, certificates in ``tmp_path/tls``."""
    yield from tls_replicas(tmp_path, request)


def tls_replicas(
    tmp_path: Path, request: pytest.FixtureRequest, *arbiter_args: str
) -> Iterator[ProcCluster]:
    """Three replicas with mutual TLS (certificates in ``tmp_path/tls``) and
    ``arbiter_args``; stopped afterwards, their logs printed when the test failed."""
    c = ProcCluster(tmp_path)
    c.tls, c.env, c.arbiter_args = True, secure_env(), arbiter_args
    try:
        c.start_arbiters(3)
        yield c
    finally:
        c.close()
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(c.dump())
