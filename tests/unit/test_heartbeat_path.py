"""The per-heartbeat path (arbiter/server/api/heartbeat_path.py, standing.py): the checks
refuse exactly what validating every field of every heartbeat refused, validate
only what changed, and acks copied from the template equal acks built in full."""

from __future__ import annotations

import dataclasses
import math
import re
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbiter.config import ArbiterConfig
from arbiter.core.observer import HeartbeatVerdict
from arbiter.server.api import heartbeat_path
from arbiter.server.api.heartbeat_path import (
    AckBuilder,
    ClusterMismatch,
    HeartbeatChecks,
    check_interval,
    interval_bounds,
)
from arbiter.server.api.limits import HeartbeatStreamRules
from arbiter.server.api.replies import cluster_mismatch
from arbiter.server.consensus.arbiterset import ArbiterSet, to_protos
from arbiter.server.consensus.standing import Standing, Standings
from membership.shared import convert
from membership.shared.errors import InvalidArgument
from membership.shared.validation import (
    validate_gpus,
    validate_health_reason,
    validate_incarnation,
    validate_labels,
    validate_node_id,
    validate_status,
)
from membership.shared.view import MemberState
from membership.v1 import membership_pb2 as pb

CFG = ArbiterConfig.lan()
CLUSTER = "default@0123"


def _reference(rules: HeartbeatStreamRules, req: pb.HeartbeatRequest) -> None:
    """What the servicer checked on every heartbeat before (every field, every time)."""
    validate_node_id(req.node_id)
    validate_incarnation(req.incarnation)
    validate_labels(req.labels)
    validate_status(req.status.phase, req.status.gauges, convert.status_numbers(req.status))
    validate_health_reason(req.status.health_reason)
    validate_gpus(convert.gpu_figures(req.status))
    check_interval(req.interval_seconds, interval_bounds(CFG))
    rules.check(req.node_id, req.incarnation, req.seq)
    refusal = cluster_mismatch(CLUSTER, "a1", req.cluster, f"node {req.node_id}")
    if refusal is not None:
        raise ClusterMismatch(refusal)


def _outcome(check: Any) -> str:
    try:
        check()
    except (InvalidArgument, ClusterMismatch) as e:
        return f"{type(e).__name__}: {e}"
    return "ok"


def _mostly(usual: list[Any], odd: list[Any]) -> st.SearchStrategy[Any]:
    """Usual values about nine times in ten: a stream runs a while before a field goes wrong."""
    return st.sampled_from(usual * (9 * len(odd)) + odd * len(usual))


_heartbeat = st.fixed_dictionaries(
    {
        "node_id": _mostly(["n1"], ["n2", "bad id", ""]),
        "incarnation": _mostly([5], [6, 0]),
        "seq_step": _mostly([1, 2], [0, -1]),
        "labels": _mostly(
            [{"a": "1"}, {"a": "2"}, {"a": "1", "b": "x"}, {}],
            [{"-bad": "1"}, {"a": "\n"}, {"b": "x" * 300}],
        ),
        "status": _mostly(
            [
                pb.NodeStatus(load=1.0),
                pb.NodeStatus(load=1.5, cpu_utilization=0.2),
                pb.NodeStatus(gauges={"g": 1.0}),
                pb.NodeStatus(),
                pb.NodeStatus(healthy=False, health_reason="ECC", rtt_seconds=0.002),
                pb.NodeStatus(gpus=[pb.GpuStatus(index=0, utilization=0.5), pb.GpuStatus(index=1)]),
            ],
            [
                pb.NodeStatus(cpu_utilization=2.0),
                pb.NodeStatus(phase="x" * 70),
                pb.NodeStatus(gauges={"g": float("nan")}),
                pb.NodeStatus(health_reason="x" * 300),
                pb.NodeStatus(rtt_seconds=-1.0),
                pb.NodeStatus(gpus=[pb.GpuStatus(index=0), pb.GpuStatus(index=0)]),
                pb.NodeStatus(gpus=[pb.GpuStatus(index=40)]),
                pb.NodeStatus(gpus=[pb.GpuStatus(index=1, memory_utilization=1.5)]),
            ],
        ),
        "interval": _mostly([0.6, 0.0, 0.3], [0.01, 9.0]),
        "cluster": _mostly(["", CLUSTER], ["other@1"]),
    }
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_heartbeat, min_size=1, max_size=12))
def test_heartbeat_path_checks_refuse_exactly_what_checking_everything_refused(
    stream: list[dict[str, Any]],
) -> None:
    checks = HeartbeatChecks(CFG, CLUSTER, "a1")
    rules = HeartbeatStreamRules()
    seq = 100
    for hb in stream:
        seq += hb["seq_step"]
        req = pb.HeartbeatRequest(
            node_id=hb["node_id"],
            incarnation=hb["incarnation"],
            seq=max(0, seq),
            labels=hb["labels"],
            status=hb["status"],
            interval_seconds=hb["interval"],
            cluster=hb["cluster"],
        )
        # Each on its own copy: both see the same bytes, as decoded from the wire.
        copy = pb.HeartbeatRequest.FromString(req.SerializeToString())
        ours = _outcome(lambda r=copy: checks.check(r, 0.0))
        reference = _outcome(lambda r=req: _reference(rules, r))
        assert ours == reference
        if ours != "ok":
            break  # the servicer ends the stream at the first refusal


def test_heartbeat_path_checks_validate_labels_and_status_only_when_they_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    for name in ("validate_labels", "validate_status", "validate_node_id"):
        real = getattr(heartbeat_path, name)
        monkeypatch.setattr(
            heartbeat_path, name, lambda *a, _r=real, _n=name: (calls.append(_n), _r(*a))[1]
        )
    checks = HeartbeatChecks(CFG, CLUSTER, "a1")

    def hb(seq: int, labels: dict[str, str], load: float) -> pb.HeartbeatRequest:
        return pb.HeartbeatRequest(
            node_id="n1", incarnation=1, seq=seq, labels=labels, status=pb.NodeStatus(load=load)
        )

    assert checks.check(hb(1, {"a": "1"}, 1.0), 0.0) == (0.0, True)
    assert sorted(calls) == ["validate_labels", "validate_node_id", "validate_status"]
    calls.clear()
    for seq in range(2, 10):
        assert checks.check(hb(seq, {"a": "1"}, 1.0), seq * 0.6) == (0.0, False)
    assert calls == []  # nothing changed: nothing validated again
    checks.check(hb(10, {"a": "1"}, 2.0), 6.0)
    assert calls == ["validate_status"]
    calls.clear()
    checks.check(hb(11, {"a": "2"}, 2.0), 6.6)
    assert calls == ["validate_labels"]
    with pytest.raises(InvalidArgument, match=r"^labels: label key"):
        checks.check(hb(12, {"-a": "2"}, 2.0), 7.2)


# --- the declared interval (docs/protocol.md, Heartbeat rule 3) ---------------------------

# At the defaults: heartbeat_interval 0.15 s to the load cap at 10,000 nodes, 0.6 x 1.25^8 s.
CEILING = 0.6 * 1.25**8  # 3.5762786865234375 s


def _interval_refusal(interval: float, config: ArbiterConfig = CFG) -> str | None:
    """The refusal of ``interval`` as a stream's declared interval (None: accepted)."""
    checks = HeartbeatChecks(config, CLUSTER, "a1")
    try:
        checks.check(
            pb.HeartbeatRequest(node_id="n1", incarnation=1, seq=1, interval_seconds=interval), 0.0
        )
    except InvalidArgument as e:
        return str(e)
    return None


def test_heartbeat_path_interval_bounds_at_the_defaults_reach_the_ceiling() -> None:
    assert (
        interval_bounds(CFG)[:2]
        == (0.15, CEILING)
        == (CFG.heartbeat_interval, CFG.interval_ceiling)
    )
    assert interval_bounds(ArbiterConfig.lan()) is interval_bounds(CFG)  # one tuple shared
    for accepted in (0.0, -0.0, 0.15, 0.6, 1.0, 1.118, CEILING):
        assert _interval_refusal(accepted) is None, accepted
    for refused in (
        math.nextafter(CEILING, math.inf),
        4.0,
        math.nextafter(0.15, 0.0),
        0.1,
        -1.0,
        math.inf,
        math.nan,
    ):
        message = _interval_refusal(refused)
        assert message is not None and message.startswith(f"interval_seconds: got {refused!r}, ")
        assert "outside [0.15, 3.5762786865234375] seconds" in message
        assert "heartbeat_interval 0.15 s (--heartbeat-interval)" in message
        assert "interval ceiling 3.5762786865234375 s" in message
        assert "max_nodes 10000 (--max-nodes)" in message
        assert "heartbeat_budget 5000/s (--heartbeat-budget)" in message
        assert "max_heartbeat_interval 0.6 s (--max-heartbeat-interval)" in message


def test_heartbeat_path_interval_bounds_move_with_max_nodes() -> None:
    local = ArbiterConfig.local()  # 1,500 nodes: the ceiling is max_heartbeat_interval
    assert interval_bounds(local)[:2] == (0.15, 0.6)
    assert _interval_refusal(0.6, local) is None
    refusal = _interval_refusal(1.0, local)
    assert refusal is not None and "outside [0.15, 0.6] seconds" in refusal
    assert "max_nodes 1500" in refusal
    big = ArbiterConfig.lan(max_nodes=100_000)
    assert interval_bounds(big)[1] == pytest.approx(33.3, abs=0.05)
    assert _interval_refusal(30.0, big) is None


@given(
    st.sampled_from(
        [ArbiterConfig.lan(), ArbiterConfig.local(), ArbiterConfig.lan(max_nodes=100_000)]
    ),
    st.floats(0.0, 1000.0),
)
def test_heartbeat_path_interval_message_names_bounds_a_client_may_declare(
    config: ArbiterConfig, interval: float
) -> None:
    """The bounds in the message are exact: a client that declares one is accepted."""
    message = _interval_refusal(interval, config)
    lowest, highest, _ = interval_bounds(config)
    assert (message is None) == (interval == 0 or lowest <= interval <= highest)
    if message is not None:
        found = re.search(r"outside \[(\S+), (\S+)\] seconds", message)
        assert found is not None, message
        assert (float(found[1]), float(found[2])) == (lowest, highest)
        assert _interval_refusal(float(found[1]), config) is None
        assert _interval_refusal(float(found[2]), config) is None


def test_heartbeat_path_interval_changed_on_a_stream_is_checked_again() -> None:
    checks = HeartbeatChecks(CFG, CLUSTER, "a1")
    for seq, interval in enumerate((0.0, 1.0, CEILING, 0.6), start=1):
        checks.check(
            pb.HeartbeatRequest(node_id="n1", incarnation=1, seq=seq, interval_seconds=interval),
            seq,
        )
    with pytest.raises(InvalidArgument, match=r"^interval_seconds: got 4\.0, outside \[0\.15, "):
        checks.check(
            pb.HeartbeatRequest(node_id="n1", incarnation=1, seq=9, interval_seconds=4.0), 9.0
        )


_configs = st.builds(
    lambda base, over, budget, nodes: ArbiterConfig.lan(
        heartbeat_interval=base,
        max_heartbeat_interval=base * over,
        heartbeat_budget=budget,
        max_nodes=nodes,
        missed_heartbeats=5.0,
    ),
    st.sampled_from([0.1, 0.15, 0.3, 1.0]),
    st.sampled_from([1.0, 1.5, 4.0, 10.0]),
    st.sampled_from([500.0, 5000.0, 20_000.0, 1e6]),
    st.integers(1, 200_000),
)


@settings(max_examples=200, deadline=None)
@given(
    _configs,
    st.lists(st.tuples(st.integers(0, 400_000), st.floats(0.0, 1.0)), min_size=1, max_size=40),
)
def test_heartbeat_path_every_suggested_interval_is_within_the_bounds(
    config: ArbiterConfig, load: list[tuple[int, float]]
) -> None:
    """No ack's ``next_interval_seconds`` is outside what the replica accepts, at any
    node count (even past max_nodes) and load: a node declaring what it was told is
    never refused (docs/protocol.md, Heartbeat rules 3 and 4)."""
    config.validate()
    governor = config.replica_settings().governor()
    bounds = interval_bounds(config)
    for t, (nodes, utilisation) in enumerate(load):
        governor.observe(utilisation, nodes, now=t * 5.0)
        suggested = governor.suggest(nodes)
        check_interval(suggested, bounds)
        assert bounds.lowest <= suggested <= bounds.highest


def _standing(**kw: Any) -> Standing:
    fields = {
        "epoch": 7,
        "in_quorum": True,
        "leader_id": "a2",
        "interval": 0.3,
        "instance": "i1",
    }
    return Standing(**(fields | kw))


ARBITERS = ArbiterSet(
    voters={"a1": "h:1", "a2": "h:2", "a3": "h:3"}, learners={"a4": "h:4"}, index=12
)


def _full_ack(seq: int, v: HeartbeatVerdict, s: Standing, arbiters: ArbiterSet) -> pb.HeartbeatAck:
    """The ack as the servicer built it before: every field, every time."""
    wire = to_protos(arbiters)
    return pb.HeartbeatAck(
        seq=seq,
        epoch=s.epoch,
        lease_seconds=v.lease,
        next_interval_seconds=s.interval,
        state=convert.state_to_pb(v.state),
        in_quorum=s.in_quorum,
        arbiter_id="a1",
        incarnation=v.incarnation,
        leader_id=s.leader_id,
        cluster_size=sum(a.voter for a in wire),
        cluster=CLUSTER,
        instance=s.instance,
        arbiters=wire,
        config_index=arbiters.index,
    )


def test_heartbeat_path_acks_from_the_template_equal_acks_built_in_full() -> None:
    builder = AckBuilder("a1", CLUSTER)
    alive = HeartbeatVerdict(accepted=True, state=MemberState.ALIVE, incarnation=3, lease=0.9)
    joining = HeartbeatVerdict(accepted=True, state=MemberState.JOINING, incarnation=3, lease=0)
    dead = HeartbeatVerdict(accepted=False, state=MemberState.DEAD, incarnation=9, lease=0.0)
    grace = HeartbeatVerdict(
        accepted=True, state=MemberState.ALIVE, incarnation=3, lease=0.9, grace=30.0, grace_id=4
    )
    s1 = _standing()
    s2 = dataclasses.replace(s1, epoch=8, in_quorum=False, leader_id="", interval=0.6)
    other = ArbiterSet(voters={"a1": "h:1", "a2": "h:2"}, index=20)
    # a grace window, then none: the reused message must not carry the window on
    cases = [(s1, ARBITERS, alive), (s1, ARBITERS, grace), (s1, ARBITERS, joining)]
    cases += [(s2, ARBITERS, dead), (s2, other, alive), (s1, other, alive)]
    for seq, (s, arbiters, v) in enumerate(cases, start=1):
        data = builder.ack(seq, v, s, arbiters)
        assert isinstance(data, bytes)
        expected = _full_ack(seq, v, s, arbiters)
        if v.grace_id:
            expected.grace_seconds, expected.grace_id = v.grace, v.grace_id
        assert pb.HeartbeatAck.FromString(data) == expected
    assert builder.template(s1, other) is builder.template(s1, other)


class _FakeReplica:
    """What Standings reads of a Replica."""

    def __init__(self) -> None:
        self.quorum_until = 10.0
        self.raft = SimpleNamespace(quorum_until=lambda: self.quorum_until, leader="a2")
        self.nodes = 5
        self.observer = SimpleNamespace(tracked=lambda: self.nodes)
        self.state = SimpleNamespace(epoch=3, instance="i1")
        self.replica_id = "a1"

    def suggested_interval(self) -> float:
        return 0.15 if self.nodes < 1000 else 0.3


def test_standing_is_the_same_object_until_something_in_it_changes() -> None:
    replica = _FakeReplica()
    healthy = [True]
    standings = Standings(replica, CFG, lambda: healthy[0])  # type: ignore[arg-type]
    first = standings.now(1.0)
    assert first == Standing(epoch=3, in_quorum=True, leader_id="a2", interval=0.15, instance="i1")
    assert standings.now(2.0) is first
    assert standings.refresh(2.0) is first  # a turn with nothing new: the same object
    replica.nodes = 6  # another node, the same interval: equal, so the same object
    assert standings.now(2.0) is first
    steps: list[tuple[str, Any]] = [
        ("quorum lost with time", lambda: None),
        ("epoch", lambda: setattr(replica.state, "epoch", 4)),
        ("leader", lambda: setattr(replica.raft, "leader", None)),
        ("interval", lambda: setattr(replica, "nodes", 2000)),
        ("fatal", lambda: healthy.__setitem__(0, False)),
    ]
    last = first
    now = 11.0  # past quorum_until: in_quorum False from the first step on
    for what, change in steps:
        change()
        if what == "fatal":
            replica.quorum_until = 100.0  # the raft would say yes; a fatal replica says no
        st_now = standings.now(now)
        assert st_now is not last or what == "fatal", what
        last = st_now
    assert last == Standing(epoch=4, in_quorum=False, leader_id="", interval=0.3, instance="i1")
    replica.state.instance = "i2"  # changes in a turn only (a Bootstrap applied)
    assert standings.refresh(now).instance == "i2"


def test_standing_quorum_until_agrees_with_in_quorum_through_elections_and_cuts() -> None:
    # Standings reads Raft's quorum_until() instead of asking in_quorum(now) per heartbeat.
    from tests.unit.raft_harness import Network

    ids = ["a", "b", "c"]
    net = Network(ids, seed=5)
    seen = set()
    for phase in ("elect", "isolate", "recover", "crash"):
        if phase == "isolate":
            net.isolate(net.leader() or "a")
        elif phase == "recover":
            net.recover()
        elif phase == "crash":
            net.crash(net.leader() or "a")
        for _ in range(200):
            net.run_for(0.05)
            for rid, node in net.nodes.items():  # a crashed replica is out of net.nodes
                q = node.in_quorum(net.now)
                assert q == (net.now < node.quorum_until()), (phase, rid)
                seen.add(q)
    assert seen == {True, False}
