"""History: retention, resume by epoch, publish, the slow-subscriber and reset rules."""

from __future__ import annotations

import pytest

from arbiter.core.history import Delivery, History, Start, after_reset, deliver
from arbiter.core.tally import ViewChange
from membership.shared.view import MemberChange, MemberState


def _change(epoch: int) -> ViewChange:
    c = MemberChange(node_id=f"n{epoch}", incarnation=1, state=MemberState.ALIVE)
    return ViewChange(epoch=epoch, changes=(c,))


def _history(size: int, epochs: range) -> History:
    h = History(size)
    for e in epochs:
        h.append(_change(e))
    return h


@pytest.mark.parametrize(
    ("size", "published", "since", "epoch", "start", "changes"),
    [
        # 2c: no resume point: a snapshot first, even of the empty view.
        pytest.param(4, range(1, 1), None, 0, Start.SNAPSHOT, [], id="fresh-empty-view"),
        pytest.param(4, range(1, 4), None, 3, Start.SNAPSHOT, [], id="fresh-retained"),
        # 2a: level with or ahead of this replica: nothing yet.
        pytest.param(4, range(1, 1), 0, 0, Start.WAIT, [], id="level-at-zero"),
        pytest.param(4, range(1, 4), 3, 3, Start.WAIT, [], id="level"),
        pytest.param(4, range(1, 2), 3, 1, Start.WAIT, [], id="ahead"),
        pytest.param(0, range(1, 4), 5, 3, Start.WAIT, [], id="ahead-nothing-retained"),
        # 2b: epoch since + 1 retained: exactly the missing changes.
        pytest.param(4, range(1, 5), 2, 4, Start.CHANGES, [3, 4], id="within"),
        pytest.param(4, range(1, 5), 0, 4, Start.CHANGES, [1, 2, 3, 4], id="from-zero-all-kept"),
        pytest.param(3, range(1, 8), 4, 7, Start.CHANGES, [5, 6, 7], id="oldest-retained-is-next"),
        pytest.param(3, range(1, 8), 6, 7, Start.CHANGES, [7], id="one-behind"),
        # 2c: epoch since + 1 gone: a snapshot, never a gap.
        pytest.param(3, range(1, 8), 3, 7, Start.SNAPSHOT, [], id="next-compacted-away"),
        pytest.param(3, range(1, 8), 0, 7, Start.SNAPSHOT, [], id="from-zero-start-gone"),
        pytest.param(0, range(1, 4), 2, 3, Start.SNAPSHOT, [], id="size-zero-retains-none"),
        pytest.param(4, range(1, 1), 1, 5, Start.SNAPSHOT, [], id="empty-after-restart"),
    ],
)
def test_history_resume(
    size: int,
    published: range,
    since: int | None,
    epoch: int,
    start: Start,
    changes: list[int],
) -> None:
    resume = _history(size, published).resume(since, epoch)
    assert resume.start is start
    assert [c.epoch for c in resume.changes] == changes


def test_history_keeps_only_the_last_size_changes_in_order() -> None:
    h = _history(3, range(1, 8))
    assert [c.epoch for c in h] == [5, 6, 7]
    assert len(h) == 3
    assert (h.retains(4), h.retains(5), h.retains(9)) == (False, True, True)


def test_history_clear_forgets_so_a_resume_behind_gets_a_snapshot() -> None:
    h = _history(8, range(1, 5))
    assert h.resume(2, 4).start is Start.CHANGES
    h.clear()
    assert len(h) == 0 and not h.retains(3)
    assert h.resume(2, 9).start is Start.SNAPSHOT
    assert h.resume(9, 9).start is Start.WAIT


@pytest.mark.parametrize(
    ("epoch", "has", "backlog", "limit", "expected"),
    [
        pytest.param(5, 4, 0, None, Delivery.CHANGE, id="next-unbounded"),
        pytest.param(5, 5, 0, None, Delivery.SKIP, id="has-it"),
        pytest.param(5, 7, 0, None, Delivery.SKIP, id="ahead"),
        pytest.param(5, 4, 7, 8, Delivery.CHANGE, id="room-for-one-more"),
        pytest.param(5, 4, 8, 8, Delivery.SNAPSHOT, id="backlog-at-limit"),
        pytest.param(5, 4, 100, None, Delivery.CHANGE, id="no-limit-no-snapshot"),
        pytest.param(5, 6, 8, 8, Delivery.SKIP, id="full-but-has-it"),
    ],
)
def test_history_deliver(
    epoch: int, has: int, backlog: int, limit: int | None, expected: Delivery
) -> None:
    assert deliver(epoch, has, backlog, limit) is expected


@pytest.mark.parametrize(
    ("has", "epoch", "expected"),
    [
        pytest.param(2, 5, Delivery.SNAPSHOT, id="behind"),
        pytest.param(0, 5, Delivery.SNAPSHOT, id="empty"),
        pytest.param(5, 5, Delivery.SKIP, id="level"),
        pytest.param(9, 5, Delivery.SKIP, id="ahead"),
    ],
)
def test_history_after_reset(has: int, epoch: int, expected: Delivery) -> None:
    assert after_reset(has, epoch) is expected
