"""The node's side of gray failures: the health flag of ``report``, the round trip it
measures and sends, and how view, watch --status and top print them."""

from __future__ import annotations

import dataclasses
import io
import json
import time
from typing import Any

import pytest
from rich.console import Console

from membership._arbiters.calls import Liveness, ViewInfo, view_info
from membership._node.collector import StatusCollector
from membership._node.session import NodeSession
from membership.cli.output import event_lines, view_json, view_text
from membership.cli.top_view import Frame, RecentChange, node_order, render
from membership.shared import convert
from membership.shared.errors import InvalidArgument
from membership.shared.status import NodeStatus, rtt_to_send
from membership.shared.view import (
    Degradation,
    JobRanks,
    MemberChange,
    MemberState,
    StatusReport,
    StatusUpdated,
    View,
    ViewChanged,
)
from membership.v1 import membership_pb2 as pb

# --- the health flag ---------------------------------------------------------------------


def test_report_healthy_false_with_reason_then_true_clears_the_reason() -> None:
    c = StatusCollector(providers=[])
    c.report(healthy=False, reason="ECC errors on GPU 3", step=7)
    s = c.snapshot()
    assert (s.healthy, s.health_reason, s.step) == (False, "ECC errors on GPU 3", 7)
    wire = convert.status_to_pb(s)
    assert wire.HasField("healthy") and not wire.healthy
    assert convert.status_from_pb(wire) == s
    c.report(healthy=True)
    assert (c.snapshot().healthy, c.snapshot().health_reason) == (True, None)
    c.report(healthy=False, reason="again")
    c.clear("healthy")
    assert (c.snapshot().healthy, c.snapshot().health_reason, c.snapshot().step) == (None, None, 7)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"reason": "no flag"}, "reason goes with healthy=False"),
        ({"healthy": True, "reason": "well"}, "reason goes with healthy=False"),
        ({"healthy": "no"}, "healthy must be True or False"),
        ({"healthy": False, "reason": "x" * 257}, "MAX_HEALTH_REASON = 256"),
        ({"healthy": False, "reason": "bad\nline"}, "non-printable"),
    ],
)
def test_report_health_refuses_what_breaks_a_rule_and_changes_nothing(
    kwargs: dict[str, Any], match: str
) -> None:
    c = StatusCollector(providers=[])
    c.report(phase="train")
    with pytest.raises(InvalidArgument, match=match):
        c.report(**kwargs)
    assert c.snapshot() == NodeStatus(phase="train")


# --- the round trip ----------------------------------------------------------------------


def test_session_round_trip_is_the_median_of_recent_acks() -> None:
    s = NodeSession(node_id="n1", incarnation=5, arbiters=["a", "b", "c"])
    assert s.round_trip(0.0, within=1.0) is None
    for arbiter, sent, acked in (("a", 0.0, 0.002), ("b", 0.0, 0.010), ("c", 0.0, 0.004)):
        seq, _ = s.heartbeat(arbiter, sent)
        s.on_ack(
            arbiter,
            seq=seq,
            lease=0.5,
            state=MemberState.ALIVE,
            recorded_incarnation=5,
            epoch=1,
            now=acked,
        )
    assert s.round_trip(0.01, within=1.0) == pytest.approx(0.004)
    # An arbiter that stopped acking no longer counts: here only b acked within 0.5 s.
    seq, _ = s.heartbeat("b", 1.0)
    s.on_ack(
        "b", seq=seq, lease=0.5, state=MemberState.ALIVE, recorded_incarnation=5, epoch=1, now=1.02
    )
    assert s.round_trip(1.1, within=0.5) == pytest.approx(0.02)


@pytest.mark.parametrize(
    ("sent", "measured", "expect"),
    [
        (None, 0.0123456789, 0.012346),
        (0.010, 0.0115, 0.010),  # moved 15 %: kept
        (0.010, 0.0125, 0.0125),  # moved 25 %: sent
        (0.0002, 0.0009, 0.0002),  # moved 350 % but under a millisecond: kept
        (0.010, None, 0.010),  # nothing measured lately: the last one stays
    ],
)
def test_rtt_to_send_moves_only_past_its_deadband(
    sent: float | None, measured: float | None, expect: float
) -> None:
    assert rtt_to_send(sent, measured) == pytest.approx(expect)


# --- view, watch --status ----------------------------------------------------------------

ECC = Degradation(cause="unhealthy", reason="ECC errors on GPU 3")


def _info() -> ViewInfo:
    resp = pb.GetViewResponse(
        arbiter_id="a1",
        leader_id="a2",
        in_quorum=True,
        view=pb.View(
            epoch=9,
            members=[
                pb.Member(
                    node_id="n1",
                    incarnation=3,
                    state=pb.MEMBER_STATE_ALIVE,
                    labels={"job": "j1"},
                    status=pb.NodeStatus(step=120, phase="train", rtt_seconds=0.0021),
                    silence_seconds=0.05,
                    suspicion=0.3,
                    detector="missed",
                ),
                pb.Member(
                    node_id="n2",
                    incarnation=4,
                    state=pb.MEMBER_STATE_ALIVE,
                    status=pb.NodeStatus(healthy=False, health_reason=ECC.reason),
                    degraded=[pb.Degradation(cause=ECC.cause, reason=ECC.reason)],
                    silence_seconds=0.1,
                    suspicion=0.7,
                    detector="missed",
                    suspected_by=["a3"],
                ),
                pb.Member(node_id="n3", incarnation=5, state=pb.MEMBER_STATE_DEAD),
            ],
        ),
    )
    return view_info(resp)


def test_view_json_and_text_carry_degraded_marks_and_the_detector_reading() -> None:
    info = _info()
    assert info.degraded == {"n2": (ECC,)}
    assert info.liveness["n1"] == Liveness(silence=0.05, suspicion=0.3, detector="missed")
    assert "n3" not in info.liveness
    members = {m["node_id"]: m for m in view_json(info)["members"]}
    assert members["n2"]["degraded"] == [{"cause": "unhealthy", "reason": ECC.reason}]
    assert members["n2"]["status"]["healthy"] is False
    assert members["n1"]["degraded"] == [] and members["n1"]["suspicion"] == 0.3
    assert members["n1"]["status"]["rtt_seconds"] == 0.0021
    assert members["n1"]["detector"] == "missed" and members["n1"]["silence_seconds"] == 0.05
    assert "suspicion" not in members["n3"]
    text = "\n".join(view_text(info))
    assert "DEGRADED (unhealthy: ECC errors on GPU 3)" in text
    assert "UNHEALTHY" in text and "rtt 2.1ms" in text


def test_watch_status_lines_carry_degraded_marks() -> None:
    report = StatusReport(
        node_id="n2",
        incarnation=4,
        status=NodeStatus(healthy=False, health_reason=ECC.reason),
        degraded=(ECC,),
        suspicion=0.7,
        detector="phi",
    )
    ev = StatusUpdated(reports=(report,), arbiter_id="a1")
    [line] = event_lines(ev, as_json=True)
    d = json.loads(line)
    assert d["degraded"] == [{"cause": "unhealthy", "reason": ECC.reason}]
    assert (d["suspicion"], d["detector"]) == (0.7, "phi")
    assert d["status"] == {"healthy": False, "health_reason": ECC.reason}
    [text] = event_lines(ev, as_json=False)
    assert text.endswith("DEGRADED (unhealthy: ECC errors on GPU 3)")
    wire = pb.MembershipEvent(
        arbiter_id="a1",
        status=pb.StatusUpdate(
            nodes=[
                pb.NodeStatusReport(
                    node_id="n2",
                    incarnation=4,
                    degraded=[pb.Degradation(cause="unhealthy", reason=ECC.reason)],
                    suspicion=0.7,
                    detector="phi",
                )
            ]
        ),
    )
    decoded = convert.event_from_pb(wire)
    assert isinstance(decoded, StatusUpdated)
    assert decoded.reports[0].degraded == (ECC,) and decoded.reports[0].suspicion == 0.7


# --- top's frame -------------------------------------------------------------------------

REPLICAS = [
    {
        "arbiter": "a1",
        "address": "127.0.0.1:7001",
        "role": "leader",
        "term": 4,
        "leader": "a1",
        "in_quorum": True,
        "epoch": 9,
        "commit_index": 30,
        "applied_index": 30,
        "followers": {"a2": {"match_index": 30, "lag": 0}},
    },
    {"arbiter": "127.0.0.1:7002", "address": "127.0.0.1:7002", "error": "UNAVAILABLE: gone"},
]


def _draw(frame: Frame, plain: bool, width: int = 200) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=not plain, color_system=None).print(
        render(frame, plain=plain)
    )
    return out.getvalue()


def test_top_frame_orders_problem_nodes_first_and_explains_them() -> None:
    info = _info()
    assert [m.node_id for m in node_order(info)] == ["n2", "n1", "n3"]  # SUSPECT, ALIVE, DEAD
    change = RecentChange(seen=0.0, epoch=9, text="n3 (incarnation 5) DEAD; suspected by a1")
    text = _draw(Frame(at=0.0, replicas=REPLICAS, info=info, changes=[change]), plain=True)
    assert "\x1b" not in text
    rows = {
        ln.split()[0]: ln for ln in text.splitlines() if ln.split()[1:2] in (["ALIVE"], ["DEAD"])
    }
    assert "DEGRADED unhealthy SUSPECT by a3" in rows["n2"]
    assert "0.05s" in rows["n1"] and "0.3 missed" in rows["n1"] and "2.1ms" in rows["n1"]
    assert "n2 DEGRADED unhealthy: ECC errors on GPU 3" in text
    assert "UNAVAILABLE: gone" in text and "a2=0" in text
    assert "n3 (incarnation 5) DEAD; suspected by a1" in text


def test_top_frame_cuts_rows_to_the_terminal_and_reads_rank_and_grace_when_present() -> None:
    info = _info()
    ranked = tuple(
        dataclasses.replace(m, labels={**m.labels, "job": "j1"}, rank=1) if m.node_id == "n1" else m
        for m in info.view.members
    )
    job = JobRanks(job="j1", epoch=9, ranks={"n0": 0, "n1": 1})
    fake = dataclasses.replace(
        info,
        view=View(epoch=9, members=ranked, jobs=(job,)),
        graces={"n1": (42.0, "checkpoint")},
    )
    text = _draw(Frame(at=0.0, replicas=REPLICAS, info=fake, max_rows=2), plain=False)
    row = next(ln for ln in text.splitlines() if ln.startswith("n1 "))
    assert " 1/2 " in row and "GRACE 42s checkpoint" in row
    assert "... 1 more" in text and not any(ln.startswith("n3 ") for ln in text.splitlines())
    assert "─" in text  # a terminal gets the tables' rules


def test_top_recent_changes_from_before_top_started_show_earlier_not_its_start() -> None:
    """The history top replays at its start came all at one moment, not when it was
    committed: it once showed every replayed death at top's start time."""
    from membership.cli.top import _Recent

    recent = _Recent(keep=10)
    recent.started = 9  # the view's epoch when top started
    for epoch, node in ((8, "n3"), (10, "n4")):
        change = MemberChange(node_id=node, incarnation=5, state=MemberState.DEAD)
        recent.take(ViewChanged(epoch=epoch, changes=(change,), arbiter_id="a1"))
    old, new = recent.items
    assert (old.epoch, old.seen) == (8, None) and new.epoch == 10 and new.seen is not None
    text = _draw(Frame(at=0.0, replicas=REPLICAS, info=_info(), changes=[old, new]), plain=True)
    rows = [ln for ln in text.splitlines() if "(incarnation 5) DEAD" in ln]
    clock = time.strftime("%H:%M:%S", time.localtime(new.seen))
    assert rows[0].split()[:2] == [clock, "10"] and rows[1].split()[:2] == ["earlier", "8"]
