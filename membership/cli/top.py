"""``membership top``: a live terminal view of the cluster (drawn by membership/cli/top_view.py).

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
   epochs the arbiter holds (never epoch 1: a resume starts after an epoch;
   a ``snapshot of the view`` line where it holds none that old), and exits:
   0 when an arbiter answered the view, 1 when none did (the frame still
   shows the replicas' errors).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.live import Live

from membership._arbiters.transport import Channels
from membership._client import MembershipClient
from membership._config import ClientConfig
from membership.cli.admin.status import ask_replica
from membership.cli.endpoints import add_arbiters_flag
from membership.cli.filters import MemberFilter
from membership.cli.output import event_lines
from membership.cli.top_view import Frame, RecentChange, render
from membership.shared import tls
from membership.shared.errors import MembershipError
from membership.shared.exits import EXIT_FAILURE, EXIT_OK
from membership.shared.interrupt import Interrupt
from membership.shared.view import StatusUpdated, ViewChanged, ViewSnapshot

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
    add_arbiters_flag(p, arbiters, arb_help)
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
    """``membership top`` (module rules; the code is in :mod:`membership.cli.top`, imported
    only when it runs so that ``membership --help`` stays fast).

    Returns:
        0, or 1 with ``--once`` when no arbiter answered the view.
    """

    return await run(args, interrupt)


def _change_text(line: str) -> str:
    """A watch line of a committed change without its ``epoch N  `` prefix."""
    return re.sub(r"^epoch \d+\s+", "", line)


class _Recent:
    """The recent changes (rule 2): committed changes, and DEGRADED and SUSPECT transitions."""

    def __init__(self, keep: int) -> None:
        self.items: collections.deque[RecentChange] = collections.deque(maxlen=keep)
        self.epoch = 0  # the highest epoch seen on the stream
        self.started = 0  # the view's epoch when top started: changes up to it are history
        self.snapshot = False
        self._marks: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}

    def _seen(self, epoch: int, now: float) -> float | None:
        """When a change of ``epoch`` was seen: None for history, committed before top
        started (replayed at its start, all at one moment that is not theirs)."""
        return None if epoch <= self.started else now

    def take(self, ev: object) -> None:
        now = time.time()
        if isinstance(ev, ViewSnapshot):
            self.snapshot, self.epoch = True, max(self.epoch, ev.view.epoch)
            # A snapshot instead of changes: the arbiter holds none older (or top
            # started at epoch 0 or 1, which no resume reaches).
            text = f"snapshot of the view at epoch {ev.view.epoch} from {ev.arbiter_id}"
            self.items.append(
                RecentChange(seen=self._seen(ev.view.epoch, now), epoch=ev.view.epoch, text=text)
            )
        elif isinstance(ev, ViewChanged):
            self.epoch = max(self.epoch, ev.epoch)
            # Member changes only: a job's re-ranking follows every one of them (the RANK
            # column shows the ranks), and would push the deaths off the list.
            seen = self._seen(ev.epoch, now)
            for line in event_lines(dataclasses.replace(ev, ranks=()), as_json=False):
                self.items.append(RecentChange(seen=seen, epoch=ev.epoch, text=_change_text(line)))
        elif isinstance(ev, StatusUpdated):
            for r in ev.reports:
                marks = (tuple(d.cause for d in r.degraded), r.suspected_by)
                before = self._marks.get(r.node_id, ((), ()))
                self._marks[r.node_id] = marks
                if marks[0] != before[0]:
                    text = (
                        f"{r.node_id} DEGRADED: "
                        + "; ".join(f"{d.cause}: {d.reason}" for d in r.degraded)
                        if r.degraded
                        else f"{r.node_id} no longer DEGRADED"
                    )
                    self.items.append(RecentChange(seen=now, epoch=0, text=text))
                if marks[1] != before[1]:
                    text = (
                        f"{r.node_id} SUSPECT by {','.join(r.suspected_by)}"
                        if r.suspected_by
                        else f"{r.node_id} no longer SUSPECT"
                    )
                    self.items.append(RecentChange(seen=now, epoch=0, text=text))


async def _frame(client: Any, channels: Any, args: argparse.Namespace, recent: _Recent) -> Frame:
    """Rule 1: the replicas' standing and the view, asked at once."""
    replicas = asyncio.gather(*(ask_replica(channels, a, args.timeout) for a in client.arbiters))
    info, error = None, ""
    try:
        info = await client.get_view()
    except MembershipError as e:
        error = str(e)
    lines = await replicas
    if info is not None:
        view = MemberFilter.of(args.state, args.label).view(info.view)
        info = dataclasses.replace(info, view=view)
    return Frame(
        at=time.time(), replicas=lines, info=info, view_error=error, changes=list(recent.items)
    )


async def _feed(client: Any, since: int, instance: str, recent: _Recent) -> None:
    """Rule 2: the Subscribe stream, into ``recent``, until cancelled."""
    async for ev in client.watch(
        since_epoch=since, status=True, instance=instance, reset_if_ahead=True
    ):
        recent.take(ev)


@contextlib.contextmanager
def _keys(on_quit: Callable[[], None]) -> Iterator[None]:
    """While a terminal is stdin: ``q`` calls ``on_quit`` (cbreak mode, restored after)."""
    if not sys.stdin.isatty():
        yield
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    loop = asyncio.get_running_loop()

    def key() -> None:
        if os.read(fd, 1) in (b"q", b"Q"):
            on_quit()

    tty.setcbreak(fd)
    loop.add_reader(fd, key)
    try:
        yield
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def run(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """``membership top`` (:mod:`membership.cli.top`'s rules).

    Returns:
        0, or 1 with ``--once`` when no arbiter answered the view.
    """
    terminal = sys.stdout.isatty()
    console = Console(
        highlight=False,
        # Not a terminal: plain text, wide enough that rows do not wrap (rule 3).
        **({} if terminal else {"width": int(os.environ.get("COLUMNS", "200") or 200)}),
    )
    config = ClientConfig(follow_view=False, call_timeout=args.timeout, **tls.config_fields(args))
    client = MembershipClient(args.arbiters, config=config)
    channels = Channels.of(client.config)
    recent = _Recent(args.changes)
    feed: asyncio.Task[None] | None = None
    try:
        first = await _frame(client, channels, args, recent)
        if first.info is not None:
            epoch = recent.started = first.info.view.epoch
            since = max(1, epoch - args.history) if epoch > 1 else 0
            feed = asyncio.create_task(_feed(client, since, first.info.instance, recent))
        if args.once:
            if feed is not None:
                # The past epochs' changes, as far as the arbiter holds them (rule 4).
                deadline = time.monotonic() + args.timeout
                while time.monotonic() < deadline and not (
                    recent.snapshot or recent.epoch >= first.info.view.epoch  # type: ignore[union-attr]
                ):
                    await asyncio.sleep(0.02)
                first = dataclasses.replace(first, changes=list(recent.items))
            console.print(render(first, plain=not terminal))
            if first.info is None:
                print(f"membership top: error: {first.view_error}", file=sys.stderr)
                return EXIT_FAILURE
            return EXIT_OK
        if not terminal:
            await _batch(client, channels, args, recent, console, first, interrupt)
            return EXIT_OK
        with (
            Live(console=console, screen=True, auto_refresh=False) as live,
            _keys(interrupt.stop.set),
        ):
            frame = first
            while True:
                height = console.size.height
                rows = height - len(frame.replicas) - min(len(frame.changes), args.changes) - 17
                live.update(render(dataclasses.replace(frame, max_rows=max(3, rows))), refresh=True)
                slept, _ = await interrupt.race(asyncio.sleep(args.interval))
                if not slept:  # q, or a signal
                    return EXIT_OK
                frame = await _frame(client, channels, args, recent)
    finally:
        if feed is not None:
            feed.cancel()
            with contextlib.suppress(BaseException):
                await feed
        await client.close()
        await channels.close()


async def _batch(
    client: Any,
    channels: Any,
    args: argparse.Namespace,
    recent: _Recent,
    console: Any,
    frame: Frame,
    interrupt: Interrupt,
) -> None:
    """Rule 3 without a terminal: a plain frame every interval, until a signal."""
    while True:
        console.print(render(frame, plain=True))
        console.print()
        slept, _ = await interrupt.race(asyncio.sleep(args.interval))
        if not slept:  # a signal
            return
        frame = await _frame(client, channels, args, recent)
