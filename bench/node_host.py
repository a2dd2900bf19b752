"""Several nodes in one process: a helper of bench/detection.py (not a tool of its own).

Runs one :class:`membership.MembershipClient` per ``--ids`` entry in a
single asyncio process, each exactly as ``membership node`` would run it
(default ClientConfig, automatic rejoin, its own gRPC connections to every
arbiter), and prints their transitions on stdout. A ``membership node``
process costs about 1.3 % of a core at default settings, mostly interpreter
and gRPC overhead that is paid once per process; hosting the background
nodes several per process lets a 2-core machine run 50 nodes without the
node processes themselves starving the arbiters.

SIGTERM or SIGINT closes every client (no leave) and exits 0.

Security as for ``membership node``: ``--tls-ca --tls-cert --tls-key`` (one
certificate for every id: a node certificate with a prefix pattern, say
``spiffe://default/node/n*``), or ``--tls-dir DIR`` for each id's own
``DIR/<id>.pem`` and ``DIR/<id>-key.pem`` (``membership certs init`` files;
:class:`membership.testing.pki.ClusterCertificates` makes them), or
``--insecure``; the environment variables ``MEMBERSHIP_TLS_*`` and
``MEMBERSHIP_INSECURE`` otherwise.

Usage: python bench/node_host.py --arbiters H:P,H:P,H:P --ids n1,n2,n3 [--tls-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from membership._client import MembershipClient
from membership._config import ClientConfig
from membership._node.session import SessionEvent
from membership.cli.output import session_event_line
from membership.shared.tls import TLSFiles, add_tls_flags, config_fields


class _OwnConnections(ClientConfig):
    """Default ClientConfig, but no sharing of TCP connections between clients.

    gRPC shares one connection among channels to the same target with the same
    options in one process; every node here gets its own, as separate
    ``membership node`` processes would.
    """

    def channel_options(self) -> list[tuple[str, int]]:
        return [*super().channel_options(), ("grpc.use_local_subchannel_pool", 1)]


def _out(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


async def main(
    arbiters: list[str], ids: list[str], tls: dict[str, Any], tls_dir: Path | None = None
) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def on_event(node_id: str) -> Callable[[SessionEvent], None]:
        def handle(ev: SessionEvent) -> None:
            line = session_event_line(node_id, ev)  # as `membership node` prints it
            if line is not None:
                _out(line)

        return handle

    config = _OwnConnections(follow_view=False, **tls)

    def config_of(node_id: str) -> ClientConfig:
        if tls_dir is None:
            return config
        files = TLSFiles.in_dir(tls_dir, node_id)
        return dataclasses.replace(
            config, tls_ca=str(files.ca), tls_cert=str(files.cert), tls_key=str(files.key)
        )

    clients = [
        MembershipClient(arbiters, node_id=n, config=config_of(n), on_event=on_event(n))
        for n in ids
    ]
    try:
        for c in clients:
            await c.start()
        _out(f"hosting {len(clients)} nodes: {', '.join(ids)}")
        await stop.wait()
    finally:
        for c in clients:
            await c.close()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arbiters", required=True, help="comma-separated host:port list")
    parser.add_argument("--ids", required=True, help="comma-separated node ids")
    parser.add_argument(
        "--tls-dir", type=Path, default=None, help="each id's DIR/<id>.pem, DIR/<id>-key.pem"
    )
    add_tls_flags(parser)
    args = parser.parse_args()
    tls = {} if args.tls_dir else config_fields(args)
    sys.exit(asyncio.run(main(args.arbiters.split(","), args.ids.split(","), tls, args.tls_dir)))
