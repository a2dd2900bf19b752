"""The ``membership`` command line: the parser, global flags, exit codes, main().

What each sub-command does is in :mod:`membership.cli.commands`; the ``arbiter``
sub-command is registered by the server package (entry point group
``membership.commands`` of pyproject.toml), so that this package never imports it.
The other sub-commands live beside it: ``admin`` (:mod:`membership.cli.admin`),
``top``, ``demo``, ``certs``, ``node-ctl`` (:mod:`membership.cli.ctl`).

Rules:

1. Exit codes (:data:`EXIT_CODES`, printed by ``membership --help``): 0 ok;
   1 a runtime failure (also a refused ``admin remove``); 2 a usage error (any
   bad flag or value, whether argparse or a configuration check finds it); 3
   a node that the cluster declared DEAD or removed (LEFT) without its asking
   and that does not rejoin; 128 +
   the signal's number for a command cut short by SIGINT or SIGTERM.
   ``node``, ``watch`` and ``arbiter`` stop normally on SIGINT or SIGTERM (a
   node leaves first) and exit 0 then.
2. An error is one line on stderr, ``membership <command>: error: ...``, never
   a traceback.
3. Global flags (``--log-level``, ``--log-format``, ``--version``) are
   accepted before and after the sub-command.
"""

from __future__ import annotations

import os

# Before anything imports grpc (membership.cli.commands does, below): gRPC reads
# these once, when it is first imported, so main() is too late.
# - gRPC core's own informational lines (GOAWAY received, ...) are not the
#   command's output; its errors still show.
# - No fork handlers: the demo forks children (subprocess with a preexec_fn)
#   while its own gRPC client runs; they exec at once and never use gRPC.
#   With the handlers on, a fork that races gRPC's threads could leave a
#   child with a broken poller ("epoll_wait error: Bad file descriptor"),
#   grpc/grpc#43055. No other command forks.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import argparse
import asyncio
import contextlib
import difflib
import logging
import math
import signal
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import NoReturn

from membership.cli import admin, agent, certs, commands, ctl, filters, top
from membership.cli.endpoints import add_arbiters_flag, fill_from_env
from membership.cli.output import event_lines, session_event_line, view_json
from membership.shared.errors import InvalidArgument, MembershipError, PermissionDenied
from membership.shared.exits import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CliError, stopped_early
from membership.shared.interrupt import Interrupt, Interrupted
from membership.shared.tls import add_tls_flags
from membership.shared.validation import parse_address

__all__ = [
    "EXIT_CODES",
    "build_parser",
    "event_lines",
    "main",
    "positive",
    "session_event_line",
    "view_json",
]

log = logging.getLogger("membership.cli")

EXIT_CODES = """\
exit status (docs/using.md has the same table):
  0        success; node and watch exit 0 when stopped by SIGINT, SIGTERM or SIGHUP,
           their normal way to stop, at any moment (a node leaves first; stopped
           before joining it says "n1: stopped before joining"), and so does arbiter
           on SIGINT or SIGTERM (it takes SIGHUP as "reload the TLS files")
  1        runtime failure: fewer than a majority of the arbiters reachable within
           --connect-timeout, a leave not committed, a data dir or listen address
           unusable; admin remove refused (no such member, already DEAD or LEFT) or
           not committed; admin status answered by no replica; a --metrics-listen
           address that cannot be bound; admin snapshot save with no leader or onto
           an existing FILE, snapshot status of a damaged file; arbiter --restore of
           a bad file or into a non-empty data dir
  2        usage: a bad flag or value (also --arbiters of two different clusters, no
           TLS files nor --insecure, TLS files missing or not matching); a
           certificate the arbiters refuse for what it asks (PERMISSION_DENIED: a
           node's heartbeats, any admin command)
  3        node: the cluster ended it without its asking and it does not rejoin:
           declared DEAD (with --no-rejoin), removed (LEFT: admin remove, or another
           process's leave), or another process took its id over
  128+N    cut short by signal N (130 SIGINT, 143 SIGTERM): view and demo on the
           first signal, every command on a second one (which exits at once)
"""


# --- flag values ------------------------------------------------------------------------


def _arbiters(value: str) -> list[str]:
    """``host:port[,host:port...]``: an empty item (``a:1,,b:2``, a trailing comma) is
    an error, as a typo that drops an arbiter would be silent otherwise."""
    items = [a.strip() for a in value.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError("no arbiter address given")
    if not all(items):
        raise argparse.ArgumentTypeError(
            "an empty address in the list (two commas, or one at an end): give "
            "host:port[,host:port...]"
        )
    try:
        addrs = [parse_address(a) for a in items]
    except MembershipError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    twice = sorted({a for a in addrs if addrs.count(a) > 1})
    if twice:  # here, so that the error names the flag or MEMBERSHIP_ARBITERS
        raise argparse.ArgumentTypeError(f"arbiter address listed twice: {', '.join(twice)}")
    return addrs


def _label(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"label {value!r} is not key=value")
    return key, val


def _add_filters(p: argparse.ArgumentParser, what: str) -> None:
    """``--state`` and ``--label`` (membership/cli/filters.py)."""
    p.add_argument(
        "--state",
        action="append",
        type=filters.states_arg,
        metavar="STATE[,STATE]",
        help=f"print only {what} in these states: ALIVE, DEAD, LEFT (repeatable; "
        "--state DEAD,LEFT shows the tombstones)",
    )
    p.add_argument(
        "--label",
        action="append",
        type=filters.label_arg,
        metavar="KEY=VALUE",
        help=f"print only {what} with this label (repeatable: all must match)",
    )


def positive(value: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not math.isfinite(f) or f <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be a finite number > 0")
    return f


def _path(value: str) -> str:
    """argparse type: a path that is not empty (an unset shell variable, say)."""
    if not value:
        raise argparse.ArgumentTypeError("an empty path")
    return value


def _whole(minimum: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"{value!r} must be >= {minimum}")
        return n

    return parse


def _folder(value: str) -> Path:
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} exists and is not a folder")
    return path


def _setup_logging(level: str, log_format: str | None = None) -> None:
    from membership.shared.logfmt import setup_logging

    setup_logging(level, log_format)


# --- parser -------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (rule 2) and exit code 2. An unknown flag is
    reported by the sub-command it was given to (argparse reports it from the top), and
    named even when a required flag is missing too (``--arbitres`` for ``--arbiters``)."""

    argv: Sequence[str] = ()  # the command line being parsed (set by main)

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            sub = _chosen(self, self.argv)
            if sub is not self:
                sub.error(message)
            message += _did_you_mean(self, message.split(":", 1)[1].split())
        elif message.startswith("the following arguments are required"):
            known = _options(self)
            unknown = [w.split("=", 1)[0] for w in self.argv if w.startswith("--")]
            unknown = [w for w in unknown if w not in known]
            if unknown:
                message += f"; unknown {', '.join(unknown)}" + _did_you_mean(self, unknown)
        elif "invalid choice: " in message and "(choose from " in message:
            message += _did_you_mean_choice(message)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _chosen(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The deepest sub-command parser that ``argv`` names (``parser`` itself for none)."""
    for word in argv:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) and word in action.choices:
                parser = action.choices[word]
                break
    return parser


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """Every ``--flag`` of ``parser`` and of its sub-commands, at any depth."""
    found: set[str] = set()
    for action in parser._actions:
        found.update(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                found |= _options(sub)
    return found


def _did_you_mean(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """``" (did you mean --arbiters?)"`` for a misspelt flag among ``unknown``, else ""."""
    known = sorted(_options(parser))
    hints = []
    for word in unknown:
        flag = word.split("=", 1)[0]
        if flag.startswith("--") and flag not in known:
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
            if close:
                hints.append(f"{flag}: did you mean {close[0]}?")
    return f" ({'; '.join(hints)})" if hints else ""


def _did_you_mean_choice(message: str) -> str:
    """``" (did you mean watch?)"`` for argparse's ``invalid choice: 'wathc' (choose
    from 'node', 'watch', ...)``, else ""."""
    word = message.split("invalid choice: ", 1)[1].split(" (choose from", 1)[0].strip("'")
    choices = [c.strip(" '") for c in message.rsplit("(choose from ", 1)[1].rstrip(")").split(",")]
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _version() -> str:
    import membership

    return str(membership.__version__)


def _add_global_flags(p: argparse.ArgumentParser, top: bool) -> None:
    """Rule 4: the same flags on the top parser and on every sub-command's (where an
    absent flag must not override one given before the sub-command)."""
    p.add_argument(
        "--log-level",
        default=None if top else argparse.SUPPRESS,
        choices=["debug", "info", "warning", "error"],
        help="log level on stderr (default: info for arbiter, warning otherwise)",
    )
    p.add_argument(
        "--log-format",
        default=None if top else argparse.SUPPRESS,
        choices=["text", "json"],
        help="log lines on stderr: text, or json (one object per line with ts, level, logger, "
        "msg and the event's fields); default text, or MEMBERSHIP_LOG_FORMAT",
    )
    p.add_argument(
        "--version", action="version", version=f"membership {_version()}", help="print the version"
    )


def _add_connect_timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--connect-timeout",
        type=positive,
        default=10.0,
        help="seconds to wait for a majority of the arbiters to answer which cluster they "
        "are, before the first heartbeat or subscription (default 10)",
    )


def _add_check_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--check-config",
        action="store_true",
        help="validate the flags and configuration without connecting, print them, and exit",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command (plugins such as ``arbiter`` included)."""
    parser = _Parser(
        prog="membership",
        description="Cluster membership over gRPC with quorum arbitration.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    arb_help = "comma-separated arbiter addresses host:port (list every replica)"
    p = sub.add_parser("node", help="run a node: heartbeat to every arbiter until SIGINT/SIGTERM")
    p.add_argument("--id", required=True, help="node id (letters, digits, . _ -; up to 128)")
    add_arbiters_flag(p, _arbiters, arb_help)
    p.add_argument(
        "--label",
        action="append",
        type=_label,
        default=[],
        metavar="KEY=VALUE",
        help="static label (repeatable)",
    )
    p.add_argument(
        "--incarnation",
        type=int,
        default=None,
        help="starting incarnation (default: wall-clock milliseconds)",
    )
    p.add_argument(
        "--no-rejoin",
        action="store_true",
        help="do not rejoin at a higher incarnation when declared DEAD (exit 3 instead)",
    )
    p.add_argument(
        "--no-status-probes",
        action="store_true",
        help="do not probe load, CPU, memory and GPUs for the live status",
    )
    p.add_argument(
        "--control-socket",
        type=_path,
        metavar="PATH",
        help="serve a local control socket (mode 0600) for a script: its rank, world size, "
        "fencing state and grace windows (`membership node-ctl`)",
    )
    _add_connect_timeout(p)
    p.add_argument(
        "--leave-timeout",
        type=positive,
        default=5.0,
        help="seconds to wait for the leave to commit on shutdown (default 5)",
    )
    p.add_argument(
        "--via-agent",
        type=_path,
        metavar="PATH",
        default=None,
        help="join through this host's agent (`membership agent --socket PATH`): its "
        "streams carry this node's heartbeats; no TLS flags here (the agent holds them)",
    )
    _add_check_config(p)
    add_tls_flags(p)
    p.set_defaults(func=commands.node, signal_exit=EXIT_OK)

    p = sub.add_parser("watch", help="print view events as they happen")
    add_arbiters_flag(p, _arbiters, arb_help)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument(
        "--since-epoch",
        type=_whole(0),
        default=0,
        help="resume after this epoch (default 0: start with a snapshot)",
    )
    p.add_argument(
        "--instance",
        default="",
        metavar="ID",
        help='the cluster instance --since-epoch belongs to (the "instance" of a snapshot '
        "line): a cluster reset since is refused even where the epoch exists again",
    )
    p.add_argument(
        "--status",
        action="store_true",
        help="also print the nodes' live status (load, CPU, memory, GPU, phase, step, gauges, "
        "which replicas suspect them) as it changes",
    )
    p.add_argument(
        "--status-interval",
        type=positive,
        default=0.0,
        help="seconds between status updates (default: the arbiter's, 1 s; never faster)",
    )
    _add_filters(p, "members and changes")
    _add_connect_timeout(p)
    _add_check_config(p)
    add_tls_flags(p)
    p.set_defaults(func=commands.watch, signal_exit=EXIT_OK)

    p = sub.add_parser("view", help="print the current view")
    add_arbiters_flag(p, _arbiters, arb_help)
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument(
        "--timeout",
        type=positive,
        default=3.0,
        help="seconds to wait for each arbiter (default 3)",
    )
    _add_filters(p, "members")
    _add_check_config(p)
    add_tls_flags(p)
    p.set_defaults(func=commands.view)

    admin.register(sub, arbiters=_arbiters, positive=positive, whole=_whole, arb_help=arb_help)
    agent.register(sub, arbiters=_arbiters, path=_path, arb_help=arb_help)
    ctl.register(sub, positive=positive)
    top.register(
        sub,
        arbiters=_arbiters,
        positive=positive,
        whole=_whole,
        add_filters=_add_filters,
        arb_help=arb_help,
    )

    p = sub.add_parser(
        "demo",
        help="run a 3-replica, 5-node cluster on loopback and kill parts of it",
        description="Run a 3-replica, 5-node cluster on loopback and kill parts of it. "
        "Interrupted (SIGINT, SIGTERM), it stops every process, removes its temporary "
        "folder and exits 130 or 143.",
    )
    p.add_argument(
        "--nodes", type=_whole(4), default=5, help="number of nodes (default 5, at least 4)"
    )
    p.add_argument(
        "--timeout",
        type=positive,
        default=55.0,
        help="give up after this many seconds (default 55; the cleanup comes on top)",
    )
    p.add_argument(
        "--keep-logs",
        metavar="DIR",
        type=_folder,
        default=None,
        help="copy every process's log here at the end",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="run the cluster in plaintext (default: mutual TLS, certificates made in the "
        "temporary folder)",
    )
    p.set_defaults(func=commands.demo)

    certs.register(sub)

    # The server registers its own sub-command, so that this package never imports it.
    for ep in entry_points(group="membership.commands"):
        if ep.name in sub.choices:  # the metadata found twice on sys.path (a checkout's
            continue  # egg-info beside an install): one command, registered once
        try:
            ep.load()(sub)
        except ImportError as e:  # pragma: no cover - broken install
            log.warning("command %s unavailable: %s", ep.name, e)
    for p in sub.choices.values():
        _add_global_flags(p, top=False)
        p.epilog = p.epilog or "exit status: see 'membership --help'"
    return parser


def _error(prog: str, message: object) -> None:
    """Rule 2: ``membership admin status: error: ...``, named by the sub-command run."""
    print(f"{prog}: error: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``membership`` command; returns the exit code (rule 1).

    Raises:
        SystemExit: for ``--help``, ``--version`` (0) and malformed flags (2).
    """
    interrupt = Interrupt()
    interrupt.install()
    args: argparse.Namespace | None = None
    prog = "membership"  # the sub-command's, once parsed: how its errors begin (rule 2)
    try:
        _Parser.argv = list(sys.argv[1:] if argv is None else argv)
        parser = build_parser()
        args = parser.parse_args(argv)
        prog = _chosen(parser, _Parser.argv).prog
        fill_from_env(args)  # --arbiters, or MEMBERSHIP_ARBITERS (membership/cli/endpoints.py)
        # A server logs what it decides (elections, deaths); clients stay quiet.
        _setup_logging(
            args.log_level or ("info" if args.command == "arbiter" else "warning"),
            args.log_format,
        )
        result = args.func(args, interrupt)
        if asyncio.iscoroutine(result):
            # A command may choose its event loop (``membership arbiter --event-loop``).
            factory = getattr(args, "loop_factory", None)
            with asyncio.Runner(loop_factory=factory) as runner:
                result = runner.run(interrupt.run(result))
        return int(result or 0)
    except (Interrupted, KeyboardInterrupt) as e:
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        if args is None:  # before the command started (membership/_entry.py)
            return stopped_early(sys.argv[1:] if argv is None else argv, signum)
        if isinstance(e, KeyboardInterrupt):
            return 128 + signum
        clean = getattr(args, "signal_exit", None)
        return clean if clean is not None else 128 + signum
    except BrokenPipeError:
        # The reader of our output went away (``membership watch | head -3``):
        # end quietly, as other command-line tools do.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except InvalidArgument as e:
        needs = getattr(args, "needs_certificate", None)
        if isinstance(e, PermissionDenied) and needs:
            e = PermissionDenied(f"{e}. {needs}")  # which certificate would do (admin status's)
        _error(prog, e)
        return EXIT_USAGE
    except CliError as e:
        _error(prog, e)
        return e.code
    except (MembershipError, OSError) as e:
        _error(prog, e)
        return EXIT_FAILURE
    finally:
        interrupt.uninstall()
