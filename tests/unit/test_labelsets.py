"""One shared copy of each distinct label set (arbiter/core/labelsets.py) and the records
that hold them: the tally's observations and members, a heartbeat stream's checks."""

from __future__ import annotations

import sys

import pytest

from arbiter.config import ArbiterConfig
from arbiter.core.commands import Observation, ObserveBatch, Opinion, encode
from arbiter.core.labelsets import LabelSets
from arbiter.core.tally import MembershipState
from arbiter.server.api.heartbeat_path import HeartbeatChecks
from membership.v1 import membership_pb2 as pb


def _fresh(text: str) -> str:
    """An equal string that is another object (as a decoder or protobuf makes them)."""
    return "".join(list(text))


def test_labelsets_equal_in_identical_out_and_values_unchanged() -> None:
    sets = LabelSets()
    one = sets.mapping({"rack": _fresh("r1"), "job": _fresh("j1")})
    two = sets.mapping({_fresh("rack"): "r1", "job": "j1"})
    assert one is two
    assert list(one.items()) == [("job", "j1"), ("rack", "r1")]  # sorted by key
    assert all(sys.intern(k) is k and sys.intern(v) is v for k, v in one.items())
    with pytest.raises(TypeError):
        one["job"] = "j2"  # type: ignore[index]
    assert sets.mapping({"rack": "r2"}) is not one
    assert sets.mapping((("job", "j1"), ("rack", "r1"))) == one  # pairs: the same labels
    # Pairs: interned as given (rule 3: no copy of a tuple that is interned already).
    pairs = sets.pairs((("job", _fresh("j1")),))
    assert pairs == (("job", "j1"),) and sets.pairs([("job", "j1")]) is pairs
    assert all(sys.intern(k) is k and sys.intern(v) is v for k, v in pairs)
    interned = (("zone", sys.intern("z9")),)
    assert sets.pairs(interned) is interned
    assert sets.mapping({}) == {} and sets.pairs(()) == ()


def test_labelsets_remember_the_most_recently_used_and_what_they_handed_out_stays_valid() -> None:
    sets = LabelSets(capacity=4)
    handed = [sets.mapping({"rank": str(i)}) for i in range(10)]
    assert len(sets) == 4  # ranks 6 to 9
    assert [dict(m) for m in handed] == [{"rank": str(i)} for i in range(10)]
    assert sets.mapping({"rank": "6"}) is handed[6]  # used again: the most recent now
    sets.mapping({"rank": "x"})  # one more: rank 7, the least recently used, goes
    assert sets.mapping({"rank": "6"}) is handed[6]
    assert sets.mapping({"rank": "7"}) is not handed[7]
    with pytest.raises(ValueError):
        LabelSets(capacity=0)


def _alive(replica: str, node: str, inc: int, seq: int, **labels: str) -> bytes:
    o = Observation(
        node_id=node,
        incarnation=inc,
        opinion=Opinion.ALIVE,
        seq=seq,
        labels=tuple(sorted(labels.items())),
    )
    return encode(ObserveBatch(replica_id=replica, observations=(o,)))


def test_labelsets_tally_records_share_labels_and_incarnation_also_after_a_snapshot() -> None:
    state = MembershipState(("r1", "r2", "r3"))
    inc = 1_733_000_000_000  # a millisecond timestamp: an int object of its own per decode
    entries = [
        _alive(r, n, inc, 1, job="j1", rack="r1") for n in ("n1", "n2") for r in ("r1", "r2", "r3")
    ]
    entries.append(_alive("r1", "n3", inc, 1, job="j1", rack="r2"))
    for index, data in enumerate(entries, start=1):
        state.apply(index, data)

    def check(st: MembershipState) -> None:
        n1, n2 = st.member("n1"), st.member("n2")
        assert n1 is not None and n2 is not None
        assert dict(n1.labels) == {"job": "j1", "rack": "r1"}
        assert n1.labels is n2.labels  # one mapping for every member with these labels
        records = [st.observation(r, n) for n in ("n1", "n2") for r in ("r1", "r2", "r3")]
        assert all(o is not None for o in records)
        assert len({id(o.labels) for o in records if o is not None}) == 1
        for node in ("n1", "n2"):
            same = [st.observation(r, node) for r in ("r1", "r2", "r3")]
            member = st.member(node)
            assert member is not None
            assert all(o is not None and o.incarnation is member.incarnation for o in same)
        lone = st.observation("r1", "n3")
        assert lone is not None and lone.labels == (("job", "j1"), ("rack", "r2"))

    check(state)
    copy = MembershipState.from_bytes(state.to_bytes())
    assert copy.view() == state.view() and copy.to_bytes() == state.to_bytes()
    n1 = copy.member("n1")
    n2 = copy.member("n2")
    assert n1 is not None and n2 is not None and n1.labels is n2.labels
    copy_records = [copy.observation(r, n) for n in ("n1", "n2") for r in ("r1", "r2", "r3")]
    assert len({id(o.labels) for o in copy_records if o is not None}) == 1


def test_labelsets_heartbeat_streams_with_equal_labels_share_one_mapping() -> None:
    sets = LabelSets()
    cfg = ArbiterConfig.local()
    streams = [HeartbeatChecks(cfg, "", "a1", sets) for _ in range(3)]
    for i, checks in enumerate(streams):
        req = pb.HeartbeatRequest(
            node_id=f"n{i}", incarnation=1_733_000_000_000 + i, seq=1, labels={"job": "j1"}
        )
        checks.check(req, 0.0)
        assert checks.incarnation == req.incarnation
    assert streams[0].labels is streams[1].labels is streams[2].labels
    assert dict(streams[0].labels) == {"job": "j1"}
    # New labels on a stream: a new mapping (ingest workers send labels on that).
    req = pb.HeartbeatRequest(node_id="n0", incarnation=1_733_000_000_000, seq=2, labels={})
    before, inc = streams[0].labels, streams[0].incarnation
    assert req.incarnation is not req.incarnation  # protobuf: a new int at every read
    streams[0].check(req, 0.1)
    assert streams[0].labels is not before and dict(streams[0].labels) == {}
    assert streams[0].incarnation is inc  # the first heartbeat's int, which records share
