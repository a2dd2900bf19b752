"""What ``membership top`` shows: one frame of the cluster, drawn with rich.

Pure: a :class:`Frame` (what the arbiters answered) in, a rich renderable out;
no I/O. :mod:`membership.cli.top` gathers the frames and puts them on the screen.

A frame has four parts:

1. A header: the cluster identity, the epoch, the leader, whether the
   answering arbiter is in a quorum, and how many members are in each state,
   DEGRADED and SUSPECT.
2. The replicas (``Admin.Status`` of each): role, term, leader, in a quorum,
   epoch, commit and applied index, and on the leader each follower's lag
   (log entries). A replica that did not answer shows its error.
3. The nodes (``GetView`` of the first arbiter in a quorum): state,
   incarnation, rank (``rank/world_size`` in its job), seconds since the
   arbiter last heard it, its detector's suspicion level, the node's
   heartbeat round trip, GPU utilisation, training phase and step, and its
   marks: DEGRADED with the causes, SUSPECT with who suspects it, GRACE with
   what is left of a grace window. Problem nodes first (SUSPECT, DEGRADED,
   then by id), DEAD and LEFT last. Under the table, each DEGRADED node's
   reasons in words.
4. The recent changes, newest first, with their evidence (who suspected a
   dead node, after how long a silence, at what suspicion level), and the
   DEGRADED marks as they come and go.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from membership._arbiters.calls import Liveness, ViewInfo
from membership.shared.view import Degradation, Member, MemberState

__all__ = ["LEGEND", "Frame", "RecentChange", "node_order", "render"]

# What the columns mean, printed under the frame.
LEGEND = (
    "HEARD: seconds since the answering arbiter last heard the node. SUSPICION: its failure "
    "detector's level (missed: heartbeat intervals missed, suspected at 5 by default; phi: "
    "-log10 of the chance that a heartbeat this late still comes, suspected at 8). RTT: the "
    "node's heartbeat round trip, as it reports it ('-': not reported). DEGRADED: heartbeats, "
    "but jitter far above the others', step rate far below its job's, or unhealthy by its own "
    "word: status, never a view change."
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecentChange:
    """One line of the recent changes.

    Attributes:
        seen: wall-clock seconds when top received it; None for a change committed
            before top started (the history it replays: when is not known).
        epoch: the view epoch it belongs to (0 for a status transition).
        text: the change in words, with its evidence.
    """

    seen: float | None
    epoch: int
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    """One picture of the cluster.

    Attributes:
        at: wall-clock seconds it was taken.
        replicas: one ``membership admin status --json`` line per arbiter address.
        info: the ``GetView`` answer (None when no arbiter answered).
        view_error: why there is no view.
        changes: the recent changes, oldest first.
        max_rows: node rows to show at most (a terminal's height); None: all.
    """

    at: float
    replicas: Sequence[Mapping[str, Any]]
    info: ViewInfo | None
    view_error: str = ""
    changes: Sequence[RecentChange] = ()
    max_rows: int | None = None


_STATE_STYLE = {
    MemberState.ALIVE: "green",
    MemberState.DEAD: "bold red",
    MemberState.LEFT: "dim",
    MemberState.JOINING: "cyan",
}


def _rank_text(member: Member, info: ViewInfo) -> str:
    """``rank/world_size`` in the member's job (``arbiter/core/ranks.py``); "-" without one
    (no ``job`` label, not ALIVE, or an arbiter older than ranks)."""
    if member.rank is None:
        return "-"
    size = info.view.world_size(member.node_id)
    return f"{member.rank}/{size}" if size else str(member.rank)


def _grace_text(member: Member, info: ViewInfo, now: float) -> str:
    """``GRACE 42s checkpoint`` while the member has a grace window at the answering
    arbiter (``arbiter/core/grace_windows.py``); "" otherwise."""
    left, reason = info.graces.get(member.node_id, (0.0, ""))
    return " ".join(p for p in ("GRACE", f"{left:.0f}s", reason) if p) if left > 0 else ""


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _suspicion(live: Liveness | None) -> str:
    if live is None or live.suspicion is None:
        return "-"
    return f"{live.suspicion:.1f} {live.detector}"


def _gpu(info: ViewInfo, node_id: str) -> str:
    status = info.statuses.get(node_id)
    if status is None:
        return "-"
    text = "-" if status.gpu_utilization is None else f"{status.gpu_utilization:.0%}"
    lost = sum(1 for g in status.gpus if g.lost)
    return f"{text} ({lost} lost)" if lost else text


def node_order(info: ViewInfo) -> list[Member]:
    """Members as the nodes table lists them: SUSPECT, then DEGRADED, then the other
    ALIVE ones, then DEAD and LEFT; by node id within each."""

    def key(m: Member) -> tuple[int, str]:
        if m.state is not MemberState.ALIVE:
            return 3, m.node_id
        if info.suspected_by.get(m.node_id):
            return 0, m.node_id
        if info.degraded.get(m.node_id):
            return 1, m.node_id
        return 2, m.node_id

    return sorted(info.view.members, key=key)


def _marks(m: Member, info: ViewInfo, now: float) -> Text:
    text = Text()
    degraded: tuple[Degradation, ...] = info.degraded.get(m.node_id, ())
    if degraded:
        text.append("DEGRADED " + ",".join(d.cause for d in degraded), style="bold yellow")
    suspects = info.suspected_by.get(m.node_id)
    if suspects:
        text.append((" " if text else "") + "SUSPECT by " + ",".join(suspects), style="bold red")
    grace = _grace_text(m, info, now)
    if grace:
        text.append((" " if text else "") + grace, style="cyan")
    return text


def _table(title: str, plain: bool) -> Table:
    return Table(
        title=title,
        title_justify="left",
        box=None if plain else box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        header_style="" if plain else "bold",
    )


def _header(frame: Frame) -> Text:
    clock = time.strftime("%H:%M:%S", time.localtime(frame.at))
    info = frame.info
    if info is None:
        return Text(f"membership top  {clock}  no view: {frame.view_error}", style="bold red")
    # Two lines, never wrapped (a narrow terminal cuts them with an ellipsis).
    counts = {s: 0 for s in (MemberState.ALIVE, MemberState.DEAD, MemberState.LEFT)}
    for m in info.view.members:
        counts[m.state] = counts.get(m.state, 0) + 1
    quorum = "in quorum" if info.in_quorum else "NOT IN QUORUM"
    return Text(
        f"membership top  {clock}  epoch {info.view.epoch}  leader {info.leader_id or 'none'}  "
        f"({info.arbiter_id} answered, {quorum})  cluster {info.cluster or '-'}\n"
        f"nodes: {counts[MemberState.ALIVE]} ALIVE, {counts[MemberState.DEAD]} DEAD, "
        f"{counts[MemberState.LEFT]} LEFT; {len(info.degraded)} DEGRADED, "
        f"{len(info.suspected_by)} SUSPECT",
        no_wrap=True,
        overflow="ellipsis",
    )


def _replicas(frame: Frame, plain: bool) -> Table:
    t = _table("replicas", plain)
    for name in ("ARBITER", "ADDRESS", "ROLE", "TERM", "LEADER", "QUORUM", "EPOCH"):
        t.add_column(name, no_wrap=True)
    t.add_column("COMMIT/APPLIED", no_wrap=True)
    t.add_column("FOLLOWERS LAG / ERROR", overflow="fold")
    for line in frame.replicas:
        if "error" in line:
            t.add_row(
                line["arbiter"], line["address"], *["-"] * 6, Text(line["error"], style="red")
            )
            continue
        lag = " ".join(f"{r}={p['lag']}" for r, p in line.get("followers", {}).items())
        t.add_row(
            line["arbiter"],
            line["address"],
            Text(line["role"], style="bold" if line["role"] == "leader" else ""),
            str(line["term"]),
            line["leader"] or "-",
            Text("yes") if line["in_quorum"] else Text("NO", style="bold red"),
            str(line["epoch"]),
            f"{line['commit_index']}/{line['applied_index']}",
            lag or "-",
        )
    return t


def _nodes(frame: Frame, info: ViewInfo, plain: bool) -> tuple[Table, list[Text]]:
    t = _table("nodes", plain)
    for name in ("NODE", "STATE", "INC", "RANK", "HEARD", "SUSPICION", "RTT", "GPU", "PHASE"):
        t.add_column(name, no_wrap=True, overflow="ellipsis")
    t.add_column("STEP", no_wrap=True, justify="right")
    t.add_column("MARKS", overflow="fold")
    members = node_order(info)
    shown = members if frame.max_rows is None else members[: max(1, frame.max_rows)]
    for m in shown:
        status = info.statuses.get(m.node_id)
        live = info.liveness.get(m.node_id)
        rtt = status.rtt if status is not None else None
        t.add_row(
            m.node_id,
            Text(m.state.value, style="" if plain else _STATE_STYLE.get(m.state, "")),
            str(m.incarnation),
            _rank_text(m, info),
            _seconds(live.silence if live is not None else None),
            _suspicion(live),
            "-" if rtt is None else f"{rtt * 1000:.1f}ms",
            _gpu(info, m.node_id),
            (status.phase if status is not None else None) or "-",
            "-" if status is None or status.step is None else str(status.step),
            _marks(m, info, frame.at),
        )
    notes = []
    if len(shown) < len(members):
        notes.append(Text(f"... {len(members) - len(shown)} more (a taller terminal shows more)"))
    for m in shown:
        for d in info.degraded.get(m.node_id, ()):
            notes.append(Text(f"{m.node_id} DEGRADED {d.cause}: {d.reason}", style="yellow"))
    return t, notes


def _changes(frame: Frame, plain: bool) -> Table:
    t = _table("recent changes (newest first)", plain)
    t.add_column("TIME", no_wrap=True)
    t.add_column("EPOCH", no_wrap=True, justify="right")
    t.add_column("CHANGE", overflow="fold", min_width=40)
    for c in reversed(frame.changes):
        at = "earlier" if c.seen is None else time.strftime("%H:%M:%S", time.localtime(c.seen))
        t.add_row(at, str(c.epoch or "-"), c.text)
    if not frame.changes:
        t.add_row("-", "-", "none seen yet")
    return t


def render(frame: Frame, plain: bool = False) -> RenderableType:
    """The frame as one rich renderable (module docstring).

    Args:
        frame: what to show.
        plain: for a stdout that is not a terminal: tables without borders or
            styles (the console prints no escape codes either way then).

    Returns:
        A :class:`rich.console.Group` of the header, the tables and the legend.
    """
    parts: list[RenderableType] = [_header(frame), _replicas(frame, plain)]
    if frame.info is not None:
        nodes, notes = _nodes(frame, frame.info, plain)
        parts += [nodes, *notes]
    parts += [_changes(frame, plain), Text(LEGEND, style="dim")]
    return Group(*parts)
