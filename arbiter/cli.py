"""The ``membership arbiter`` sub-command (registered through the entry point group
``membership.commands`` of pyproject.toml, so the client package never imports the server).

Rules:

1. Every check runs before anything is created, at a real start as under
   ``--check-config``: the flags and the configuration (exit 2), ``--listen``
   being this replica's own ``--peers`` address and no address given twice
   (:func:`arbiter.server.app.check_listen`, exit 2); then, at a real start
   only, the listen address is bound (exit 1: unknown host, address in use,
   not an address of this machine) before the data dir is opened or created.
2. ``--data-dir`` is required: a replica's Raft state is where the operator
   says (as etcd's ``--data-dir``), never a default shared by every cluster
   started on the machine. ``--peers`` counts at the first start only; after
   it the stored configuration wins (arbiter/server/consensus/stored.py): a data dir
   that holds state is checked against it (``--listen`` at this replica's
   stored address, exit 1 otherwise), not against ``--peers``.
3. SIGINT and SIGTERM stop the replica gracefully in every phase, start-up
   and the host name checks included (exit 0); a second one exits at once.
4. Secure by default: ``--tls-ca --tls-cert --tls-key`` (or the
   ``MEMBERSHIP_TLS_*`` variables) give mutual TLS; the certificate must be
   ``spiffe://<--cluster>/arbiter/<--id>`` (exit 2 otherwise). ``--insecure``
   (``MEMBERSHIP_INSECURE=1``) serves plaintext, with a WARNING when the
   listen address is not loopback; neither is a usage error (exit 2).
   SIGHUP re-reads the TLS files for new connections (streams stay up; bad
   files are logged as an ERROR and the old ones kept).
5. ``--metrics-listen HOST:PORT`` (or ``MEMBERSHIP_METRICS_LISTEN``; the flag
   wins) serves Prometheus metrics at ``/metrics`` (arbiter/server/ops/metrics.py);
   off by default. A malformed address, or the ``--listen`` address itself,
   is a usage error (exit 2); one that cannot be bound exits 1, before the
   data dir is touched.
6. ``--restore FILE`` starts a new group from a backup into an empty data
   dir (arbiter/server/ops/backup.py, rules 3 to 5); ``--check-config`` checks
   the file too and prints the new group's identity. A bad file or a
   non-empty data dir is exit 1.
7. ``--health-listen HOST:PORT`` serves the health service alone in
   plaintext (arbiter/server/ops/health_port.py), from start to stop.
8. ``--join ADDR[,ADDR...]`` instead of ``--peers``: a replica added with
   ``membership admin arbiters add`` joins the running group
   (arbiter/server/ops/joining.py); a data dir that already holds state just
   restarts from its stored configuration. A replica removed from the group
   logs it at WARNING and exits 0.
9. ``--event-loop auto|asyncio|uvloop`` (arbiter/server/eventloop.py):
   uvloop when installed (auto), or the loop chosen; ``uvloop`` without it
   installed is a usage error (exit 2).
10. ``--ingest-workers auto|K`` (or ``MEMBERSHIP_INGEST_WORKERS``; the flag
    wins): heartbeat ingest in K worker processes (arbiter/server/ingest);
    ``auto``, the lan preset's default, is one per usable core (at most 64),
    the local preset's is 0. A value that is neither is a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from arbiter.config import ArbiterConfig
from arbiter.workers import ingest_worker_count, parse_ingest_workers
from membership.shared.errors import InvalidArgument
from membership.shared.exits import EXIT_FAILURE, EXIT_OK
from membership.shared.interrupt import Interrupt
from membership.shared.tls import LoadedTLS, add_tls_flags, describe, load, resolve_args

__all__ = ["register"]

T = TypeVar("T")

# --metrics-listen's environment variable (rule 5).
ENV_METRICS_LISTEN = "MEMBERSHIP_METRICS_LISTEN"
# --ingest-workers's environment variable (rule 10; the tests set it to 0).
ENV_INGEST_WORKERS = "MEMBERSHIP_INGEST_WORKERS"


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
        "cap of the suggested interval up to budget x cap nodes, seconds (grows beyond)",
    ),
    ("--load-target", "load_target", "utilisation the adaptive interval aims at, 0 to 1"),
    ("--shed-utilisation", "shed_utilisation", "utilisation from which new nodes are refused"),
    (
        "--shed-lateness",
        "shed_lateness",
        "backlog (s: loop lateness averaged over 2 s, or ingest) from which new nodes are refused",
    ),
    ("--shed-retry-after", "shed_retry_after", "retry hint to refused nodes, seconds (x1-x2)"),
    ("--lease-fraction", "lease_fraction", "lease granted per ack, as a fraction of D"),
    (
        "--restart-grace",
        "restart_grace",
        "seconds without suspicion after a restart, at least (raised to the longest lease)",
    ),
    (
        "--observation-batch-interval",
        "observation_batch_interval",
        "seconds between the leader's batches of joins; 0: every observation at once",
    ),
    ("--election-timeout", "election_timeout", "Raft election timeout, seconds"),
    ("--raft-heartbeat-interval", "raft_heartbeat_interval", "Raft leader heartbeat, seconds"),
    ("--snapshot-every", "snapshot_every", "applied log entries between two snapshots"),
    (
        "--progress-interval",
        "progress_interval",
        "seconds between progress markers to idle subscribers",
    ),
    ("--status-interval", "status_interval", "seconds between status events to subscribers"),
    ("--degraded-jitter-factor", "degraded_jitter_factor", "DEGRADED: jitter over x median"),
    ("--degraded-jitter-floor", "degraded_jitter_floor", "... and over x its interval"),
    ("--degraded-min-samples", "degraded_min_samples", "heartbeats before jitter counts"),
    ("--degraded-step-fraction", "degraded_step_fraction", "DEGRADED: step rate < x job median"),
    ("--degraded-step-window", "degraded_step_window", "seconds the step rate is taken over"),
    ("--degraded-min-steps", "degraded_min_steps", "steps the job median must make in it"),
    (
        "--tombstone-retention",
        "tombstone_retention",
        "seconds a DEAD or LEFT record stays in the view",
    ),
    ("--max-tombstones", "max_tombstones", "most DEAD and LEFT records kept in the view"),
    ("--max-grace", "max_grace", "longest grace window a node is granted, seconds"),
)

# (flag, ArbiterConfig field, help) of the wire contract's limits (docs/protocol.md).
_LIMITS = (
    ("--max-message-bytes", "max_message_bytes", "largest request of a client, bytes"),
    (
        "--max-peer-message-bytes",
        "max_peer_message_bytes",
        "largest message at all (Raft traffic), bytes",
    ),
    ("--max-heartbeat-rate", "max_heartbeat_rate", "heartbeats per second per stream"),
    (
        "--heartbeat-rate-margin",
        "heartbeat_rate_margin",
        "seconds a stream may stay throttled before it is cut",
    ),
    ("--max-nodes", "max_nodes", "node ids one replica tracks; sets the longest interval"),
    ("--max-heartbeat-streams", "max_heartbeat_streams", "heartbeat streams open at once"),
    ("--max-host-entries", "max_host_entries", "node ids in one request of a host stream"),
    ("--max-subscribers", "max_subscribers", "subscriptions open at once"),
    ("--max-concurrent-streams", "max_concurrent_streams", "streams per client connection"),
    (
        "--ingest-workers",
        "ingest_workers",
        "heartbeat-ingest worker processes sharing --listen: auto (one per usable core, "
        "at most 64), or K (0: none, all in this process; arbiter/server/ingest)",
    ),
    (
        "--subscriber-write-timeout",
        "subscriber_write_timeout",
        "seconds an event may wait for a subscriber that does not read",
    ),
)


def _defaults_help() -> str:
    cfg = ArbiterConfig.lan()
    return (
        f"defaults: heartbeat interval {cfg.heartbeat_interval}s, suspect after "
        f"{cfg.missed_heartbeats:g} missed (D = {cfg.suspect_after:.2f}s), lease {cfg.lease:.2f}s, "
        f"interval grows past {cfg.heartbeat_budget * cfg.heartbeat_interval:.0f} nodes up to "
        f"{cfg.interval_ceiling:.2f}s at {cfg.max_nodes} nodes (restart grace "
        f"{cfg.grace:.1f}s), election timeout {cfg.election_timeout}s"
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
    first = p.add_mutually_exclusive_group(required=True)
    first.add_argument(
        "--peers",
        help="every replica of a new group, itself included: a1=host:port,a2=host:port,... "
        "(used at the first start only: the stored configuration wins after it)",
    )
    first.add_argument(
        "--join",
        metavar="ADDR[,ADDR...]",
        help="join a running group as the learner added by 'membership admin arbiters add "
        "ID=HOST:PORT' (replicas of the group to ask; see README 'Replacing an arbiter')",
    )
    p.add_argument("--cluster", default="default", help="cluster name (default: default)")
    p.add_argument(
        "--preset",
        choices=["lan", "local"],
        default="lan",
        help="configuration preset (default: lan)",
    )
    cfg = ArbiterConfig.lan()
    for title, table in (
        ("detection and timing (defaults of the lan preset; see arbiter/config.py)", _TUNABLES),
        (
            "limits of the wire contract (each refusal names its limit; see arbiter/config.py)",
            _LIMITS,
        ),
    ):
        group = p.add_argument_group(title)
        for flag, field, text in table:
            default = getattr(cfg, field)
            if field == "ingest_workers":  # auto or a count
                kind, metavar, shown = _ingest_workers_flag, "auto|K", str(default)
            else:
                kind, metavar, shown = type(default), type(default).__name__.upper(), f"{default:g}"
            group.add_argument(
                flag,
                dest=field,
                type=kind,
                default=None,
                metavar=metavar,
                help=f"{text} (default {shown})",
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
        required=True,
        help="directory of this replica's durable Raft state (created if missing); one per "
        "replica, kept across restarts; a fresh one for a new cluster",
    )
    p.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        default=os.environ.get(ENV_METRICS_LISTEN) or None,
        help="serve Prometheus metrics at http://HOST:PORT/metrics (plain HTTP, no "
        f"authentication: bind it where only the scraper reaches); default off, or "
        f"{ENV_METRICS_LISTEN}",
    )
    p.add_argument(
        "--health-listen",
        metavar="HOST:PORT",
        default=None,
        help="also serve the gRPC health service alone, in plaintext, here (for Kubernetes' "
        "grpc probe, which cannot do mutual TLS; see arbiter/server/ops/health_port.py)",
    )
    p.add_argument(
        "--event-loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="the asyncio event loop: uvloop when installed (auto, the default), or the one "
        "chosen (arbiter/server/eventloop.py)",
    )
    p.add_argument(
        "--restore",
        type=Path,
        metavar="FILE",
        default=None,
        help="start a NEW group from a backup (membership admin snapshot save) into an empty "
        "--data-dir: same members and epoch, a new cluster identity; give every replica the "
        "same FILE and --peers (ignored once this data dir was restored from FILE)",
    )
    p.add_argument(
        "--check-config",
        action="store_true",
        help="validate the flags and configuration, print it, and exit",
    )
    add_tls_flags(p)
    p.set_defaults(func=run, signal_exit=EXIT_OK)


def _ingest_workers_flag(value: str) -> int | str:
    try:
        return parse_ingest_workers(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"give auto or a number of workers, got {value!r}"
        ) from None


def _config(args: argparse.Namespace) -> ArbiterConfig:
    base = ArbiterConfig.local() if args.preset == "local" else ArbiterConfig.lan()
    overrides: dict[str, Any] = {"cluster": args.cluster}
    if args.metrics_listen:
        from arbiter.server.net.addresses import split_host_port
        from membership.shared.validation import parse_address

        try:
            metrics_listen = parse_address(args.metrics_listen)
        except InvalidArgument as e:
            raise InvalidArgument(f"--metrics-listen: {e}") from None
        if split_host_port(metrics_listen) == split_host_port(parse_address(args.listen)):
            raise InvalidArgument(
                f"--metrics-listen {metrics_listen} is the --listen address: give metrics a "
                "port of their own"
            )
        overrides["metrics_listen"] = metrics_listen
    for name in [field for _, field, _ in (*_TUNABLES, *_LIMITS)] + ["detector_kind"]:
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    env_workers = os.environ.get(ENV_INGEST_WORKERS, "").strip()
    if args.ingest_workers is None and env_workers:  # rule 10: the flag wins
        try:
            overrides["ingest_workers"] = parse_ingest_workers(env_workers)
        except ValueError:
            raise InvalidArgument(
                f"{ENV_INGEST_WORKERS}={env_workers!r}: give auto or a number of workers"
            ) from None
    return dataclasses.replace(base, **overrides).validate()


def run(args: argparse.Namespace, interrupt: Interrupt) -> Any:
    """The command: checks (rule 1), then serves until SIGINT or SIGTERM (a coroutine,
    run on the event loop of ``--event-loop``: rule 9)."""
    from arbiter.server.eventloop import loop_factory

    args.loop_factory = loop_factory(args.event_loop)
    return _run(args, interrupt)


async def _run(args: argparse.Namespace, interrupt: Interrupt) -> int:
    from arbiter.server.consensus.storage import DB_NAME, cluster_identity
    from arbiter.server.net.addresses import check_listen, parse_peers
    from membership.shared.validation import parse_address

    join = [] if args.join is None else [parse_address(a) for a in args.join.split(",") if a]
    if args.join is not None and not join:
        raise InvalidArgument("--join needs at least one replica address, host:port")
    if join and args.restore is not None:
        raise InvalidArgument(
            "--restore starts a new group and --join joins a running one: give one of them"
        )
    listen = parse_address(args.listen)
    health_listen = None if args.health_listen is None else parse_address(args.health_listen)
    if health_listen is not None and health_listen == listen:
        raise InvalidArgument(f"--health-listen {health_listen} is --listen: give another port")
    peers = parse_peers(args.peers) if args.peers is not None else {args.id: listen}
    config = _config(args)
    if args.id not in peers:
        raise InvalidArgument(f"--id {args.id!r} is not in --peers ({', '.join(peers)})")
    from arbiter.server.net.security import check_replica_cert

    files = resolve_args(args, f"arbiter {args.id}")
    loaded = None if files is None else load(files)
    if loaded is not None:
        check_replica_cert(loaded, config.cluster, args.id)
    data_dir: Path = args.data_dir
    # A data dir that holds state is checked against its stored configuration, by the server.
    if not (data_dir / DB_NAME).exists():
        checked, _ = await interrupt.race(_in_thread(check_listen, args.id, listen, peers))
        if not checked:
            return EXIT_OK
    if args.check_config:
        print(f"arbiter {args.id}: configuration OK")
        settings = {
            "id": args.id,
            "listen": listen,
            "peers" if not join else "join": ",".join(f"{k}={v}" for k, v in peers.items())
            if not join
            else ",".join(join),
            "cluster_identity": "taken from the group at the first start"
            if join
            else cluster_identity(config.cluster, peers),
            "data_dir": data_dir,
            "health_listen": health_listen or "off",
        }
        if args.restore is not None:
            from arbiter.server.ops.backup import check_restore, restored_identity

            snap, _ = check_restore(args.restore, cluster=config.cluster, replica_ids=list(peers))
            settings["cluster_identity"] = restored_identity(config.cluster, peers, snap)
            settings["restore"] = (
                f"{args.restore} (epoch {snap.epoch}, {snap.members} members, index "
                f"{snap.index}, sha256 {snap.sha256})"
            )
        if loaded is None:
            settings["tls"] = "off (--insecure: plaintext, no identities)"
        else:
            settings.update(describe(loaded))
        for name, value in settings.items():
            print(f"  {name} = {value}")
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            if f.name == "ingest_workers" and value == "auto":
                value = f"auto ({ingest_worker_count(value)} worker processes: usable cores)"
            print(f"  {f.name} = {value}")
        # Derived: the upper bound of a node's interval_seconds (docs/protocol.md, rule 3).
        print(
            f"  interval_ceiling = {config.interval_ceiling!r} (derived, seconds: the longest "
            f"interval suggested or accepted, the load cap at max_nodes)"
        )
        return EXIT_OK
    return await _serve(
        args.id,
        peers,
        listen,
        config,
        data_dir,
        interrupt,
        loaded,
        args.restore,
        health_listen,
        join,
    )


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a daemon thread: a host name lookup that hangs neither blocks the
    loop (signals are still handled) nor keeps the process from exiting."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not done.done():
            outcome()

    def work() -> None:
        outcome: Callable[[], None]
        try:
            value = fn(*args)
            outcome = lambda: done.set_result(value)  # noqa: E731
        except BaseException as e:  # handed to the loop, raised there
            error = e
            outcome = lambda: done.set_exception(error)  # noqa: E731
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=work, name="arbiter-checks", daemon=True).start()
    return await done


async def _serve(
    replica_id: str,
    peers: dict[str, str],
    listen: str,
    config: ArbiterConfig,
    data_dir: Path,
    interrupt: Interrupt,
    loaded: LoadedTLS | None = None,
    restore: Path | None = None,
    health_listen: str | None = None,
    join: list[str] | None = None,
) -> int:
    from arbiter.server.app import ArbiterServer
    from arbiter.server.ops.health_port import start_health_port

    server = ArbiterServer(
        replica_id=replica_id,
        peers=peers,
        listen=listen,
        config=config,
        data_dir=data_dir,
        tls=loaded,
        restore=restore,
        join=join or [],
    )
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGHUP, server.reload_tls)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no SIGHUP
        logging.getLogger("arbiter").warning("no SIGHUP here: TLS files are not reloaded")
    health_port = None
    try:
        started, _ = await interrupt.race(server.start())
        if started and health_listen is not None:
            try:
                health_port = await start_health_port(health_listen, server.health)
            except OSError:
                await server.stop(0)
                raise
        if started:
            await interrupt.race(server.wait_failed())
    finally:
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(signal.SIGHUP)
    await server.stop()
    if health_port is not None:  # after the stop: probes saw NOT_SERVING during its grace
        await health_port.stop(0)
    if server.removed is not None and server.failure is None:
        logging.getLogger("arbiter").warning("%s", server.removed)
        print(f"arbiter {replica_id} stopped: {server.removed}", file=sys.stderr)
        return EXIT_OK
    if server.failure is not None:
        print(f"membership arbiter: error: {server.failure}", file=sys.stderr)
        return EXIT_FAILURE
    if not logging.getLogger("arbiter").isEnabledFor(logging.INFO):
        print(f"arbiter {replica_id} stopped", file=sys.stderr)  # else its log line says so
    return EXIT_OK
