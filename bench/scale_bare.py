"""The scale benchmark's baseline: a bare grpc.aio server that acks heartbeats, nothing else.

    python bench/scale_bare.py --listen 127.0.0.1:PORT --interval 0.6

It serves ``membership.v1.Membership/Heartbeat`` only: every HeartbeatRequest
is decoded (the generated protobuf class, as the replica does) and answered
by one HeartbeatAck (its seq, a fixed epoch, ALIVE, in quorum, a lease and
``--interval`` as next_interval_seconds). No failure detector, no Raft, no
validation: the cost of gRPC and protobuf per heartbeat on this machine, which
``bench/scale.py`` divides the replica's cost by. It prints ``ready`` once
listening and runs until SIGTERM. uvloop is used when ``--uvloop`` is given
and it is installed (as the replica may).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator

import grpc

from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc


class BareMembership(pb_grpc.MembershipServicer):
    """Acks every heartbeat with the same fixed fields; the other RPCs are UNIMPLEMENTED."""

    def __init__(self, interval: float) -> None:
        self.interval = interval

    async def Heartbeat(
        self,
        request_iterator: AsyncIterator[pb.HeartbeatRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.HeartbeatAck]:
        """One HeartbeatAck per HeartbeatRequest: seq echoed, ALIVE, lease 3 intervals."""
        async for req in request_iterator:
            yield pb.HeartbeatAck(
                seq=req.seq,
                epoch=1,
                lease_seconds=3 * self.interval,
                next_interval_seconds=self.interval,
                state=pb.MEMBER_STATE_ALIVE,
                in_quorum=True,
                arbiter_id="bare",
                incarnation=req.incarnation,
                cluster_size=3,
            )


async def serve(listen: str, interval: float, options: list[tuple[str, str | int]]) -> None:
    """Serves until SIGTERM or SIGINT; ``options``: more gRPC server options."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), *options])
    pb_grpc.add_MembershipServicer_to_server(BareMembership(interval), server)  # type: ignore[abstract]
    if server.add_insecure_port(listen) == 0:
        raise SystemExit(f"scale_bare: cannot listen on {listen}")
    await server.start()
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0.5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", required=True, help="host:port")
    p.add_argument("--interval", type=float, default=0.6, help="next_interval_seconds, seconds")
    p.add_argument("--uvloop", action="store_true", help="run on uvloop when installed")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a gRPC server option (an int when VALUE is one), e.g. grpc.http2.bdp_probe=0",
    )
    args = p.parse_args()
    options: list[tuple[str, str | int]] = []
    for item in args.option:
        name, _, value = item.partition("=")
        options.append((name, int(value) if value.lstrip("-").isdigit() else value))
    if args.uvloop:
        try:
            import uvloop  # type: ignore[import-not-found,unused-ignore]

            uvloop.install()
        except ImportError:
            pass
    asyncio.run(serve(args.listen, args.interval, options))


if __name__ == "__main__":
    main()
