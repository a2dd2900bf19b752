"""The batching of owed observations (arbiter/core/batching.py): time passed in, no Raft."""

from __future__ import annotations

import itertools
import math

import pytest

from arbiter.core.batching import BatchPacer
from arbiter.core.commands import Observation, ObserveBatch, Opinion, encode
from arbiter.core.detection import MissedHeartbeatDetector
from arbiter.core.observer import Observer
from arbiter.core.tally import MembershipState
from membership.shared.view import MemberState

REPLICAS = ("a1", "a2", "a3")
BATCH = 0.2
RETRY = 0.5


class Log:
    """Commits observation batches straight into a state machine."""

    def __init__(self) -> None:
        self.state = MembershipState(REPLICAS)
        self.index = 0

    def commit(self, replica: str, observations: tuple[Observation, ...]) -> None:
        self.index += 1
        self.state.apply(
            self.index, encode(ObserveBatch(replica_id=replica, observations=observations))
        )


def _observer(*, leading: bool, replica: str = "a1", batch: float = BATCH) -> Observer:
    obs = Observer(
        replica_id=replica,
        detector=MissedHeartbeatDetector(interval=0.1, missed_limit=5),
        lease=0.5,
        retry_after=RETRY,
        seq_base=1000,
        now=0.0,
        restart_grace=0.0,
        batch_interval=batch,
    )
    obs.pacer.leading = leading
    return obs


def _ids(observations: tuple[Observation, ...]) -> list[str]:
    return [o.node_id for o in observations]


# --- the pacer alone (rules 2 to 4) ------------------------------------------------------


def test_batching_pacer_leader_leading_edge_then_trailing_edge() -> None:
    p = BatchPacer(BATCH)
    p.leading = True
    assert p.release_at(5.0) == 5.0  # nothing went out before: at once
    p.released(5.0, 5.0)
    assert p.release_at(5.05) == pytest.approx(5.2)  # within the interval: at its end
    assert p.release_at(5.3) == 5.3  # a quiet interval passed: at once again


def test_batching_pacer_follower_waits_twice_the_interval_for_what_never_follows() -> None:
    p = BatchPacer(BATCH)
    assert p.follow_wait == pytest.approx(2 * BATCH)
    assert p.release_at(5.0) == pytest.approx(5.0 + 2 * BATCH)


def test_batching_pacer_interval_zero_releases_at_once() -> None:
    p = BatchPacer(0.0)
    p.leading = True
    p.released(1.0, 1.0)
    assert p.release_at(1.01) == 1.01
    p.leading = False
    assert p.release_at(1.01) == 1.01


@pytest.mark.parametrize("bad", [-0.1, math.inf, math.nan])
def test_batching_pacer_refuses_a_bad_interval(bad: float) -> None:
    with pytest.raises(ValueError, match="interval"):
        BatchPacer(bad)


# --- the observer with a pacer (rule 1 and the observer's rule 2) ------------------------


def test_batching_leader_lone_join_goes_out_at_once() -> None:
    log, obs = Log(), _observer(leading=True)
    obs.heartbeat("n1", 1, {}, 10.0, log.state)
    assert _ids(obs.observations(10.0, log.state)) == ["n1"]


def test_batching_leader_storm_is_cut_into_one_batch_per_interval() -> None:
    log, obs = Log(), _observer(leading=True)
    obs.heartbeat("n0", 1, {}, 10.0, log.state)
    first = obs.observations(10.0, log.state)
    assert _ids(first) == ["n0"]  # leading edge
    log.commit("a1", first)
    proposed: list[list[str]] = []
    now = 10.0
    for i in range(1, 40):  # one join every 10 ms for 0.39 s, a tick after each
        now = round(10.0 + i * 0.01, 6)
        obs.heartbeat(f"n{i:02d}", 1, {}, now, log.state)
        out = obs.observations(now, log.state)
        if out:
            proposed.append(_ids(out))
            log.commit("a1", out)
        due = obs.next_deadline()
        assert due is not None and (out or due > now)  # held: no busy tick
    # One trailing batch at 10.2 with every join since the leading edge.
    assert [len(b) for b in proposed] == [20]
    assert proposed[0] == [f"n{i:02d}" for i in range(1, 21)]
    assert obs.held() == 19
    assert obs.next_deadline() == pytest.approx(10.4)


def test_batching_suspect_is_never_held() -> None:
    log, obs = Log(), _observer(leading=True)
    for r in ("a1", "a2", "a3"):  # n1 ALIVE, everyone's opinion committed
        log.commit(r, (Observation(node_id="n1", incarnation=1, opinion=Opinion.ALIVE, seq=1),))
    obs.heartbeat("n1", 1, {}, 0.0, log.state)
    log.commit("a1", obs.observations(0.0, log.state))
    obs.heartbeat("n9", 1, {}, 0.9, log.state)
    assert _ids(obs.observations(0.9, log.state)) == ["n9"]  # leading edge: the pacer is busy
    obs.heartbeat("n8", 1, {}, 0.95, log.state)
    obs.tick(1.0, log.state)  # n1 silent since 0.0: suspected at D = 0.5 (ticked late)
    out = obs.observations(1.0, log.state)
    assert [(o.node_id, o.opinion) for o in out] == [("n1", Opinion.SUSPECT)]  # n8 waits
    assert obs.held() == 1


def test_batching_follower_holds_a_join_until_another_voter_commits_it() -> None:
    log, obs = Log(), _observer(leading=False, replica="a2")
    obs.heartbeat("n1", 1, {}, 10.0, log.state)
    obs.heartbeat("n2", 1, {}, 10.0, log.state)
    assert obs.observations(10.0, log.state) == ()
    assert obs.next_deadline() == pytest.approx(10.0 + 2 * BATCH)  # the follow wait
    assert not obs.follow_due(log.state)
    log.commit("a1", (Observation(node_id="n1", incarnation=1, opinion=Opinion.ALIVE, seq=7),))
    assert obs.follow_due(log.state)  # an apply: some may follow now
    out = obs.observations(10.01, log.state)
    assert _ids(out) == ["n1"]  # follows the leader's; n2 still held
    assert not obs.follow_due(log.state)
    log.commit("a2", out)
    assert _ids(obs.observations(10.0 + 2 * BATCH, log.state)) == ["n2"]  # never followed


def test_batching_a_suspicion_refuted_follows_at_once() -> None:
    # a2 suspected n1 while the others still hear it: its ALIVE again goes out at once.
    log, obs = Log(), _observer(leading=False, replica="a2")
    for r in ("a1", "a3"):
        log.commit(r, (Observation(node_id="n1", incarnation=1, opinion=Opinion.ALIVE, seq=1),))
    assert log.state.member("n1").state is MemberState.ALIVE  # type: ignore[union-attr]
    obs.heartbeat("n1", 1, {}, 0.0, log.state)
    log.commit("a2", obs.observations(0.0, log.state))  # follows
    obs.tick(0.6, log.state)
    log.commit("a2", obs.observations(0.6, log.state))  # SUSPECT
    obs.heartbeat("n1", 1, {}, 0.7, log.state)
    assert [(o.node_id, o.opinion) for o in obs.observations(0.7, log.state)] == [
        ("n1", Opinion.ALIVE)
    ]


def test_batching_retries_of_a_lost_batch_go_out_as_one_batch() -> None:
    # The leader's batch is lost (no commit): it comes back whole after the
    # retry timeout, as one batch, never one entry per node; the timeout
    # doubles with each retry (arbiter/core/retry.py rule 4: 0.5, 1, 2 s).
    log, obs = Log(), _observer(leading=True)
    obs.heartbeat("n0", 1, {}, 10.0, log.state)
    log.commit("a1", obs.observations(10.0, log.state))
    obs.heartbeat("n0", 1, {}, 10.0, log.state)
    for i in range(1, 11):
        obs.heartbeat(f"n{i:02d}", 1, {}, 10.0 + i * 0.01, log.state)
    assert len(obs.observations(10.2, log.state)) == 10  # trailing edge; lost
    batches = []
    now = 10.2
    while now < 12.6:
        now = round(now + 0.01, 6)
        out = obs.observations(now, log.state)
        if out:
            batches.append((now, _ids(out)))
    ten = [f"n{i:02d}" for i in range(1, 11)]
    assert batches == [(10.7, ten), (11.7, ten)]


def test_batching_committed_observations_are_not_proposed_again() -> None:
    log, obs = Log(), _observer(leading=True)
    obs.heartbeat("n1", 1, {}, 0.0, log.state)
    log.commit("a1", obs.observations(0.0, log.state))
    obs.heartbeat("n1", 1, {}, 0.1, log.state)
    assert obs.observations(1.0, log.state) == ()
    assert obs.owed() == 0 and obs.next_deadline() is not None  # the detector's only


def test_batching_config_carries_the_interval_and_refuses_a_negative_one() -> None:
    from arbiter.config import ArbiterConfig
    from membership.shared.errors import InvalidArgument

    assert ArbiterConfig.lan().replica_settings().observation_batch_interval == BATCH
    off = ArbiterConfig.lan(observation_batch_interval=0.0).validate()
    assert off.replica_settings().observation_batch_interval == 0.0
    with pytest.raises(InvalidArgument, match="observation_batch_interval must be >= 0"):
        ArbiterConfig.lan(observation_batch_interval=-0.1).validate()


def test_batching_a_late_echo_is_held_not_proposed_per_turn() -> None:
    # a3 hears n1 only after a1 and a2 made it ALIVE: its observation adds
    # nothing to the view, so it waits for the follow wait (one batch), not
    # one entry per driver turn.
    log, obs = Log(), _observer(leading=False, replica="a3")
    for r in ("a1", "a2"):
        log.commit(r, (Observation(node_id="n1", incarnation=1, opinion=Opinion.ALIVE, seq=1),))
    assert log.state.member("n1").state is MemberState.ALIVE  # type: ignore[union-attr]
    obs.heartbeat("n1", 1, {}, 5.0, log.state)
    obs.heartbeat("n2", 1, {}, 5.05, log.state)
    assert obs.observations(5.05, log.state) == ()
    assert obs.held() == 2
    assert _ids(obs.observations(5.0 + 2 * BATCH, log.state)) == ["n1", "n2"]


def test_batching_one_alive_batch_in_flight_the_rest_waits_for_its_commit() -> None:
    # A follower behind on its heartbeats reads a storm's nodes one driver turn
    # at a time after the leader's batch committed: one entry, then the rest
    # together once it commits (rule 6), not one entry per turn.
    log, obs = Log(), _observer(leading=False, replica="a2")
    ids = [f"n{i}" for i in range(1, 6)]
    log.commit("a1", tuple(
        Observation(node_id=n, incarnation=1, opinion=Opinion.ALIVE, seq=1) for n in ids
    ))  # fmt: skip
    obs.heartbeat("n1", 1, {}, 1.0, log.state)
    first = obs.observations(1.0, log.state)
    assert _ids(first) == ["n1"]  # follows, nothing in flight: at once
    for k, n in enumerate(ids[1:], start=1):
        now = 1.0 + k * 0.01
        obs.heartbeat(n, 1, {}, now, log.state)
        assert obs.observations(now, log.state) == ()  # n1 in flight
        assert obs.held() == k
    assert obs.next_deadline() == pytest.approx(1.0 + RETRY)  # n1's retry at the latest
    log.commit("a2", first)
    assert obs.follow_due(log.state)
    assert _ids(obs.observations(1.05, log.state)) == ids[1:]  # one batch


def test_batching_a_batch_in_flight_never_holds_a_suspect_or_a_refutation() -> None:
    log, obs = Log(), _observer(leading=False, replica="a2")
    log.commit("a1", tuple(
        Observation(node_id=n, incarnation=1, opinion=Opinion.ALIVE, seq=1)
        for n in ("n1", "n2", "n3")
    ))  # fmt: skip
    obs.heartbeat("n1", 1, {}, 0.0, log.state)
    obs.heartbeat("n2", 1, {}, 0.0, log.state)
    log.commit("a2", obs.observations(0.0, log.state))  # follow: n1, n2 ALIVE
    obs.heartbeat("n2", 1, {}, 0.3, log.state)
    obs.tick(0.6, log.state)  # n1 silent since 0.0: SUSPECT
    log.commit("a2", obs.observations(0.6, log.state))
    obs.heartbeat("n3", 1, {}, 0.61, log.state)
    assert _ids(obs.observations(0.61, log.state)) == ["n3"]  # follows a1's
    obs.heartbeat("n1", 1, {}, 0.62, log.state)  # n1 back while n3 is in flight
    obs.tick(0.9, log.state)  # n2 silent since 0.3: SUSPECT, in flight too
    out = obs.observations(0.9, log.state)
    assert [(o.node_id, o.opinion) for o in out] == [
        ("n1", Opinion.ALIVE),  # refutes a2's committed SUSPECT
        ("n2", Opinion.SUSPECT),
    ]


def test_batching_pacer_gathering_leader_waits_the_gather_window_after_a_quiet_spell() -> None:
    p = BatchPacer(BATCH)
    p.leading = p.gathering = True
    assert p.gather_window == pytest.approx(BATCH / 4)
    assert p.release_at(5.0) == pytest.approx(5.0 + BATCH / 4)  # the others' batches
    p.released(5.05, 5.0)
    assert p.release_at(5.1) == pytest.approx(5.05 + BATCH)  # trailing edge: the interval


def test_batching_pacer_gathering_spaces_a_long_storm_out_to_a_third_of_its_age() -> None:
    # Rule 2a: a storm that never lets up is cut every interval for its first 3 x interval
    # seconds, then every third of its age, at most 5 x interval apart.
    p = BatchPacer(BATCH)
    p.leading = p.gathering = True
    cuts = []
    t, ready = 0.0, 0.0
    while t < 10.0:
        t = p.release_at(ready)
        p.released(t, ready)
        cuts.append(t)
        ready = t + 0.001  # the next observation is ready at once: the storm goes on
    gaps = [b - a for a, b in itertools.pairwise(cuts)]
    assert gaps[0] == pytest.approx(BATCH)
    assert max(gaps) == pytest.approx(5 * BATCH)
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(gaps))  # never closer
    for start, gap in zip(cuts, gaps, strict=False):
        assert gap == pytest.approx(max(BATCH, min(5 * BATCH, (start - cuts[0]) / 3)))
    assert len(cuts) <= 20  # 50 cuts at the interval alone


def test_batching_pacer_gathering_leader_holds_its_next_cut_while_one_is_pending() -> None:
    # Rule 2b: one cut in flight.
    p = BatchPacer(BATCH)
    p.leading = p.gathering = True
    p.released(1.0, 1.0)
    p.pending = 7
    assert p.release_at(1.5) == math.inf
    p.pending = None
    assert p.release_at(1.5) == pytest.approx(1.5 + BATCH / 4)
    p.gathering = False
    p.pending = 7  # not gathering: the rule is off (the observer's rule 6 holds its own)
    assert p.release_at(1.5) == 1.5


def test_batching_pacer_a_quiet_spell_ends_the_storm() -> None:
    p = BatchPacer(BATCH)
    p.leading = p.gathering = True
    t = 0.0
    for _ in range(12):  # a storm of about 2 s: spacing past the interval
        t = p.release_at(t)
        p.released(t, t - 0.001)
    assert p.spacing > BATCH
    late = t + p.spacing + 1.0  # nothing was ready for a while
    assert p.release_at(late) == pytest.approx(late + BATCH / 4)
    p.released(late + BATCH / 4, late)
    assert p.spacing == pytest.approx(BATCH)  # a new storm starts at the interval


def test_batching_pacer_without_gathering_keeps_the_interval() -> None:
    p = BatchPacer(BATCH)
    p.leading = True
    t = 0.0
    for _ in range(30):
        t = p.release_at(t)
        p.released(t, t - 0.001)
    assert p.spacing == BATCH
