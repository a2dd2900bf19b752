"""Observer: opinions from heartbeats and detector, owed observations, leases (time given)."""

from __future__ import annotations

from arbiter.core.commands import Observation, ObserveBatch, Opinion, encode
from arbiter.core.detection import MissedHeartbeatDetector
from arbiter.core.observer import Observer
from arbiter.core.tally import MembershipState
from membership.shared.view import MemberState

REPLICAS = ("a1", "a2", "a3")
INTERVAL = 0.1
MISSED = 5  # D = 0.5 s
LEASE = 0.5


class Log:
    """Commits observation batches straight into a state machine (no Raft needed here)."""

    def __init__(self) -> None:
        self.state = MembershipState(REPLICAS)
        self.index = 0

    def commit(self, replica: str, observations: tuple[Observation, ...]) -> None:
        self.index += 1
        self.state.apply(
            self.index, encode(ObserveBatch(replica_id=replica, observations=observations))
        )


def _observer(now: float = 0.0, grace: float = 0.0, replica: str = "a1") -> Observer:
    return Observer(
        replica_id=replica,
        detector=MissedHeartbeatDetector(interval=INTERVAL, missed_limit=MISSED),
        lease=LEASE,
        retry_after=0.3,
        seq_base=1000,
        now=now,
        restart_grace=grace,
    )


def _admit(log: Log, node: str, incarnation: int = 1) -> None:
    """Makes ``node`` ALIVE through the other replicas' observations."""
    for i, r in enumerate(("a2", "a3")):
        log.commit(
            r,
            (Observation(node_id=node, incarnation=incarnation, opinion=Opinion.ALIVE, seq=i + 1),),
        )


def test_observer_first_heartbeat_owes_alive_observation_and_no_lease() -> None:
    log, obs = Log(), _observer()
    v = obs.heartbeat("n1", 1, {"rack": "r1"}, 0.0, log.state)
    assert v.accepted and v.state is MemberState.JOINING and v.lease == 0.0
    owed = obs.observations(0.0, log.state)
    assert [(o.node_id, o.opinion, o.labels) for o in owed] == [
        ("n1", Opinion.ALIVE, (("rack", "r1"),))
    ]


def test_observer_lease_only_after_own_alive_is_committed() -> None:
    log, obs = Log(), _observer()
    obs.heartbeat("n1", 1, {}, 0.0, log.state)
    owed = obs.observations(0.0, log.state)
    assert obs.heartbeat("n1", 1, {}, 0.1, log.state).lease == 0.0
    log.commit("a1", owed)
    assert obs.heartbeat("n1", 1, {}, 0.2, log.state).lease == LEASE


def test_observer_retries_uncommitted_observation_after_retry_interval() -> None:
    log, obs = Log(), _observer()
    obs.heartbeat("n1", 1, {}, 0.0, log.state)
    first = obs.observations(0.0, log.state)
    assert obs.observations(0.1, log.state) == ()
    assert obs.next_deadline() is not None
    again = obs.observations(0.3, log.state)
    assert again == first  # same seq: applying both changes nothing
    log.commit("a1", again)
    assert obs.observations(1.0, log.state) == ()
    assert obs.owed() == 0


def test_observer_silence_turns_into_suspect_observation() -> None:
    log, obs = Log(), _observer()
    _admit(log, "n1")
    obs.heartbeat("n1", 1, {}, 0.0, log.state)
    log.commit("a1", obs.observations(0.0, log.state))
    obs.tick(0.4, log.state)
    assert obs.observations(0.4, log.state) == ()
    obs.tick(0.6, log.state)
    owed = obs.observations(0.6, log.state)
    assert [(o.node_id, o.opinion) for o in owed] == [("n1", Opinion.SUSPECT)]
    assert obs.suspects() == ["n1"]


def test_observer_suspect_in_flight_forbids_lease() -> None:
    log, obs = Log(), _observer()
    _admit(log, "n1")
    obs.heartbeat("n1", 1, {}, 0.0, log.state)
    log.commit("a1", obs.observations(0.0, log.state))
    obs.tick(0.6, log.state)
    obs.observations(0.6, log.state)  # SUSPECT proposed, not committed
    v = obs.heartbeat("n1", 1, {}, 0.7, log.state)
    assert v.lease == 0.0  # a new ALIVE opinion is owed; the old commit does not count
    assert [o.opinion for o in obs.observations(0.7, log.state)] == [Opinion.ALIVE]


def test_observer_never_suspects_during_a_granted_lease() -> None:
    log, obs = Log(), _observer()
    _admit(log, "n1")
    obs.heartbeat("n1", 1, {}, 0.0, log.state)
    log.commit("a1", obs.observations(0.0, log.state))
    v = obs.heartbeat("n1", 1, {}, 0.1, log.state)
    assert v.lease == LEASE
    obs.tick(0.1 + LEASE - 0.01, log.state)
    assert obs.suspects() == []


def test_observer_refuses_old_and_final_incarnations() -> None:
    log, obs = Log(), _observer()
    _admit(log, "n1", incarnation=5)
    v = obs.heartbeat("n1", 4, {}, 0.0, log.state)
    assert not v.accepted and v.state is MemberState.DEAD and v.incarnation == 5
    for r in ("a2", "a3"):
        log.commit(r, (Observation(node_id="n1", incarnation=5, opinion=Opinion.SUSPECT, seq=10),))
    assert log.state.member("n1").state is MemberState.DEAD  # type: ignore[union-attr]
    v = obs.heartbeat("n1", 5, {}, 0.1, log.state)
    assert not v.accepted and v.state is MemberState.DEAD and v.lease == 0.0
    assert obs.observations(0.1, log.state) == ()


def test_observer_higher_incarnation_restarts_detection() -> None:
    log, obs = Log(), _observer()
    obs.heartbeat("n1", 1, {}, 0.0, log.state)
    obs.heartbeat("n1", 2, {}, 0.45, log.state)
    obs.tick(0.6, log.state)  # incarnation 1's deadline must not fire for incarnation 2
    assert obs.suspects() == []
    # a late heartbeat of incarnation 1 refreshes nothing
    assert not obs.heartbeat("n1", 1, {}, 0.7, log.state).accepted
    obs.tick(0.96, log.state)
    assert obs.suspects() == ["n1"]


def test_observer_restart_grace_defers_suspicion_and_tracks_unheard_members() -> None:
    log = Log()
    _admit(log, "n1")
    obs = _observer(now=10.0, grace=LEASE)
    obs.tick(10.0, log.state)  # learns n1 is ALIVE without hearing it
    assert obs.observations(10.0, log.state) == ()  # assumed ALIVE is never proposed
    obs.tick(10.45, log.state)
    assert obs.suspects() == []
    obs.tick(10.51, log.state)  # grace over, silence longer than D since start
    assert obs.suspects() == ["n1"]
    assert [o.opinion for o in obs.observations(10.51, log.state)] == [Opinion.SUSPECT]


def test_observer_superseded_heartbeat_names_the_newer_uncommitted_incarnation() -> None:
    log, obs = Log(), _observer()
    _admit(log, "n1", incarnation=5)
    obs.heartbeat("n1", 5, {}, 0.0, log.state)
    obs.heartbeat("n1", 9, {}, 0.1, log.state)  # a newer life, not committed anywhere yet
    v = obs.heartbeat("n1", 5, {}, 0.2, log.state)
    assert not v.accepted and v.state is MemberState.DEAD
    assert v.incarnation == 9  # "superseded by 9", not "declared DEAD at 5"


def _leave(log: Log, node: str, incarnation: int, heard_by: str = "") -> None:
    from arbiter.core.commands import Leave

    log.index += 1
    command = Leave(node_id=node, incarnation=incarnation, request_id="q", heard_by=heard_by)
    log.state.apply(log.index, encode(command))


def test_observer_retired_incarnation_is_answered_left_and_forgotten() -> None:
    # n1 heartbeats while joining, then leaves before it joined the view: its
    # owed ALIVE observation is forgotten, not proposed for ever, and a late
    # heartbeat of that life is answered LEFT without a lease.
    log, obs = Log(), _observer()
    assert obs.heard("n1") is None
    obs.heartbeat("n1", 1, {}, 0.0, log.state)
    assert obs.owed() == 1 and obs.heard("n1") == 1
    _leave(log, "n1", 1, heard_by="a1")  # a1 heard it: the incarnation is joining
    assert obs.observations(0.0, log.state) == ()
    assert obs.owed() == 0 and obs.opinion("n1") is None
    v = obs.heartbeat("n1", 1, {}, 0.1, log.state)
    assert (v.accepted, v.state, v.lease, v.incarnation) == (False, MemberState.LEFT, 0.0, 1)
    assert obs.opinion("n1") is None
    # Its next life is heard as usual.
    v = obs.heartbeat("n1", 2, {}, 0.2, log.state)
    assert v.accepted and v.state is MemberState.JOINING


def test_observer_an_agents_silent_stream_suspects_its_nodes_in_one_tick() -> None:
    # Rule 8: n3 declares a longer interval, so its detector is due later than n1's and
    # n2's: without the rule the agent's three ids are suspected at two ticks, so in two
    # batches and two epochs.
    from arbiter.core.observer import Carrier

    log, obs = Log(), _observer()
    carrier = Carrier()
    for n in ("n1", "n2", "n3"):
        _admit(log, n)
    t = 0.0
    for step in range(10):
        t = step * INTERVAL
        for n in ("n1", "n2", "n3"):
            interval = 0.2 if n == "n3" else INTERVAL
            obs.heartbeat(n, 1, {}, t, log.state, interval, carrier=carrier)
        log.commit("a1", obs.observations(t, log.state))
    # silence: n1's detector is due first (its hold and its 5 missed intervals)
    suspected: list[set[str]] = []
    now = t
    while now < t + 3.0 and len(set().union(*suspected)) < 3:
        now += 0.01
        obs.tick(now, log.state)
        new = set(obs.suspects()) - set().union(*suspected)
        if new:
            suspected.append(new)
    assert suspected == [{"n1", "n2", "n3"}], suspected


def test_observer_a_hung_node_on_a_live_stream_suspects_no_other_node() -> None:
    # Rule 8: the agent dropped a hung n2; n1 and n3 go on heartbeating on the same stream.
    from arbiter.core.observer import Carrier

    log, obs = Log(), _observer()
    carrier = Carrier()
    for n in ("n1", "n2", "n3"):
        _admit(log, n)
    for step in range(40):
        t = step * INTERVAL
        for n in ("n1", "n2", "n3"):
            if n == "n2" and step >= 10:
                continue  # hung: the agent no longer vouches for it
            obs.heartbeat(n, 1, {}, t, log.state, carrier=carrier)
        log.commit("a1", obs.observations(t, log.state))
        obs.tick(t + 0.05, log.state)
    assert obs.suspects() == ["n2"]


def test_observer_a_silent_streams_suspicion_waits_for_a_mate_held_a_moment_longer() -> None:
    # Rule 8: n2's detector hold ends 50 ms after n1's (a slow start's hold runs from the
    # ack's send): n1's suspicion waits for it, and both are suspected at one tick.
    from arbiter.core.observer import Carrier

    log, obs = Log(), _observer()
    carrier = Carrier()
    for n in ("n1", "n2"):
        _admit(log, n)
    t = 0.0
    for step in range(10):
        t = step * INTERVAL
        for n in ("n1", "n2"):
            obs.heartbeat(n, 1, {}, t, log.state, carrier=carrier)
        log.commit("a1", obs.observations(t, log.state))
    obs.detector.hold("n2", t + LEASE + 0.05)
    ticks: list[tuple[float, list[str]]] = []
    now = t
    while now < t + 2.0 and len(obs.suspects()) < 2:
        deadline = obs.next_deadline()
        assert deadline is not None
        now = max(now + 0.001, deadline)
        obs.tick(now, log.state)
        if obs.suspects():
            ticks.append((now, obs.suspects()))
    assert [names for _, names in ticks] == [["n1", "n2"]], ticks
    assert ticks[0][0] >= t + LEASE + 0.05  # never before n2's hold ends
