"""Unit tests of membership._arbiters.calls.leave_round: how a node reads its arbiters'
answers to a Leave.

Fake stubs stand for the arbiters: each answers with a response or a status.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from membership._arbiters import calls
from membership.shared.errors import RejectedError
from membership.v1 import membership_pb2 as pb

OK = pb.LeaveResponse(epoch=7, joined=True)
NOT_FOUND = (grpc.StatusCode.NOT_FOUND, "arbiter aX: n1 is unknown to the cluster")
REFUSED = (grpc.StatusCode.FAILED_PRECONDITION, "stale incarnation 3: n1 is at incarnation 4")
DOWN = (grpc.StatusCode.UNAVAILABLE, "connection refused")


class _Stub:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    async def Leave(self, request: pb.LeaveRequest, timeout: float) -> pb.LeaveResponse:
        if isinstance(self.answer, pb.LeaveResponse):
            return self.answer
        code, details = self.answer
        raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class _Channels:
    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers

    def stub(self, address: str) -> _Stub:
        return _Stub(self.answers[address])

    def discard(self, address: str) -> None:
        pass


async def _round(*answers: Any) -> pb.LeaveResponse | None:
    arbiters = [f"a{i}:1" for i in range(len(answers))]
    channels = _Channels(dict(zip(arbiters, answers, strict=True)))
    return await calls.leave_round(
        arbiters,
        channels,  # type: ignore[arg-type]
        pb.LeaveRequest(node_id="n1", incarnation=3),
        deadline=float("inf"),
        call_timeout=1.0,
        errors={},
    )


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        pytest.param((OK, DOWN, DOWN), OK, id="one-success-wins"),
        # A replica that lags (or never heard the node) refuses; another accepts.
        pytest.param((REFUSED, NOT_FOUND, OK), OK, id="success-beats-refusal-and-not-found"),
        # Nothing to leave anywhere a majority looked: the node just stops.
        pytest.param((NOT_FOUND, NOT_FOUND, DOWN), calls.NOTHING_TO_LEAVE, id="majority-not-found"),
        # One NOT_FOUND of three is not enough to know: try again.
        pytest.param((NOT_FOUND, DOWN, DOWN), None, id="minority-not-found-retries"),
        pytest.param((DOWN, DOWN, DOWN), None, id="all-down-retries"),
    ],
)
async def test_leave_round_prefers_a_success_and_reads_not_found_as_nothing_there(
    answers: tuple[Any, ...], expected: pb.LeaveResponse | None
) -> None:
    got = await _round(*answers)
    if expected is calls.NOTHING_TO_LEAVE:
        assert got is calls.NOTHING_TO_LEAVE  # the agent tells it apart by identity
    else:
        assert got == expected


async def test_leave_round_refusal_counts_only_when_nobody_accepts() -> None:
    with pytest.raises(RejectedError, match="stale incarnation 3"):
        await _round(REFUSED, NOT_FOUND, DOWN)
