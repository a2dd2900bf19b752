"""membership.backoff (one formula, random source passed in) and membership.identity."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from tenacity import AsyncRetrying

from membership.backoff import Backoff
from membership.errors import ClusterMismatch, InvalidArgument
from membership.identity import ClusterCheck, cluster_name


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


def test_identity_same_cluster_everywhere_is_accepted() -> None:
    check = ClusterCheck()
    for addr in ("a:1", "b:1", "c:1"):
        check.record(addr, "prod@0123456789ab")
    check.record("d:1", "")  # a replica that states none is not held against it
    assert check.expected == "prod@0123456789ab"


def test_identity_two_clusters_are_refused_naming_both_sides() -> None:
    check = ClusterCheck()
    check.record("a:1", "prod@0123456789ab")
    check.record("b:1", "prod@0123456789ab")
    with pytest.raises(ClusterMismatch) as info:
        check.record("x:9", "other@ba9876543210")
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
    check = ClusterCheck()
    check.record("a:1", "default@0123456789ab")
    with pytest.raises(ClusterMismatch):
        check.record("b:1", "default@ffffffffffff")


def test_identity_expected_name_is_enforced() -> None:
    check = ClusterCheck("prod")
    with pytest.raises(ClusterMismatch, match="not 'prod'"):
        check.record("a:1", "staging@0123456789ab")
    assert cluster_name("prod@0123456789ab") == "prod"
