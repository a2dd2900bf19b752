"""The retransmission timer of proposals (arbiter/core/retry.py) and the observer using it."""

from __future__ import annotations

import math

import pytest

from arbiter.core.commands import Observation, ObserveBatch, encode
from arbiter.core.detection import MissedHeartbeatDetector
from arbiter.core.observer import Observer
from arbiter.core.retry import RetryTimer
from arbiter.core.tally import MembershipState


def test_retry_timer_keeps_the_floor_while_commits_are_fast() -> None:
    t = RetryTimer(0.5, 4.0)
    assert t.timeout == 0.5 and t.estimate is None
    for _ in range(20):
        t.sample(0.02)
    assert t.timeout == 0.5
    srtt, rttvar = t.estimate or (0, 0)
    assert srtt == pytest.approx(0.02) and rttvar < 0.01


def test_retry_timer_follows_rfc6298_estimates() -> None:
    t = RetryTimer(0.1, 100.0)
    t.sample(1.0)  # first: srtt = R, rttvar = R / 2
    assert t.estimate == (1.0, 0.5)
    assert t.timeout == pytest.approx(3.0)
    t.sample(2.0)  # rttvar = 3/4 0.5 + 1/4 |1 - 2|, srtt = 7/8 1 + 1/8 2
    srtt, rttvar = t.estimate or (0, 0)
    assert rttvar == pytest.approx(0.625) and srtt == pytest.approx(1.125)
    assert t.timeout == pytest.approx(1.125 + 4 * 0.625)


def test_retry_timer_backs_off_to_the_ceiling_and_a_sample_resets_it() -> None:
    t = RetryTimer(0.5, 4.0)
    timeouts = []
    for _ in range(6):
        t.retried()
        timeouts.append(t.timeout)
    assert timeouts == [1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    t.sample(0.01)
    assert t.timeout == 0.5


@pytest.mark.parametrize("bad", [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0), (0.5, math.inf)])
def test_retry_timer_refuses_bad_bounds(bad: tuple[float, float]) -> None:
    with pytest.raises(ValueError):
        RetryTimer(*bad)


def test_retry_timer_ignores_impossible_samples() -> None:
    t = RetryTimer(0.5, 4.0)
    t.sample(-1.0)
    t.sample(math.nan)
    assert t.estimate is None


def _observer() -> Observer:
    """a1's observer with a 0.5 s retry floor, a detector that suspects nobody here."""
    return Observer(
        replica_id="a1",
        detector=MissedHeartbeatDetector(interval=1.0, missed_limit=100),
        lease=1.0,
        retry_after=0.5,
        seq_base=1,
        now=0.0,
        restart_grace=0.0,
    )


def _commit(state: MembershipState, index: int, owed: tuple[Observation, ...]) -> None:
    state.apply(index, encode(ObserveBatch(replica_id="a1", observations=owed)))


def test_observer_does_not_repropose_faster_than_its_commits() -> None:
    """The feedback loop seen at 3,000 nodes: commits taking 2 s, retries every 0.5 s
    proposed every pending observation again before the first could commit."""
    state = MembershipState(("a1", "a2", "a3"))
    obs = _observer()
    index, now = 0, 0.0
    proposals = 0
    pending: list[tuple[float, tuple[Observation, ...]]] = []  # commit time, batch
    for k in range(40):  # a node joins every 0.5 s; each batch commits 2 s after it is proposed
        obs.heartbeat(f"n{k}", 1, {}, now, state)
        for at, batch in [p for p in pending if p[0] <= now]:
            index += 1
            _commit(state, index, batch)
            pending.remove((at, batch))
        out = obs.observations(now, state)
        if out:
            proposals += len(out)
            pending.append((now + 2.0, out))
        now += 0.5
    # 40 observations; a fixed 0.5 s retry proposes each about 4 times (and, every
    # one being retried, never gets a commit-time sample: Karn's rule).
    assert proposals < 40 * 1.5
    srtt, _ = obs.retry.estimate or (0.0, 0.0)
    assert srtt == pytest.approx(2.0, abs=0.01)
    assert obs.retry.timeout >= 2.0


def test_observer_resends_to_a_new_leader_without_backing_off() -> None:
    state = MembershipState(("a1", "a2", "a3"))
    obs = _observer()
    obs.heartbeat("n1", 1, {}, 0.0, state)
    assert len(obs.observations(0.0, state)) == 1  # lost: never committed
    assert len(obs.observations(0.5, state)) == 1  # a retry to the same leader
    assert obs.retry.timeout == 1.0  # backs off
    obs.new_leader()  # the replica saw a new leader: the timer starts over
    assert obs.retry.timeout == 0.5
    assert obs.observations(0.9, state) == ()
    assert len(obs.observations(1.0, state)) == 1  # re-sent to the new leader ...
    assert obs.retry.timeout == 0.5  # ... which is no sign of slow commits
    assert len(obs.observations(1.5, state)) == 1  # a real retry again
    assert obs.retry.timeout == 1.0
