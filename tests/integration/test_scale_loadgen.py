"""The scale benchmark's Go load generator (bench/loadgen/) speaks the real wire.

A grpc.aio server in this process, built on the generated membership.v1
classes, receives what ``loadgen hb`` and ``loadgen sub`` send: every
hand-encoded HeartbeatRequest must decode with the fields the SDK sets, the
interval must follow the acks, a stream must keep one heartbeat in flight
until an ack grants a lease (the SDK's slow start), a shed stream must be
reopened no sooner than the replica's retry hint, and a ``kill`` must end
that node's stream (no Leave) while the others go on; the subscriber must
decode a snapshot and a change. Skipped where Go and Debian's grpc-go are not installed (the
benchmark installs them; the test does not). No speed is asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from membership.testing.localcluster import free_ports
from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc
from tests.integration.harness import wait_async

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.append(str(BENCH))  # bench/ is not a package: its scripts import each other by name
import loadgen  # noqa: E402

SUGGESTED = 0.25
HINT_MS = 2500  # a retry hint above the load generator's own 0.5 to 1.5 s reopen delay


def _binary() -> Path:
    if shutil.which("go") is None or not (loadgen.GOPATH / "src/google.golang.org/grpc").is_dir():
        pytest.skip(
            "Go and golang-google-grpc-dev are not installed (bench/scale.py installs them)"
        )
    return loadgen.binary()


class Recorder(pb_grpc.MembershipServicer):
    """Acks every heartbeat (ALIVE, next_interval SUGGESTED) and records the requests."""

    def __init__(self) -> None:
        self.requests: dict[str, list[pb.HeartbeatRequest]] = defaultdict(list)
        self.ended: set[str] = set()
        self.gate = asyncio.Event()  # acks wait for it
        self.gate.set()
        self.lease = 1.0  # granted in every ack
        self.shed: dict[str, int] = {}  # node -> streams to refuse with a retry hint (ms)
        self.opened: dict[str, list[float]] = defaultdict(list)  # node -> stream open times

    async def Heartbeat(
        self, request_iterator: AsyncIterator[pb.HeartbeatRequest], context: Any
    ) -> AsyncIterator[pb.HeartbeatAck]:
        node = ""
        try:
            async for req in request_iterator:
                if req.node_id != node:  # a stream's first heartbeat
                    self.opened[req.node_id].append(time.monotonic())
                    if self.shed.get(req.node_id):
                        self.shed[req.node_id] -= 1
                        await context.abort(
                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                            "shedding: test",
                            trailing_metadata=(("grpc-retry-pushback-ms", str(HINT_MS)),),
                        )
                node = req.node_id
                self.requests[node].append(req)
                await self.gate.wait()
                yield pb.HeartbeatAck(
                    seq=req.seq,
                    lease_seconds=self.lease,
                    epoch=7,
                    next_interval_seconds=SUGGESTED,
                    state=pb.MEMBER_STATE_ALIVE,
                    incarnation=req.incarnation,
                )
        finally:
            self.ended.add(node)

    async def Subscribe(
        self, request: pb.SubscribeRequest, context: Any
    ) -> AsyncIterator[pb.MembershipEvent]:
        alive = pb.Member(node_id="x1", incarnation=1, state=pb.MEMBER_STATE_ALIVE, epoch=5)
        yield pb.MembershipEvent(snapshot=pb.ViewSnapshot(view=pb.View(epoch=5, members=[alive])))
        dead = pb.MemberChange(node_id="x1", incarnation=1, state=pb.MEMBER_STATE_DEAD)
        yield pb.MembershipEvent(change=pb.ViewChange(epoch=6, changes=[dead]))
        await asyncio.Event().wait()  # held open until the client cancels


class Lines:
    """A child's JSON lines, read on the loop."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[dict[str, Any]] = []
        self.task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.lines.append(json.loads(raw))

    def last(self, ev: str) -> dict[str, Any] | None:
        return next((x for x in reversed(self.lines) if x.get("ev") == ev), None)

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()


@contextlib.asynccontextmanager
async def _child(*argv: str) -> AsyncIterator[Lines]:
    proc = await asyncio.create_subprocess_exec(
        str(_binary()), *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    lines = Lines(proc)
    try:
        yield lines
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        lines.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lines.task


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Recorder]]:
    rec = Recorder()
    srv = grpc.aio.server()
    pb_grpc.add_MembershipServicer_to_server(rec, srv)
    addr = f"127.0.0.1:{free_ports(1)[0]}"
    srv.add_insecure_port(addr)
    await srv.start()
    try:
        yield addr, rec
    finally:
        await srv.stop(0)


async def test_loadgen_heartbeats_decode_follow_the_interval_and_kill_ends_one_stream(
    server: tuple[str, Recorder],
) -> None:
    addr, rec = server
    async with _child("hb", "--arbiters", addr, "--prefix", "t", "--count", "3") as lg:
        nodes = {"t0", "t1", "t2"}

        def following() -> bool:
            return set(rec.requests) == nodes and all(
                any(r.interval_seconds == SUGGESTED for r in rec.requests[n]) for n in nodes
            )

        await wait_async(following, 10, "every node declaring the suggested interval")
        for n in nodes:
            reqs = rec.requests[n]
            first = reqs[0]
            assert first.interval_seconds == 0  # before any suggestion, as the SDK
            assert first.incarnation > 0 and all(r.incarnation == first.incarnation for r in reqs)
            assert [r.seq for r in reqs] == sorted({r.seq for r in reqs})  # strictly increasing
            assert dict(first.labels) == {"role": "worker", "pool": "bench"}
            assert first.status.phase == "allreduce" and first.status.HasField("load")
            assert first.send_time_unix > 1e9
        await wait_async(
            lambda: (
                (r := lg.last("report")) is not None
                and r["arbiters"][0]["states"].get("ALIVE") == 3
            ),
            5,
            "a report of 3 ALIVE",
        )
        await lg.send("kill t1")
        await wait_async(lambda: "t1" in rec.ended, 5, "t1's stream to end")
        killed = next(x for x in lg.lines if x.get("ev") == "killed")
        assert killed["node"] == "t1" and killed["t"] > 0
        before = len(rec.requests["t0"])
        await wait_async(lambda: len(rec.requests["t0"]) > before + 1, 5, "t0 to go on")
        assert "t0" not in rec.ended and "t2" not in rec.ended
        await lg.send("quit")
        await wait_async(lambda: lg.last("final") is not None, 5, "the final report")
        final = lg.last("final")
        assert final is not None and final["live"] == 2


async def test_loadgen_slow_start_one_heartbeat_in_flight_until_an_ack_grants_a_lease(
    server: tuple[str, Recorder],
) -> None:
    addr, rec = server
    rec.gate.clear()  # the replica is late: no ack yet
    rec.lease = 0.0  # and the nodes join: no lease
    argv = ("hb", "--arbiters", addr, "--prefix", "w", "--count", "2", "--report", "0.1")
    async with _child(*argv) as lg:
        await wait_async(lambda: set(rec.requests) == {"w0", "w1"}, 10, "both first heartbeats")

        def reports() -> int:
            return sum(1 for x in lg.lines if x.get("ev") == "report")

        seen = reports()
        # Five reports later (0.5 s: three of the 0.15 s intervals) nothing more was sent,
        # and the load generator says both streams wait for their first ack.
        await wait_async(lambda: reports() >= seen + 5, 10, "five more reports")
        assert {n: [r.seq for r in reqs] for n, reqs in rec.requests.items()} == {
            "w0": [1],
            "w1": [1],
        }
        last = lg.last("report")
        assert last is not None
        assert last["arbiters"][0]["slow_start_waiting"] == 2
        assert last["arbiters"][0]["required_rate"] == 0
        rec.gate.set()  # the acks come, one heartbeat at a time while nothing is leased
        await wait_async(
            lambda: all(len(rec.requests[n]) >= 3 for n in ("w0", "w1")), 10, "the cadence"
        )
        rec.lease = 1.0  # the join committed: a lease, and slow start is over
        leased = {n: len(rec.requests[n]) + 1 for n in ("w0", "w1")}
        await wait_async(
            lambda: all(len(rec.requests[n]) > leased[n] for n in leased), 10, "a leased ack"
        )
        rec.gate.clear()  # late again: a leased stream sends on at its interval
        sent = lg.last("report")["arbiters"][0]["sent"]  # type: ignore[index]
        await wait_async(
            lambda: lg.last("report")["arbiters"][0]["sent"] >= sent + 6,  # type: ignore[index]
            10,
            "heartbeats with none acked",
        )
        rec.gate.set()


async def test_loadgen_waits_for_the_retry_hint_of_a_replica_that_sheds(
    server: tuple[str, Recorder],
) -> None:
    addr, rec = server
    rec.shed["h0"] = 1  # its first stream is refused, with a hint
    async with _child("hb", "--arbiters", addr, "--prefix", "h", "--count", "1"):
        await wait_async(lambda: len(rec.requests["h0"]) >= 2, 15, "h0 heartbeating again")
        first, second = rec.opened["h0"][:2]
        assert second - first >= HINT_MS / 1000 - 0.05


async def test_loadgen_gaps_report_the_nodes_own_lateness_when_its_process_stalls(
    server: tuple[str, Recorder],
) -> None:
    addr, rec = server
    async with _child("hb", "--arbiters", addr, "--prefix", "g", "--count", "1") as lg:
        await wait_async(
            lambda: any(r.interval_seconds == SUGGESTED for r in rec.requests["g0"]),
            10,
            "g0 declaring the suggested interval",
        )

        async def gaps() -> dict[str, Any]:
            seen = sum(1 for x in lg.lines if x.get("ev") == "gaps")
            await lg.send("gaps g0")
            await wait_async(
                lambda: sum(1 for x in lg.lines if x.get("ev") == "gaps") > seen, 5, "gaps"
            )
            last = lg.last("gaps")
            assert last is not None
            return last

        before = len(rec.requests["g0"])
        await wait_async(lambda: len(rec.requests["g0"]) >= before + 3, 10, "leased heartbeats")
        ok = await gaps()
        (link,) = ok["links"]
        assert link["addr"] == addr and link["max_gap_s"] > 0
        assert link["interval_s"] == pytest.approx(SUGGESTED)
        # The node's own process stops for 1.5 s (six of its intervals): the gap is its own,
        # and the ratio says so.
        lg.proc.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(1.5)  # the length of the stall is the fault itself
        finally:
            lg.proc.send_signal(signal.SIGCONT)
        await wait_async(lambda: len(rec.requests["g0"]) >= before + 5, 10, "g0 sending again")
        late = await gaps()
        assert late["links"][0]["max_gap_s"] >= 1.4
        assert late["max_ratio"] >= 1.4 / SUGGESTED
        assert late["max_ratio"] > ok["max_ratio"]


async def test_loadgen_subscribers_decode_the_snapshot_and_a_death(
    server: tuple[str, Recorder],
) -> None:
    addr, _ = server
    async with _child("sub", "--arbiters", addr, "--count", "2") as sub:

        def seen() -> dict[str, Any] | None:
            return next((x for x in sub.lines if x.get("ev") == "epoch"), None)

        await wait_async(lambda: seen() is not None, 10, "epoch 6 at both subscribers")
        ev = seen()
        assert ev is not None
        assert ev["epoch"] == 6 and ev["subs"] == 2 and ev["dead"] == ["x1"] and ev["alive"] == 0
