"""Incarnations are 1 .. 2**53 - 1 on both sides of the wire (docs/protocol.md)."""

from __future__ import annotations

import pytest

from membership import MembershipClient
from membership._config import ClientConfig
from membership.shared.errors import InvalidArgument
from membership.shared.validation import MAX_INCARNATION, validate_incarnation


def test_the_largest_incarnation_survives_a_double() -> None:
    assert float(MAX_INCARNATION) == MAX_INCARNATION
    assert float(MAX_INCARNATION + 2) != MAX_INCARNATION + 2  # beyond it, doubles round


@pytest.mark.parametrize("good", [1, 1_800_000_000_000, MAX_INCARNATION])
def test_incarnations_in_range_pass(good: int) -> None:
    validate_incarnation(good)


@pytest.mark.parametrize("bad", [0, -1, MAX_INCARNATION + 1, 2**62, 2**64 - 1])
def test_incarnations_out_of_range_are_refused_naming_the_range(bad: int) -> None:
    with pytest.raises(InvalidArgument, match=r"1\.\.9007199254740991"):
        validate_incarnation(bad)


def test_the_sdk_refuses_an_incarnation_beyond_the_range() -> None:
    with pytest.raises(InvalidArgument, match="incarnation must be in"):
        MembershipClient(
            ["127.0.0.1:1"],
            node_id="n1",
            incarnation=MAX_INCARNATION + 1,
            config=ClientConfig(insecure=True),
        )
