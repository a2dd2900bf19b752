"""``membership top``: a live terminal view of the cluster (drawn by membership/top_view.py).

Rules:

1. Every ``--interval`` seconds (1 by default) it asks every arbiter of
   ``--arbiters`` for its standing (``Admin.Status``; under mutual TLS that
   needs an admin or observer certificate, and a refusal shows as that
   replica's error) and the arbiters for the view with the nodes' status
   (``GetView``, the first answer in a quorum, as ``membership view``), and
   draws a frame. Each call waits ``--timeout`` seconds at most; one that
   does not answer never holds the frame up for longer.
2. Meanwhile a ``Subscribe`` stream with status feeds the recent changes:
   each committed change with its evidence, and each node that becomes or
   stops being DEGRADED or SUSPECT (the last ``--changes`` of them). It
   resumes from ``--history`` epochs before the current one, so the recent
   past is there at once, as far as the arbiter still holds it; those
   changes show the time ``earlier`` (a change carries no time: top knows only
   when it saw one, and it saw these all at its start).
3. On a terminal the frame is redrawn in place on the alternate screen
   (rich's Live display; ``q`` or Ctrl-C quits, exit 0), the node rows cut
   to the terminal's height, problem nodes first. When stdout is not a
   terminal, each frame is printed whole as plain text, with no escape codes
   (borderless tables, as ``top -b``), one every interval.
4. ``--once`` draws one frame, with the changes of the last ``--history``
   epochs the arbiter holds, and exits: 0 when an arbiter answered the view,
   1 when none did (the frame still shows the replicas' errors).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from membership import tls
from membership.commands import EXIT_OK, Interrupt

__all__ = ["register", "top"]


def register(
    sub: Any,
    *,
    arbiters: Callable[[str], list[str]],
    positive: Callable[[str], float],
    whole: Callable[[int], Callable[[str], int]],
    add_filters: Callable[[argparse.ArgumentParser, str], None],
    arb_help: str,
) -> None:
    """Adds ``top`` to the ``membership`` parser's sub-commands (the argument types
    are :mod:`membership.cli`'s)."""
    p = sub.add_parser(
        "top",
        help="a live terminal view: replicas, nodes (state, rank, suspicion, RTT, GPU, step, "
        "DEGRADED), recent changes with their evidence",
        description="A live view of the cluster, redrawn every --interval seconds: every "
        "replica's role, term and quorum; every node's state, incarnation, rank, last heard, "
        "suspicion level, RTT, GPU utilisation, phase, step and DEGRADED, SUSPECT and grace "
        "marks; the recent changes with their evidence. q or Ctrl-C quits. When stdout is not "
        "a terminal it prints plain text frames (no escape codes).",
    )
    p.add_argument("--arbiters", required=True, type=arbiters, help=arb_help)
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument(
        "--interval", type=positive, default=1.0, help="seconds between frames (default 1)"
    )
    p.add_argument(
        "--timeout", type=positive, default=3.0, help="seconds to wait for each call (default 3)"
    )
    p.add_argument("--changes", type=whole(1), default=10, help="recent changes shown (default 10)")
    p.add_argument(
        "--history",
        type=whole(0),
        default=20,
        help="epochs of the past to show changes of at the start (default 20)",
    )
    add_filters(p, "nodes")
    tls.add_tls_flags(p)
    p.set_defaults(func=top, signal_exit=EXIT_OK)


async def top(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """``membership top`` (module rules; the code is in :mod:`membership.top_live`, imported
    only when it runs so that ``membership --help`` stays fast).

    Returns:
        0, or 1 with ``--once`` when no arbiter answered the view.
    """
    from membership.top_live import run

    return await run(args, interrupt)
