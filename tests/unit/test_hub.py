"""Hub: resume by epoch, snapshot when the resume point is gone, bounded queues."""

from __future__ import annotations

import asyncio

import pytest

from arbiter.core.tally import ViewChange
from arbiter.server.fanout.hub import PULSE_SLOTS, Hub, HubStatus, Marker, NotReading
from membership.shared.view import MemberChange, MemberState, View


class Views:
    """A view that grows one member per change, like the state machine's."""

    def __init__(self) -> None:
        self.view = View()

    def change(self, epoch: int) -> ViewChange:
        c = MemberChange(node_id=f"n{epoch}", incarnation=1, state=MemberState.ALIVE)
        self.view = self.view.with_changes(epoch, (c,))
        return ViewChange(epoch=epoch, changes=(c,))


def _hub(views: Views, history: int = 4, queue: int = 8) -> Hub:
    return Hub(view=lambda: views.view, history_size=history, queue_limit=queue)


def _epochs(items: list[object]) -> list[tuple[str, int]]:
    out = []
    for it in items:
        if isinstance(it, View):
            out.append(("snapshot", it.epoch))
        elif isinstance(it, ViewChange):
            out.append(("change", it.epoch))
    return out


def test_hub_since_zero_gets_snapshot_then_changes() -> None:
    views = Views()
    hub = _hub(views)
    hub.publish(views.change(1))
    sub = hub.subscribe(0)
    hub.publish(views.change(2))
    assert _epochs(list(sub.queue)) == [("snapshot", 1), ("change", 2)]


def test_hub_resume_within_history_gets_exactly_the_missing_changes() -> None:
    views = Views()
    hub = _hub(views)
    for e in range(1, 5):
        hub.publish(views.change(e))
    sub = hub.subscribe(2)
    assert _epochs(list(sub.queue)) == [("change", 3), ("change", 4)]


def test_hub_resume_point_no_longer_retained_gets_snapshot_never_a_gap() -> None:
    views = Views()
    hub = _hub(views, history=3)
    for e in range(1, 8):
        hub.publish(views.change(e))
    sub = hub.subscribe(2)  # epochs 3 and 4 are gone from the history
    assert _epochs(list(sub.queue)) == [("snapshot", 7)]


def test_hub_subscriber_ahead_of_replica_waits_for_it() -> None:
    views = Views()
    hub = _hub(views)
    hub.publish(views.change(1))
    sub = hub.subscribe(3)  # it saw epoch 3 on another replica
    assert list(sub.queue) == []
    for e in (2, 3, 4):
        hub.publish(views.change(e))
    assert _epochs(list(sub.queue)) == [("change", 4)]


def test_hub_slow_subscriber_queue_is_replaced_by_one_snapshot() -> None:
    views = Views()
    hub = _hub(views, history=100, queue=8)
    sub = hub.subscribe(0)
    for e in range(1, 30):
        hub.publish(views.change(e))
    assert len(sub.queue) <= 8
    kinds = _epochs(list(sub.queue))
    # A snapshot at some epoch s, then every change after s: nothing lost silently.
    first_kind, s = kinds[0]
    assert first_kind == "snapshot"
    assert kinds[1:] == [("change", e) for e in range(s + 1, 30)]
    assert hub.snapshots_for_slowness >= 1


def test_hub_status_reaches_every_subscriber_and_close_ends_them() -> None:
    views = Views()
    hub = _hub(views)
    a, b = hub.subscribe(0), hub.subscribe(0)
    hub.publish_status(HubStatus(in_quorum=False, leader_id=None, epoch=0))
    for sub in (a, b):
        assert isinstance(sub.queue[-1], HubStatus)
    hub.close_all()
    assert a.closed and b.closed
    hub.unsubscribe(a)
    assert hub.subscribers == 1


def test_hub_reset_after_raft_snapshot_sends_fresh_view_to_subscribers_behind() -> None:
    views = Views()
    hub = _hub(views)
    hub.publish(views.change(1))
    behind = hub.subscribe(1)
    ahead = hub.subscribe(9)  # resumed from a replica that was further on
    for e in range(2, 6):  # the state machine jumps to epoch 5 without the changes
        views.change(e)
    hub.reset()
    assert _epochs(list(behind.queue)) == [("snapshot", 5)]
    assert _epochs(list(ahead.queue)) == []
    hub.publish(views.change(6))
    assert _epochs(list(behind.queue)) == [("snapshot", 5), ("change", 6)]
    late = hub.subscribe(3)  # epoch 4 is not in the history any more
    assert _epochs(list(late.queue)) == [("snapshot", 6)]


# --- the fan-out's timing (hub.py rules 2 to 4) ------------------------------------------


def test_hub_pulse_sends_progress_only_to_streams_idle_for_the_interval() -> None:
    views = Views()
    hub = Hub(view=lambda: views.view, history_size=4, queue_limit=8, progress_interval=1.0)
    subs = [hub.subscribe(0, now=0.0) for _ in range(PULSE_SLOTS)]
    for sub in subs:
        sub.queue.clear()  # the snapshot was written at 0.0
    hub.pulse(0.5)
    assert all(not s.queue for s in subs)
    # Due within the last quarter of the interval, each at its own offset: not all at once.
    due = []
    for t in (0.8, 0.85, 0.9, 0.95, 1.0):
        hub.pulse(t)
        due.append(sum(1 for s in subs if s.queue))
    assert due[0] < due[-1] == PULSE_SLOTS
    assert all(list(s.queue) == [Marker.PROGRESS] for s in subs)  # one each, not one a pulse


def test_hub_progress_not_yet_written_gives_way_to_a_change() -> None:
    views = Views()
    hub = _hub(views)
    sub = hub.subscribe(0, now=0.0)
    sub.queue.clear()
    hub.pulse(2.0)
    assert list(sub.queue) == [Marker.PROGRESS]
    hub.publish(views.change(1))
    assert _epochs(list(sub.queue)) == [("change", 1)] and len(sub.queue) == 1


async def test_hub_get_skips_a_progress_marker_followed_by_anything() -> None:
    views = Views()
    hub = _hub(views)
    sub = hub.subscribe(0, now=0.0)
    sub.queue.clear()
    sub.queue.extend([Marker.PROGRESS, HubStatus(in_quorum=True, leader_id="a1", epoch=0)])
    assert isinstance(await sub.get(), HubStatus)


def test_hub_status_items_come_after_the_view_then_every_status_interval() -> None:
    views = Views()
    hub = _hub(views)
    hub.publish(views.change(1))
    sub = hub.subscribe(0, status_every=2.0, now=0.0)
    assert _epochs(list(sub.queue)) == [("snapshot", 1)] and sub.queue[-1] is Marker.STATUS
    sub.queue.clear()
    hub.pulse(0.5)  # not due (nor is a progress marker: written at 0.0)
    assert not sub.queue
    hub.pulse(2.0)
    assert list(sub.queue) == [Marker.STATUS]
    plain = hub.subscribe(0, now=0.0)
    assert Marker.STATUS not in plain.queue


async def test_hub_stream_waits_without_a_timer_and_is_woken_by_a_change() -> None:
    views = Views()
    hub = _hub(views)
    sub = hub.subscribe(0, now=0.0)
    assert isinstance(await sub.get(), View)
    loop = asyncio.get_running_loop()
    timers = len(loop._scheduled)  # type: ignore[attr-defined]
    getting = asyncio.ensure_future(sub.get())
    await asyncio.sleep(0)
    assert not getting.done()
    assert len(loop._scheduled) == timers  # type: ignore[attr-defined]
    hub.publish(views.change(1))
    item = await asyncio.wait_for(getting, 5)
    assert isinstance(item, ViewChange) and item.epoch == 1
    hub.close_all()
    assert await asyncio.wait_for(sub.get(), 5) is None


async def test_hub_write_waiting_past_the_timeout_raises_not_reading() -> None:
    views = Views()
    hub = Hub(view=lambda: views.view, history_size=4, queue_limit=8, write_timeout=5.0)
    sub = hub.subscribe(0, now=0.0)
    blocked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    written: list[bytes] = []

    async def write(data: bytes) -> None:
        written.append(data)
        await blocked  # the subscriber does not read: gRPC never takes it

    writing = asyncio.ensure_future(sub.write(write, b"event", 5.0))
    while sub.writing_since is None:
        await asyncio.sleep(0)
    hub.pulse(sub.writing_since + 4.0)
    await asyncio.sleep(0)
    assert not writing.done()
    hub.pulse(sub.writing_since + 5.0)
    with pytest.raises(NotReading):
        await asyncio.wait_for(writing, 5)
    assert written == [b"event"] and hub.not_reading == 1
    # A write that gRPC takes is no such thing, and marks the stream's silence from then.
    await sub.write(_taken, b"next", 5.0)
    assert sub.writing_since is None and sub.sent_at > 0


async def _taken(data: bytes) -> None:
    return None
