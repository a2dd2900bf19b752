"""``membership view|watch --state/--label`` (membership/cli/filters.py) and how forgotten
changes are printed (membership/cli/output.py)."""

from __future__ import annotations

import json

import pytest

from membership.cli import build_parser
from membership.cli.filters import MemberFilter, WatchFilter
from membership.cli.output import event_lines
from membership.shared.view import (
    Member,
    MemberChange,
    MemberState,
    QuorumChanged,
    StatusReport,
    StatusUpdated,
    View,
    ViewChanged,
    ViewSnapshot,
)

ALIVE, DEAD, LEFT = MemberState.ALIVE, MemberState.DEAD, MemberState.LEFT
ARBITERS = "127.0.0.1:7001"
VIEW = View(
    epoch=9,
    members=(
        Member(node_id="a", incarnation=1, state=ALIVE, labels={"job": "j1", "rack": "r1"}),
        Member(node_id="b", incarnation=2, state=DEAD, labels={"job": "j1"}),
        Member(node_id="c", incarnation=1, state=LEFT, labels={"job": "j2"}),
        Member(node_id="d", incarnation=1, state=ALIVE, labels={"job": "j2"}),
    ),
)


def _filter(*argv: str, command: str = "view") -> MemberFilter:
    args = build_parser().parse_args([command, "--arbiters", ARBITERS, *argv])
    return MemberFilter.of(args.state, args.label)


@pytest.mark.parametrize(
    ("argv", "kept"),
    [
        ((), ["a", "b", "c", "d"]),
        (("--state", "ALIVE"), ["a", "d"]),
        (("--state", "DEAD,LEFT"), ["b", "c"]),  # the way to see tombstones
        (("--state", "dead", "--state", "left"), ["b", "c"]),  # repeatable, any case
        (("--label", "job=j1"), ["a", "b"]),
        (("--label", "job=j1", "--label", "rack=r1"), ["a"]),  # all must match
        (("--label", "job=j1", "--state", "DEAD"), ["b"]),
        (("--label", "rack="), []),  # an empty value matches only an empty label
        (("--label", "job=j3"), []),
    ],
)
def test_view_filters_members(argv: tuple[str, ...], kept: list[str]) -> None:
    for command in ("view", "watch"):
        got = _filter(*argv, command=command).view(VIEW)
        assert [m.node_id for m in got.members] == kept
        assert got.epoch == VIEW.epoch


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (("--state", "SUSPECT"), "expected ALIVE, DEAD or LEFT"),
        (("--state", ","), "expected ALIVE, DEAD or LEFT"),
        (("--state", "JOINING"), "expected ALIVE, DEAD or LEFT"),
        (("--label", "job"), "expected key=value"),
        (("--label", "=j1"), "expected key=value"),
    ],
)
def test_filter_flags_refuse_bad_values(
    argv: tuple[str, ...], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in ("view", "watch"):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args([command, "--arbiters", ARBITERS, *argv])
        assert e.value.code == 2
        assert error in capsys.readouterr().err


def test_watch_filter_keeps_matching_changes_and_drops_empty_events() -> None:
    keep = WatchFilter(_filter("--state", "DEAD,LEFT", "--label", "job=j1", command="watch"))
    snap = keep.event(ViewSnapshot(view=VIEW, arbiter_id="a1"))
    assert isinstance(snap, ViewSnapshot) and [m.node_id for m in snap.view.members] == ["b"]
    joined = ViewChanged(
        epoch=10,
        changes=(MemberChange(node_id="e", incarnation=1, state=ALIVE, labels={"job": "j1"}),),
    )
    assert keep.event(joined) is None  # nothing left to print
    forgotten = MemberChange(
        node_id="b", incarnation=2, state=DEAD, labels={"job": "j1"}, forgotten=True
    )
    died = MemberChange(node_id="d", incarnation=1, state=DEAD, labels={"job": "j2"})
    ev = keep.event(ViewChanged(epoch=11, changes=(forgotten, died)))
    assert isinstance(ev, ViewChanged) and ev.changes == (forgotten,)
    quorum = QuorumChanged(in_quorum=True, arbiter_id="a1", leader_id="a1")
    assert keep.event(quorum) is quorum  # other events pass


def test_watch_filter_judges_status_reports_by_the_folded_view() -> None:
    keep = WatchFilter(_filter("--label", "job=j2", command="watch"))
    keep.event(ViewSnapshot(view=VIEW))
    keep.event(
        ViewChanged(
            epoch=10,
            changes=(MemberChange(node_id="e", incarnation=1, state=ALIVE, labels={"job": "j2"}),),
        )
    )
    from membership.shared.status import NodeStatus

    reports = tuple(StatusReport(node_id=n, incarnation=1, status=NodeStatus()) for n in "ade")
    ev = keep.event(StatusUpdated(reports=reports))
    assert isinstance(ev, StatusUpdated) and [r.node_id for r in ev.reports] == ["d", "e"]


def test_forgotten_change_is_printed_as_such() -> None:
    change = MemberChange(node_id="b", incarnation=2, state=DEAD, forgotten=True)
    ev = ViewChanged(epoch=12, changes=(change,), arbiter_id="a1")
    [line] = event_lines(ev, as_json=True)
    assert json.loads(line)["forgotten"] is True
    [text] = event_lines(ev, as_json=False)
    assert text == "epoch 12  b (incarnation 2) DEAD; forgotten (bounded history)"
    plain = ViewChanged(epoch=12, changes=(MemberChange(node_id="b", incarnation=2, state=DEAD),))
    assert "forgotten" not in json.loads(event_lines(plain, as_json=True)[0])


def test_forgotten_change_removes_the_member_from_a_folded_view() -> None:
    change = MemberChange(node_id="b", incarnation=2, state=DEAD, forgotten=True)
    folded = VIEW.with_changes(10, (change,))
    assert [m.node_id for m in folded.members] == ["a", "c", "d"] and folded.epoch == 10
