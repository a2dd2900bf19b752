"""Local health in the core (observer rule 6), and the shell's load measurement and
shedding rule (arbiter/server/load/monitor.py), with time and readings given."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest

from arbiter.config import ArbiterConfig
from arbiter.core.commands import Observation, ObserveBatch, Opinion, encode
from arbiter.core.detection import MissedHeartbeatDetector
from arbiter.core.observer import Observer
from arbiter.core.replica import ReplicaSettings
from arbiter.core.tally import MembershipState
from arbiter.server.api.shedding import PUSHBACK_KEY, Shed, check_shedding
from arbiter.server.load.monitor import LoadMonitor, LocalHealth
from membership.shared.backoff import MAX_PUSHBACK, retry_pushback

INTERVAL, MISSED = 0.1, 5  # D = 0.5 s


def _observer() -> Observer:
    return Observer(
        replica_id="a1",
        detector=MissedHeartbeatDetector(interval=INTERVAL, missed_limit=MISSED),
        lease=0.5,
        retry_after=0.3,
        seq_base=1,
        now=0.0,
        restart_grace=0.0,
    )


# --- observer rule 6 ---------------------------------------------------------------


def test_load_late_replica_suspects_nobody_for_a_silence_it_could_not_hear() -> None:
    state, obs = MembershipState(("a1", "a2", "a3")), _observer()
    obs.heartbeat("n1", 1, {}, 0.0, state)
    # The replica is late by as much as the silence: it heard up to t = 0 only.
    for t in (0.6, 1.0, 2.0, 3.0):
        obs.tick(t, state, lateness=t)
        assert obs.opinion("n1") is Opinion.ALIVE
    # On time again: n1 is really gone, and suspected at once (D has long passed).
    obs.tick(3.01, state, lateness=0.0)
    assert obs.opinion("n1") is Opinion.SUSPECT
    (owed,) = obs.observations(3.01, state)
    assert owed.silence == pytest.approx(3.01)


def test_load_lateness_delays_a_suspicion_by_exactly_the_lateness() -> None:
    state, obs = MembershipState(("a1", "a2", "a3")), _observer()
    obs.heartbeat("n1", 1, {}, 0.0, state)
    obs.tick(0.69, state, lateness=0.2)  # heard until 0.49 < D
    assert obs.opinion("n1") is Opinion.ALIVE
    obs.tick(0.71, state, lateness=0.2)  # heard until 0.51 > D
    assert obs.opinion("n1") is Opinion.SUSPECT
    (owed,) = obs.observations(0.71, state)
    assert owed.silence == pytest.approx(0.51)  # the silence it could observe


def test_load_lateness_is_bounded_by_the_longest_lease_in_the_replica() -> None:
    s = ReplicaSettings(
        lease=0.75,
        observation_retry=0.5,
        restart_grace=3.0,
        heartbeat_interval=0.15,
        heartbeat_budget=5000.0,
        max_heartbeat_interval=0.6,
        max_nodes=1_000,
    )
    assert s.max_lateness == pytest.approx(3.0)  # the lease at the ceiling, 0.6 s
    assert ReplicaSettings(
        lease=0.5, observation_retry=0.5, restart_grace=0.0, heartbeat_interval=0.1
    ).max_lateness == pytest.approx(2.0)


def test_load_observer_refuses_negative_lateness() -> None:
    state, obs = MembershipState(("a1",)), _observer()
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError):
            obs.tick(1.0, state, lateness=bad)


# --- the measurement (monitor.py rule 1) ----------------------------------------------


def test_load_monitor_utilisation_is_busy_time_over_wall_time_averaged() -> None:
    clock, busy = [0.0], [0.0]  # busy: on a CPU; waiting for one is a quarter of it here
    seen: list[tuple[float, float]] = []
    m = LoadMonitor(
        name="a1",
        window=2,
        reader=lambda: (busy[0] * 0.8, busy[0] * 0.2),
        clock=lambda: clock[0],
        on_sample=lambda u, now: seen.append((u, now)),
    )
    m._last = (0.0, 0.0, 0.0)  # as start() leaves it
    clock[0], busy[0] = 1.0, 0.5
    assert m.sample() == pytest.approx(0.5)
    assert m.cpu == pytest.approx(0.4)  # shedding's: the wait for a CPU left out
    clock[0], busy[0] = 2.0, 1.4  # 0.9 busy in this second
    assert m.sample() == pytest.approx(0.7)  # mean of the last two
    m.add_source(lambda now: 0.95)  # a worker more loaded than this loop
    clock[0], busy[0] = 3.0, 1.5
    assert m.sample() == pytest.approx(0.95)
    assert seen[-1][0] == pytest.approx(0.95) and seen[-1][1] == 3.0
    assert m.samples == 3 and m.cost >= 0


# --- lateness (monitor.py rule 3) -------------------------------------------------------


class _Lag:
    def __init__(self) -> None:
        self.ongoing = 0.0
        self.latest_late = (0.0, -math.inf)
        self.lasting = 0.0

    def recent_lag(self, now: float, since: float) -> float:
        return self.ongoing

    def mean_lateness(self, now: float) -> float:
        return self.lasting


def test_load_backlog_is_the_lasting_loop_lag_or_a_source_not_a_stall() -> None:
    lag = _Lag()
    h = LocalHealth(lag, listen_after=0.15)  # type: ignore[arg-type]
    lag.ongoing, lag.latest_late = 0.8, (0.8, 10.0)  # one stall: lateness, no backlog
    assert h.lateness(10.0) == pytest.approx(0.8) and h.backlog(10.0) == 0.0
    lag.ongoing, lag.lasting = 0.0, 0.25  # late for much of the last 2 s
    assert h.backlog(20.0) == pytest.approx(0.25)
    assert h.lateness(20.0) >= 0.25  # what lasts is lateness too
    h.add_source(lambda now: 1.5)  # an ingest backlog
    assert h.backlog(20.0) == pytest.approx(1.5)


def test_load_lateness_covers_a_stall_for_as_long_as_it_lasted_then_sources() -> None:
    lag = _Lag()
    h = LocalHealth(lag, listen_after=0.15)  # type: ignore[arg-type]
    assert h.lateness(10.0) == 0.0
    lag.ongoing = 0.4  # a stall in progress
    assert h.lateness(10.0) == pytest.approx(0.4)
    lag.ongoing, lag.latest_late = 0.0, (2.0, 10.0)  # a 2 s stall ended at t = 10
    assert h.lateness(11.9) == pytest.approx(2.0)  # its backlog may take as long to read
    assert h.lateness(12.1) == 0.0
    lag.latest_late = (0.05, 20.0)  # a short one: one interval of listening
    assert h.lateness(20.1) == pytest.approx(0.05) and h.lateness(20.2) == 0.0
    h.add_source(lambda now: 1.5)  # an ingest backlog
    assert h.lateness(30.0, own_lag=0.1) == pytest.approx(1.5)

    def broken(now: float) -> float:
        raise RuntimeError("source failed")

    h.add_source(broken)  # a failing source does not stop detection
    assert h.lateness(30.0) == pytest.approx(1.5)


# --- shedding (shedding.py) -------------------------------------------------------


def _driver(
    utilisation: float, lateness: float, known: bool = False, state: object = None
) -> SimpleNamespace:
    refusals: list[tuple[str, float, float]] = []  # what the observer was told (rule 5)
    return SimpleNamespace(
        config=ArbiterConfig.lan(),
        replica_id="a1",
        load=SimpleNamespace(cpu=utilisation, shed=0, shed_since=None, last_shed=-math.inf),
        health=SimpleNamespace(backlog=lambda now: lateness),
        observer=SimpleNamespace(
            opinion=lambda n: Opinion.ALIVE if known else None,
            refused=lambda n, until, now: refusals.append((n, until, now)),
        ),
        state=MembershipState(("a1", "a2", "a3")) if state is None else state,
        refusals=refusals,
    )


def test_load_shedding_refuses_new_nodes_with_a_jittered_retry_hint() -> None:
    d = _driver(utilisation=0.95, lateness=0.0)  # lateness: the sources' backlog
    with pytest.raises(Shed) as e:
        check_shedding(d, "n1", 0.0, random.Random(1))  # type: ignore[arg-type]
    assert str(e.value).startswith("shedding: arbiter a1 is loaded (cpu 0.95")
    assert 1000 <= e.value.pushback_ms < 2000  # shed_retry_after 1 s, x1 to x2
    assert e.value.trailing == ((PUSHBACK_KEY, str(e.value.pushback_ms)),)
    assert d.load.shed == 1
    # the observer holds n1 until it may come back (observer rule 5, refusals)
    assert d.refusals == [("n1", e.value.pushback_ms / 1000, 0.0)]
    with pytest.raises(Shed, match=r"backlog 0\.500s"):
        check_shedding(_driver(0.1, 0.5), "n1", 0.0)  # type: ignore[arg-type]


def test_load_shedding_hint_doubles_while_an_episode_lasts_and_starts_again_after() -> None:
    d = _driver(utilisation=0.1, lateness=0.5)  # shed_retry_after 1 s (lan)

    def hint(now: float) -> int:
        with pytest.raises(Shed) as e:
            check_shedding(d, "n1", now, random.Random(7))  # type: ignore[arg-type]
        return e.value.pushback_ms

    first = hint(100.0)
    assert 1000 <= first < 2000
    # Every second of the episode doubles it (the same jitter each time here)...
    ratios = [round(hint(t) / first, 2) for t in (100.5, 101.2, 102.1, 103.0)]
    assert ratios == [1, 2, 4, 8]
    assert hint(130.0 - 1.5) <= 30_000  # ...up to the longest hint a client takes
    d.health.backlog = lambda now: 0.0
    check_shedding(d, "n1", 131.0)  # type: ignore[arg-type]  # unloaded: the episode ends
    d.health.backlog = lambda now: 0.5
    assert hint(131.5) == first
    assert hint(140.0) == first  # nothing shed for 2 s: a new episode


def test_load_shedding_never_refuses_a_known_node_nor_below_the_thresholds() -> None:
    known, light = _driver(0.95, 5.0, known=True), _driver(0.89, 0.09)
    check_shedding(known, "n1", 0.0)  # type: ignore[arg-type]
    check_shedding(light, "n1", 0.0)  # type: ignore[arg-type]
    assert known.refusals == light.refusals == []  # nothing refused, nothing held


def test_load_shedding_takes_a_node_another_replica_admitted() -> None:
    # A node is ALIVE only once a quorum admits it (tally rule 3). Refused here
    # after a2 took it, it waited for two replicas' hints to meet an unloaded
    # moment: a 1,000-node join under four busy loops took 45 s.
    state = MembershipState(("a1", "a2", "a3"))
    seen = Observation(node_id="n1", incarnation=7, opinion=Opinion.ALIVE, seq=1)
    state.apply(1, encode(ObserveBatch(replica_id="a2", observations=(seen,))))
    assert state.member("n1") is None  # joining: one replica's ALIVE is no member
    loaded = _driver(0.95, 5.0, state=state)
    check_shedding(loaded, "n1", 0.0)  # type: ignore[arg-type]
    assert loaded.refusals == [] and loaded.load.shed == 0
    with pytest.raises(Shed):  # a node nobody took is still refused
        check_shedding(loaded, "n2", 0.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("trailing", "expected"),
    [
        ((("grpc-retry-pushback-ms", "1500"),), 1.5),
        ((("other", "1"), ("grpc-retry-pushback-ms", b"250")), 0.25),
        ((("grpc-retry-pushback-ms", "-5"),), None),  # gRFC A6: not a hint
        ((("grpc-retry-pushback-ms", "soon"),), None),
        ((("grpc-retry-pushback-ms", "99999999"),), MAX_PUSHBACK),
        ((), None),
        (None, None),
    ],
)
def test_load_sdk_reads_the_retry_hint(trailing: object, expected: float | None) -> None:
    assert retry_pushback(trailing) == expected  # type: ignore[arg-type]
