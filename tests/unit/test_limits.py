"""The per-stream rules of arbiter/server/api/limits.py and the limits' configuration checks."""

from __future__ import annotations

import dataclasses

import pytest

from arbiter.config import ArbiterConfig
from arbiter.server.api.limits import HeartbeatStreamRules, LimitExceeded, Throttle
from membership.shared.errors import InvalidArgument


def test_throttle_passes_a_burst_of_one_seconds_worth() -> None:
    t = Throttle(rate=20, margin=2)
    assert [t.admit(0.0) for _ in range(20)] == [0.0] * 20
    assert t.admit(0.0) == pytest.approx(1 / 20)
    assert t.throttled == 1


def test_throttle_never_delays_a_stream_at_the_rate() -> None:
    t = Throttle(rate=20, margin=2)
    assert all(t.admit(i / 20) == 0.0 for i in range(200))


def test_throttle_delays_then_cuts_a_stream_that_keeps_flooding() -> None:
    t = Throttle(rate=10, margin=2)
    now = 0.0
    for _ in range(10):
        assert t.admit(now) == 0.0
    # A lockstep flooder: the next heartbeat is read once the delayed one is handled.
    waits = []
    with pytest.raises(LimitExceeded, match=r"^max_heartbeat_rate: .*heartbeat_rate_margin"):
        while now < 10:
            wait = t.admit(now)
            waits.append(wait)
            now += wait
    assert all(w == pytest.approx(0.1) for w in waits)
    assert 2.0 < now <= 2.2  # cut once throttled for more than the margin


def test_throttle_pause_ends_the_throttled_run() -> None:
    t = Throttle(rate=10, margin=2)
    now = 0.0
    for _ in range(11):
        t.admit(now)
    assert t.admit(1.5) == 0.0  # tokens refilled meanwhile: not throttled any more
    for i in range(30):  # throttled again, but the run started anew
        now = 1.5 + i * 0.05
        t.admit(now)
    assert t.throttled > 0


def test_stream_rules_first_heartbeat_sets_identity() -> None:
    rules = HeartbeatStreamRules()
    assert rules.check("n1", 3, 10) is True
    assert rules.check("n1", 3, 11) is False


@pytest.mark.parametrize(
    ("node_id", "incarnation", "seq", "message"),
    [
        ("n1", 3, 5, r"^seq: 5 after 12 \(seq must increase strictly"),
        ("n1", 3, 12, r"^seq: 12 after 12"),
        ("n2", 3, 13, r"^node_id: changed from 'n1' to 'n2'"),
        ("n1", 4, 13, r"^incarnation: changed from 3 to 4 .*new stream"),
    ],
)
def test_stream_rules_refuse_with_the_rule_named(
    node_id: str, incarnation: int, seq: int, message: str
) -> None:
    rules = HeartbeatStreamRules()
    for s in (10, 11, 12):
        rules.check("n1", 3, s)
    with pytest.raises(InvalidArgument, match=message):
        rules.check(node_id, incarnation, seq)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_message_bytes", 4096, "max_message_bytes must be >= 49152"),
        ("max_nodes", 0, "max_nodes must be >= 1"),
        ("max_heartbeat_streams", 0, "max_heartbeat_streams must be >= 1"),
        ("max_subscribers", 0, "max_subscribers must be >= 1"),
        ("max_concurrent_streams", 1, "max_concurrent_streams must be >= 4"),
        ("heartbeat_rate_margin", 0.0, "heartbeat_rate_margin must be > 0"),
        ("subscriber_write_timeout", 0.0, "subscriber_write_timeout must be > 0"),
        ("max_heartbeat_rate", 5.0, "must allow twice the heartbeat rate"),
    ],
)
def test_config_limits_are_checked(field: str, value: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        dataclasses.replace(ArbiterConfig.lan(), **{field: value}).validate()  # type: ignore[arg-type]


def test_config_default_rate_limit_is_far_above_what_a_node_is_asked_for() -> None:
    cfg = ArbiterConfig.lan().validate()
    assert cfg.max_heartbeat_rate >= 3 / cfg.heartbeat_interval
