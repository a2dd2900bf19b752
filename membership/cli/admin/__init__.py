"""The ``membership admin`` sub-commands' parsers: remove a node, the replicas' status,
backups (``snapshot save|status``) and the arbiter group (``arbiters ...``).

Each action's code is in its own module of this package (``remove``, ``status``,
``snapshot``, ``arbiters``), imported only when it runs, so that
``membership --help`` stays fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from membership.cli.endpoints import add_arbiters_flag
from membership.shared.interrupt import Interrupt
from membership.shared.tls import add_tls_flags

__all__ = ["register"]


def register(
    sub: Any,
    *,
    arbiters: Callable[[str], list[str]],
    positive: Callable[[str], float],
    whole: Callable[[int], Callable[[str], int]],
    arb_help: str,
) -> None:
    """Adds ``admin`` and its actions to the ``membership`` parser's sub-commands.

    Args:
        sub: the top parser's sub-parsers.
        arbiters, positive, whole: the argument types of :mod:`membership.cli`
            (an arbiter address list, seconds > 0, an integer at least n).
        arb_help: the help text of ``--arbiters``.
    """
    admin = sub.add_parser(
        "admin",
        help="administer the cluster (remove a node, change the arbiter group, the replicas' "
        "status, save a snapshot)",
        description="Administer the cluster. Under mutual TLS these commands need an admin "
        "certificate.",
    )
    admin_sub = admin.add_subparsers(dest="admin_command", required=True, metavar="ACTION")
    p = admin_sub.add_parser(
        "remove",
        help="remove a node: it becomes LEFT (not DEAD), stops, and does not rejoin",
        description="Remove a node from the cluster: its recorded incarnation becomes LEFT "
        "(committed like any view change, with who removed it), the node is told so on its "
        "next heartbeat, logs an ERROR and stops without rejoining (a `membership node` exits "
        "3). Exit 1 with one line when the cluster has no such member (NOT_FOUND), it is "
        "already DEAD or LEFT (FAILED_PRECONDITION) or no arbiter answered; exit 2 when the "
        "caller may not administer (PERMISSION_DENIED).",
    )
    p.add_argument("node", metavar="NODE", help="the node id to remove")
    add_arbiters_flag(p, arbiters, arb_help)
    p.add_argument(
        "--incarnation",
        type=whole(0),
        default=0,
        help="remove only this incarnation (default 0: whichever one the cluster records)",
    )
    p.add_argument(
        "--timeout",
        type=positive,
        default=10.0,
        help="seconds to wait for the removal to commit (default 10)",
    )
    add_tls_flags(p)
    p.set_defaults(func=_admin_remove)
    _add_snapshot(admin_sub, arbiters, positive, arb_help)

    p = admin_sub.add_parser(
        "status",
        help="every replica's raft role, term, leader, log indexes, epoch, quorum and version",
        description="Ask every replica for its standing (Admin.Status; under mutual TLS an "
        "admin or observer certificate) and print one line per replica: a table, or with "
        "--json one JSON object per line (arbiter, role, term, leader, commit_index, "
        "applied_index, epoch, in_quorum, version, configuration, and on the leader each "
        "follower's match_index and lag). A replica that does not answer gets a line with "
        "its address and error. Exit 1 when none answered.",
    )
    add_arbiters_flag(p, arbiters, arb_help)
    p.add_argument("--json", action="store_true", help="one JSON object per replica and line")
    p.add_argument(
        "--timeout",
        type=positive,
        default=3.0,
        help="seconds to wait for each arbiter (default 3)",
    )
    add_tls_flags(p)
    p.set_defaults(func=_admin_status)

    from membership.cli.admin import arbiters as admin_arbiters

    admin_arbiters.register(admin_sub, arbiters, arb_help)
    _set_needs(admin_sub, "membership admin")


# What certificate each action needs under mutual TLS (reads: an observer's will do),
# said after a PERMISSION_DENIED (membership.cli.main), as admin status says it.
_ADMIN_CERT = "an admin certificate of this cluster (spiffe://CLUSTER/admin/NAME; docs/security.md)"
_READ_CERT = (
    "an admin or an observer certificate of this cluster (spiffe://CLUSTER/admin/NAME or "
    "spiffe://CLUSTER/observer/NAME; docs/security.md)"
)
_READS = {"membership admin status", "membership admin arbiters list"}


def _set_needs(sub: Any, prog: str) -> None:
    """Sets ``needs_certificate`` on every action parser under ``sub`` (at any depth):
    "PROG needs ..." with :data:`_READ_CERT` for the reads, :data:`_ADMIN_CERT` else."""
    for name, parser in sub.choices.items():
        here = f"{prog} {name}"
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for action in nested:
            _set_needs(action, here)
        if not nested:
            cert = _READ_CERT if here in _READS else _ADMIN_CERT
            parser.set_defaults(
                needs_certificate=f"{here.removeprefix('membership ')} needs {cert}"
            )


def _add_snapshot(
    admin_sub: Any,
    arbiters: Callable[[str], list[str]],
    positive: Callable[[str], float],
    arb_help: str,
) -> None:
    """``admin snapshot save|status`` (membership/cli/admin/snapshot.py)."""
    snap = admin_sub.add_parser("snapshot", help="save a backup of the view, or check one")
    snap_sub = snap.add_subparsers(dest="snapshot_command", required=True, metavar="ACTION")
    p = snap_sub.add_parser(
        "save",
        help="save a consistent snapshot (members, epoch) to FILE, for --restore",
        description="Save a consistent snapshot of the cluster's tally, from the leader, to "
        "FILE (written atomically, mode 0600). Restore with `membership arbiter ... --restore "
        "FILE` on every replica. Exit 1 with one line when FILE exists (without --force) or no "
        "leader answers; exit 2 when the caller may not administer (PERMISSION_DENIED).",
    )
    p.add_argument("file", metavar="FILE", type=Path, help="the file to write")
    add_arbiters_flag(p, arbiters, arb_help)
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    p.add_argument("--json", action="store_true", help="print what was saved as one JSON line")
    p.add_argument(
        "--timeout", type=positive, default=10.0, help="seconds to wait for a leader (default 10)"
    )
    add_tls_flags(p)
    p.set_defaults(func=_snapshot_save)
    p = snap_sub.add_parser(
        "status",
        help="print a backup's epoch, members, index and whether its checksum is valid",
        description="Print what a backup holds: epoch, members, log index and term, cluster, "
        "sha256. Exit 1 when the file is damaged (checksum mismatch) or not a backup.",
    )
    p.add_argument("file", metavar="FILE", type=Path, help="the backup file")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=_snapshot_status)


def _snapshot_save(args: argparse.Namespace, interrupt: Interrupt) -> Any:
    from membership.cli.admin.snapshot import admin_snapshot_save

    return admin_snapshot_save(args, interrupt)


def _snapshot_status(args: argparse.Namespace, interrupt: Interrupt) -> Any:
    from membership.cli.admin.snapshot import admin_snapshot_status

    return admin_snapshot_status(args, interrupt)


def _admin_remove(args: argparse.Namespace, interrupt: Interrupt) -> Any:
    from membership.cli.admin.remove import admin_remove

    return admin_remove(args, interrupt)


def _admin_status(args: argparse.Namespace, interrupt: Interrupt) -> Any:
    from membership.cli.admin.status import admin_status

    return admin_status(args, interrupt)
