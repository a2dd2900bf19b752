"""Quorum arithmetic and RaftConfig validation, checked against dumb definitions."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arbiter.core.raft import RaftConfig, committed_index, quorum_size


def _dumb_quorum(n: int) -> int:
    """The smallest k such that any two k-subsets of n intersect."""
    return next(k for k in range(1, n + 1) if 2 * k > n)


def _dumb_committed(match: list[int]) -> int:
    """The largest i that at least a quorum of voters have stored."""
    return max(
        i for i in range(max(match) + 1) if sum(m >= i for m in match) >= _dumb_quorum(len(match))
    )


@pytest.mark.parametrize(
    ("n", "expected"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)]
)
def test_quorum_size_is_strict_majority(n: int, expected: int) -> None:
    assert quorum_size(n) == expected


@pytest.mark.parametrize("n", [0, -1])
def test_quorum_size_rejects_empty_group(n: int) -> None:
    with pytest.raises(ValueError):
        quorum_size(n)


@pytest.mark.parametrize("n", range(1, 12))
def test_quorum_size_any_two_quorums_intersect(n: int) -> None:
    q = quorum_size(n)
    for a, b in itertools.product(itertools.combinations(range(n), q), repeat=2):
        assert set(a) & set(b)
    if q > 1:  # and one fewer would not do
        assert any(
            not set(a) & set(b)
            for a, b in itertools.product(itertools.combinations(range(n), q - 1), repeat=2)
        )


@pytest.mark.parametrize(
    ("match", "expected"),
    [
        ([5], 5),
        ([5, 3], 3),
        ([5, 3, 1], 3),
        ([1, 3, 5], 3),
        ([0, 0, 7], 0),
        ([4, 4, 4, 1, 1], 4),
        ([9, 8, 2, 1, 1], 2),
        ([3, 3, 2, 2], 2),
    ],
)
def test_committed_index_table(match: list[int], expected: int) -> None:
    assert committed_index(match) == expected


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=9))
def test_committed_index_matches_brute_force(match: list[int]) -> None:
    assert committed_index(match) == _dumb_committed(match)


@given(st.integers(min_value=1, max_value=200))
def test_quorum_size_matches_brute_force(n: int) -> None:
    assert quorum_size(n) == _dumb_quorum(n)


def test_committed_index_rejects_empty() -> None:
    with pytest.raises(ValueError):
        committed_index([])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"heartbeat_interval": 0.0},
        {"heartbeat_interval": -0.1},
        {"election_timeout": float("nan")},
        {"election_timeout": float("inf")},
        {"heartbeat_interval": 0.5, "election_timeout": 1.0},
        {"heartbeat_interval": 0.6, "election_timeout": 1.0},
        {"max_append_entries": 0},
    ],
)
def test_raft_config_validate_rejects(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RaftConfig(**kwargs).validate()


@pytest.mark.parametrize(
    "kwargs", [{}, {"heartbeat_interval": 0.05, "election_timeout": 0.5}, {"max_append_entries": 1}]
)
def test_raft_config_validate_accepts(kwargs: dict[str, Any]) -> None:
    RaftConfig(**kwargs).validate()
