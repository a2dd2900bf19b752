"""The programs behind bench/heartbeat_path.py: a heartbeat load worker and a bare server.

Not a benchmark of its own; bench/heartbeat_path.py starts these as child processes.

``--load``: one process simulating ``--count`` nodes, each with one real
``Heartbeat`` stream to every ``--targets`` address on a gRPC channel (one TCP
connection) of its own, as the SDK does. Each stream writes a request, reads
its ack, and sleeps to the next tick of ``--interval`` seconds (declared in
``interval_seconds``); a stream that fell more than one interval behind skips
ahead, never bursting to catch up. Requests carry what the SDK's carry:
node id, incarnation, seq, send time, two labels, a status (load, CPU and
memory use) that changes every ``--status-every`` seconds (the SDK probes
once a second), and the cluster on the first heartbeat of a stream. Control
on stdin, one word a line: ``mark`` prints one JSON line with the counters
since the last mark (sent, acked, stream failures, streams acked at least
once, the lateness of its own sends and the write-to-ack round trip, both
p50/p99/max in ms, this process's CPU seconds) and ``stop`` exits.

``--bare``: a grpc.aio server on ``--port`` with the Membership service's
``Heartbeat`` only: it decodes every HeartbeatRequest (gRPC does) and answers
a HeartbeatAck of the replica's shape (epoch, lease, interval, state,
quorum, ids, cluster, instance, three arbiters, config index) copied from
one template with ``seq`` and ``incarnation`` set: the least a server can
do per heartbeat with these messages. It is the baseline of every figure.

``--bare --like-ours``: the same with the replica's gRPC server settings (its
options: keepalive, limits; and its request interceptor), to tell what the
settings cost from what the replica's code costs.

Both take ``--loop asyncio|uvloop``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time

import grpc

from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc

_OWN_CONNECTION = ("grpc.use_local_subchannel_pool", 1)


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Load:
    """The streams of one load process and their counters."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sent = self.acked = self.failures = 0
        self.late: list[float] = []
        self.rtt: list[float] = []
        self.acked_once: set[tuple[int, str]] = set()
        self.stop = asyncio.Event()

    def mark(self) -> str:
        out = {
            "sent": self.sent,
            "acked": self.acked,
            "failures": self.failures,
            "streams_acked": len(self.acked_once),
            "late_ms": [round(_pct(self.late, q) * 1000, 2) for q in (0.5, 0.99, 1.0)],
            "rtt_ms": [round(_pct(self.rtt, q) * 1000, 2) for q in (0.5, 0.99, 1.0)],
            "cpu_s": time.process_time(),
        }
        self.sent = self.acked = self.failures = 0
        self.late, self.rtt = [], []
        return json.dumps(out)

    async def stream(self, i: int, target: str, offset: float) -> None:
        a = self.args
        node = f"{a.prefix}{i}"
        loop = asyncio.get_running_loop()
        await asyncio.sleep(offset)
        incarnation = int(time.time() * 1000)
        labels = {"job": "bench", "rank": str(i)}
        while not self.stop.is_set():
            channel = grpc.aio.insecure_channel(
                target, options=[_OWN_CONNECTION, ("grpc.enable_retries", 0)]
            )
            try:
                call = pb_grpc.MembershipStub(channel).Heartbeat()
                seq = 0
                due = loop.time()
                status_at = -1.0
                status = pb.NodeStatus()
                while True:
                    seq += 1
                    now = loop.time()
                    self.late.append(max(0.0, now - due))
                    if now - status_at >= a.status_every:
                        status_at = now
                        # A new status, as the SDK's probe gives every second.
                        status = pb.NodeStatus(
                            load=0.5 + (seq % 7) / 10,
                            cpu_utilization=(seq % 13) / 13,
                            memory_utilization=0.4,
                        )
                    await call.write(
                        pb.HeartbeatRequest(
                            node_id=node,
                            incarnation=incarnation,
                            seq=seq,
                            send_time_unix=time.time(),
                            labels=labels,
                            status=status,
                            interval_seconds=a.interval,
                            cluster=a.cluster if seq == 1 else "",
                        )
                    )
                    self.sent += 1
                    ack = await call.read()
                    if ack is grpc.aio.EOF:
                        raise ConnectionError("stream ended")
                    self.rtt.append(loop.time() - now)
                    self.acked += 1
                    self.acked_once.add((i, target))
                    due += a.interval
                    if due < loop.time() - a.interval:
                        due = loop.time()  # far behind: skip ahead, never burst
                    await asyncio.sleep(max(0.0, due - loop.time()))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # AioRpcError, or a write after the server ended the call
                self.failures += 1
                if self.failures <= 3:
                    print(f"stream {node} -> {target}: {e!r}"[:300], file=sys.stderr)
            finally:
                await channel.close(grace=None)
            await asyncio.sleep(0.2)

    async def run(self) -> None:
        a = self.args
        loop = asyncio.get_running_loop()
        commands: asyncio.Queue[str] = asyncio.Queue()

        def read_stdin() -> None:
            for line in sys.stdin:
                loop.call_soon_threadsafe(commands.put_nowait, line.strip())
            loop.call_soon_threadsafe(commands.put_nowait, "stop")

        threading.Thread(target=read_stdin, daemon=True).start()
        targets = a.targets.split(",")
        tasks = [
            loop.create_task(self.stream(i, t, (k / a.count) * a.interval))
            for k, i in enumerate(range(a.first, a.first + a.count))
            for t in targets
        ]
        while True:
            cmd = await commands.get()
            if cmd == "mark":
                print(self.mark(), flush=True)
            elif cmd == "stop":
                break
        self.stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Bare(pb_grpc.MembershipServicer):
    """Acks every heartbeat with a copy of one replica-shaped template (module docstring)."""

    def __init__(self) -> None:
        self.template = pb.HeartbeatAck(
            epoch=1234,
            lease_seconds=2.25,
            next_interval_seconds=0.6,
            state=pb.MEMBER_STATE_ALIVE,
            in_quorum=True,
            arbiter_id="a1",
            leader_id="a2",
            cluster_size=3,
            cluster="default@0123456789abcdef",
            instance="0123456789abcdef0123456789abcdef",
            arbiters=[
                pb.Arbiter(id=f"a{i}", address=f"127.0.0.1:{40000 + i}", voter=True)
                for i in (1, 2, 3)
            ],
            config_index=0,
        )

    async def Heartbeat(self, request_iterator, context):  # type: ignore[no-untyped-def]
        template = self.template
        async for req in request_iterator:
            ack = pb.HeartbeatAck()
            ack.CopyFrom(template)
            ack.seq = req.seq
            ack.incarnation = req.incarnation
            yield ack


async def serve_bare(port: int, like_ours: bool = False) -> None:
    options: list[tuple[str, int]] = [("grpc.so_reuseport", 0)]
    interceptors: list[object] = []
    if like_ours:
        # The replica's gRPC server settings: its options (keepalive, limits) and
        # its request interceptor; what is left between the two is the replica's code.
        from arbiter.config import ArbiterConfig
        from arbiter.server.api.decoding import DecodeRefusal
        from arbiter.server.net.options import server_options

        cfg = ArbiterConfig.lan()
        options = server_options(cfg)
        interceptors = [DecodeRefusal(cfg.max_message_bytes)]
    server = grpc.aio.server(options=options, interceptors=interceptors)
    pb_grpc.add_MembershipServicer_to_server(Bare(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("serving", flush=True)
    await server.wait_for_termination()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--load", action="store_true")
    p.add_argument("--bare", action="store_true")
    p.add_argument("--like-ours", action="store_true", help="--bare with the replica's settings")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--targets", default="")
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--prefix", default="n")
    p.add_argument("--interval", type=float, default=0.6)
    p.add_argument("--status-every", type=float, default=1.0)
    p.add_argument("--cluster", default="")
    p.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    a = p.parse_args()
    factory = None
    if a.loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        if a.bare:
            runner.run(serve_bare(a.port, a.like_ours))
        else:
            runner.run(Load(a).run())


if __name__ == "__main__":
    main()
