"""The ``membership arbiter`` sub-command (registered through the
``membership.commands`` entry point, so the client package never imports the server)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import sys
from pathlib import Path
from typing import Any

from arbiter.config import ArbiterConfig
from membership.errors import InvalidArgument

__all__ = ["default_data_dir", "register"]


def default_data_dir(cluster: str, replica_id: str) -> Path:
    """Where a replica keeps its Raft state unless ``--data-dir`` says otherwise.

    ``$XDG_STATE_HOME/membership/<cluster>/<replica id>``, with
    ``~/.local/state`` when XDG_STATE_HOME is unset (XDG Base Directory
    specification: state that persists across restarts).

    Raises:
        InvalidArgument: the cluster name cannot be a directory name.
    """
    if cluster in (".", "..") or "/" in cluster or "\0" in cluster:
        raise InvalidArgument(f"cluster {cluster!r} cannot name a directory; pass --data-dir")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "membership" / cluster / replica_id


# (flag, ArbiterConfig field, help) of the tunables the command line sets.
_TUNABLES = (
    ("--heartbeat-interval", "heartbeat_interval", "seconds between node heartbeats, H"),
    ("--missed-heartbeats", "missed_heartbeats", "silent intervals before a replica suspects"),
    (
        "--heartbeat-budget",
        "heartbeat_budget",
        "heartbeats per second per replica; the interval grows past budget x H nodes",
    ),
    (
        "--max-heartbeat-interval",
        "max_heartbeat_interval",
        "longest interval suggested to nodes, seconds",
    ),
    ("--lease-fraction", "lease_fraction", "lease granted per ack, as a fraction of D"),
    ("--restart-grace", "restart_grace", "seconds without suspicion after a restart"),
    ("--election-timeout", "election_timeout", "Raft election timeout, seconds"),
    ("--raft-heartbeat-interval", "raft_heartbeat_interval", "Raft leader heartbeat, seconds"),
    ("--snapshot-every", "snapshot_every", "applied log entries between two snapshots"),
    (
        "--progress-interval",
        "progress_interval",
        "seconds between progress markers to idle subscribers",
    ),
    ("--status-interval", "status_interval", "seconds between status events to subscribers"),
)


def _defaults_help() -> str:
    cfg = ArbiterConfig.lan()
    return (
        f"defaults: heartbeat interval {cfg.heartbeat_interval}s, suspect after "
        f"{cfg.missed_heartbeats:g} missed (D = {cfg.suspect_after:.2f}s), lease {cfg.lease:.2f}s, "
        f"interval grows past {cfg.heartbeat_budget * cfg.heartbeat_interval:.0f} nodes up to "
        f"{cfg.max_heartbeat_interval}s, election timeout {cfg.election_timeout}s"
    )


def register(sub: Any) -> None:
    """Adds the ``arbiter`` sub-command to the ``membership`` parser."""
    p = sub.add_parser(
        "arbiter",
        help="run one arbiter replica",
        description="Run one arbiter replica. " + _defaults_help(),
    )
    p.add_argument("--id", required=True, help="this replica's id; must appear in --peers")
    p.add_argument("--listen", required=True, help="address to listen on, host:port")
    p.add_argument(
        "--peers",
        required=True,
        help="every replica, itself included: a1=host:port,a2=host:port,...",
    )
    p.add_argument("--cluster", default="default", help="cluster name (default: default)")
    p.add_argument(
        "--preset",
        choices=["lan", "local"],
        default="lan",
        help="configuration preset (default: lan)",
    )
    cfg = ArbiterConfig.lan()
    timing = p.add_argument_group(
        "detection and timing (defaults of the lan preset; see arbiter/config.py)"
    )
    for flag, field, text in _TUNABLES:
        default = getattr(cfg, field)
        timing.add_argument(
            flag,
            dest=field,
            type=type(default),
            default=None,
            metavar=type(default).__name__.upper(),
            help=f"{text} (default {default:g})",
        )
    p.add_argument(
        "--detector",
        dest="detector_kind",
        choices=["missed", "phi"],
        default=None,
        help=f"failure detector: missed-heartbeat count or phi accrual "
        f"(default {cfg.detector_kind})",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="directory for this replica's durable Raft state (created if missing; default: "
        "$XDG_STATE_HOME or ~/.local/state, then membership/<cluster>/<id>)",
    )
    p.add_argument(
        "--check-config",
        action="store_true",
        help="validate the flags and configuration, print it, and exit",
    )
    p.set_defaults(func=run)


def _config(args: argparse.Namespace) -> ArbiterConfig:
    base = ArbiterConfig.local() if args.preset == "local" else ArbiterConfig.lan()
    overrides: dict[str, Any] = {"cluster": args.cluster}
    for name in [field for _, field, _ in _TUNABLES] + ["detector_kind"]:
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    return dataclasses.replace(base, **overrides).validate()


def run(args: argparse.Namespace) -> Any:
    """Validates the flags, then serves until SIGINT or SIGTERM (returns a coroutine)."""
    from arbiter.server.app import parse_peers
    from membership.validation import parse_address

    peers = parse_peers(args.peers)
    listen = parse_address(args.listen)
    config = _config(args)
    if args.id not in peers:
        raise InvalidArgument(f"--id {args.id!r} is not in --peers ({', '.join(peers)})")
    data_dir = args.data_dir or default_data_dir(config.cluster, args.id)
    if args.check_config:
        print(f"arbiter {args.id}: configuration OK")
        for f in dataclasses.fields(config):
            print(f"  {f.name} = {getattr(config, f.name)}")
        print(f"  data_dir = {data_dir}")
        return 0
    return _serve(args.id, peers, listen, config, data_dir)


async def _serve(
    replica_id: str, peers: dict[str, str], listen: str, config: ArbiterConfig, data_dir: Path
) -> int:
    from arbiter.server.app import ArbiterServer

    server = ArbiterServer(
        replica_id=replica_id, peers=peers, listen=listen, config=config, data_dir=data_dir
    )
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()
    print(f"arbiter {replica_id} stopped", file=sys.stderr)
    return 0
