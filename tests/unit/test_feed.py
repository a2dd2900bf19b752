"""membership._watch.feed: the subscriber's decisions with time passed in (no I/O)."""

from __future__ import annotations

import pytest

from membership._watch.feed import FeedState
from membership.shared.errors import EpochOutOfRange
from membership.shared.view import (
    Disconnected,
    MemberChange,
    MemberState,
    ProgressMarker,
    QuorumChanged,
    Reconnected,
    StatusUpdated,
    View,
    ViewChanged,
    ViewReset,
    ViewSnapshot,
)

A1, A2, A3 = "10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"
IDLE, DISCONNECT, PROBE = 3.0, 3.0, 1.0


def _feed(since: int = 0, *, reset: bool = False, status: bool = False) -> FeedState:
    return FeedState(
        since_epoch=since,
        include_status=status,
        idle_timeout=IDLE,
        disconnect_after=DISCONNECT,
        probe_interval=PROBE,
        reset_if_ahead=reset,
        arbiters=3,
        now=0.0,
    )


def _quorum(ok: bool = True, epoch: int = 0) -> QuorumChanged:
    return QuorumChanged(in_quorum=ok, arbiter_id="a1", epoch=epoch)


def _change(epoch: int, node: str = "n1", state: MemberState = MemberState.ALIVE) -> ViewChanged:
    return ViewChanged(
        epoch=epoch,
        changes=(MemberChange(node_id=node, incarnation=1, state=state),),
        arbiter_id="a1",
    )


def _served(feed: FeedState, address: str = A1, now: float = 0.0) -> list[object]:
    """Opens ``address`` and feeds its first message (quorum: yes)."""
    assert feed.take_resubscribe() is not None or feed.serving is not None
    feed.opened(address, "a1", now)
    return list(feed.on_event(address, _quorum(), now))


def test_feed_starts_with_a_decision_to_subscribe_from_the_given_epoch() -> None:
    feed = _feed(since=7)
    decision = feed.take_resubscribe()
    assert decision is not None and decision.since_epoch == 7
    assert feed.take_resubscribe() is None


def test_feed_passes_changes_in_order_once_and_folds_the_view() -> None:
    feed = _feed()
    _served(feed)
    snap = ViewSnapshot(view=View(epoch=4), arbiter_id="a1")
    assert feed.on_event(A1, snap, 0.1) == [snap]
    assert feed.on_event(A1, _change(5), 0.2) == [_change(5)]
    assert feed.on_event(A1, _change(5), 0.3) == []  # duplicate (resume overlap)
    assert feed.on_event(A1, _change(4), 0.3) == []
    assert feed.last_epoch == 5
    member = feed.view.get("n1")
    assert member is not None and member.state is MemberState.ALIVE and feed.view.epoch == 5
    assert feed.pending is None


def test_feed_gap_resubscribes_on_the_same_arbiter_from_the_last_epoch() -> None:
    feed = _feed()
    _served(feed)
    feed.on_event(A1, ViewSnapshot(view=View(epoch=4)), 0.1)
    assert feed.on_event(A1, _change(6), 0.2) == []
    decision = feed.take_resubscribe()
    assert decision is not None
    assert (decision.since_epoch, decision.prefer) == (4, A1)
    assert "gap" in decision.reason


def test_feed_snapshot_behind_the_view_held_moves_elsewhere() -> None:
    feed = _feed(since=9)
    _served(feed)
    assert feed.on_event(A1, ViewSnapshot(view=View(epoch=8)), 0.1) == []
    decision = feed.take_resubscribe()
    assert decision is not None and decision.avoid == A1 and decision.since_epoch == 9


def test_feed_ignores_messages_of_a_subscription_it_left() -> None:
    feed = _feed()
    _served(feed, A1)
    feed.opened(A2, "a2", 1.0)
    assert feed.on_event(A1, _change(1), 1.1) == []
    assert feed.last_epoch == 0


def test_feed_reports_disconnected_once_then_reconnected() -> None:
    feed = _feed()
    _served(feed, A1, 0.0)
    feed.on_event(A1, ViewSnapshot(view=View(epoch=3)), 0.0)
    assert feed.tick(2.9) == []
    feed.on_failure(A1, "UNAVAILABLE: connection reset", 1.0)
    (lost,) = feed.tick(3.0)
    assert isinstance(lost, Disconnected)
    assert (lost.epoch, lost.silence, lost.arbiter_id) == (3, 3.0, "a1")
    assert "connection reset" in lost.reason
    assert feed.tick(10.0) == []  # once per loss
    feed.opened(A2, "a2", 10.0)
    events = feed.on_event(A2, _quorum(), 10.5)
    assert events[-1] == Reconnected(epoch=3, arbiter_id="a2", silence=10.5)
    assert not feed.disconnected


def test_feed_progress_markers_keep_contact_and_the_stream() -> None:
    feed = _feed()
    _served(feed, A1, 0.0)
    for t in range(1, 20):
        assert feed.on_event(A1, ProgressMarker(epoch=0, in_quorum=True, interval=1.0), t) == []
        assert feed.tick(t + 0.9) == []
    assert feed.pending is None and not feed.disconnected


def test_feed_replica_without_quorum_is_no_contact() -> None:
    feed = _feed()
    feed.take_resubscribe()
    feed.opened(A1, "a1", 0.0)
    (lost_quorum,) = feed.on_event(A1, _quorum(ok=False), 0.0)
    assert isinstance(lost_quorum, QuorumChanged) and not lost_quorum.in_quorum
    for t in (1.0, 2.0):
        feed.on_event(A1, ProgressMarker(epoch=0, in_quorum=False, interval=1.0), t)
    (lost,) = feed.tick(3.0)
    assert isinstance(lost, Disconnected)


def test_feed_idle_stream_is_abandoned_after_the_timeout_or_announced_intervals() -> None:
    feed = _feed()
    _served(feed, A1, 0.0)
    assert feed.tick(IDLE - 0.01) == [] and feed.pending is None
    feed.tick(IDLE)
    decision = feed.pending
    assert decision is not None and decision.avoid == A1
    # A replica that announces 2 s markers is kept for 2.5 of them.
    slow = _feed()
    _served(slow, A1, 0.0)
    slow.on_event(A1, ProgressMarker(epoch=0, in_quorum=True, interval=2.0), 0.0)
    slow.tick(4.9)
    assert slow.pending is None and slow.idle_timeout == 5.0
    slow.tick(5.0)
    assert slow.pending is not None


def test_feed_lost_quorum_asks_for_probes_then_moves_to_the_one_found() -> None:
    feed = _feed()
    _served(feed, A1, 0.0)
    assert not feed.wants_probe(0.0)
    (ev,) = feed.on_event(A1, _quorum(ok=False), 1.0)
    assert isinstance(ev, QuorumChanged) and not ev.in_quorum
    assert feed.wants_probe(1.0) and not feed.wants_probe(1.5)
    assert feed.wants_probe(2.0)
    feed.quorum_found(A3)
    decision = feed.pending
    assert decision is not None and decision.prefer == A3


def test_feed_quorum_regained_is_reported_only_after_a_loss() -> None:
    feed = _feed()
    assert _served(feed) == []  # a first "in quorum" is not news
    feed.opened(A2, "a2", 1.0)
    assert feed.on_event(A2, _quorum(), 1.0) == []
    feed.on_event(A2, _quorum(ok=False), 2.0)
    (back,) = feed.on_event(A2, _quorum(), 3.0)
    assert isinstance(back, QuorumChanged) and back.in_quorum


@pytest.mark.parametrize("asked", [False, True])
def test_feed_status_events_pass_only_when_asked(asked: bool) -> None:
    feed = _feed(status=asked)
    _served(feed)
    ev = StatusUpdated(reports=())
    assert feed.on_event(A1, ev, 0.1) == ([ev] if asked else [])


def test_feed_future_epoch_needs_a_second_arbiter_then_raises() -> None:
    feed = _feed(since=9999)
    _served(feed, A1)
    feed.on_event(A1, _quorum(epoch=40), 0.1)
    assert feed.on_out_of_range(A1, 1.0) == []
    decision = feed.take_resubscribe()
    assert decision is not None and decision.avoid == A1 and decision.since_epoch == 9999
    feed.opened(A2, "a2", 1.1)
    feed.on_event(A2, _quorum(epoch=40), 1.1)
    with pytest.raises(EpochOutOfRange) as info:
        feed.on_out_of_range(A2, 2.0)
    assert (info.value.since_epoch, info.value.cluster_epoch) == (9999, 40)


def test_feed_future_epoch_refused_three_times_by_the_only_answering_arbiter_raises() -> None:
    feed = _feed(since=50)
    for t in (1.0, 2.0):
        feed.opened(A1, "a1", t)
        feed.on_event(A1, _quorum(epoch=40), t)
        assert feed.on_out_of_range(A1, t) == []
    feed.opened(A1, "a1", 3.0)
    with pytest.raises(EpochOutOfRange):
        feed.on_out_of_range(A1, 3.0)


def test_feed_future_epoch_with_reset_starts_again_from_a_snapshot() -> None:
    feed = _feed(since=9999, reset=True)
    for addr, t in ((A1, 1.0), (A2, 2.0)):
        feed.opened(addr, "a", t)
        feed.on_event(addr, _quorum(epoch=40), t)
        events = feed.on_out_of_range(addr, t)
    assert events == [ViewReset(since_epoch=9999, cluster_epoch=40)]
    decision = feed.take_resubscribe()
    assert decision is not None and decision.since_epoch == 0 and feed.last_epoch == 0


def test_feed_real_epoch_after_one_refusal_clears_the_count() -> None:
    feed = _feed(since=41)
    feed.opened(A1, "a1", 0.0)
    feed.on_event(A1, _quorum(epoch=40), 0.0)
    feed.on_out_of_range(A1, 1.0)  # a lagging follower
    feed.opened(A2, "a2", 1.0)
    feed.on_event(A2, _quorum(epoch=42), 1.0)
    assert feed.on_event(A2, _change(42), 1.1) == [_change(42)]
    feed.opened(A3, "a3", 2.0)
    feed.on_event(A3, _quorum(epoch=42), 2.0)
    assert feed.on_out_of_range(A3, 3.0) == []  # one refusal again, not two


@pytest.mark.parametrize("heard", ["served", "reported"])
def test_feed_epoch_known_committed_is_never_beyond_the_cluster(heard: str) -> None:
    """The watcher holds epoch 6: served by a1, or given by the caller and reported by
    a1 as its own. a1 goes, and a2 and a3, which have not applied 6 yet, refuse it
    (OUT_OF_RANGE): they lag, it is no reset ("since_epoch 6 is beyond the cluster's
    epoch 6" was raised before)."""
    feed = _feed(since=5 if heard == "served" else 6)
    _served(feed, A1)
    if heard == "served":
        assert feed.on_event(A1, _change(6), 0.1) == [_change(6)]
    else:
        feed.on_event(A1, _quorum(epoch=6), 0.1)
    feed.on_failure(A1, "UNAVAILABLE", 0.5)
    for addr, t in ((A2, 1.0), (A3, 2.0), (A2, 3.0), (A3, 4.0)):
        decision = feed.take_resubscribe()
        assert decision is not None and decision.since_epoch == 6
        feed.opened(addr, addr, t)
        feed.on_event(addr, _quorum(epoch=5), t)
        assert feed.on_out_of_range(addr, t + 0.5) == []
        assert feed.serving is None
    decision = feed.take_resubscribe()
    assert decision is not None and decision.avoid == A3 and decision.since_epoch == 6


def test_feed_next_deadline_covers_idle_disconnect_and_probe() -> None:
    feed = _feed()
    assert feed.next_deadline() == DISCONNECT  # nothing served yet: only the contact clock
    _served(feed, A1, 0.0)
    assert feed.next_deadline() == min(IDLE, DISCONNECT)
    feed.on_event(A1, _quorum(ok=False), 1.0)
    assert feed.next_deadline() == 1.0  # the probe is due at once


def test_feed_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError):
        FeedState(
            since_epoch=-1,
            include_status=False,
            idle_timeout=1,
            disconnect_after=1,
            probe_interval=1,
            now=0,
        )
    with pytest.raises(ValueError):
        FeedState(
            since_epoch=0,
            include_status=False,
            idle_timeout=0,
            disconnect_after=1,
            probe_interval=1,
            now=0,
        )


def test_feed_another_instance_of_the_cluster_is_a_reset() -> None:
    # Rule 7: the watcher followed instance "aa"; a replica now serves "bb"
    # (the cluster was started again on fresh data dirs): its epochs are another
    # history, even where the numbers exist.
    feed = _feed()
    feed.take_resubscribe()
    assert feed.opened(A1, "a1", 0.0, instance="aa", epoch=0) == []
    feed.on_event(A1, ViewSnapshot(view=View(epoch=7)), 0.1)
    assert feed.instance == "aa"
    with pytest.raises(EpochOutOfRange, match="reset") as info:
        feed.opened(A2, "a2", 1.0, instance="bb", epoch=9)
    assert (info.value.since_epoch, info.value.cluster_epoch) == (7, 9)
    reset = _feed(reset=True)
    reset.take_resubscribe()
    reset.opened(A1, "a1", 0.0, instance="aa")
    reset.on_event(A1, ViewSnapshot(view=View(epoch=7)), 0.1)
    assert reset.opened(A2, "a2", 1.0, instance="bb", epoch=9) == [
        ViewReset(since_epoch=7, cluster_epoch=9)
    ]
    decision = reset.take_resubscribe()
    assert decision is not None and decision.since_epoch == 0 and reset.instance == ""
    # A replica that has no instance yet (a cluster just started) is no evidence.
    fresh = _feed()
    fresh.take_resubscribe()
    fresh.opened(A1, "a1", 0.0, instance="aa")
    assert fresh.opened(A2, "a2", 1.0, instance="") == [] and fresh.instance == "aa"


def test_feed_given_instance_is_kept_only_with_an_epoch() -> None:
    assert _feed_with(since=5, instance="aa").instance == "aa"
    assert _feed_with(since=0, instance="aa").instance == ""


def _feed_with(*, since: int, instance: str) -> FeedState:
    return FeedState(
        since_epoch=since,
        include_status=False,
        idle_timeout=IDLE,
        disconnect_after=DISCONNECT,
        probe_interval=PROBE,
        instance=instance,
        now=0.0,
    )
