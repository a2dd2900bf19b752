"""An ingest worker process: it holds heartbeat streams on the replica's port.

Started by :class:`arbiter.server.ingest.pool.IngestPool` as ``python -m
arbiter.server.ingest --fd N``, with one end of a socketpair (the channel of
:mod:`arbiter.server.ingest.frames`); never forked from a process running gRPC.

Rules:

1. It binds the replica's ``--listen`` with ``grpc.so_reuseport=1``, beside
   the replica's other workers (the kernel spreads connections among them;
   Linux lets only the same user join the port), with the replica's server
   options, TLS credentials and message limits.
2. ``Membership.Heartbeat`` is served here with the rules of the in-process
   servicer (:mod:`arbiter.server.api.servicers`): the caller's right to speak
   for the node, the request checks, the stream rules and the throttle of
   :mod:`arbiter.server.api.limits`, the cluster identity; at most
   ``ceil(max_heartbeat_streams / K)`` streams per worker. The verdict comes
   from the consensus process, in batches (:mod:`arbiter.server.ingest.batcher`);
   ``max_nodes`` is checked there. A node's status goes along only when it
   changed on the stream (:func:`arbiter.server.fanout.statusboard.changed`) or
   ``STATUS_REFRESH`` seconds passed, its labels only when they changed.
   Refusals come back in the verdict too (``max_nodes``, and shedding, which
   the consensus process decides for a stream's first heartbeat: monitor.py
   rule 4): the stream ends with RESOURCE_EXHAUSTED, the message and, for a
   shed, the trailing ``grpc-retry-pushback-ms``, as in-process.
3. Every other method is forwarded to the consensus process
   (:mod:`arbiter.server.ingest.proxy`).
4. Cost: what a stream's earlier heartbeat already passed is not checked
   again (its node id and incarnation are the first's by the stream
   rules; labels and status equal to the last ones checked), and an ack is
   the batch's common fields, encoded once per batch, followed by the
   heartbeat's own (seq, lease, state, incarnation): protobuf's wire format
   merges concatenated messages, so the bytes decode to the same ack.
   Memory (a stream lives as long as its node): the message of the
   heartbeat's own fields is one for the whole worker, and the status last
   sent is kept as the current request's while equal to it, else as plain
   values, never as an older request's (statusboard rule 2).
5. It lives no longer than the consensus process: PR_SET_PDEATHSIG, and it
   exits when its channel closes. It ignores SIGINT, SIGHUP and SIGTERM (a
   group's signals reach the consensus process, which tells it; lifetime.py);
   SIGKILL ends it, and it is restarted. STOP ends every heartbeat stream with
   UNAVAILABLE at its next heartbeat and stops the server with the shutdown
   grace; RELOAD_TLS re-reads the TLS files for new connections (SIGHUP).
6. Load: a :class:`arbiter.server.load.monitor.LoadMonitor` samples this worker's
   loop (monitor.py rule 1) and every batch carries its latest value: the
   consensus process's interval and shedding follow the workers' load.
7. Lateness: the worker measures its own (:func:`_lateness`) and sends it
   with every batch (batcher rule 2, lateness rule 1a), so the consensus
   process suspects no node for a heartbeat this worker had not read yet
   (shedding does not read it). It is the
   larger of its loop's stall, in progress or ended less than one heartbeat
   interval ago (a :class:`arbiter.server.load.looplag.LoopLagMonitor`; by
   then every node has sent again and what the stall left queued is read),
   and the read lag of its streams (:mod:`arbiter.server.load.readlag`, from
   each heartbeat's ``send_time_unix``: heartbeats that wait in gRPC's
   buffers while the loop turns on time). Not the consensus process's
   ``LocalHealth``, which counts a stall of L for L seconds after it: under
   the horizon's rule (what the latest batch said holds until the next one)
   that piled up, stall after stall (1.2 s stalls every 1.5 s made a killed
   node DEAD in 8.8 s instead of 1.4). Cost per heartbeat: one
   ``time.time()`` and the read lag's ring update.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import math
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from arbiter.config import ArbiterConfig
from arbiter.core.labelsets import LabelSets
from arbiter.server.api import limits
from arbiter.server.api.decoding import DecodeRefusal, Undecodable, checks_requests, refuse
from arbiter.server.api.heartbeat_path import ClusterMismatch, HeartbeatChecks
from arbiter.server.api.limits import LimitExceeded
from arbiter.server.api.replies import deny
from arbiter.server.api.shedding import PUSHBACK_KEY
from arbiter.server.fanout.statusboard import changed, differs, fields_of
from arbiter.server.ingest import frames
from arbiter.server.ingest.batcher import Batcher, ChannelClosed, ReplicaStatus
from arbiter.server.ingest.lifetime import die_with_parent
from arbiter.server.ingest.proxy import Forwarder
from arbiter.server.load.looplag import LoopLagMonitor
from arbiter.server.load.monitor import LoadMonitor
from arbiter.server.load.readlag import HostBases, ReadLag, StreamBase
from arbiter.server.net.authz import AllowAll, Authorizer, MutualTLS
from membership.shared.errors import InvalidArgument
from membership.v1 import membership_pb2 as pb

__all__ = [
    "HEARTBEAT_METHOD",
    "STATUS_REFRESH",
    "HeartbeatService",
    "main",
    "serve",
    "status_update",
]

log = logging.getLogger("arbiter.ingest")

HEARTBEAT_METHOD = "/membership.v1.Membership/Heartbeat"
# Seconds after which a node's status is sent again though unchanged (rule 2):
# the board prunes a node it has not heard for 60 s (statusboard.py rule 2).
STATUS_REFRESH = 5.0


def status_update(
    last: pb.NodeStatus | dict[str, Any] | None, current: pb.NodeStatus, refresh: bool
) -> tuple[bool, pb.NodeStatus | dict[str, Any]]:
    """Whether a stream sends ``current`` to the consensus process (rule 2), and what it
    keeps as the status last sent (rule 4).

    Args:
        last: what the stream kept of the status it last sent (None: none sent).
        current: the status of the heartbeat just read.
        refresh: ``STATUS_REFRESH`` seconds passed since the last one sent.

    Returns:
        (send ``current``, what to keep now): ``current`` itself when sent or
        equal to the one last sent, else the plain values
        (:func:`arbiter.server.fanout.statusboard.fields_of`) of the one last sent,
        never an older request's submessage.
    """
    if last is None or refresh:
        return True, current
    if isinstance(last, dict):
        values = fields_of(current)
        if values == last:
            return False, current  # the same again: the current request holds it
        return (True, current) if differs(last, values) else (False, last)
    if current == last:
        return False, current
    if changed(last, current):
        return True, current
    return False, fields_of(last)


def _lateness(monitor: LoopLagMonitor, read_lag: ReadLag, listen_after: float, now: float) -> float:
    """Seconds of the recent past this worker has not heard at ``now`` (monotonic; rule 7).

    Args:
        monitor: the worker loop's lag monitor.
        read_lag: the read lag of the worker's streams.
        listen_after: seconds after a stall during which it still counts (the
            heartbeat interval).
    """
    return max(monitor.recent_lag(now, now - listen_after), read_lag.lateness(now))


class HeartbeatService:
    """``Membership.Heartbeat`` in a worker (rule 2).

    Args:
        settings: the SETUP frame's dict.
        batcher: the channel to the consensus process.
        authz: who may heartbeat as whom.
    """

    def __init__(self, settings: dict[str, Any], batcher: Batcher, authz: Authorizer) -> None:
        self.config = ArbiterConfig(**settings["config"])
        self.replica_id: str = settings["replica_id"]
        self.cluster: str = settings["identity"]
        self.index: int = settings["index"]
        self.max_streams = math.ceil(self.config.max_heartbeat_streams / settings["workers"])
        self.labelsets = LabelSets()  # one copy of each label set for every stream
        # The acks' own fields, set and serialised with no await in between: one
        # message for every stream of this worker's loop, not one per stream.
        self._ack = pb.HeartbeatAck()
        self.batcher = batcher
        self.authz = authz
        self.closing = False
        self._tokens = 0
        self.streams_served = 0
        self.read_lag = ReadLag()  # rule 7
        self.host_bases = HostBases()  # readlag rule 1b

    def handler(self) -> grpc.RpcMethodHandler:
        """The Heartbeat method: requests decoded by gRPC, acks already bytes (rule 4)."""
        return grpc.stream_stream_rpc_method_handler(
            self.heartbeat, request_deserializer=pb.HeartbeatRequest.FromString
        )

    def prepare(self, st: ReplicaStatus) -> None:
        """Encodes the acks' fields common to one batch (rule 4)."""
        st.base = pb.HeartbeatAck(
            epoch=st.epoch,
            next_interval_seconds=st.interval,
            in_quorum=st.in_quorum,
            arbiter_id=self.replica_id,
            leader_id=st.leader,
            cluster_size=sum(a.voter for a in st.arbiters),
            cluster=self.cluster,
            instance=st.instance,
            arbiters=st.arbiters,
            config_index=st.config_index,
        ).SerializeToString()

    @checks_requests
    async def heartbeat(
        self, requests: AsyncIterator[pb.HeartbeatRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """One node's heartbeat stream (rule 2); undecodable requests and the caller's
        right to speak for the node are checked here, as the in-process servicer does
        (no wrapper of the requests per stream: memory per node)."""
        cfg, batcher = self.config, self.batcher
        if self.closing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "arbiter shutting down")
        if batcher.streams >= self.max_streams:
            refusal = limits.stream_slot(
                "max_heartbeat_streams",
                batcher.streams,
                cfg,
                f"{self.replica_id} (ingest worker {self.index}: {self.max_streams} of them here)",
            )
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal or "")
        vouch = not isinstance(self.authz, AllowAll)  # --insecure: nobody to ask
        # the servicer's checks (rule 4)
        checks = HeartbeatChecks(cfg, self.cluster, self.replica_id, self.labelsets)
        self._tokens += 1
        token = self._tokens
        batcher.streams += 1
        self.streams_served += 1
        if self.streams_served == 1:
            log.info(
                "ingest worker %d (pid %d) serves its first heartbeat stream",
                self.index,
                os.getpid(),
            )
        labels_of: Any = None  # the labels last sent (the checks' shared mapping)
        # The status last sent: the current request's while equal to it, else its plain
        # values (statusboard rule 2: a submessage holds its whole request).
        status_of: pb.NodeStatus | dict[str, Any] | None = None
        status_at = 0.0
        ack = self._ack
        last_at = None  # the stream's previous heartbeat (the inter-arrival histogram)
        read_lag, base, wall = self.read_lag, StreamBase(), time.time  # rule 7
        host = self.host_bases.of(context.peer(), time.monotonic())  # readlag rule 1b
        try:
            async for req in requests:
                if req.__class__ is Undecodable:  # type: ignore[comparison-overlap]
                    await refuse(context, req)
                if vouch:  # the first heartbeat: may the caller speak for its node?
                    vouch = False
                    await deny(context, self.authz.node(context, req.node_id))
                batcher.heartbeats += 1
                if self.closing:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "arbiter shutting down")
                now = time.monotonic()
                if last_at is not None:
                    batcher.interarrival.observe(now - last_at)
                last_at = now
                if 0.0 < req.send_time_unix < math.inf:  # rule 7 (readlag rule 1; NaN: no)
                    read_lag.add(base.queued(wall() - req.send_time_unix, now, read_lag, host), now)
                try:
                    wait, first = checks.check(req, now)
                except InvalidArgument as e:
                    log.info("heartbeat refused from %s: %s", context.peer(), e)
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                except LimitExceeded as e:
                    log.info("heartbeat stream cut from %s: %s", context.peer(), e)
                    await context.abort(e.code, str(e))
                except ClusterMismatch as e:
                    log.info("heartbeat refused from %s: %s", context.peer(), e)
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
                if wait > 0:
                    await asyncio.sleep(wait)  # throttled (limits rule 3)
                labels = None
                if checks.labels is not labels_of:  # another mapping: the labels changed
                    labels_of = checks.labels
                    labels = tuple(labels_of.items())
                status = None
                send, status_of = status_update(
                    status_of, req.status, now - status_at > STATUS_REFRESH
                )
                if send:
                    status, status_at = req.status.SerializeToString(), now
                try:
                    verdict, st = await batcher.ask(
                        (token, checks.node_id, req.incarnation, labels, req.interval_seconds,
                         first, status)
                    )  # fmt: skip
                except ChannelClosed:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "arbiter shutting down")
                if len(verdict) == 2:  # max_nodes (limits rule 5), or shed (shedding.py)
                    message, pushback_ms = verdict
                    (log.debug if pushback_ms else log.info)(
                        "heartbeat stream cut from %s: %s", context.peer(), message
                    )
                    await context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        message,
                        trailing_metadata=((PUSHBACK_KEY, str(pushback_ms)),)
                        if pushback_ms
                        else (),
                    )
                _, ack.state, ack.incarnation, ack.lease_seconds, grace, grace_id = verdict
                ack.grace_seconds, ack.grace_id = grace, grace_id
                ack.seq = req.seq
                batcher.acks += 1
                yield st.base + ack.SerializeToString()  # rule 4
        finally:
            batcher.streams -= 1
            batcher.stream_closed(token)


class _Router(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Heartbeat here, everything else to the consensus process (rules 2 and 3)."""

    def __init__(self, heartbeat: grpc.RpcMethodHandler, forwarder: Forwarder) -> None:
        self._heartbeat = heartbeat
        self._forwarder = forwarder

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        if handler_call_details.method == HEARTBEAT_METHOD:
            return self._heartbeat
        return self._forwarder.service(handler_call_details)


def _arbiters(items: tuple[tuple[str, str, bool], ...]) -> list[pb.Arbiter]:
    return [pb.Arbiter(id=i, address=a, voter=v) for i, a, v in items]


async def serve(fd: int) -> int:
    """Runs the worker on channel ``fd`` until STOP or the channel closes (module rules).

    Returns:
        The exit status: 0 after STOP or the channel's end, 1 when the port
        could not be bound (the consensus process was told why).
    """
    from arbiter.server.net.options import server_options
    from membership.shared.logfmt import setup_logging
    from membership.shared.tls import ServerCredentials, TLSFiles, load

    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    kind, settings = await frames.read_frame(reader)
    assert kind == frames.SETUP, kind
    setup_logging(settings["log_level"], settings["log_format"])
    index = settings["index"]
    config = ArbiterConfig(**settings["config"])
    creds = None
    if settings["tls"] is not None:
        creds = ServerCredentials(load(TLSFiles(*(Path(f) for f in settings["tls"]))))
    authz: Authorizer = AllowAll() if creds is None else MutualTLS(config.cluster)
    batcher = Batcher(writer.write, _arbiters)
    service = HeartbeatService(settings, batcher, authz)
    batcher.prepare = service.prepare
    channel = grpc.aio.insecure_channel(
        "unix:" + settings["socket"],
        options=[
            ("grpc.max_receive_message_length", config.max_peer_message_bytes),
            ("grpc.max_send_message_length", config.max_peer_message_bytes),
        ],
    )
    forwarder = Forwarder(channel, config.subscriber_write_timeout)
    options = [(k, v) for k, v in server_options(config) if k != "grpc.so_reuseport"]
    server = grpc.aio.server(
        options=[*options, ("grpc.so_reuseport", 1)],
        interceptors=[DecodeRefusal(config.max_message_bytes, exempt="/arbiter.v1.Peer/")],
    )
    server.add_generic_rpc_handlers((_Router(service.handler(), forwarder),))
    listen = settings["listen"]
    try:
        if creds is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, creds.credentials)
    except RuntimeError:
        port = 0
    if port == 0:
        writer.write(
            frames.encode(frames.FAILED, f"ingest worker {index} cannot listen on {listen}")
        )
        await writer.drain()
        return 1
    await server.start()
    name = f"{settings['replica_id']} ingest worker {index}"
    monitor = LoadMonitor(name=name)
    monitor.start()  # rule 6
    batcher.monitor = monitor
    lag_monitor = LoopLagMonitor(name=name, warn_after=config.loop_lag_warning)
    lag_monitor.start()  # rule 7
    batcher.lateness = functools.partial(
        _lateness, lag_monitor, service.read_lag, config.heartbeat_interval
    )
    writer.write(frames.encode(frames.HELLO, index, os.getpid(), time.monotonic()))
    idle = asyncio.get_running_loop().create_task(batcher.run_idle())
    why = "channel closed"
    try:
        while True:
            try:
                msg = await frames.read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError, frames.FrameError) as e:
                why = f"channel to the consensus process closed ({type(e).__name__})"
                break
            if msg[0] == frames.VERDICTS:
                batcher.on_verdicts(msg[1], msg[2], msg[3])
            elif msg[0] == frames.STOP:
                why = "stopping"
                break
            elif msg[0] == frames.RELOAD_TLS and creds is not None:
                try:
                    creds.reload()
                    log.info("ingest worker %d: TLS files reloaded", index)
                except InvalidArgument as e:
                    log.error(
                        "ingest worker %d: TLS reload failed, keeping the old files: %s", index, e
                    )
    finally:
        service.closing = True
        forwarder.close()
        batcher.close(RuntimeError(why))
        idle.cancel()
        await monitor.stop()
        await lag_monitor.stop()
        await server.stop(config.shutdown_grace if why == "stopping" else 0)
        await channel.close()
        log.info(
            "ingest worker %d (pid %d) stopped (%s): it served %d heartbeat streams, "
            "%d batches, %d forwarded calls",
            index,
            os.getpid(),
            why,
            service.streams_served,
            batcher.batches,
            forwarder.calls,
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m arbiter.server.ingest --fd N`` (started by the pool only)."""
    p = argparse.ArgumentParser(prog="python -m arbiter.server.ingest")
    p.add_argument("--fd", type=int, required=True, help="the channel's inherited descriptor")
    args = p.parse_args(argv)
    die_with_parent()  # again: the __main__ module did it, a caller of main() may not have
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(serve(args.fd))
    return 0
