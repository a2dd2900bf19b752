"""``--ingest-workers``: the channel's frames, the horizon (a batch overdue makes the
replica late), detectors held to it, and the worker's batcher."""

from __future__ import annotations

import asyncio
import marshal
import random
import struct
import time
import types

import pytest

from arbiter.core.detection import MissedHeartbeatDetector
from arbiter.core.raft import RaftConfig
from arbiter.core.replica import Replica, ReplicaSettings
from arbiter.server.ingest import frames
from arbiter.server.ingest.batcher import FLUSH_AFTER, MAX_BATCH, Batcher, ChannelClosed
from arbiter.server.ingest.lateness import Horizon

# --- frames (frames.py rule 1) -----------------------------------------------------------


def test_ingest_frames_round_trip_in_pieces() -> None:
    batch = (
        frames.BATCH,
        7,
        12.5,
        (
            (1, "n1", 3, (("rack", "r1"),), 0.15, True, b"\x08\x01"),
            (2, "n2", 1, None, 0.0, False, None),
        ),
        (4, 5),
        (10, 9, 2),
        (0.25, 0.2),
        ((0, 3, 1, 0, 0, 0, 0, 0, 0, 0, 0), 0.42),
    )
    data = frames.encode(*batch) + frames.encode(frames.STOP)
    dec = frames.FrameDecoder()
    out = []
    for i in range(0, len(data), 3):  # fed three bytes at a time
        out += dec.feed(data[i : i + 3])
    assert out == [batch, (frames.STOP,)]


@pytest.mark.parametrize(
    "body, why",
    [
        (marshal.dumps([1, 2]), "not a tuple"),
        (marshal.dumps(()), "empty"),
        (marshal.dumps((1, 2)), "no kind first"),
        (b"\xff\x00garbage", "does not decode"),
    ],
)
def test_ingest_frames_refuse_what_is_not_a_frame(body: bytes, why: str) -> None:
    with pytest.raises(frames.FrameError):
        frames.FrameDecoder().feed(struct.pack(">I", len(body)) + body)


def test_ingest_frames_refuse_an_oversized_announcement() -> None:
    with pytest.raises(frames.FrameError, match="over"):
        frames.FrameDecoder().feed(struct.pack(">I", frames.MAX_FRAME + 1))


async def test_ingest_read_frame_from_a_stream() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(frames.encode(frames.HELLO, 0, 123, 1.5))
    reader.feed_eof()
    assert await frames.read_frame(reader) == (frames.HELLO, 0, 123, 1.5)
    with pytest.raises(asyncio.IncompleteReadError):
        await frames.read_frame(reader)


# --- the horizon (lateness.py) --------------------------------------------------------------


def test_ingest_horizon_an_overdue_batch_makes_the_replica_late() -> None:
    h = Horizon()
    assert h.lateness(100.0) == 0.0  # no worker: never late
    h.joined(0, 10.0)
    h.joined(1, 10.0)
    h.heard(0, 10.5)
    h.heard(1, 10.52)
    assert h.lateness(10.53) == pytest.approx(0.03)
    # Worker 1's batches stop (overdue): the replica is as late as worker 1's last batch.
    h.heard(0, 11.5)
    assert h.lateness(11.52) == pytest.approx(11.52 - 10.52)
    assert h.overdue(11.52, 0.5) == [1]
    h.heard(1, 11.0)  # an older batch than one already heard never moves it back
    h.heard(1, 10.9)
    assert h.lateness(11.52) == pytest.approx(0.52)
    h.left(1)  # gone: its streams are gone with it
    assert h.lateness(11.52) == pytest.approx(0.02)
    assert h.overdue(11.52, 0.5) == []


def _replica() -> Replica:
    return Replica(
        replica_id="a1",
        replica_ids=["a1", "a2", "a3"],
        raft_config=RaftConfig(),
        settings=ReplicaSettings(
            lease=0.5, observation_retry=0.2, restart_grace=0.0, heartbeat_interval=0.1
        ),
        detector=MissedHeartbeatDetector(interval=0.1, missed_limit=5),
        rng=random.Random(1),
        now=0.0,
        seq_base=1,
    )


def test_ingest_detectors_tick_no_later_than_the_horizon() -> None:
    """Heard at 1.0, D = 0.5 s: at now = 2 a replica that has heard everything only up
    to 1.2 (a worker's batch overdue: 0.8 s late) suspects nobody; once heard up to now,
    it does."""
    rep = _replica()
    rep.heartbeat("n1", 1, {}, 1.0)
    h = Horizon()
    h.joined(0, 0.0)
    h.heard(0, 1.2)
    rep.tick(2.0, h.lateness(2.0))
    assert rep.observer.suspects() == []
    h.heard(0, 2.1)
    rep.tick(2.1, h.lateness(2.1))
    assert rep.observer.suspects() == ["n1"]


# --- the batcher (batcher.py) ---------------------------------------------------------------


async def test_ingest_batcher_batches_answers_in_order_and_fails_when_closed() -> None:
    sent: list[bytes] = []
    b = Batcher(sent.append, lambda items: [f"{i}@{a}" for i, a, _ in items])
    first = [b.ask((1, f"n{i}", 1, None, 0.0, False, None)) for i in range(3)]
    assert sent == []  # the batch waits FLUSH_AFTER for others
    await asyncio.sleep(FLUSH_AFTER * 5)
    (batch,) = frames.FrameDecoder().feed(b"".join(sent))
    assert batch[0] == frames.BATCH and [e[1] for e in batch[3]] == ["n0", "n1", "n2"]
    assert batch[6] == (0.0, 0.0) and batch[7] is None  # no load monitor, no inter-arrival
    status = (4, True, "a2", 0.15, "inst", 9, (("a1", "h:1", True),))
    refusal = ("shedding: loaded", 750)
    b.on_verdicts(batch[1], ((True, 2, 1, 0.75), (False, 1, 1, 0.0), refusal), status)
    got = [await f for f in first]
    assert [v for v, _ in got] == [(True, 2, 1, 0.75), (False, 1, 1, 0.0), refusal]
    assert got[0][1].arbiters == ["a1@h:1"] and got[0][1].epoch == 4 and got[0][1].leader == "a2"
    # Every batch carries the worker's latest load sample (batcher rule 3).
    # and the inter-arrival times observed since the last one, then none.
    b.monitor = types.SimpleNamespace(utilisation=0.75, cpu=0.5)
    b.interarrival.observe(0.12)
    b.interarrival.observe(0.6)
    b.flush()
    (batch,) = frames.FrameDecoder().feed(sent[-1])
    counts, seconds = batch[7]
    assert batch[6] == (0.75, 0.5) and sum(counts) == 2 and seconds == pytest.approx(0.72)
    b.flush()
    assert frames.FrameDecoder().feed(sent[-1])[0][7] is None
    # MAX_BATCH heartbeats leave at once; the channel gone fails them and every later one.
    sent.clear()
    many = [b.ask((2, "n", 1, None, 0.0, False, None)) for _ in range(MAX_BATCH)]
    assert len(frames.FrameDecoder().feed(b"".join(sent))) == 1
    b.close(RuntimeError("channel closed"))
    for f in many:
        with pytest.raises(ChannelClosed):
            await f
    with pytest.raises(ChannelClosed):
        b.ask((3, "n", 1, None, 0.0, False, None))


async def test_ingest_a_late_worker_tells_its_lateness_and_nobody_is_suspected_for_it() -> None:
    """Batcher rule 2, lateness rule 1a: a worker that woke from a 2 s stall flushes an
    empty batch at once, before it reads the heartbeats gRPC kept for it. Taken as
    heard up to its send time, n1, silent for those 2 s, would be suspected; with the
    worker's lateness carried along, nobody is. The same silence with the worker on
    time is a suspicion. Shedding's backlog (Horizon.lateness) ignores the worker's
    lateness: a join storm's read lag must not shed the storm."""
    sent: list[bytes] = []
    b = Batcher(sent.append, lambda items: [])
    rep = _replica()
    t0 = time.monotonic()
    rep.heartbeat("n1", 1, {}, t0 - 2.2)  # heard once, then the worker stalled 2 s
    h = Horizon()
    h.joined(0, t0 - 2.2)
    b.lateness = lambda now: 2.0  # the worker's loop: a 2 s stall that just ended
    b.flush()
    (batch,) = frames.FrameDecoder().feed(sent[-1])
    assert batch[8] == 2.0 and batch[2] == pytest.approx(time.monotonic(), abs=0.05)
    h.heard(0, batch[2], batch[8])
    now = time.monotonic()
    assert h.lateness(now) < 0.05 and h.hearing(now) == pytest.approx(2.0, abs=0.05)
    rep.tick(now, max(h.lateness(now), h.hearing(now)))
    assert rep.observer.suspects() == []
    b.lateness = lambda now: 0.0  # on time: the same silence is n1's own
    b.flush()
    (batch,) = frames.FrameDecoder().feed(sent[-1])
    h.heard(0, batch[2], batch[8])
    now = time.monotonic()
    assert h.hearing(now) < 0.05
    rep.tick(now, max(h.lateness(now), h.hearing(now)))
    assert rep.observer.suspects() == ["n1"]


def test_ingest_ack_from_cached_parts_decodes_as_the_whole_ack() -> None:
    """worker.py rule 4: the batch's common fields + the heartbeat's own are one ack."""
    from dataclasses import asdict

    from arbiter.config import ArbiterConfig
    from arbiter.server.ingest.batcher import ReplicaStatus
    from arbiter.server.ingest.worker import HeartbeatService, _arbiters
    from arbiter.server.net.authz import AllowAll
    from membership.v1 import membership_pb2 as pb

    settings = {
        "config": asdict(ArbiterConfig.local()),
        "replica_id": "a2",
        "identity": "default@abc",
        "index": 0,
        "workers": 2,
    }
    service = HeartbeatService(settings, None, AllowAll())  # type: ignore[arg-type]
    arbiters = _arbiters((("a1", "h:1", True), ("a2", "h:2", True), ("a4", "h:4", False)))
    st = ReplicaStatus((7, True, "a1", 0.3, "inst", 12, None), arbiters)
    service.prepare(st)
    own = pb.HeartbeatAck(seq=41, state=pb.MEMBER_STATE_ALIVE, incarnation=3, lease_seconds=0.9)
    whole = pb.HeartbeatAck(
        seq=41, epoch=7, lease_seconds=0.9, next_interval_seconds=0.3,
        state=pb.MEMBER_STATE_ALIVE, in_quorum=True, arbiter_id="a2", incarnation=3,
        leader_id="a1", cluster_size=2, cluster="default@abc", instance="inst",
        arbiters=arbiters, config_index=12,
    )  # fmt: skip
    assert pb.HeartbeatAck.FromString(st.base + own.SerializeToString()) == whole


@pytest.mark.parametrize("seed", range(3))
def test_ingest_status_update_sends_as_before_and_keeps_no_older_request(seed: int) -> None:
    """worker.py rules 2 and 4: what a stream sends is what comparing with the last status
    sent decided, and what it keeps is the current request's status or plain values."""
    from arbiter.server.fanout.statusboard import changed
    from arbiter.server.ingest.worker import status_update
    from membership.v1 import membership_pb2 as pb

    rng = random.Random(seed)
    kept: object = None
    sent_last: pb.NodeStatus | None = None  # the reference: the message last sent, kept
    for i in range(400):
        req = pb.HeartbeatRequest(
            status=pb.NodeStatus(
                load=rng.choice([1.0, 1.02, 1.05, 1.3, 2.0]),
                phase=rng.choice(["train", "train", "eval"]),
                step=i // 3,
            )
        )
        current = req.status
        refresh = rng.random() < 0.05
        send, kept = status_update(kept, current, refresh)  # type: ignore[arg-type]
        expected = sent_last is None or refresh or changed(sent_last, current)
        assert send is expected
        if send:
            sent_last = pb.NodeStatus()
            sent_last.CopyFrom(current)
            assert kept is current
        else:
            assert kept is current or isinstance(kept, dict)
