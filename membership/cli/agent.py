"""``membership agent``: one per host; local processes join through it (docs/agent.md).

``membership agent --arbiters A,B,C --socket PATH [--tls-ca/--tls-cert/--tls-key |
--insecure] [--id-prefix P]`` serves PATH (mode 0600) until SIGINT or SIGTERM
(exit 0); ``membership node --id ID --via-agent PATH`` joins through it. The
agent's certificate is a node certificate of the ids it carries
(``spiffe://CLUSTER/node/<prefix>*``: ``membership certs init ... --nodes
'worker-*'``).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any

from membership.cli.endpoints import add_arbiters_flag
from membership.shared import tls
from membership.shared.exits import EXIT_OK
from membership.shared.interrupt import Interrupt
from membership.shared.validation import validate_node_id

__all__ = ["register"]

log = logging.getLogger("membership.agent")


def register(
    sub: Any, *, arbiters: Callable[[str], list[str]], path: Callable[[str], str], arb_help: str
) -> None:
    """Adds ``agent`` to the ``membership`` parser's sub-commands."""
    p = sub.add_parser(
        "agent",
        help="run this host's agent: one heartbeat stream per arbiter for every local node",
        description="Serve a unix socket (mode 0600) that local `membership node --via-agent "
        "PATH` processes (and MembershipClient(..., via_agent=PATH)) join through: each "
        "arbiter gets one heartbeat stream from this host, carrying an entry for every "
        "local node id per interval, instead of one stream per node. A local process that "
        "stops heartbeating the agent is dropped from the entries within half an interval "
        "of its missed heartbeat. Runs until SIGINT or SIGTERM (exit 0). docs/agent.md.",
    )
    add_arbiters_flag(p, arbiters, arb_help)
    p.add_argument("--socket", required=True, type=path, metavar="PATH", help="the unix socket")
    p.add_argument(
        "--id-prefix",
        default="",
        metavar="P",
        help="carry only node ids that start with P (its certificate should be node/P*)",
    )
    tls.add_tls_flags(p)
    p.set_defaults(func=run, signal_exit=EXIT_OK)


async def run(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """Serves until a signal; returns 0."""
    from membership._config import ClientConfig
    from membership._host.agent import HostAgent

    if args.id_prefix:
        validate_node_id(args.id_prefix)
    files = tls.resolve_args(args)
    agent = HostAgent(
        args.arbiters,
        args.socket,
        tls_files=files,
        id_prefix=args.id_prefix,
        channel_options=ClientConfig().channel_options(),
    )
    await agent.start()
    try:
        await interrupt.race(agent.wait())
    finally:
        log.warning("agent: stopping (the local nodes' ids go silent unless they left)")
        await agent.stop()
    return EXIT_OK
