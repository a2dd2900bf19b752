"""The scale benchmark's ``loadgen etcd`` keeps leases alive as etcd's clientv3 does.

A fake etcd in this process (etcdserverpb's Lease, KV and Watch services on raw
bytes, messages hand-encoded with the field numbers of etcd 3.4's rpc.proto)
answers the load generator: a lease's next keepalive must wait TTL/3 after its
last answer (clientv3's ``nextKeepAlive``; counted from the child's start, so a
slow machine can only make it look slower), an unanswered one is sent again, a
TTL 0 answer must make it grant the lease again and put the key under the new
one, a failed grant must be retried (the process must not die), a kill must
stop that lease's keepalives and name the lease, and a watched DELETE must be
printed with the lease its key was under. Skipped where Go and Debian's
grpc-go are not installed. No speed is asserted.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from membership.testing.localcluster import free_ports
from tests.integration.harness import wait_async
from tests.integration.test_scale_loadgen import _child

TTL = 3  # a lease is renewed TTL/3 = 1 s after its last answer, at the next 0.5 s pass


def _varint(v: int) -> bytes:
    out = bytearray()
    v &= (1 << 64) - 1
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _field(num: int, v: int | bytes) -> bytes:
    if isinstance(v, int):
        return _varint(num << 3) + _varint(v)
    return _varint(num << 3 | 2) + _varint(len(v)) + v


def _fields(msg: bytes) -> dict[int, int | bytes]:
    """The last value of each field of a message (varint and length-delimited only)."""
    out: dict[int, int | bytes] = {}
    i = 0

    def varint() -> int:
        nonlocal i
        v = shift = 0
        while True:
            b = msg[i]
            i += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return v

    while i < len(msg):
        tag = varint()
        if tag & 7 == 0:
            out[tag >> 3] = varint()
        else:
            n = varint()
            out[tag >> 3] = msg[i : i + n]
            i += n
    return out


class FakeEtcd:
    """Grants leases 1, 2, ... (the first grant fails UNAVAILABLE), renews them at TTL
    unless told otherwise, and streams the PUTs and DELETEs it is given to watchers."""

    def __init__(self) -> None:
        self.grants = 0
        self.next_id = 0
        self.puts: dict[bytes, int] = {}  # key -> lease
        self.keepalives: dict[int, list[float]] = defaultdict(list)  # lease -> send times
        self.answered: dict[int, list[float]] = defaultdict(list)
        self.gone: set[int] = set()  # answered TTL 0
        self.mute: set[int] = set()  # not answered
        self.metadata: list[dict[str, str]] = []
        self.watchers: list[asyncio.Queue[bytes]] = []

    async def grant(self, request: bytes, context: Any) -> bytes:
        self.grants += 1
        if self.grants == 1:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out")
        self.next_id += 1
        return _field(2, self.next_id) + _field(3, TTL)

    async def put(self, request: bytes, context: Any) -> bytes:
        f = _fields(request)
        key, lease = f[1], f.get(3, 0)
        assert isinstance(key, bytes) and isinstance(lease, int)
        self.puts[key] = lease
        self.event(0, key, lease)
        return b""

    def event(self, typ: int, key: bytes, lease: int = 0) -> None:
        kv = _field(1, key) + _field(3, len(self.puts) + 100) + (_field(6, lease) if lease else b"")
        ev = (_field(1, typ) if typ else b"") + _field(2, kv)
        for q in self.watchers:
            q.put_nowait(_field(11, ev))

    async def keepalive(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        self.metadata.append(dict(context.invocation_metadata()))
        async for req in requests:
            lease = _fields(req)[1]
            assert isinstance(lease, int)
            self.keepalives[lease].append(time.monotonic())
            if lease in self.mute:
                continue
            self.answered[lease].append(time.monotonic())
            yield _field(2, lease) + (b"" if lease in self.gone else _field(3, TTL))

    async def watch(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        q: asyncio.Queue[bytes] = asyncio.Queue()
        self.watchers.append(q)
        await anext(aiter(requests))  # the create request
        yield _field(3, 1)  # created
        while True:
            yield await q.get()

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        def h(svc: str, methods: dict[str, Any]) -> grpc.GenericRpcHandler:
            return grpc.method_handlers_generic_handler(f"etcdserverpb.{svc}", methods)

        stream: Callable[..., Any] = grpc.stream_stream_rpc_method_handler
        return [
            h(
                "Lease",
                {
                    "LeaseGrant": grpc.unary_unary_rpc_method_handler(self.grant),
                    "LeaseKeepAlive": stream(self.keepalive),
                },
            ),
            h("KV", {"Put": grpc.unary_unary_rpc_method_handler(self.put)}),
            h("Watch", {"Watch": stream(self.watch)}),
        ]


@pytest.fixture
async def etcd() -> AsyncIterator[tuple[str, FakeEtcd]]:
    fake = FakeEtcd()
    srv = grpc.aio.server()
    srv.add_generic_rpc_handlers(fake.handlers())
    addr = f"127.0.0.1:{free_ports(1)[0]}"
    srv.add_insecure_port(addr)
    await srv.start()
    try:
        yield addr, fake
    finally:
        await srv.stop(0)


async def test_loadgen_etcd_renews_as_clientv3_grants_again_and_matches_deletes(
    etcd: tuple[str, FakeEtcd],
) -> None:
    addr, fake = etcd
    start = time.monotonic()
    async with _child("etcd", "--endpoints", addr, "--prefix", "t", "--count", "3") as lg:
        await wait_async(lambda: lg.last("ready") is not None, 10, "all 3 leases granted")
        assert fake.grants == 4  # the failed one was retried
        assert set(fake.puts) == {b"/bench/t0", b"/bench/t1", b"/bench/t2"}
        lease = {k.decode()[7:]: v for k, v in fake.puts.items()}
        await wait_async(
            lambda: all(len(fake.keepalives[v]) >= 2 for v in lease.values()), 10, "renewals"
        )
        assert all(m.get("hasleader") == "true" for m in fake.metadata)  # clientv3's metadata
        for v in lease.values():  # each at least TTL/3 after the previous one's answer
            sent = fake.keepalives[v]
            assert len(sent) <= (sent[-1] - start) / (TTL / 3) + 1

        fake.mute.add(lease["t2"])  # unanswered: sent again at the following passes
        fake.gone.add(lease["t1"])  # etcd says it no longer has t1's lease
        await lg.send("kill t0")
        muted = len(fake.keepalives[lease["t2"]])
        await wait_async(lambda: lg.last("killed") is not None, 5, "the kill")
        killed_at = len(fake.keepalives[lease["t0"]])
        killed = lg.last("killed")
        assert killed is not None and killed["node"] == "t0" and killed["lease"] == lease["t0"]
        await wait_async(lambda: len(fake.keepalives[lease["t2"]]) >= muted + 2, 5, "resends")
        await wait_async(lambda: lg.last("expired") is not None, 5, "the expiry")
        expired = lg.last("expired")
        assert expired is not None and (expired["node"], expired["lease"]) == ("t1", lease["t1"])
        await wait_async(lambda: fake.puts[b"/bench/t1"] != lease["t1"], 10, "t1 granted again")
        renewed = fake.puts[b"/bench/t1"]
        await wait_async(lambda: len(fake.keepalives[renewed]) >= 1, 5, "the new lease renewed")
        assert len(fake.keepalives[lease["t0"]]) <= killed_at + 1  # one already on its way

        fake.puts.pop(b"/bench/t0")
        fake.event(1, b"/bench/t0")  # the watcher sees t0's key deleted
        await wait_async(lambda: lg.last("deleted") is not None, 5, "the DELETE")
        deleted = lg.last("deleted")
        assert deleted is not None and deleted["node"] == "t0"
        assert deleted["lease"] == lease["t0"]  # the lease the key was under: the kill's

        await lg.send("quit")
        await wait_async(lambda: lg.last("final") is not None, 5, "the final report")
        final = lg.last("final")
        assert final is not None
        assert final["expired"] == 1 and final["grant_errors"] == 1 and final["live"] == 2
