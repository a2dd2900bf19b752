"""A learner's observations are committed but never counted (tally rule 9), until promoted."""

from __future__ import annotations

from arbiter.core.commands import Observation, ObserveBatch, Opinion, encode
from arbiter.core.raft import ArbiterConfiguration
from arbiter.core.tally import MembershipState
from membership.shared.view import MemberState

VOTERS = {"r1": "h:1", "r2": "h:2", "r3": "h:3"}
WITH_LEARNER = ArbiterConfiguration(voters=VOTERS, learners={"r4": "h:4"}, index=1)


def _obs(replica: str, opinion: Opinion, seq: int) -> bytes:
    o = Observation(node_id="n", incarnation=1, opinion=opinion, seq=seq, labels=())
    return encode(ObserveBatch(replica_id=replica, observations=(o,)))


def _state() -> tuple[MembershipState, list[int]]:
    st = MembershipState(ArbiterConfiguration.initial(VOTERS))
    st.apply_configuration(1, WITH_LEARNER)
    return st, [1]


def _apply(st: MembershipState, index: list[int], data: bytes) -> None:
    index[0] += 1
    result = st.apply(index[0], data)
    assert result.error is None, result.error


def test_tally_learner_observation_is_stored_but_never_makes_a_quorum() -> None:
    st, i = _state()
    _apply(st, i, _obs("r1", Opinion.ALIVE, 1))
    _apply(st, i, _obs("r4", Opinion.ALIVE, 1))  # committed (no error), not counted
    assert st.observation("r4", "n") is not None
    assert st.view().get("n") is None  # r1 and a learner are not a quorum of 3 voters
    _apply(st, i, _obs("r2", Opinion.ALIVE, 1))
    member = st.view().get("n")
    assert member is not None and member.state is MemberState.ALIVE
    # Suspicions: r1 and the learner are not a quorum either.
    _apply(st, i, _obs("r1", Opinion.SUSPECT, 2))
    _apply(st, i, _obs("r4", Opinion.SUSPECT, 2))
    assert st.death_votes("n") == ("r1",)
    member = st.view().get("n")
    assert member is not None and member.state is MemberState.ALIVE


def test_tally_promoted_learner_counts_from_its_promotion_on() -> None:
    st, i = _state()
    _apply(st, i, _obs("r1", Opinion.ALIVE, 1))
    _apply(st, i, _obs("r2", Opinion.ALIVE, 1))
    _apply(st, i, _obs("r1", Opinion.SUSPECT, 2))
    _apply(st, i, _obs("r4", Opinion.SUSPECT, 1))
    member = st.view().get("n")
    assert member is not None and member.state is MemberState.ALIVE
    # Promoted: 4 voters, quorum 3; r1 and r4 suspect: still not a quorum.
    i[0] += 1
    st.apply_configuration(
        i[0], ArbiterConfiguration(voters={**VOTERS, "r4": "h:4"}, learners={}, index=i[0])
    )
    assert st.death_votes("n") == ("r1", "r4")
    _apply(st, i, _obs("r2", Opinion.SUSPECT, 2))
    member = st.view().get("n")
    assert member is not None and member.state is MemberState.DEAD


def test_tally_removed_replica_observations_are_refused_the_same_everywhere() -> None:
    st, i = _state()
    i[0] += 1
    result = st.apply(i[0], _obs("r9", Opinion.ALIVE, 1))
    assert result.error is not None and "not a member" in result.error
