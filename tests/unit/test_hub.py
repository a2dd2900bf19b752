"""Hub: resume by epoch, snapshot when the resume point is gone, bounded queues."""

from __future__ import annotations

from arbiter.core.tally import ViewChange
from arbiter.server.hub import Hub, HubStatus
from membership.view import MemberChange, MemberState, View


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
