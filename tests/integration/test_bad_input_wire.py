"""The bad-input suite on real replica processes: hypothesis-made messages for every RPC,
bytes that are not HTTP/2, 10,000 streams from one client, subscribers that never read.

One cluster of three ``membership arbiter`` processes serves the whole module
(with small limits, so that each is reached in a moment); every test attacks
replica a1. After each attack the test checks that a1 still serves everyone
else, and that its resident memory stayed bounded:

- the real node ``good`` (a ``membership node`` process) is ALIVE and
  suspected by no replica, and never logged that it was fenced;
- the witness, a node heartbeating to a1 all through the attack, had an ack
  from a1 at least every ``WITNESS_GAP`` seconds, each with a lease;
- a1's VmRSS (/proc/<pid>/status) stays below its resident memory before the
  first attack plus ``RSS_MARGIN``. What the limits let the attacks make a1
  hold is under 9 MiB (per-item costs measured by bench/limits_memory.py):
  100 streams of one connection (max_concurrent_streams, ~28 KiB each),
  150 heartbeat streams (--max-heartbeat-streams, 4.2 MiB), 12
  subscriptions (--max-subscribers, ~44 KiB each and one event gRPC could
  not send, < 64 KiB), 64 node ids (--max-nodes, ~5 KiB each). The rest of
  the margin is allocator slack (pymalloc and gRPC core's arenas keep freed
  memory): 48 MiB is over five times what the limits allow, and far below
  what one unbounded attack would make: the 10,000 streams of one client,
  were they all accepted, would take some 270 MiB.

To add an RPC: give it a strategy in ``REQUESTS`` and a caller in ``CALLS``.
"""

from __future__ import annotations

import collections
import itertools
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc
from tests.integration import rawh2
from tests.integration.harness import ProcCluster, wait_until

pytestmark = pytest.mark.integration

# Limits of the suite's replicas: small, so that each is reached in a moment.
MAX_NODES = 64
MAX_HEARTBEAT_STREAMS = 150
MAX_SUBSCRIBERS = 12
WRITE_TIMEOUT = 1.5
LIMIT_FLAGS = (
    *("--preset", "local"),
    *("--max-nodes", str(MAX_NODES)),
    *("--max-heartbeat-streams", str(MAX_HEARTBEAT_STREAMS)),
    *("--max-subscribers", str(MAX_SUBSCRIBERS)),
    *("--subscriber-write-timeout", str(WRITE_TIMEOUT)),
    *("--heartbeat-rate-margin", "1"),
)
RSS_MARGIN = 48 * 1024 * 1024  # bytes; see the module docstring
# The witness's lease is D (0.75 s): an ack at least this often keeps it leased
# all along (a gap of one lease plus one interval).
WITNESS_GAP = 0.9
# good's labels make a view snapshot bigger than a small receive window.
BIG_LABELS = {f"l{i:02d}": "v" * 200 for i in range(16)}

SERVICE = "/membership.v1.Membership/"


def rss(pid: int) -> int:
    """Resident memory of process ``pid``, bytes (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


class Witness:
    """A node heartbeating to every replica every 0.15 s in lockstep, one thread each,
    for the whole module; the acks of the attacked replica are kept."""

    def __init__(self, addresses: list[str], target: str, node_id: str = "witness") -> None:
        self.acks: list[tuple[float, float]] = []  # (monotonic receipt, lease) from target
        self.errors: list[grpc.RpcError] = []
        self._stop = threading.Event()
        self._node_id = node_id
        self._incarnation = time.time_ns() // 1000
        self._channels = [grpc.insecure_channel(a) for a in addresses]
        self._threads = [
            threading.Thread(target=self._run, args=(ch, a == target), daemon=True)
            for ch, a in zip(self._channels, addresses, strict=True)
        ]
        for t in self._threads:
            t.start()

    def _requests(self) -> Iterator[pb.HeartbeatRequest]:
        seq = 0
        while not self._stop.is_set():
            seq += 1
            yield pb.HeartbeatRequest(node_id=self._node_id, incarnation=self._incarnation, seq=seq)
            self._stop.wait(0.15)

    def _run(self, channel: grpc.Channel, keep: bool) -> None:
        try:
            for ack in pb_grpc.MembershipStub(channel).Heartbeat(self._requests()):
                if keep:
                    self.acks.append((time.monotonic(), ack.lease_seconds))
        except grpc.RpcError as e:
            if not self._stop.is_set():
                self.errors.append(e)

    def leased(self) -> bool:
        return bool(self.acks) and self.acks[-1][1] > 0

    def close(self) -> None:
        self._stop.set()
        for ch in self._channels:
            ch.close()
        for t in self._threads:
            t.join(5)

    def check(self, since: float) -> None:
        """Acks came at least every WITNESS_GAP seconds since ``since``, with leases."""
        assert not self.errors, f"the witness's streams failed: {self.errors}"
        now = time.monotonic()
        wait_until(lambda: sum(t > now for t, _ in self.acks) >= 3, 5, "acks after the attack")
        times = [since] + [t for t, _ in self.acks if t >= since] + [time.monotonic()]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert max(gaps) < WITNESS_GAP, f"a1 left the witness without an ack for {max(gaps):.2f}s"
        leases = [lease for t, lease in self.acks if t >= since]
        assert leases and min(leases) > 0, "a1 acked the witness without a lease"


@dataclass
class Wire:
    cluster: ProcCluster
    target: str  # a1's address: every test attacks it
    pid: int
    rss_before: int
    witness: Witness
    rss_seen: list[int] = field(default_factory=list)

    def stub(self, address: str | None = None) -> Any:
        ch = grpc.insecure_channel(address or self.target)
        return pb_grpc.MembershipStub(ch), ch

    def views(self) -> dict[str, pb.GetViewResponse]:
        out = {}
        for rid, addr in self.cluster.arbiters.items():
            stub, ch = self.stub(addr)
            with ch:
                out[rid] = stub.GetView(pb.GetViewRequest(), timeout=5)
        return out


@pytest.fixture(scope="module")
def wire(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wire]:
    cluster = ProcCluster(tmp_path_factory.mktemp("wire"))
    try:
        cluster.start_arbiters(3, *LIMIT_FLAGS)
        wait_until(cluster.leader, 30, "a leader")
        cluster.start_node("good", "--no-status-probes", labels=BIG_LABELS)
        target = cluster.arbiters["a1"]
        witness = Witness(cluster.addresses, target)
        w = Wire(cluster, target, cluster.procs["a1"].pid, 0, witness)
        try:
            wait_until(lambda: _good_alive_everywhere(w), 30, "good ALIVE on every replica")
            wait_until(witness.leased, 30, "the witness leased by a1")
            w.rss_before = rss(w.pid)
            yield w
        finally:
            witness.close()
        print(
            f"a1 VmRSS: {w.rss_before / 2**20:.1f} MiB before, after each test (MiB): "
            + ", ".join(f"{r / 2**20:.1f}" for r in w.rss_seen)
        )
    finally:
        if any(not p.alive() for p in cluster.procs.values()):
            print(cluster.dump())
        cluster.close()


def _good_alive_everywhere(w: Wire) -> bool:
    for view in w.views().values():
        good = [m for m in view.view.members if m.node_id == "good"]
        if not good or good[0].state != pb.MEMBER_STATE_ALIVE or good[0].suspected_by:
            return False
        if "good" in view.local_suspects:
            return False
    return True


@pytest.fixture
def undisturbed(wire: Wire, request: pytest.FixtureRequest) -> Iterator[Callable[[], None]]:
    """Runs the witness through the test; the test calls the check after its attack."""
    witness = wire.witness
    since = time.monotonic()
    checked = []

    def check() -> None:
        witness.check(since)
        assert wire.cluster.procs["a1"].alive(), "a1 died"
        assert _good_alive_everywhere(wire), "good is not ALIVE and unsuspected everywhere"
        fenced = [
            ln for ln in wire.cluster.procs["good"].stderr().splitlines() if " fenced (epoch" in ln
        ]
        assert not fenced, fenced
        refused = [
            ln
            for ln in wire.cluster.procs["good"].stderr().splitlines()
            if "refused our heartbeats" in ln
        ]
        assert not refused, refused  # the SDK never trips the wire contract
        now_rss = rss(wire.pid)
        wire.rss_seen.append(now_rss)
        assert now_rss < wire.rss_before + RSS_MARGIN, (
            f"a1 VmRSS {now_rss / 2**20:.1f} MiB, bound "
            f"{(wire.rss_before + RSS_MARGIN) / 2**20:.1f} MiB"
        )
        checked.append(True)

    yield check
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.passed:
        assert checked, "the test never checked that the others were undisturbed"


def _code(fn: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def _stream_status(stub: Any, *requests: pb.HeartbeatRequest) -> tuple[grpc.StatusCode, str, int]:
    """Sends ``requests`` on one heartbeat stream (then half-closes): status, acks."""
    acks = 0

    def run() -> None:
        nonlocal acks
        for _ in stub.Heartbeat(iter(requests), timeout=10):
            acks += 1

    code, details = _code(run)
    return code, details, acks


# --- the Done-when case: a backwards seq ------------------------------------------------


def test_wire_backwards_seq_is_refused(wire: Wire, undisturbed: Callable[[], None]) -> None:
    stub, ch = wire.stub()
    with ch:
        beats = [pb.HeartbeatRequest(node_id="back", incarnation=1, seq=s) for s in (10, 11, 12, 5)]
        code, details, acks = _stream_status(stub, *beats)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("seq: 5 after 12"), details
    assert acks == 3
    undisturbed()


# --- hypothesis: every RPC -------------------------------------------------------------

_ids = st.one_of(
    st.sampled_from(["", "x" * 129, "bad id!", "-x", "é", "good", "witness"]),
    st.text(max_size=140),
    st.from_regex(r"fz-[a-z0-9]{1,6}", fullmatch=True),
)
_u64 = st.integers(0, 2**64 - 1)
_floats = st.floats(allow_nan=True, allow_infinity=True)
_labels = st.dictionaries(st.text(max_size=70), st.text(max_size=300), max_size=40)


@st.composite
def _status(draw: st.DrawFn) -> pb.NodeStatus:
    s = pb.NodeStatus(gauges=draw(st.dictionaries(st.text(max_size=70), _floats, max_size=70)))
    for name in ("load", "gpu_utilization", "progress", "cpu_utilization"):
        if draw(st.booleans()):
            setattr(s, name, draw(_floats))
    if draw(st.booleans()):
        s.phase = draw(st.text(max_size=80))
    if draw(st.booleans()):
        s.step = draw(st.integers(-(2**63), 2**63 - 1))
    return s


def _safe(node_id: str) -> bool:
    """The fuzz never speaks as the nodes whose health the checks read."""
    return node_id not in ("good", "witness")


_heartbeat = st.builds(
    pb.HeartbeatRequest,
    node_id=_ids.filter(_safe),
    incarnation=_u64,
    seq=_u64,
    send_time_unix=_floats,
    labels=_labels,
    status=_status(),
    interval_seconds=_floats,
    cluster=st.one_of(st.just(""), st.text(max_size=80)),
)
REQUESTS: dict[str, st.SearchStrategy[Any]] = {
    "Heartbeat": st.lists(_heartbeat, min_size=1, max_size=4),
    "Subscribe": st.builds(
        pb.SubscribeRequest,
        since_epoch=_u64,
        subscriber_id=st.text(max_size=200),
        include_status=st.booleans(),
        status_interval_seconds=_floats,
        cluster=st.text(max_size=80),
        instance=st.text(max_size=40),
    ),
    "GetView": st.builds(pb.GetViewRequest, summary=st.booleans()),
    "Leave": st.builds(
        pb.LeaveRequest, node_id=_ids.filter(_safe), incarnation=_u64, cluster=st.text(max_size=80)
    ),
    # The Admin service: under --insecure anyone may administer, so the ids are
    # never the checked nodes' (nor any member's: the fuzz's own ids only join
    # one replica, never a quorum); a removal of a real member is no garbage.
    "RemoveNode": st.builds(
        pb.RemoveNodeRequest,
        node_id=_ids.filter(_safe),
        incarnation=_u64,
        cluster=st.text(max_size=80),
    ),
    # Admin.Status only reads: any cluster text is answered or refused (FAILED_PRECONDITION).
    "Status": st.builds(pb.StatusRequest, cluster=st.text(max_size=80)),
    # A backup changes nothing; a follower, or another identity, refuses it.
    "SaveSnapshot": st.builds(pb.SaveSnapshotRequest, cluster=st.text(max_size=80)),
    # Any bytes as the request of any method: what a client of another language might send.
    "raw": st.tuples(
        st.sampled_from(
            ["Heartbeat", "Subscribe", "GetView", "Leave", "RemoveNode", "Status", "SaveSnapshot"]
        ),
        st.binary(max_size=300),
    ),
}


def _call_subscribe(stub: Any, request: pb.SubscribeRequest) -> None:
    call = stub.Subscribe(request, timeout=5)
    try:
        next(call)  # the first event (a quorum status) or the refusal
    finally:
        call.cancel()


def _call_raw(channel: grpc.Channel, request: tuple[str, bytes]) -> None:
    method, payload = request
    if method == "Heartbeat":
        call = channel.stream_stream(SERVICE + method)(iter([payload]), timeout=5)
        for _ in call:
            pass
    elif method == "Subscribe":
        call = channel.unary_stream(SERVICE + method)(payload, timeout=5)
        try:
            next(call)
        finally:
            call.cancel()
    elif method in ("RemoveNode", "Status"):
        channel.unary_unary("/membership.v1.Admin/" + method)(payload, timeout=5)
    elif method == "SaveSnapshot":
        list(channel.unary_stream("/membership.v1.Admin/" + method)(payload, timeout=5))
    else:
        channel.unary_unary(SERVICE + method)(payload, timeout=5)


CALLS: dict[str, Callable[[Any, grpc.Channel, Any], object]] = {
    "Heartbeat": lambda stub, ch, reqs: [ack for ack in stub.Heartbeat(iter(reqs), timeout=5)],
    "Subscribe": lambda stub, ch, req: _call_subscribe(stub, req),
    "GetView": lambda stub, ch, req: stub.GetView(req, timeout=5),
    "Leave": lambda stub, ch, req: stub.Leave(req, timeout=5),
    "RemoveNode": lambda stub, ch, req: pb_grpc.AdminStub(ch).RemoveNode(req, timeout=5),
    "Status": lambda stub, ch, req: pb_grpc.AdminStub(ch).Status(req, timeout=5),
    "SaveSnapshot": lambda stub, ch, req: list(pb_grpc.AdminStub(ch).SaveSnapshot(req, timeout=5)),
    "raw": lambda stub, ch, req: _call_raw(ch, req),
}
# A refusal, or a call cut short by the test (CANCELLED). UNKNOWN (a handler
# that raised) would be a crash; bytes that do not decode are INVALID_ARGUMENT
# (arbiter/server/api/decoding.py).
ANSWERS = {
    grpc.StatusCode.OK,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
}


@pytest.mark.parametrize("rpc", sorted(REQUESTS))
def test_wire_fuzzed_requests_get_a_status_and_change_nothing(
    wire: Wire, undisturbed: Callable[[], None], rpc: str
) -> None:
    before = {
        rid: (v.view.epoch, sorted((m.node_id, m.state) for m in v.view.members))
        for rid, v in wire.views().items()
    }
    stub, channel = wire.stub()
    answers: dict[grpc.StatusCode, int] = {}
    undecodable: list[Any] = []

    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(request=REQUESTS[rpc])
    def fuzz(request: Any) -> None:
        code, details = _code(lambda: CALLS[rpc](stub, channel, request))
        answers[code] = answers.get(code, 0) + 1
        assert code in ANSWERS, f"{rpc} {request!r}: {code} {details}"
        if details.startswith("request: the message does not decode"):
            undecodable.append(request)

    with channel:
        fuzz()
    after = {
        rid: (v.view.epoch, sorted((m.node_id, m.state) for m in v.view.members))
        for rid, v in wire.views().items()
    }
    assert after == before, "fuzzed requests changed the committed view"
    if rpc == "raw":  # junk bytes are refused as such, with INVALID_ARGUMENT
        assert undecodable, answers
    if rpc != "GetView":  # (its one field is a bool: nothing to refuse)
        assert set(answers) - {grpc.StatusCode.OK}, f"nothing was refused: {answers}"
    undisturbed()


# --- bytes that are not HTTP/2 ---------------------------------------------------------


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _closed_by_server(sock: socket.socket, timeout: float) -> bytes:
    """Reads until the server closes the connection; returns what it sent."""
    sock.settimeout(timeout)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def test_wire_random_bytes_get_the_connection_closed(
    wire: Wire, undisturbed: Callable[[], None]
) -> None:
    rnd = random.Random(10)
    for size in (1, 24, 1000, 100_000):
        with _connect(wire.target) as sock:
            sock.sendall(bytes(rnd.getrandbits(8) for _ in range(size)))
            _closed_by_server(sock, 10)  # a timeout here fails the test
    # A valid preface followed by garbage frames: the server answers GOAWAY.
    with _connect(wire.target) as sock:
        sock.sendall(rawh2.PREFACE + bytes(rnd.getrandbits(8) for _ in range(5000)))
        got = _closed_by_server(sock, 10)
        assert got, "no GOAWAY"
    undisturbed()


def test_wire_truncated_preface_holds_nothing_and_blocks_nobody(
    wire: Wire, undisturbed: Callable[[], None]
) -> None:
    socks = []
    try:
        for i in range(300):  # many half-started connections at once
            sock = _connect(wire.target)
            sock.sendall(rawh2.PREFACE[: 1 + i % (len(rawh2.PREFACE) - 1)])
            socks.append(sock)
        # Everyone else is served meanwhile: a new client gets its view at once.
        stub, ch = wire.stub()
        with ch:
            assert stub.GetView(pb.GetViewRequest(summary=True), timeout=5).in_quorum
        undisturbed()
    finally:
        for sock in socks:
            sock.close()
    # A truncated preface and then the end of the connection: nothing is left behind.
    with _connect(wire.target) as sock:
        sock.sendall(rawh2.PREFACE[:10])
        sock.shutdown(socket.SHUT_WR)
        _closed_by_server(sock, 10)


# --- streams --------------------------------------------------------------------------


def test_wire_ten_thousand_streams_on_one_connection_are_refused_past_the_limit(
    wire: Wire, undisturbed: Callable[[], None]
) -> None:
    """A client that ignores SETTINGS_MAX_CONCURRENT_STREAMS: 10,000 calls at once.

    gRPC refuses every stream past 100 with RST_STREAM(REFUSED_STREAM). If the
    client reads those RST_STREAMs too slowly, gRPC's flood protection
    (grpc.http2.max_pending_induced_frames, 10,000) closes the connection
    instead, which ends all its streams: either way no more than 100 are open.
    """
    sock = _connect(wire.target)
    reader = rawh2.FrameReader(sock)
    try:
        sock.sendall(rawh2.PREFACE + rawh2.settings())
        try:
            for start in range(0, 10_000, 500):
                sock.sendall(
                    b"".join(
                        rawh2.grpc_request_headers(2 * i + 1, SERVICE + "Heartbeat")
                        for i in range(start, start + 500)
                    )
                )
        except OSError:
            pass  # the server closed the connection: checked below
        wait_until(
            lambda: len(reader.of_kind(rawh2.RST_STREAM)) >= 9_900 or reader.closed.is_set(),
            30,
            "RST_STREAM for every stream past the limit, or the connection closed",
        )
        refused = reader.of_kind(rawh2.RST_STREAM)
        codes = collections.Counter(int.from_bytes(f.payload, "big") for f in refused)
        # REFUSED_STREAM, or ENHANCE_YOUR_CALM once gRPC sees the client keeps on.
        assert set(codes) <= {rawh2.REFUSED_STREAM, rawh2.ENHANCE_YOUR_CALM}, codes
        if not reader.closed.is_set():
            assert len({f.stream for f in refused}) == 9_900, codes  # 100 (the limit) stay open
        print(f"10,000 streams: RST_STREAM codes {dict(codes)}, closed {reader.closed.is_set()}")
        settings_frame = reader.of_kind(rawh2.SETTINGS)[0].payload
        values = {
            int.from_bytes(settings_frame[i : i + 2], "big"): int.from_bytes(
                settings_frame[i + 2 : i + 6], "big"
            )
            for i in range(0, len(settings_frame), 6)
        }
        assert values[0x3] == 100  # SETTINGS_MAX_CONCURRENT_STREAMS
        undisturbed()
    finally:
        reader.close()


def test_wire_heartbeat_streams_past_the_limit_are_refused(
    wire: Wire, undisturbed: Callable[[], None]
) -> None:
    """Streams over several connections (100 each at most) reach max_heartbeat_streams."""
    channels = [
        grpc.insecure_channel(wire.target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(3)
    ]
    calls = []
    hold = threading.Event()

    def nothing_yet() -> Iterator[pb.HeartbeatRequest]:
        hold.wait()  # a stream kept open, its first heartbeat never sent
        yield from ()

    try:
        for ch in channels:
            stub = pb_grpc.MembershipStub(ch)
            for _ in range(70):
                calls.append(stub.Heartbeat(nothing_yet(), timeout=20))
        # The ones past the limit end at once; the others wait for a first heartbeat.
        # At most the limit less good's stream and the witness's are left open.
        least = len(calls) - (MAX_HEARTBEAT_STREAMS - 2)
        refused = wait_until(
            lambda: [c for c in calls if c.done()] if sum(c.done() for c in calls) >= least else [],
            15,
            "refusals past max_heartbeat_streams",
        )
        assert len(refused) <= len(calls) - 100, "streams under the limit were refused"
        for c in refused:
            assert c.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, c.details()
            assert re.match(
                r"max_heartbeat_streams: \d+ heartbeat streams are open on arbiter "
                r"a1 \(the limit is 150\)",
                c.details(),
            ), c.details()
        undisturbed()  # good and the witness kept theirs
    finally:
        hold.set()
        for c in calls:
            c.cancel()
        for ch in channels:
            ch.close()


def test_wire_heartbeat_flood_is_throttled_then_cut(
    wire: Wire, undisturbed: Callable[[], None]
) -> None:
    stub, ch = wire.stub()
    with ch:
        started = time.monotonic()
        flood = [
            pb.HeartbeatRequest(node_id="witness-flood", incarnation=1, seq=i)
            for i in range(1, 200)
        ]
        code, details, acks = _stream_status(stub, *flood)
        took = time.monotonic() - started
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details.startswith("max_heartbeat_rate: more than 20 heartbeats per second"), details
    # Throttled first: a second's burst, then one per token, for the 1 s margin.
    assert 20 <= acks <= 45, acks
    assert took >= 1.0, took
    undisturbed()


# --- subscribers ----------------------------------------------------------------------


def test_wire_subscribers_that_never_read_are_cut_off(
    wire: Wire, undisturbed: Callable[[], None]
) -> None:
    # A small receive window (no growth): the snapshot (good's labels are 3 KiB) cannot pass.
    options = [
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", 1024),
        ("grpc.use_local_subchannel_pool", 1),
    ]
    channels = [grpc.insecure_channel(wire.target, options=options) for _ in range(MAX_SUBSCRIBERS)]
    try:
        a1 = wire.cluster.procs["a1"]
        cut_before = a1.stderr().count("does not read: its subscription is ended")
        calls = [
            pb_grpc.MembershipStub(ch).Subscribe(pb.SubscribeRequest(), timeout=60)
            for ch in channels
        ]
        started = time.monotonic()
        # Nothing is read: a1 ends each once an event waited WRITE_TIMEOUT (it says so).
        wait_until(
            lambda: (
                a1.stderr().count("does not read: its subscription is ended")
                >= cut_before + MAX_SUBSCRIBERS - 1
            ),
            WRITE_TIMEOUT + 15,
            "a1 to cut the subscribers that do not read",
        )
        assert time.monotonic() - started >= WRITE_TIMEOUT

        def served() -> bool:
            stub, ch = wire.stub()
            with ch:
                call = stub.Subscribe(pb.SubscribeRequest(), timeout=5)
                try:
                    return next(call).WhichOneof("event") == "quorum"
                except grpc.RpcError as e:
                    assert e.details().startswith("max_subscribers"), e
                    return False
                finally:
                    call.cancel()

        # Their slots are free again at once (a1 logs just before it frees one):
        # a new subscriber (which reads) is served.
        wait_until(served, 5, "a new subscriber served")
        undisturbed()
        # Each one, reading at last, finds what was sent and then the status. (good's
        # client may hold a slot on a1 too, to follow the view: one may have been refused.)
        cut = []
        for call in calls:
            with pytest.raises(grpc.RpcError) as info:
                for _ in call:
                    pass
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            details = info.value.details()
            assert details.startswith(
                (
                    f"subscriber_write_timeout: an event waited more than {WRITE_TIMEOUT:g}s",
                    "max_subscribers: 12 subscriptions are open",
                )
            ), details
            cut.append(details.startswith("subscriber_write_timeout"))
        assert sum(cut) >= MAX_SUBSCRIBERS - 1, cut
    finally:
        for ch in channels:
            ch.close()


# --- the SDK never trips the rules ----------------------------------------------------


def _record(wire: Wire, node_id: str) -> list[tuple[int, int]]:
    """(incarnation, state) of ``node_id`` in every replica's view."""
    out = []
    for view in wire.views().values():
        out += [(m.incarnation, m.state) for m in view.view.members if m.node_id == node_id]
    return out


def test_wire_sdk_node_moving_to_a_new_incarnation_opens_new_streams(
    wire: Wire, undisturbed: Callable[[], None]
) -> None:
    """A node started below the incarnation the cluster records moves up on every link
    (membership/_node/session.py rule 4): it must do so on new streams, never refused."""
    # The cluster records incarnation 5 for "rejoiner" (heard by all three, then gone).
    stubs = [wire.stub(a) for a in wire.cluster.addresses]
    try:
        for i in range(1, 15):
            for stub, _ in stubs:
                stub.Heartbeat(
                    iter([pb.HeartbeatRequest(node_id="rejoiner", incarnation=5, seq=i)]), timeout=5
                ).next()
            if (5, pb.MEMBER_STATE_ALIVE) in _record(wire, "rejoiner"):
                break
            time.sleep(0.15)
    finally:
        for _, ch in stubs:
            ch.close()
    node = wire.cluster.start_node("rejoiner", "--no-status-probes", "--incarnation", "1")
    wait_until(
        lambda: (
            all(inc > 5 and st == pb.MEMBER_STATE_ALIVE for inc, st in _record(wire, "rejoiner"))
            and len(_record(wire, "rejoiner")) == 3
        ),
        20,
        "rejoiner ALIVE above incarnation 5 on every replica",
    )
    assert "rejoining as" in node.stderr()  # it did move up on its links
    refused = [ln for ln in node.stderr().splitlines() if "refused our heartbeats" in ln]
    assert not refused, refused  # the node keeps running (stopped with the cluster)
    undisturbed()


# --- nodes (last: the node ids it adds stay tracked) -----------------------------------


def test_wire_new_node_ids_past_max_nodes_are_refused_known_ones_go_on(
    wire: Wire, undisturbed: Callable[[], None]
) -> None:
    stub, ch = wire.stub()
    with ch:
        refusal = None
        for i in range(MAX_NODES + 10):
            beat = pb.HeartbeatRequest(node_id=f"cap-{i}", incarnation=1, seq=1)
            code, details, _ = _stream_status(stub, beat)
            if code != grpc.StatusCode.OK:
                refusal = (code, details)
                break
        assert refusal is not None, "no node id was refused"
        assert refusal[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert re.match(
            r"max_nodes: arbiter a1 tracks \d+ nodes \(the limit is 64\) and does "
            r"not know 'cap-\d+'",
            refusal[1],
        ), refusal[1]
        # A node it knows opens a new stream and is acked.
        code, _, acks = _stream_status(
            stub, pb.HeartbeatRequest(node_id="cap-0", incarnation=1, seq=2)
        )
        assert code == grpc.StatusCode.OK and acks == 1
    undisturbed()
