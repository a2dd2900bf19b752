"""A heartbeat link's rules (membership/_node/linkrules.py) with times given, and the link
(membership/_node/heartbeats.py) following them over fake streams: slow start, silence,
hedging and abandoning only where another arbiter answers, the stall bound."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import pytest

from membership._node.heartbeats import HeartbeatLink
from membership._node.linkrules import (
    LinkTimings,
    StreamClock,
    abandon_after,
    answering,
    hedge_due,
    next_check,
    odd_one_out,
)
from membership.shared.backoff import Backoff
from membership.v1 import membership_pb2 as pb
from tests.integration.harness import wait_async

T = LinkTimings(
    interval=0.15, hedge_after=0.3, ack_timeout=0.6, stall_timeout=3.0, slow_start_timeout=30.0
)


def _acked_at(t: float, seq: int = 1) -> StreamClock:
    """A stream that sent ``seq`` at ``t`` and had it acked at once, with a lease."""
    st = StreamClock()
    st.sent(seq, t)
    st.ack(seq, t, lease=0.75)
    return st


# --- rule 1: slow start -----------------------------------------------------------


def test_linkrules_a_stream_keeps_one_heartbeat_in_flight_until_an_ack_grants_a_lease() -> None:
    st = StreamClock()
    assert st.takes_heartbeat()
    st.sent(1, 0.0)
    assert not st.takes_heartbeat()  # the first waits for its ack
    st.ack(1, 2.5)  # late (the replica works through a storm), and no lease: JOINING
    assert st.takes_heartbeat() and st.acked and not st.leased
    st.sent(2, 2.6)
    assert not st.takes_heartbeat()  # still one at a time
    st.ack(2, 3.1, lease=0.75)  # the join committed: a lease
    assert st.leased
    st.sent(3, 3.2)
    st.sent(4, 3.35)  # leased, it takes every heartbeat
    assert st.takes_heartbeat()
    assert [seq for seq, _ in st.unacked] == [3, 4]


def test_linkrules_a_hedge_takes_the_heartbeat_that_opens_it_then_waits() -> None:
    hedge = StreamClock(hedge=True)
    assert hedge.takes_heartbeat()
    hedge.sent(7, 1.0)
    assert not hedge.takes_heartbeat()


# --- rule 2: silence --------------------------------------------------------------


def test_linkrules_silence_counts_from_the_oldest_unacked_send_while_acks_are_prompt() -> None:
    st = _acked_at(0.0)
    assert st.silence(5.0) == 0.0  # nothing unacked
    st.sent(2, 0.15)
    st.sent(3, 0.30)
    assert st.silence(0.40) == pytest.approx(0.25)  # from seq 2's send
    assert st.silent_since() == 0.15


def test_linkrules_acks_that_keep_coming_late_are_no_silence() -> None:
    # A replica 2 s behind still acks every heartbeat, each 2 s after its send.
    st = StreamClock()
    for k in range(1, 30):
        st.sent(k, k * 0.15)
        if k * 0.15 >= 2.0:
            st.ack(k - 13, k * 0.15)  # the ack of the heartbeat sent ~2 s ago
    now = 29 * 0.15 + 0.05
    assert now - st.unacked[0][1] > 1.8  # the oldest unacked waits ~2 s...
    assert st.silence(now) == pytest.approx(0.05)  # ...but the stream is not silent
    assert answering([st], now, T.hedge_after)


def test_linkrules_a_wedged_stream_is_silent_from_its_first_unanswered_heartbeat() -> None:
    st = _acked_at(0.0)
    for k, t in enumerate((0.15, 0.30, 0.45, 0.60), start=2):
        st.sent(k, t)  # nothing comes back any more
    assert st.silence(0.70) == pytest.approx(0.55)
    assert not answering([st], 0.70, T.hedge_after)


def test_linkrules_a_stream_never_acked_does_not_answer() -> None:
    st = StreamClock()
    st.sent(1, 0.0)
    assert not answering([st], 0.01, T.hedge_after)
    assert not answering([], 0.01, T.hedge_after)


# --- rules 3 and 4: hedging and abandoning ----------------------------------------


def _silent(since: float) -> StreamClock:
    st = _acked_at(since - 0.15)
    st.sent(2, since)
    return st


@pytest.mark.parametrize(
    ("mine", "theirs", "odd"),
    [
        (0.4, [0.05, 0.4], True),  # a wedge: another arbiter answers promptly
        (0.4, [0.2, 0.9], True),  # loaded, but the other answers twice as fast
        (0.4, [0.35, 0.38], False),  # every link late alike: load, or the node itself
        (0.4, [0.21, 0.5], False),
        (0.0, [0.0, 0.0], True),  # nothing unacked anywhere: answering, no silence to judge
    ],
)
def test_linkrules_a_link_is_the_odd_one_out_when_another_answers_twice_as_promptly(
    mine: float, theirs: list[float], odd: bool
) -> None:
    now = 10.0

    def silent_for(seconds: float) -> StreamClock:
        st = _acked_at(now - seconds - 0.15)
        if seconds > 0:
            st.sent(2, now - seconds)
        return st

    others = [[silent_for(t)] for t in theirs]
    assert odd_one_out([silent_for(mine)], others, now) is odd
    assert not odd_one_out([silent_for(mine)], [], now)  # a single arbiter: never


@pytest.mark.parametrize(
    ("others", "silent_for", "hedge"),
    [
        (True, 0.29, False),
        (True, 0.31, True),  # another arbiter answers: this connection is the odd one
        (False, 0.31, False),  # every link silent alike: load, or the node itself
        (False, 2.9, False),
    ],
)
def test_linkrules_hedge_only_while_another_arbiter_answers(
    others: bool, silent_for: float, hedge: bool
) -> None:
    st = _silent(10.0)
    assert hedge_due([st], T, others, 10.0 + silent_for) is hedge


def test_linkrules_no_hedge_of_a_stream_in_slow_start_nor_beside_a_hedge() -> None:
    first = StreamClock()
    first.sent(1, 0.0)
    assert not hedge_due([first], T, True, 1.0)
    first.ack(1, 0.1)  # acked without a lease: the node joins; its replica may be slow
    first.sent(2, 0.2)
    assert not hedge_due([first], T, True, 1.0)
    old, hedge = _silent(0.0), StreamClock(hedge=True)
    hedge.sent(3, 0.35)
    assert not hedge_due([old, hedge], T, True, 1.0)


@pytest.mark.parametrize(
    ("kind", "others", "after"),
    [
        ("acked", True, T.ack_timeout),
        ("acked", False, T.stall_timeout),  # every link silent: only the stall bound
        ("hedge", True, T.ack_timeout),
        ("hedge", False, T.stall_timeout),
        ("first", True, T.slow_start_timeout),  # a storm's queue: never sooner
        ("first", False, T.slow_start_timeout),
        ("joining", True, T.slow_start_timeout),  # acked, no lease yet
    ],
)
def test_linkrules_abandon_after(kind: str, others: bool, after: float) -> None:
    st = StreamClock(hedge=kind == "hedge")
    if kind == "acked":
        st = _acked_at(0.0)
    if kind == "joining":
        st.sent(1, 0.0)
        st.ack(1, 0.1)
    assert abandon_after(st, T, others) == after


def test_linkrules_every_link_wedged_at_once_still_recovers_by_the_stall_bound() -> None:
    # A node whose three connections wedged at t = 1: no link answers, so no
    # hedge and no abandon at ack_timeout; each stream is given up at the stall bound.
    links = [_silent(1.0) for _ in range(3)]
    now = 1.0 + T.ack_timeout + 0.01
    others = any(answering([o], now, T.hedge_after) for o in links[1:])
    assert not others
    assert not hedge_due([links[0]], T, others, now)
    assert links[0].silence(now) < abandon_after(links[0], T, others)
    assert next_check([links[0]], T, others, now) == pytest.approx(1.0 + T.stall_timeout)
    assert links[0].silence(1.0 + T.stall_timeout + 0.01) > abandon_after(links[0], T, others)


def test_linkrules_next_check_names_the_next_rule_deadline() -> None:
    st = _silent(5.0)
    assert next_check([st], T, True, 5.1) == pytest.approx(5.0 + T.hedge_after)
    # Past the hedge time (the link hedged): the abandon deadline is next.
    assert next_check([st], T, True, 5.4) == pytest.approx(5.0 + T.ack_timeout)
    # Others silent: hedging and ack_timeout are held back; only the stall bound remains.
    assert next_check([st], T, False, 5.1) == pytest.approx(5.0 + T.stall_timeout)
    assert next_check([_acked_at(0.0)], T, True, 1.0) == math.inf  # nothing unacked
    assert next_check([], T, True, 1.0) == math.inf


# --- the link over fake streams ---------------------------------------------------


class _Call:
    """A fake Heartbeat call: records writes; acks only what the test releases."""

    def __init__(self) -> None:
        self.written: list[pb.HeartbeatRequest] = []
        self.acks: asyncio.Queue[pb.HeartbeatAck] = asyncio.Queue()
        self.cancelled = False

    async def write(self, request: pb.HeartbeatRequest) -> None:
        self.written.append(pb.HeartbeatRequest(seq=request.seq))

    async def read(self) -> object:
        return await self.acks.get()

    def cancel(self) -> None:
        self.cancelled = True


class _Channels:
    """Hands out one fake call per stream the link opens."""

    def __init__(self) -> None:
        self.calls: list[_Call] = []
        self.alone: list[bool] = []  # per stream: every earlier one was closed when it opened

    def fresh(self, address: str) -> tuple[object, object]:
        call = _Call()
        self.alone.append(all(c.cancelled for c in self.calls))
        self.calls.append(call)

        class _Stub:
            @staticmethod
            def Heartbeat() -> _Call:
                return call

        class _Channel:
            async def close(self, grace: float | None = None) -> None:
                return None

        return _Channel(), _Stub()


class _Owner:
    """A link owner whose other arbiters answer or not, as the test says."""

    def __init__(self, timings: LinkTimings, others: Callable[[], bool]) -> None:
        self._timings = timings
        self._others = others
        self.seq = 0
        self.acks: list[int] = []
        self.done = False

    def timings(self) -> LinkTimings:
        return self._timings

    def incarnation(self) -> int:
        return 1

    def next_request(self, address: str, now: float) -> tuple[int, pb.HeartbeatRequest]:
        self.seq += 1
        return self.seq, pb.HeartbeatRequest(node_id="n1", incarnation=1, seq=self.seq)

    def others_answer(self, address: str, now: float) -> bool:
        return self._others()

    def on_ack(self, address: str, ack: pb.HeartbeatAck, now: float) -> None:
        self.acks.append(ack.seq)

    def expected_cluster(self) -> str:
        return ""

    def finished(self) -> bool:
        return self.done


async def _running(owner: _Owner, channels: _Channels) -> asyncio.Task[None]:
    link = HeartbeatLink(
        "a1:1",
        owner=owner,
        channels=channels,  # type: ignore[arg-type]
        backoff=Backoff(0.01, 0.02),
    )
    return asyncio.get_running_loop().create_task(link.run())


async def _stop(owner: _Owner, task: asyncio.Task[None]) -> None:
    owner.done = True
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_linkrules_link_keeps_one_heartbeat_in_flight_until_a_lease_then_its_cadence() -> (
    None
):
    # A short interval, so that many heartbeat times pass quickly; the other bounds
    # far, so that no stream is hedged or given up here.
    t = LinkTimings(
        interval=0.01, hedge_after=20, ack_timeout=30, stall_timeout=60, slow_start_timeout=60
    )
    owner, channels = _Owner(t, lambda: True), _Channels()
    task = await _running(owner, channels)
    try:
        await wait_async(lambda: len(channels.calls) == 1 and channels.calls[0].written, 5, "1st")
        call = channels.calls[0]
        # Many intervals pass: the link keeps looking (its owner's timings are read)...
        reads = [0]
        timings = owner.timings

        def counting() -> LinkTimings:
            reads[0] += 1
            return timings()

        owner.timings = counting  # type: ignore[method-assign]
        await wait_async(lambda: reads[0] >= 20, 5, "the link to run many intervals")
        # ...yet the stream carries its first heartbeat only, and no other stream opened.
        assert [r.seq for r in call.written] == [1]
        assert len(channels.calls) == 1 and owner.seq == 1
        call.acks.put_nowait(pb.HeartbeatAck(seq=1))  # no lease: the node joins
        await wait_async(lambda: len(call.written) == 2, 5, "the second heartbeat")
        seen = reads[0]
        await wait_async(lambda: reads[0] >= seen + 20, 5, "many intervals more")
        assert [r.seq for r in call.written] == [1, 2]  # one at a time
        call.acks.put_nowait(pb.HeartbeatAck(seq=2, lease_seconds=0.75))  # joined
        await wait_async(lambda: len(call.written) >= 5, 5, "heartbeats at the interval")
        assert owner.acks == [1, 2] and not call.cancelled
    finally:
        await _stop(owner, task)


async def test_linkrules_link_hedges_a_silent_stream_only_while_another_arbiter_answers() -> None:
    t = LinkTimings(
        interval=0.01, hedge_after=0.05, ack_timeout=30, stall_timeout=60, slow_start_timeout=60
    )
    others = [False]
    owner, channels = _Owner(t, lambda: others[0]), _Channels()
    task = await _running(owner, channels)
    try:
        await wait_async(lambda: channels.calls and channels.calls[0].written, 5, "1st")
        first = channels.calls[0]
        first.acks.put_nowait(pb.HeartbeatAck(seq=1, lease_seconds=0.75))
        # Acked once, then silent (no more acks) while no other arbiter answers:
        # heartbeats go on over the one stream, and no second one opens.
        await wait_async(lambda: len(first.written) >= 30, 5, "30 heartbeats unacked")
        assert len(channels.calls) == 1
        others[0] = True  # another arbiter answers: this connection is the odd one
        await wait_async(lambda: len(channels.calls) == 2, 5, "a hedge")
        hedge = channels.calls[1]
        await wait_async(lambda: bool(hedge.written), 5, "the hedge's first heartbeat")
        hedge.acks.put_nowait(pb.HeartbeatAck(seq=hedge.written[0].seq))
        await wait_async(lambda: first.cancelled, 5, "the old stream closed")
        assert len(channels.calls) == 2
    finally:
        await _stop(owner, task)


async def test_linkrules_link_gives_up_silent_streams_at_its_bounds_when_nothing_answers() -> None:
    t = LinkTimings(
        interval=0.01, hedge_after=0.02, ack_timeout=0.03, stall_timeout=0.2, slow_start_timeout=0.3
    )
    owner, channels = _Owner(t, lambda: False), _Channels()
    task = await _running(owner, channels)
    try:
        # A stream never acked is given up at the first-ack bound, having carried one
        # heartbeat...
        await wait_async(lambda: len(channels.calls) >= 2, 10, "the first-ack bound to reopen")
        assert channels.calls[0].cancelled
        assert [r.seq for r in channels.calls[0].written] == [1]
        second = channels.calls[1]
        await wait_async(lambda: bool(second.written), 5, "the second stream's heartbeat")
        second.acks.put_nowait(pb.HeartbeatAck(seq=second.written[0].seq, lease_seconds=0.75))
        # ...an acked one that goes silent, at the stall bound; never a stream beside
        # another, as no other arbiter answers.
        await wait_async(lambda: len(channels.calls) >= 3, 10, "the stall bound to reopen")
        assert second.cancelled and len(second.written) > 1
        assert all(channels.alone)
    finally:
        await _stop(owner, task)
