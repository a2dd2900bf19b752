"""Unit tests of arbiter.core.commands: the log's commands and their bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arbiter.core.commands import (
    Bootstrap,
    Command,
    CommandDecodeError,
    Leave,
    Observation,
    ObserveBatch,
    Opinion,
    Remove,
    decode,
    encode,
)

_ids = st.text(min_size=1, max_size=12)
_counts = st.integers(min_value=0, max_value=2**63)
_labels = st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=4).map(
    lambda d: tuple(sorted(d.items()))
)
_observations = st.builds(
    Observation,
    node_id=_ids,
    incarnation=_counts,
    opinion=st.sampled_from(Opinion),
    seq=_counts,
    labels=_labels,
)
_commands: st.SearchStrategy[Command] = st.one_of(
    st.builds(
        ObserveBatch,
        replica_id=_ids,
        observations=st.lists(_observations, max_size=5).map(tuple),
    ),
    st.builds(
        Leave,
        node_id=_ids,
        incarnation=_counts,
        request_id=st.text(max_size=12),
        heard_by=st.text(max_size=6),
    ),
    st.builds(Remove, node_id=_ids, incarnation=_counts, by=_ids, request_id=st.text(max_size=12)),
    st.builds(Bootstrap, instance=st.text("0123456789abcdef", min_size=1, max_size=64)),
)


@given(_commands)
def test_commands_round_trip(command: Command) -> None:
    data = encode(command)
    assert decode(data) == command
    assert encode(decode(data)) == data  # canonical: one command, one encoding
    assert data.isascii()


def test_commands_encoding_is_compact_sorted_and_versioned() -> None:
    batch = ObserveBatch(
        replica_id="r1",
        observations=(
            Observation(
                node_id="n1",
                incarnation=2,
                opinion=Opinion.ALIVE,
                seq=7,
                labels=(("rack", "a"), ("zone", "é")),
            ),
        ),
    )
    assert encode(batch) == (
        b'{"obs":[{"inc":2,"labels":[["rack","a"],["zone","\\u00e9"]],"node":"n1",'
        b'"op":"alive","seq":7}],"replica":"r1","type":"observe","v":1}'
    )
    leave = Leave(node_id="n1", incarnation=3, request_id="q")
    assert encode(leave) == b'{"inc":3,"node":"n1","request_id":"q","type":"leave","v":1}'
    heard = Leave(node_id="n1", incarnation=3, request_id="q", heard_by="r2")
    assert encode(heard) == (
        b'{"heard":"r2","inc":3,"node":"n1","request_id":"q","type":"leave","v":1}'
    )
    remove = Remove(node_id="n1", incarnation=0, by="spiffe://c/admin/ops", request_id="q")
    assert encode(remove) == (
        b'{"by":"spiffe://c/admin/ops","inc":0,"node":"n1","request_id":"q","type":"remove","v":1}'
    )


def test_commands_decode_error_is_value_error() -> None:
    assert issubclass(CommandDecodeError, ValueError)


_DROP = object()  # an override that removes the field


def _obs(**overrides: Any) -> bytes:
    o: dict[str, Any] = {"node": "n", "inc": 1, "op": "alive", "seq": 1, "labels": []}
    o.update(overrides)
    o = {k: v for k, v in o.items() if v is not _DROP}
    return json.dumps({"v": 1, "type": "observe", "replica": "r", "obs": [o]}).encode()


def _leave(**overrides: Any) -> bytes:
    c: dict[str, Any] = {"v": 1, "type": "leave", "node": "n", "inc": 1, "request_id": "q"}
    c.update(overrides)
    return json.dumps({k: v for k, v in c.items() if v is not _DROP}).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not a JSON command"),
        (b"not json", "not a JSON command"),
        (b"\xff\xfe", "not a JSON command"),
        (b"[]", "expected an object"),
        (b"null", "expected an object"),
        (b'{"v":1,"v":1,"type":"leave","node":"n","inc":1,"request_id":"q"}', "duplicate"),
        (_leave(v=2), "unknown version 2"),
        (_leave(v=True), "unknown version"),
        (_leave(v="1"), "unknown version"),
        (_leave(v=_DROP), "unknown version None"),
        (_leave(type="join"), "unknown type 'join'"),
        (_leave(type=_DROP), "unknown type None"),
        (_leave(request_id=_DROP), "missing fields ['request_id']"),
        (_leave(extra=1), "unknown fields ['extra']"),
        (_leave(inc="1"), "leave.inc: expected int, got str"),
        (_leave(inc=True), "leave.inc: expected int, got bool"),
        (_leave(inc=1.0), "leave.inc: expected int, got float"),
        (_leave(inc=-1), "incarnation must be an int >= 0"),
        (_leave(node=""), "node_id must be a non-empty string"),
        (_leave(node=None), "leave.node: expected str"),
        (_leave(request_id=5), "leave.request_id: expected str"),
        (b'{"v":1,"type":"leave","node":"n","inc":NaN,"request_id":"q"}', "NaN"),
        (b'{"v":1,"type":"leave","node":"n","inc":' + b"9" * 5000 + b',"request_id":"q"}', ""),
        (b"[" * 100_000 + b"]" * 100_000, ""),
        (b'{"v":1,"type":"observe","replica":"r","obs":{}}', "observe.obs: expected list"),
        (b'{"v":1,"type":"observe","replica":"","obs":[]}', "replica_id must be"),
        (b'{"v":1,"type":"observe","replica":1,"obs":[]}', "observe.replica: expected str"),
        (b'{"v":1,"type":"observe","replica":"r","obs":[1]}', "obs[0]: expected an object"),
        (_obs(op="dead"), "unknown opinion 'dead'"),
        (_obs(op=None), "op: expected str"),
        (_obs(seq=-3), "seq must be an int >= 0"),
        (_obs(seq=2.5), "seq: expected int"),
        (_obs(labels={"a": "b"}), "labels: expected list"),
        (_obs(labels=[["b", "1"], ["a", "2"]]), "sorted by key"),
        (_obs(labels=[["a", "1"], ["a", "2"]]), "unique keys"),
        (_obs(labels=[["a"]]), "expected [key, value] strings"),
        (_obs(labels=[["a", 1]]), "expected [key, value] strings"),
        (_obs(labels=_DROP), "missing fields ['labels']"),
        (_leave(heard=""), "an empty heard_by is written as no 'heard'"),
        (_leave(heard=3), "leave.heard: expected str"),
        (b'{"by":"a","inc":0,"node":"n","type":"remove","v":1}', "missing fields ['request_id']"),
        (b'{"by":"","inc":0,"node":"n","request_id":"q","type":"remove","v":1}', "by must be"),
        (b'{"by":"a","inc":-1,"node":"n","request_id":"q","type":"remove","v":1}', "incarnation"),
        (b'{"by":"a","inc":0,"node":"","request_id":"q","type":"remove","v":1}', "node_id must"),
        (b'{"instance":"","type":"bootstrap","v":1}', "instance must be 1 to 64 hex digits"),
        (b'{"instance":"XYZ","type":"bootstrap","v":1}', "instance must be 1 to 64 hex digits"),
        (b'{"instance":7,"type":"bootstrap","v":1}', "bootstrap.instance: expected str"),
        (b'{"instance":"ab","type":"bootstrap","v":1,"x":0}', "unknown fields ['x']"),
    ],
)
def test_commands_decode_rejects_malformed(data: bytes, message: str) -> None:
    with pytest.raises(CommandDecodeError) as info:
        decode(data)
    assert message in str(info.value)


def test_commands_decode_accepts_non_canonical_json() -> None:
    # Whitespace and key order do not matter to decode; encode is what is canonical.
    data = b'{ "type": "leave", "v": 1, "request_id": "q", "inc": 4, "node": "n" }'
    assert decode(data) == Leave(node_id="n", incarnation=4, request_id="q")


@pytest.mark.parametrize(
    "build",
    [
        lambda: Observation(node_id="", incarnation=0, opinion=Opinion.ALIVE, seq=0),
        lambda: Observation(node_id="n", incarnation=-1, opinion=Opinion.ALIVE, seq=0),
        lambda: Observation(node_id="n", incarnation=True, opinion=Opinion.ALIVE, seq=0),
        lambda: Observation(node_id="n", incarnation=0, opinion="alive", seq=0),  # type: ignore[arg-type]
        lambda: Observation(node_id="n", incarnation=0, opinion=Opinion.ALIVE, seq=-1),
        lambda: Observation(
            node_id="n", incarnation=0, opinion=Opinion.ALIVE, seq=0, labels=(("b", ""), ("a", ""))
        ),
        lambda: Observation(
            node_id="n",
            incarnation=0,
            opinion=Opinion.ALIVE,
            seq=0,
            labels=[("a", "b")],  # type: ignore[arg-type]
        ),
        lambda: ObserveBatch(replica_id="", observations=()),
        lambda: ObserveBatch(replica_id="r", observations=[]),  # type: ignore[arg-type]
        lambda: Leave(node_id="", incarnation=0, request_id=""),
        lambda: Leave(node_id="n", incarnation=-5, request_id=""),
        lambda: Leave(node_id="n", incarnation=1, request_id="", heard_by=None),  # type: ignore[arg-type]
        lambda: Remove(node_id="n", incarnation=1, by="", request_id=""),
        lambda: Remove(node_id="", incarnation=1, by="a", request_id=""),
        lambda: Remove(node_id="n", incarnation=-1, by="a", request_id=""),
    ],
)
def test_commands_constructors_validate(build: Any) -> None:
    with pytest.raises(ValueError):
        build()


def test_commands_encode_rejects_non_commands() -> None:
    with pytest.raises(TypeError):
        encode("leave")  # type: ignore[arg-type]
