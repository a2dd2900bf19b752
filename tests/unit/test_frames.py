"""EventFrames: subscriber events serialised once per replica, exactly as a fresh encoding."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc

from arbiter.core.degraded import DegradedPolicy
from arbiter.core.tally import ViewChange
from arbiter.server.consensus.arbiterset import ArbiterSet
from arbiter.server.fanout.degradation import DegradedMarks
from arbiter.server.fanout.encoding import ViewEncoder
from arbiter.server.fanout.frames import SERVICE, EventFrames, add_membership_service
from arbiter.server.fanout.hub import HubStatus
from arbiter.server.fanout.statusboard import StatusBoard
from membership.shared import convert
from membership.shared.view import Member, MemberChange, MemberState, View
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc


@dataclass
class State:
    """The few reads of the applied state that the frames make."""

    epoch: int = 3
    instance: str = "i1"
    applied_index: int = 10
    suspects: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def member(self, node_id: str) -> Member | None:
        return None

    def suspected_by(self, node_id: str) -> tuple[str, ...]:
        return self.suspects.get(node_id, ())


@dataclass
class FakeDriver:
    replica_id: str = "a1"
    state: State = field(default_factory=State)


ARBITERS = ArbiterSet(voters={"a1": "h:1", "a2": "h:2", "a3": "h:3"}, index=7)


def _frames() -> tuple[EventFrames, FakeDriver]:
    driver = FakeDriver()
    board = StatusBoard()
    marks = DegradedMarks(driver, board, DegradedPolicy())  # type: ignore[arg-type]
    views = ViewEncoder(driver, board, marks)  # type: ignore[arg-type]
    frames = EventFrames(driver, views, "c@d", lambda: ARBITERS, 1.0)  # type: ignore[arg-type]
    return frames, driver


def test_frames_change_is_the_event_a_fresh_encoding_gives_made_once() -> None:
    frames, driver = _frames()
    c = MemberChange(node_id="n1", incarnation=2, state=MemberState.DEAD)
    change = ViewChange(epoch=4, changes=(c,))
    data = frames.change(change)
    expected = pb.MembershipEvent(
        arbiter_id="a1",
        cluster="c@d",
        instance="i1",
        change=pb.ViewChange(epoch=4, changes=[convert.change_to_pb(c)]),
    )
    assert data == expected.SerializeToString()
    assert frames.change(change) is data  # every stream writes the same bytes
    driver.state.instance = "i2"  # another history: its own event
    assert pb.MembershipEvent.FromString(frames.change(change)).instance == "i2"


def test_frames_snapshot_follows_the_suspicions_applied_since() -> None:
    frames, driver = _frames()
    m = Member(node_id="n1", incarnation=1, state=MemberState.ALIVE, epoch=2)
    view = View(epoch=3, members=(m,))
    first = frames.snapshot(view)
    assert frames.snapshot(View(epoch=3, members=(m,))) is first
    driver.state.suspects["n1"] = ("a2",)
    driver.state.applied_index += 1  # the suspicion was committed and applied
    event = pb.MembershipEvent.FromString(frames.snapshot(view))
    assert list(event.snapshot.view.members[0].suspected_by) == ["a2"]
    assert event.snapshot.view.epoch == 3 and event.arbiter_id == "a1"


def test_frames_quorum_and_progress_carry_the_arbiters_and_follow_the_epoch() -> None:
    frames, driver = _frames()
    status = HubStatus(in_quorum=True, leader_id="a2", epoch=3)
    quorum = pb.MembershipEvent.FromString(frames.quorum(status))
    assert (quorum.quorum.leader_id, quorum.quorum.epoch, quorum.quorum.config_index) == (
        "a2",
        3,
        7,
    )
    assert [a.id for a in quorum.quorum.arbiters] == ["a1", "a2", "a3"]
    progress = frames.progress(True)
    assert frames.progress(True) is progress
    got = pb.MembershipEvent.FromString(progress).progress
    assert (got.epoch, got.in_quorum, got.progress_interval_seconds) == (3, True, 1.0)
    driver.state.epoch = 4
    assert pb.MembershipEvent.FromString(frames.progress(False)).progress.epoch == 4


class _Server:
    def __init__(self) -> None:
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        assert service == SERVICE
        self.handlers = handlers


def test_frames_service_has_every_method_and_subscribe_writes_bytes() -> None:
    server = _Server()
    add_membership_service(pb_grpc.MembershipServicer(), server)  # type: ignore[arg-type]
    methods = pb.DESCRIPTOR.services_by_name["Membership"].methods
    assert sorted(server.handlers) == sorted(m.name for m in methods)
    subscribe = server.handlers["Subscribe"]
    assert subscribe.unary_stream is not None and subscribe.response_serializer is None
    assert server.handlers["GetView"].response_serializer is not None
    assert isinstance(subscribe, grpc.RpcMethodHandler)
