"""The fan-out's own cost: one replica's Subscribe streams alone, changes published at a rate.

    python bench/fanout_cost.py                               # 333 subscribers (1,000 / 3)
    python bench/fanout_cost.py --before DIR --rounds 5       # against another checkout
    python bench/fanout_cost.py --batch 100                   # changes of 100 members
    python bench/fanout_cost.py --profile DIR [--native]      # py-spy on each server

A server process (this script with ``--serve``) runs the replica's own
``MembershipServicer`` and ``Hub`` (the code of this tree, or of ``--before
DIR``: ``git archive COMMIT arbiter membership | tar -x -C DIR``) on a gRPC
server with the replica's options and interceptor, over a stand-in for the
driver that holds a view of ``--members`` members and nothing else: no Raft,
no heartbeats, no disk. ``--subscribers`` Subscribe streams come from the Go
load generator (``loadgen sub --times``). The server then publishes
``--changes`` view changes of ``--batch`` members each (a join, then their
death, and so on) ``--rate`` a second, the way a replica's driver does
(``Counters.applied``, then ``Hub.publish``), and prints the wall-clock time
of each. System ``bare`` is the floor: a gRPC server of the same options
whose Subscribe writes the same bytes to every stream with one wake-up each
(no queue rules, history, progress markers or metrics).

Measured per system and round: every subscriber's receive time minus the
publish time (p50/p90/p99/max, ms), the spread (last minus first receive of
a change), the server's CPU (all its threads) per delivery over the changes
(which come faster than the progress interval, so no progress marker is
sent meanwhile), its CPU at rest (progress markers only) over ``--idle``
seconds just before, and its CPU per subscription opened (a quorum status
and a snapshot of the view each). The figures are the fan-out's, not a loaded
replica's: bench/fanout.py measures that. No test asserts a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


# --- the server (--serve): runs in its own process, with the code under test ------------


class _Stream:
    """A bare server's stream: what it has yet to write, and the future it waits on."""

    def __init__(self, waiter: asyncio.Future[None]) -> None:
        self.queue: collections.deque[bytes] = collections.deque()
        self.waiter = waiter


async def _serve(args: argparse.Namespace) -> None:
    import grpc

    from arbiter.config import ArbiterConfig
    from arbiter.core.tally import ViewChange
    from arbiter.server.api.decoding import DecodeRefusal
    from arbiter.server.api.servicers import MembershipServicer
    from arbiter.server.app import PEER_SERVICE
    from arbiter.server.consensus.counters import Counters
    from arbiter.server.consensus.driver import ReplicaStatus
    from arbiter.server.fanout.hub import Hub, HubStatus
    from arbiter.server.net.options import server_options
    from membership.shared import convert
    from membership.shared.view import Member, MemberChange, MemberState, View
    from membership.v1 import membership_pb2 as pb
    from membership.v1 import membership_pb2_grpc as pb_grpc

    cfg = ArbiterConfig.lan(max_subscribers=args.subscribers + 100)

    class State:
        """The applied state as the subscriber path reads it: a view, no tally."""

        def __init__(self) -> None:
            self.epoch = 0
            self.applied_index = 0
            self.instance = "bench"
            self._view = View()
            self._members: dict[str, Member] = {}

        def view(self) -> View:
            return self._view

        def member(self, node_id: str) -> Member | None:
            return self._members.get(node_id)

        def suspected_by(self, node_id: str) -> tuple[str, ...]:
            return ()

        def apply(self, change: ViewChange) -> None:
            self._view = self._view.with_changes(change.epoch, change.changes)
            self._members = {m.node_id: m for m in self._view.members}
            self.epoch, self.applied_index = change.epoch, self.applied_index + 1

    class Driver:
        """What the servicer reads of a driver."""

        def __init__(self) -> None:
            self.replica_id = "a1"
            self.config = cfg
            self.state = State()
            self.counters = Counters()

        def status(self) -> ReplicaStatus:
            return ReplicaStatus(
                arbiter_id="a1", leader_id="a1", in_quorum=True, term=1, role="leader",
                epoch=self.state.epoch,
            )  # fmt: skip

    class Bare:
        """The least a gRPC server does to fan events out: the same bytes written to
        every stream, one wake-up each (no queue rules, history, timers or metrics)."""

        def __init__(self, driver: Driver) -> None:
            self._driver = driver
            self._snapshot: tuple[int, bytes] = (-1, b"")
            self._streams: set[_Stream] = set()

        def _event(self, **event: Any) -> bytes:
            return pb.MembershipEvent(
                arbiter_id="a1", instance="bench", **event
            ).SerializeToString()

        async def Subscribe(self, request: Any, context: Any) -> None:
            loop = asyncio.get_running_loop()
            view = self._driver.state.view()
            await context.write(
                self._event(quorum=pb.QuorumStatus(in_quorum=True, epoch=view.epoch))
            )
            if self._snapshot[0] != view.epoch:
                members = [convert.member_to_pb(m) for m in view.members]
                snap = pb.ViewSnapshot(view=pb.View(epoch=view.epoch, members=members))
                self._snapshot = (view.epoch, self._event(snapshot=snap))
            await context.write(self._snapshot[1])
            stream = _Stream(loop.create_future())
            self._streams.add(stream)
            try:
                while True:
                    while not stream.queue:
                        stream.waiter = loop.create_future()
                        await stream.waiter
                    await context.write(stream.queue.popleft())
            finally:
                self._streams.discard(stream)

        def publish(self, change: ViewChange) -> None:
            data = self._event(
                change=pb.ViewChange(
                    epoch=change.epoch, changes=[convert.change_to_pb(c) for c in change.changes]
                )
            )
            for stream in self._streams:
                stream.queue.append(data)
                if not stream.waiter.done():
                    stream.waiter.set_result(None)

    driver = Driver()
    hub_args: dict[str, Any] = {}
    if "progress_interval" in inspect.signature(Hub).parameters:
        hub_args = {
            "progress_interval": cfg.progress_interval,
            "write_timeout": cfg.subscriber_write_timeout,
        }
    hub = Hub(
        view=driver.state.view,
        history_size=cfg.history_size,
        queue_limit=cfg.subscriber_queue,
        **hub_args,
    )
    api = MembershipServicer(driver, hub)  # type: ignore[arg-type]
    server = grpc.aio.server(
        options=server_options(cfg),
        interceptors=[DecodeRefusal(cfg.max_message_bytes, exempt=PEER_SERVICE)],
    )
    bare = Bare(driver) if args.bare else None
    if bare is not None:
        handler = grpc.unary_stream_rpc_method_handler(
            bare.Subscribe, request_deserializer=pb.SubscribeRequest.FromString
        )
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "membership.v1.Membership", {"Subscribe": handler}
                ),
            )
        )
    else:
        try:
            from arbiter.server.fanout.frames import add_membership_service
        except ImportError:  # the code before serialised every event per stream
            pb_grpc.add_MembershipServicer_to_server(api, server)
        else:
            add_membership_service(api, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    hub.publish_status(HubStatus(in_quorum=True, leader_id="a1", epoch=0))
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def say(**line: Any) -> None:
        print(json.dumps(line), flush=True)

    if args.members:  # the view subscribers get a snapshot of (not published: no one listens)
        driver.state.apply(
            ViewChange(
                epoch=1,
                changes=tuple(
                    MemberChange(node_id=f"m{i}", incarnation=1, state=MemberState.ALIVE)
                    for i in range(args.members)
                ),
            )
        )
    say(ev="ready", port=port, pid=os.getpid())
    while line := (await reader.readline()).decode().split():
        if line[0] == "cpu":
            say(ev="cpu", cpu=time.process_time(), subscribers=hub.subscribers)
        elif line[0] == "publish":
            count, rate, batch = int(line[1]), float(line[2]), int(line[3])
            start = loop.time()
            for i in range(count):
                await asyncio.sleep(max(0.0, start + i / rate - loop.time()))
                epoch = driver.state.epoch + 1
                dead = epoch % 2 == 1  # a batch joins, the next one dies
                change = ViewChange(
                    epoch=epoch,
                    changes=tuple(
                        MemberChange(
                            node_id=f"n{(epoch - 2) // 2}-{k}",
                            incarnation=1,
                            state=MemberState.DEAD if dead else MemberState.ALIVE,
                        )
                        for k in range(batch)
                    ),
                )
                driver.state.apply(change)  # as the driver: applied, counted, published
                driver.counters.applied(epoch, time.monotonic())
                wall = time.time()
                if bare is not None:
                    bare.publish(change)
                else:
                    hub.publish(change)
                say(ev="published", epoch=epoch, wall=wall)
            say(ev="done")
    await server.stop(0)


# --- the driver of the runs ---------------------------------------------------------------


class Server:
    """One ``--serve`` process of ``system`` (its code from ``tree`` on PYTHONPATH)."""

    def __init__(self, args: argparse.Namespace, system: str, tree: Path | None, log: Path) -> None:
        self.lines: list[dict[str, Any]] = []
        env = {**os.environ}
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve",
             "--subscribers", str(args.subscribers), "--members", str(args.members),
             *(["--bare"] if system == "bare" else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "ab"),  # noqa: SIM115
            env=env, cwd=log.parent,
        )  # fmt: skip
        self.ready = self.expect("ready")

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def expect(self, ev: str) -> dict[str, Any]:
        """The next line of kind ``ev`` (lines of other kinds are kept in :attr:`lines`)."""
        assert self.proc.stdout is not None
        while True:
            raw = self.proc.stdout.readline()
            if not raw:
                raise RuntimeError(f"the server exited before '{ev}' (see its log)")
            line = json.loads(raw)
            self.lines.append(line)
            if line["ev"] == ev:
                return line

    def cpu(self) -> float:
        self.send("cpu")
        return float(self.expect("cpu")["cpu"])

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()


def run_system(
    args: argparse.Namespace, system: str, tree: Path | None, work: Path, profile: Path | None
) -> dict[str, Any]:
    """One server, its subscribers, the changes; returns the figures."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from detection_common import Procs
    from fanout_common import receive_latency, start_spy, stop_spy
    from loadgen import Process

    work.mkdir(parents=True, exist_ok=True)
    procs = Procs(work)
    server = Server(args, system, tree, work / "server.log")
    subs = spy = None
    try:
        addr = f"127.0.0.1:{server.ready['port']}"
        c00 = server.cpu()
        subs = Process(
            procs, "sub",
            ["sub", "--arbiters", addr, "--count", str(args.subscribers), "--times",
             "--epoch-wait", "30"],
            work / "sub.log",
        )  # fmt: skip
        if not subs.wait_for(lambda: subs.report.get("snapshots", 0) >= args.subscribers, 300):
            raise RuntimeError(f"{args.subscribers} snapshots not received within 300 s")
        # Opening every subscription: a quorum status and a snapshot each.
        open_cpu = (server.cpu() - c00) / args.subscribers
        time.sleep(1.0)
        c0, t0 = server.cpu(), time.monotonic()
        time.sleep(args.idle)
        idle = (server.cpu() - c0) / (time.monotonic() - t0)
        spy = start_spy(server.ready["pid"], profile, args.native)
        c1, t1, s1 = server.cpu(), time.monotonic(), subs.cpu()
        server.send(f"publish {args.changes} {args.rate} {args.batch}")
        server.expect("done")
        last = max(line["epoch"] for line in server.lines if line["ev"] == "published")
        subs.wait_for(
            lambda: any(e.get("ev") == "epoch" and e["epoch"] >= last for e in subs.events), 30
        )
        dt = time.monotonic() - t1
        cpu = server.cpu() - c1
        sub_cores = (subs.cpu() - s1) / dt
        top = stop_spy(spy, profile)
        spy = None
        published = {ln["epoch"]: ln["wall"] for ln in server.lines if ln["ev"] == "published"}
        lat = receive_latency(subs.events, lambda r, e: published.get(e), set(published))
        deliveries = args.changes * args.subscribers
        return {
            "system": system,
            "deliveries": deliveries,
            "profile_top": top,
            **lat,
            "idle_cores": round(idle, 4),
            # Changes come faster than the progress interval: no marker is sent
            # meanwhile, so this is the changes' own cost (the markers' is idle).
            "cpu_us_per_delivery": round(cpu / deliveries * 1e6, 2),
            "open_ms_per_subscriber": round(open_cpu * 1e3, 3),
            "subscriber_cores": round(sub_cores, 3),
        }
    finally:
        stop_spy(spy, profile)
        if subs is not None:
            subs.stop()
        server.stop()
        procs.kill_all()


def _table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    from fanout_common import summary

    head = (
        f"{'system':<7} {'rd':>2} {'recv':>7} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7} "
        f"{'spr50':>7} {'us/dlv':>7} {'idle':>6} {'open ms':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r['system']:<7} {r['round']:>2} {r['samples']:>7} {r['p50_ms']:>7.1f} "
            f"{r['p90_ms']:>7.1f} {r['p99_ms']:>7.1f} {r['max_ms']:>7.1f} "
            f"{r['spread_p50_ms']:>7.1f} {r['cpu_us_per_delivery']:>7.1f} {r['idle_cores']:>6.3f} "
            f"{r['open_ms_per_subscriber']:>7.2f}"
        )
    keys = ("p50_ms", "p99_ms", "max_ms", "cpu_us_per_delivery", "idle_cores")
    lines += ["", *summary(results, lambda r: str(r["system"]), (*keys, "open_ms_per_subscriber"))]
    lines.append(
        f"\n{args.subscribers} subscribers on one server, a view of {args.members} members; "
        f"{args.changes} changes of {args.batch} member(s) each at {args.rate}/s. p50..max: "
        "receive minus publish over every subscriber and change (ms); spr50: median of "
        "(last - first receive) per change; us/dlv: the server's CPU (all threads) over the "
        "changes, per delivery; idle: its cores at rest (progress markers); open "
        "ms: the server's CPU per subscription opened (its quorum status and snapshot)."
    )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--systems",
        default="before,ours,bare",
        help="of before (needs --before), ours, bare (the floor: gRPC alone)",
    )
    p.add_argument("--subscribers", type=int, default=333)
    p.add_argument("--changes", type=int, default=100)
    p.add_argument("--rate", type=float, default=4.0, help="changes a second")
    p.add_argument("--batch", type=int, default=1, help="members per change")
    p.add_argument("--members", type=int, default=1000, help="members of the view")
    p.add_argument("--idle", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--before", type=Path, default=None)
    p.add_argument("--profile", type=Path, default=None, help="py-spy of each system into DIR")
    p.add_argument("--native", action="store_true")
    p.add_argument("--out", type=Path, default=None, help="write the table and JSON here")
    args = p.parse_args()
    if args.serve:
        try:
            import uvloop

            factory: Any = uvloop.new_event_loop
        except ImportError:
            factory = None
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(_serve(args))
        return 0
    wanted = args.systems.split(",")
    systems: list[tuple[str, Path | None]] = [
        (name, args.before.resolve() if name == "before" else None)
        for name in wanted
        if name != "before" or args.before is not None
    ]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-fanout-cost-") as tmp_s:
        tmp = Path(tmp_s)
        for rnd in range(args.rounds):
            for system, tree in systems:
                r = run_system(args, system, tree, tmp / f"{system}-{rnd}", None)
                r["round"] = rnd
                results.append(r)
                print(_table([r], args).split("\n\n")[0].splitlines()[-1], flush=True)
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            for system, tree in systems:
                out = args.profile / f"cost-{system}.txt"
                top = run_system(args, system, tree, tmp / f"{system}-profile", out)["profile_top"]
                if top is not None:
                    (args.profile / f"cost-{system}-top.txt").write_text(top + "\n")
                    print(f"\nprofile of {system} (py-spy on the server):\n{top}")
    text = _table(results, args)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fanout_cost.txt").write_text(text + "\n")
        rows = [{k: v for k, v in r.items() if k != "profile_top"} for r in results]
        (args.out / "fanout_cost.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
