"""Explainable deaths: suspicion evidence from the detector, through the log, into DEAD."""

from __future__ import annotations

import pytest

from arbiter.core.commands import (
    CommandDecodeError,
    Observation,
    ObserveBatch,
    Opinion,
    decode,
    encode,
)
from arbiter.core.detection import MissedHeartbeatDetector
from arbiter.core.detection.phi import PhiAccrualDetector
from arbiter.core.observer import Observer
from arbiter.core.tally import MembershipState
from membership.shared.view import Evidence, MemberState

R3 = ("a1", "a2", "a3")


def _suspect(node: str, seq: int, **ev: object) -> Observation:
    return Observation(node_id=node, incarnation=1, opinion=Opinion.SUSPECT, seq=seq, **ev)  # type: ignore[arg-type]


def _alive(node: str, seq: int) -> Observation:
    return Observation(node_id=node, incarnation=1, opinion=Opinion.ALIVE, seq=seq)


def test_evidence_round_trips_through_the_log_encoding() -> None:
    o = _suspect("n1", 7, silence=0.812, suspicion=5.413, detector="missed")
    assert decode(encode(ObserveBatch(replica_id="a1", observations=(o,)))) == ObserveBatch(
        replica_id="a1", observations=(o,)
    )
    # No evidence: the encoding is exactly the one of earlier versions (no "ev" key).
    bare = encode(ObserveBatch(replica_id="a1", observations=(_suspect("n1", 7),)))
    assert b'"ev"' not in bare


@pytest.mark.parametrize(
    "kwargs",
    [
        {"silence": -1.0},
        {"silence": float("nan")},
        {"suspicion": float("inf")},
        {"silence": 1},  # an int is not a float: the encoding must stay canonical
        {"detector": 3},
    ],
)
def test_evidence_bad_values_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _suspect("n1", 1, **kwargs)


def test_evidence_on_an_alive_observation_is_refused() -> None:
    with pytest.raises(ValueError, match="SUSPECT"):
        Observation(node_id="n", incarnation=1, opinion=Opinion.ALIVE, seq=1, silence=0.5)


@pytest.mark.parametrize(
    "ev",
    [b"[0.5,1.0]", b'[0.5,1.0,"missed",4]', b'["x",1.0,"missed"]', b'[null,null,""]', b"{}"],
)
def test_evidence_malformed_in_the_log_is_a_decode_error(ev: bytes) -> None:
    data = (
        b'{"obs":[{"ev":' + ev + b',"inc":1,"labels":[],"node":"n","op":"suspect","seq":1}],'
        b'"replica":"a1","type":"observe","v":1}'
    )
    with pytest.raises(CommandDecodeError):
        decode(data)


def _apply(state: MembershipState, replica: str, *obs: Observation) -> object:
    state._applied_probe = getattr(state, "_applied_probe", 0) + 1  # type: ignore[attr-defined]
    return state.apply(
        state._applied_probe,  # type: ignore[attr-defined]
        encode(ObserveBatch(replica_id=replica, observations=obs)),
    )


def test_evidence_dead_change_names_the_quorum_that_decided_it() -> None:
    state = MembershipState(R3)
    for r in R3:
        _apply(state, r, _alive("n1", 1))
    _apply(state, "a3", _suspect("n1", 2, silence=0.76, suspicion=5.07, detector="missed"))
    result = _apply(
        state, "a1", _suspect("n1", 2, silence=0.801, suspicion=5.34, detector="missed")
    )
    change = result.change  # type: ignore[attr-defined]
    assert change is not None
    (dead,) = change.changes
    assert dead.state is MemberState.DEAD
    assert dead.evidence == (
        Evidence(arbiter_id="a1", silence=0.801, suspicion=5.34, detector="missed"),
        Evidence(arbiter_id="a3", silence=0.76, suspicion=5.07, detector="missed"),
    )


def test_evidence_survives_a_snapshot_so_every_replica_reports_the_same() -> None:
    live = MembershipState(R3)
    for r in R3:
        _apply(live, r, _alive("n1", 1))
    _apply(live, "a2", _suspect("n1", 2, silence=0.9, suspicion=9.1, detector="phi"))
    restored = MembershipState.from_bytes(live.to_bytes())
    restored._applied_probe = live._applied_probe  # type: ignore[attr-defined]
    last = _suspect("n1", 3, silence=0.75, suspicion=8.2, detector="phi")
    a = _apply(live, "a1", last).change  # type: ignore[attr-defined]
    b = _apply(restored, "a1", last).change  # type: ignore[attr-defined]
    assert a == b and a is not None
    assert [e.arbiter_id for e in a.changes[0].evidence] == ["a1", "a2"]


def test_evidence_old_snapshot_rows_without_it_still_restore() -> None:
    state = MembershipState(R3)
    for r in R3:
        _apply(state, r, _alive("n1", 1))
    _apply(state, "a2", _suspect("n1", 2))
    data = state.to_bytes()
    assert b'"suspect",2,[]]' in data  # six columns: the version-1 layout
    assert MembershipState.from_bytes(data).observation("a2", "n1") is not None


@pytest.mark.parametrize(
    ("detector", "kind", "level_low", "level_high"),
    [
        (MissedHeartbeatDetector(interval=0.1, missed_limit=5), "missed", 5.0, 5.5),
        (
            PhiAccrualDetector(
                interval=0.1,
                threshold=8.0,
                max_sample_size=200,
                min_std_deviation=0.025,
                acceptable_heartbeat_pause=0.2,
                first_heartbeat_estimate=0.1,
            ),
            "phi",
            8.0,
            50.0,
        ),
    ],
)
def test_evidence_observer_records_silence_and_level_at_suspicion(
    detector: object, kind: str, level_low: float, level_high: float
) -> None:
    state = MembershipState(R3)
    for r in ("a2", "a3"):
        _apply(state, r, _alive("n1", 1))
    obs = Observer(
        replica_id="a1",
        detector=detector,  # type: ignore[arg-type]
        lease=0.0,
        retry_after=0.3,
        seq_base=100,
        now=0.0,
        restart_grace=0.0,
    )
    t = 0.0
    for _ in range(30):
        obs.heartbeat("n1", 1, {}, t, state)
        t += 0.1
    last = t - 0.1
    deadline = detector.next_deadline()  # type: ignore[attr-defined]
    assert deadline is not None
    obs.tick(deadline, state)
    owed = [o for o in obs.observations(deadline, state) if o.opinion is Opinion.SUSPECT]
    assert len(owed) == 1
    o = owed[0]
    assert o.detector == kind
    assert o.silence == pytest.approx(deadline - last, abs=1e-3)
    assert o.suspicion is not None and level_low <= o.suspicion <= level_high
