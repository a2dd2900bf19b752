"""membership.shared.backoff (one formula, random source passed in) and
membership._arbiters.identity."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from tenacity import AsyncRetrying

from membership._arbiters.identity import ClusterCheck, cluster_name
from membership.shared.backoff import Backoff
from membership.shared.errors import ClusterMismatch, InvalidArgument


def test_backoff_is_full_jitter_under_a_growing_capped_ceiling() -> None:
    b = Backoff(0.05, 1.0, random.Random(1))
    assert [b.ceiling(k) for k in range(0, 7)] == [0.0, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    for k in range(1, 12):
        delays = [b.delay(k) for _ in range(200)]
        assert all(0.0 <= d <= b.ceiling(k) for d in delays)
        # Jittered: spread over the window, not one value for the whole fleet.
        assert max(delays) - min(delays) > b.ceiling(k) / 2
    assert b.delay(0) == 0.0
    assert b.ceiling(10**6) == 1.0  # no overflow for a long outage


def test_backoff_same_seed_same_delays_and_tenacity_protocol() -> None:
    one, two = Backoff(0.05, 1.0, random.Random(7)), Backoff(0.05, 1.0, random.Random(7))
    assert [one.delay(k) for k in range(1, 9)] == [two.delay(k) for k in range(1, 9)]
    state = SimpleNamespace(attempt_number=3)
    assert 0.0 <= one(state) <= 0.4
    AsyncRetrying(wait=one)  # accepted as a tenacity wait strategy


@pytest.mark.parametrize(("initial", "maximum"), [(0.0, 1.0), (2.0, 1.0), (-1.0, 1.0)])
def test_backoff_refuses_bad_bounds(initial: float, maximum: float) -> None:
    with pytest.raises(ValueError):
        Backoff(initial, maximum)


def test_identity_settles_on_a_majority_of_the_addresses_given() -> None:
    check = ClusterCheck(listed=3)
    check.note("a:1", "prod@0123456789ab", "a1")
    assert not check.try_settle() and not check.settled  # one of three is no majority
    check.note("d:1", "")  # a replica that states none is not held against it
    assert not check.try_settle()
    check.note("b:1", "prod@0123456789ab", "a2")
    assert check.try_settle() and check.expected == "prod@0123456789ab"
    assert check.record("c:1", "prod@0123456789ab", "a3")
    assert check.refused == {}


def test_identity_two_clusters_are_refused_naming_both_sides() -> None:
    check = ClusterCheck(listed=3)
    check.note("a:1", "prod@0123456789ab")
    check.note("b:1", "prod@0123456789ab")
    check.note("x:9", "other@ba9876543210")
    with pytest.raises(ClusterMismatch) as info:
        check.try_settle()
    text = str(info.value)
    assert "a:1, b:1 in cluster prod@0123456789ab" in text
    assert "x:9 in cluster other@ba9876543210" in text
    assert info.value.identities == {
        "a:1": "prod@0123456789ab",
        "b:1": "prod@0123456789ab",
        "x:9": "other@ba9876543210",
    }
    assert isinstance(info.value, InvalidArgument)  # the caller's list is wrong


def test_identity_same_name_other_arbiter_set_is_another_cluster() -> None:
    check = ClusterCheck(listed=2)
    check.record("a:1", "default@0123456789ab")
    with pytest.raises(ClusterMismatch):
        check.record("b:1", "default@ffffffffffff")


def test_identity_one_replica_at_two_addresses_is_refused() -> None:
    # 127.0.0.1:7001 and localhost:7001 are one arbiter: counted twice, it would
    # give a node a quorum of leases it does not have.
    check = ClusterCheck(listed=3)
    check.note("127.0.0.1:7001", "prod@0123456789ab", "a1")
    check.note("localhost:7001", "prod@0123456789ab", "a1")
    with pytest.raises(ClusterMismatch) as info:
        check.try_settle()
    assert "127.0.0.1:7001 and localhost:7001 are one arbiter (a1)" in str(info.value)


def test_identity_stranger_after_settling_is_refused_not_fatal() -> None:
    check = ClusterCheck(listed=3)
    for addr, rid in (("a:1", "a1"), ("b:1", "a2")):
        check.note(addr, "prod@0123456789ab", rid)
    assert check.try_settle()
    # A listed address that was down at the start comes up as another
    # cluster's replica, or as a replica already reached at another address.
    assert not check.record("x:9", "other@ba9876543210", "b3")
    assert "not prod@0123456789ab" in check.refused["x:9"]
    assert not check.record("alias:1", "prod@0123456789ab", "a1")
    assert "reached at a:1" in check.refused["alias:1"]
    assert check.record("c:1", "prod@0123456789ab", "a3")
    # The same stranger asked again is still refused.
    assert not check.record("x:9", "other@ba9876543210", "b3") and "x:9" in check.refused


def test_identity_expected_name_is_enforced() -> None:
    check = ClusterCheck("prod")
    check.note("a:1", "staging@0123456789ab")
    with pytest.raises(ClusterMismatch, match="not 'prod'"):
        check.try_settle()
    assert cluster_name("prod@0123456789ab") == "prod"


def test_identity_refusal_is_lifted_by_an_answer_of_the_right_replica() -> None:
    check = ClusterCheck(listed=3)
    for addr, rid in (("a:1", "a1"), ("b:1", "a2"), ("c:1", "a3")):
        check.note(addr, "prod@0123456789ab", rid)
    assert check.try_settle()
    assert not check.record("c:1", "other@ba9876543210", "x1")  # a stranger took c's port
    assert not check.lost()  # one of three
    assert check.record("c:1", "prod@0123456789ab", "a3")  # the real a3 is back
    assert "c:1" not in check.refused
    for addr in ("a:1", "b:1"):
        check.record(addr, "other@ba9876543210", "x2")
    assert check.lost()  # a majority of the addresses are another cluster's now
