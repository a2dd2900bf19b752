"""What the ``membership`` sub-commands do: node, watch, view, demo (the parser is in cli.py).

Each command is a coroutine ``command(args, interrupt) -> exit code``, run by
:func:`membership.cli.main`. Rules (the CLI's, see :mod:`membership.cli`):

1. Exit codes: :data:`EXIT_OK` (0), :data:`EXIT_FAILURE` (1, a runtime
   failure), :data:`EXIT_USAGE` (2, a bad flag or value), :data:`EXIT_ENDED`
   (3, a node the cluster declared DEAD or LEFT without its asking, that does
   not rejoin); a command cut short by a signal raises :class:`Interrupted`.
2. SIGINT and SIGTERM are honoured in every phase (connecting, running,
   leaving, starting up): the first one ends the command as its normal end
   does (:class:`membership.shared.interrupt.Interrupt` and its ``race``); a second
   one exits at once.
3. ``--check-config`` validates every flag and value, connects to nothing,
   and prints only the settings the command depends on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import stat
import sys
import time
from collections.abc import Awaitable, Sequence
from typing import Any

from membership._node.session import EndReason, SessionEvent, StateChanged, Superseded
from membership.cli.filters import MemberFilter, WatchFilter
from membership.cli.output import event_lines, session_event_line, view_json, view_text
from membership.shared import tls
from membership.shared.errors import InvalidArgument, MembershipError, UnavailableError
from membership.shared.exits import EXIT_ENDED, EXIT_OK, CliError
from membership.shared.interrupt import Interrupt, Interrupted
from membership.shared.view import MemberState

__all__ = [
    "demo",
    "node",
    "view",
    "watch",
]

log = logging.getLogger("membership.cli")

# --- shared steps -----------------------------------------------------------------------


def _print(line: str, keep_going: bool = False) -> None:
    """Prints one line; with ``keep_going`` a reader gone (``membership node | head``)
    costs the output only: the node heartbeats on and still leaves on a signal."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        if not keep_going:
            raise  # view and watch end quietly (cli.py)
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


async def _wait_reachable(client: Any, timeout: float, what: str) -> str:
    """Waits until an arbiter answers who it is (the cheap identity question, not a
    whole view); says why it waits after 1 s (a plaintext client of a TLS cluster
    learns it then, not at the timeout), then every 5 s.

    Returns:
        The cluster identity.

    Raises:
        CliError: none answered within ``timeout`` seconds.
        ClusterMismatch: the arbiters belong to different clusters.
    """
    start = time.monotonic()
    every = 1.0
    while True:
        left = timeout - (time.monotonic() - start)
        try:
            identity: str = await client.wait_connected(timeout=min(every, max(0.0, left)))
            return identity
        except TimeoutError:
            reasons = tls.join_reasons(client.unreachable, "no answer")
            left = timeout - (time.monotonic() - start)
            if left <= 0:
                answered = len(client.arbiters) - len(client.unreachable)
                raise CliError(
                    f"fewer than a majority of the arbiters answered within {timeout:g}s "
                    f"({answered} of {len(client.arbiters)}; {reasons})"
                ) from None
            log.warning(
                "%s: waiting for a majority of the arbiters to answer (%s); "
                "giving up %.0fs from now",
                what,
                reasons,
                left,
            )
            every = 5.0


# Settings each command depends on, of ClientConfig (rule: print only those).
_NODE_SETTINGS = (
    "heartbeat_interval",
    "ack_timeout",
    "hedge_after",
    "stall_timeout",
    "slow_start_timeout",
    "backoff_initial",
    "backoff_max",
    "keepalive_time",
    "keepalive_timeout",
    "call_timeout",
    "auto_rejoin",
    "collect_status",
    "status_probe_interval",
    "reachability_log_interval",
)
_WATCH_SETTINGS = (
    "call_timeout",
    "stream_idle_timeout",
    "disconnect_after",
    "subscribe_hedge",
    "failover_probe_interval",
    "backoff_initial",
    "backoff_max",
    "keepalive_time",
    "keepalive_timeout",
)


def _config_ok(
    what: str, settings: dict[str, Any], config: Any = None, fields: Sequence[str] = ()
) -> int:
    """The ``--check-config`` report: an OK line, then ``  name = value`` lines."""
    _print(f"{what}: configuration OK")
    for name, value in settings.items():
        _print(f"  {name} = {value}")
    for name in fields:
        if hasattr(config, name):
            _print(f"  {name} = {getattr(config, name)}")
    return EXIT_OK


# --- node ---------------------------------------------------------------------------------


async def node(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """``membership node``: joins, heartbeats until a signal, then leaves.

    Returns:
        0 once left (or stopped before joining).

    Raises:
        CliError: no arbiter reachable, the leave not committed (code 1), or
            the cluster ended the node without its asking (code 3).
    """
    from membership._client import MembershipClient
    from membership._config import ClientConfig
    from membership.cli import control

    superseded: list[Superseded] = []
    left_unasked = asyncio.Event()
    leaving = False

    def on_event(ev: SessionEvent) -> None:
        taken_over = client.end_reason is EndReason.SUPERSEDED
        line = session_event_line(args.id, ev, leaving, taken_over)
        if line is not None:
            _print(line, keep_going=True)
        if isinstance(ev, Superseded):
            superseded.append(ev)
        elif isinstance(ev, StateChanged) and ev.state is MemberState.LEFT and not leaving:
            left_unasked.set()

    keys = [k for k, _ in args.label]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise InvalidArgument(f"--label {', '.join(twice)} given twice")
    client = MembershipClient(
        args.arbiters,
        node_id=args.id,
        labels=dict(args.label),
        incarnation=args.incarnation,
        config=ClientConfig(
            auto_rejoin=not args.no_rejoin,
            follow_view=bool(args.control_socket),  # the control socket tells the rank
            collect_status=not args.no_status_probes,
            **(
                {"via_agent": args.via_agent}  # the agent holds the TLS files
                if args.via_agent
                else tls.config_fields(args)
            ),
        ),
        on_event=on_event,
    )
    if args.check_config:
        # The client checked every address, the id, the labels and its config,
        # and connected to nothing (channels open on first use).
        settings = {
            "arbiters": ",".join(client.arbiters),
            "labels": ",".join(f"{k}={v}" for k, v in client.labels.items()),
            "incarnation": args.incarnation or "wall-clock milliseconds at start",
            "connect_timeout": args.connect_timeout,
            "leave_timeout": args.leave_timeout,
            **tls.settings_of(client.config),
        }
        return _config_ok(f"node {client.node_id}", settings, client.config, _NODE_SETTINGS)
    ctl: control.ControlServer | None = None
    try:
        # membership/cli/control.py; first, so that a path that cannot be used stops the
        # node before it has told the cluster anything (a script reads JOINING meanwhile)
        ctl = await control.start(client, args.control_socket)
        reached, _ = await interrupt.race(
            _wait_reachable(client, args.connect_timeout, f"node {args.id}")
        )
        if not reached:  # stopped while connecting: nothing to leave
            print(f"{args.id}: stopped before joining", file=sys.stderr, flush=True)
            return EXIT_OK
        await client.start()
        await interrupt.race(_first(client.ended.wait(), left_unasked.wait()))
        if client.ended.is_set() and client.error is not None:
            raise client.error  # e.g. arbiters of two clusters: the SDK names them
        if superseded:
            raise CliError(
                f"node id {args.id!r} was taken over by incarnation {superseded[-1].by} "
                "(is another process running with the same id?)",
                EXIT_ENDED,
            )
        if client.ended.is_set() or left_unasked.is_set():
            state = client.state
            if state is MemberState.DEAD:
                why = "was declared DEAD by the cluster and --no-rejoin is set"
            else:
                why = (
                    "was removed from the cluster: it is LEFT without having asked (by an "
                    "administrator, or another process's leave); it does not rejoin"
                )
            raise CliError(f"{args.id} {why}", EXIT_ENDED)
        leaving = True  # what the join does from now on is not printed (output.py)
        _print(f"{args.id}: leaving", keep_going=True)
        try:
            epoch = await client.leave(timeout=args.leave_timeout)
        except MembershipError as e:
            raise CliError(f"leave failed: {e}") from None
        if client.state is MemberState.LEFT:
            _print(f"{args.id}: LEFT at epoch {epoch}", keep_going=True)
        else:  # it never joined: nothing was recorded in the view
            _print(f"{args.id}: left before it joined the view (no record kept)", keep_going=True)
        return EXIT_OK
    finally:
        await control.stop(ctl)
        await client.close()


async def _first(*aws: Awaitable[Any]) -> None:
    """Returns when the first of ``aws`` is done (the others are cancelled)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


# --- watch / view ---------------------------------------------------------------------------


async def watch(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """``membership watch``: prints view events (``--json``: one object per line) until a
    signal or until the reader of a pipe goes away.

    Raises:
        CliError: no arbiter reachable, or the subscription ended.
        MembershipError: the arbiters refused the subscription.
    """
    from membership._client import MembershipClient
    from membership._config import ClientConfig

    if args.instance and not args.since_epoch:
        raise InvalidArgument("--instance names the instance of --since-epoch: give both")
    client = MembershipClient(
        args.arbiters, config=ClientConfig(follow_view=False, **tls.config_fields(args))
    )
    if args.check_config:
        settings = {
            "arbiters": ",".join(client.arbiters),
            "json": args.json,
            "since_epoch": args.since_epoch,
            "instance": args.instance or "any",
            "status": args.status,
            "status_interval": args.status_interval or "the arbiter's",
            "connect_timeout": args.connect_timeout,
            **tls.settings_of(client.config),
        }
        return _config_ok("watch", settings, client.config, _WATCH_SETTINGS)

    keep = WatchFilter(MemberFilter.of(args.state, args.label))

    async def pump() -> None:
        async for event in client.watch(
            since_epoch=args.since_epoch,
            status=args.status,
            status_interval=args.status_interval,
            instance=args.instance,
        ):
            if (ev := keep.event(event)) is None:
                continue
            for line in event_lines(ev, args.json):
                _print(line)

    loop = asyncio.get_running_loop()
    watching_pipe = stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode)
    try:
        reached, _ = await interrupt.race(_wait_reachable(client, args.connect_timeout, "watch"))
        if not reached:
            print("watch: stopped before connecting", file=sys.stderr, flush=True)
            return EXIT_OK
        if watching_pipe:
            # A pipe's write end polls as an error once its reader is gone:
            # stop then, not at the next event (which may be far off).
            def reader_gone() -> None:
                loop.remove_reader(sys.stdout.fileno())
                interrupt.stop.set()

            loop.add_reader(sys.stdout.fileno(), reader_gone)
        finished, _ = await interrupt.race(pump())
        if not finished:
            return EXIT_OK
        raise CliError("the subscription ended")
    except BrokenPipeError:
        raise
    except (MembershipError, CliError, Interrupted):
        raise
    except Exception as e:  # a bug: still one line
        raise CliError(f"watch ended unexpectedly: {e!r}") from None
    finally:
        if watching_pipe:
            with contextlib.suppress(Exception):
                loop.remove_reader(sys.stdout.fileno())
        await client.close()


async def view(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """``membership view``: prints the view of the first arbiter in a quorum (or any).

    Raises:
        CliError: no arbiter answered.
        Interrupted: a signal came first.
    """
    from membership._client import MembershipClient
    from membership._config import ClientConfig

    client = MembershipClient(
        args.arbiters,
        config=ClientConfig(
            follow_view=False, call_timeout=args.timeout, **tls.config_fields(args)
        ),
    )
    if args.check_config:
        settings = {
            "arbiters": ",".join(client.arbiters),
            "json": args.json,
            "timeout": args.timeout,
            **tls.settings_of(client.config),
        }
        return _config_ok("view", settings)
    try:
        answered, info = await interrupt.race(client.get_view())
    except UnavailableError as e:
        raise CliError(str(e)) from None
    finally:
        await client.close()
    if not answered:
        assert interrupt.signum is not None
        raise Interrupted(interrupt.signum)
    assert info is not None
    info = dataclasses.replace(info, view=MemberFilter.of(args.state, args.label).view(info.view))
    if args.json:
        import json

        _print(json.dumps(view_json(info)))
    else:
        for line in view_text(info):
            _print(line)
    return EXIT_OK


# --- demo ---------------------------------------------------------------------------------


async def demo(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """``membership demo`` (:class:`membership.cli.demo.Demo`); the summary is printed
    after the cleanup, also when the demo fails or is interrupted.

    Raises:
        CliError: a step did not happen in time.
        Interrupted: a signal stopped it (the cleanup ran).
    """
    from membership.cli.demo import Demo, DemoError

    demo = Demo(nodes=args.nodes, keep_logs=args.keep_logs, tls=not args.insecure)
    interrupt.on_force(demo.abort)
    try:
        finished = await demo.run(interrupt.stop, args.timeout)
    except DemoError as e:
        raise CliError(str(e)) from None
    finally:
        for line in demo.summary():
            _print(line)
    if interrupt.signum is not None:  # also when it came during the cleanup
        raise Interrupted(interrupt.signum)
    assert finished
    return EXIT_OK
