"""The host agent (``membership agent``): one host stream per arbiter for every local node id.

Local processes connect to the agent's unix socket as they would to the
arbiters (``membership node --via-agent PATH``, ``MembershipClient(...,
via_agent=PATH)``); each call names the arbiter it is for in the
``membership-arbiter`` metadata key (:mod:`membership._arbiters.transport`).

Rules:

1. Heartbeat streams from local processes are not forwarded: each becomes a
   local link of the arbiter it names (:mod:`membership._host.table`), and the
   agent's one ``HostHeartbeat`` stream to that arbiter carries an entry for
   every link it vouches for, once per interval (the interval the arbiter's
   acks suggest; 0.15 s until the first ack). The entries' acks come back on
   the links.
2. Every other call (Subscribe, GetView, Leave, Grace, Admin...) is forwarded
   as it is, raw bytes both ways, to the arbiter it names, over the agent's
   channel (the agent's certificate under mutual TLS), with its metadata and
   deadline; status, details and trailing metadata come back as they are.
3. Only the arbiters of the agent's configuration are reached: its
   ``--arbiters`` and every arbiter the acks' configurations list. A call for
   another address is PERMISSION_DENIED; a call that names none is
   INVALID_ARGUMENT.
4. ``--id-prefix P``: a local heartbeat for a node id outside ``P*`` is
   PERMISSION_DENIED at the agent (the arbiters would refuse its entry under
   mutual TLS anyway: the agent's ``node/<prefix>*`` certificate bounds it).
5. The socket is created mode 0600 (its owner's processes only): whoever may
   open it may speak for every id the agent may carry. A stale socket file
   (no agent answering on it) is replaced at start; a live one is an error.
6. A host stream that fails is reopened with the SDK's backoff; meanwhile its
   links get no acks, as if their arbiter were down, and their sessions fence
   themselves by their own lease clocks.
7. Stopping (SIGINT, SIGTERM): the socket closes, every local stream ends
   UNAVAILABLE, and the host streams close (the arbiters then see every id
   silent: each node is suspected and declared DEAD unless its process left
   first). An agent restarted on the same socket is a new agent: processes
   reconnect (their links are new streams) and keep their incarnations, so
   nothing rejoins if they are back within the detection time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from membership._arbiters.transport import ARBITER_KEY
from membership._host.table import HostTable, LocalLink
from membership.shared import tls
from membership.shared.backoff import Backoff
from membership.shared.errors import InvalidArgument
from membership.shared.validation import MIN_KEEPALIVE_TIME
from membership.v1 import membership_pb2 as pb

__all__ = ["HostAgent"]

log = logging.getLogger("membership.agent")

HEARTBEAT = "/membership.v1.Membership/Heartbeat"
HOST_HEARTBEAT = "/membership.v1.Membership/HostHeartbeat"
DEFAULT_INTERVAL = 0.15  # seconds, until an ack suggests one (rule 1)

_CODES = {c.value[0]: c for c in grpc.StatusCode}

# The local clients ping as the arbiters allow (every MIN_KEEPALIVE_TIME s at most):
# the agent's socket allows the same, or gRPC answers them too_many_pings.
_SERVER_OPTIONS = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", int(MIN_KEEPALIVE_TIME * 1000)),
    ("grpc.http2.max_ping_strikes", 2),
    ("grpc.so_reuseport", 0),
]
_DROPPED = {ARBITER_KEY, "user-agent", "te", "content-type"}


def _forwarded(metadata: Any) -> list[tuple[str, Any]]:
    return [
        (k, v)
        for k, v in (metadata or ())
        if k not in _DROPPED and not k.startswith(("grpc-", ":"))
    ]


class _Uplink:
    """The host stream to one arbiter (rules 1, 6)."""

    def __init__(self, agent: HostAgent, address: str) -> None:
        self.agent = agent
        self.address = address
        self.table = HostTable()
        self.interval = DEFAULT_INTERVAL
        self.task: asyncio.Task[None] | None = None
        self.connected = False

    async def run(self) -> None:
        backoff = Backoff(0.05, 2.0)
        failures = 0
        while True:
            try:
                await self._stream()
                failures = 0
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as e:
                failures += 1
                if self.connected or failures == 1:
                    log.warning(
                        "agent: host stream to %s ended: %s: %s",
                        self.address,
                        e.code().name,
                        e.details(),
                    )
            except Exception:  # pragma: no cover - a bug; keep serving the others
                failures += 1
                log.exception("agent: host stream to %s failed", self.address)
            self.connected = False
            self.table.fail_all()
            await asyncio.sleep(backoff.delay(max(1, failures)))

    async def _stream(self) -> None:
        # a channel of its own each attempt: a channel that failed to connect may sit in
        # gRPC's reconnect backoff (seconds) while the arbiter is back already
        channel = self.agent.new_channel(self.address)
        call = channel.stream_stream(
            HOST_HEARTBEAT,
            request_serializer=pb.HeartbeatRequest.SerializeToString,
            response_deserializer=pb.HeartbeatAck.FromString,
        )()
        reader = asyncio.get_running_loop().create_task(self._read(call))
        try:
            seq = 0
            while not reader.done():
                now = time.monotonic()
                entries = self.table.entries(now, self.interval)
                if entries:
                    seq += 1
                    await call.write(
                        pb.HeartbeatRequest(
                            seq=seq,
                            send_time_unix=time.time(),
                            cluster=self.agent.cluster,
                            entries=entries,
                        )
                    )
                await asyncio.wait({reader}, timeout=self.interval)
            await reader  # raises its error
        finally:
            reader.cancel()
            call.cancel()
            await channel.close(grace=None)

    async def _read(self, call: Any) -> None:
        async for ack in call:
            if not self.connected:
                self.connected = True
                log.info("agent: host stream to %s (%s) is up", self.address, ack.arbiter_id)
            if ack.next_interval_seconds > 0:
                self.interval = ack.next_interval_seconds
            if ack.cluster and not self.agent.cluster:
                self.agent.cluster = ack.cluster
            self.agent.learn(ack)
            self.table.on_ack(ack)
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(),
            "the arbiter ended the host stream",
        )


class HostAgent:
    """The agent of one host (module rules).

    Args:
        arbiters: the arbiters' addresses (host:port).
        socket_path: the unix socket to serve.
        tls_files: the agent's TLS files, or None for plaintext (``--insecure``).
        id_prefix: node ids the agent carries must start with it ("" = any).
        channel_options: gRPC options of the channels to the arbiters.

    Raises:
        InvalidArgument: from :meth:`start`: the socket is in use by a live agent,
            or its folder does not exist.
    """

    def __init__(
        self,
        arbiters: Sequence[str],
        socket_path: str | Path,
        tls_files: tls.TLSFiles | None = None,
        id_prefix: str = "",
        channel_options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.arbiters = list(arbiters)
        self.known: set[str] = set(arbiters)  # rule 3
        self.socket_path = Path(socket_path)
        self.id_prefix = id_prefix
        self.cluster = ""
        loaded = None if tls_files is None else tls.load(tls_files)
        self._credentials = None if loaded is None else tls.channel_credentials(loaded)
        self._options = list(channel_options)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.uplinks: dict[str, _Uplink] = {}
        self._server: grpc.aio.Server | None = None
        self._streams: set[asyncio.Task[Any]] = set()

    # --- arbiters ----------------------------------------------------------------------

    def channel(self, address: str) -> grpc.aio.Channel:
        """The agent's channel to ``address`` for forwarded calls (created on first use)."""
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = self.new_channel(address)
        return ch

    def new_channel(self, address: str) -> grpc.aio.Channel:
        """A new channel to ``address`` with a connection of its own; the caller closes it."""
        options = [*self._options, ("grpc.use_local_subchannel_pool", 1)]
        if self._credentials is None:
            return grpc.aio.insecure_channel(address, options=options)
        return grpc.aio.secure_channel(address, self._credentials, options=options)

    def learn(self, ack: pb.HeartbeatAck) -> None:
        """Rule 3: the arbiters of a configuration an ack carries may be reached too."""
        for a in ack.arbiters:
            if a.address and a.address not in self.known:
                self.known.add(a.address)
                log.info("agent: arbiter %s (%s) added to the configuration", a.id, a.address)

    def uplink(self, address: str) -> _Uplink:
        """The host stream to ``address`` (started on first use)."""
        up = self.uplinks.get(address)
        if up is None:
            up = self.uplinks[address] = _Uplink(self, address)
            up.task = asyncio.get_running_loop().create_task(up.run())
        return up

    def _target(self, context: grpc.aio.ServicerContext) -> str | tuple[grpc.StatusCode, str]:
        for k, v in context.invocation_metadata() or ():
            if k == ARBITER_KEY:
                if v in self.known:
                    return str(v)
                return (
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{v} is not an arbiter of this agent's configuration "
                    f"({', '.join(sorted(self.known))})",
                )
        return (
            grpc.StatusCode.INVALID_ARGUMENT,
            f"no {ARBITER_KEY} metadata: a call to the agent names the arbiter it is for "
            "(the SDK's via_agent does)",
        )

    # --- the socket --------------------------------------------------------------------

    async def start(self) -> None:
        """Serves the socket (rule 5) and opens a host stream to every arbiter."""
        path = self.socket_path
        if not path.parent.is_dir():
            raise InvalidArgument(f"--socket {path}: the folder {path.parent} does not exist")
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise InvalidArgument(f"--socket {path}: exists and is not a socket")
            if _answers(path):
                raise InvalidArgument(f"--socket {path}: another agent serves it")
            path.unlink()  # a stale socket of an agent that died
        server = grpc.aio.server(options=_SERVER_OPTIONS)
        server.add_generic_rpc_handlers((_Handler(self),))
        old = os.umask(0o177)  # rule 5: created 0600
        try:
            server.add_insecure_port(f"unix:{path}")
            await server.start()
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self._server = server
        for address in self.arbiters:
            self.uplink(address)
        log.info(
            "agent serving %s for %s (ids %s)",
            path,
            ",".join(self.arbiters),
            f"{self.id_prefix}*" if self.id_prefix else "any",
        )

    async def stop(self, grace: float = 0.5) -> None:
        """Rule 7."""
        if self._server is not None:
            await self._server.stop(grace)
        for up in self.uplinks.values():
            if up.task is not None:
                up.task.cancel()
        for up in self.uplinks.values():
            if up.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await up.task
        for ch in self._channels.values():
            with contextlib.suppress(Exception):
                await ch.close(grace=None)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def wait(self) -> None:
        """Until the server stops."""
        assert self._server is not None
        await self._server.wait_for_termination()

    # --- local heartbeat links (rule 1) ------------------------------------------------

    async def heartbeat(
        self, requests: AsyncIterator[pb.HeartbeatRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """One local process's heartbeat stream toward one arbiter."""
        target = self._target(context)
        if isinstance(target, tuple):
            await context.abort(*target)
            return
        up = self.uplink(target)
        inbox: asyncio.Queue[bytes | tuple[int, str] | None] = asyncio.Queue()
        link: LocalLink | None = None

        async def read() -> None:
            nonlocal link
            try:
                async for req in requests:
                    if link is None:
                        nid = req.node_id
                        if self.id_prefix and not nid.startswith(self.id_prefix):
                            inbox.put_nowait(
                                (
                                    grpc.StatusCode.PERMISSION_DENIED.value[0],
                                    f"node id {nid!r} is outside this agent's ids "
                                    f"({self.id_prefix}*, --id-prefix)",
                                )
                            )
                            return
                        link = LocalLink(node_id=nid, deliver=inbox.put_nowait)
                        up.table.open(link)
                    elif req.node_id != link.node_id:
                        inbox.put_nowait((3, "node_id: one stream speaks for one node id"))
                        return
                    elif link.request is not None and req.seq <= link.request.seq:
                        inbox.put_nowait((3, f"seq: {req.seq} after {link.request.seq}"))
                        return
                    up.table.heard(link, req, time.monotonic())
            finally:
                inbox.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                item = await inbox.get()
                if item is None:
                    return  # the process ended its stream, or went away
                if isinstance(item, tuple):
                    code, message = item
                    await context.abort(_CODES.get(code, grpc.StatusCode.UNKNOWN), message)
                    return
                yield item
        finally:
            reader.cancel()
            if link is not None:
                up.table.close(link)

    # --- everything else (rule 2) ------------------------------------------------------

    async def forward(
        self, method: str, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """Any other call, raw bytes both ways, to the arbiter it names."""
        target = self._target(context)
        if isinstance(target, tuple):
            await context.abort(*target)
            return
        call = self.channel(target).stream_stream(method)(
            metadata=tuple(_forwarded(context.invocation_metadata())),
            timeout=context.time_remaining(),
        )

        async def pump() -> None:
            with contextlib.suppress(Exception):
                async for request in requests:
                    await call.write(request)
                await call.done_writing()

        pumping = asyncio.get_running_loop().create_task(pump())
        try:
            initial = await call.initial_metadata()
            if initial:
                await context.send_initial_metadata(_forwarded(initial))
            async for response in call:
                yield response
            trailing = await call.trailing_metadata()
            if trailing:
                context.set_trailing_metadata(tuple(_forwarded(trailing)))
        except grpc.aio.AioRpcError as e:
            await context.abort(
                e.code(), e.details() or "", tuple(_forwarded(e.trailing_metadata()))
            )
        finally:
            pumping.cancel()
            call.cancel()


class _Handler(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Heartbeat to the agent's links, everything else forwarded (rules 1, 2)."""

    def __init__(self, agent: HostAgent) -> None:
        self._agent = agent
        self._heartbeat = grpc.stream_stream_rpc_method_handler(
            agent.heartbeat, request_deserializer=pb.HeartbeatRequest.FromString
        )
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        if method == HEARTBEAT:
            return self._heartbeat
        handler = self._handlers.get(method)
        if handler is None:
            if len(self._handlers) > 64:
                self._handlers.clear()
            agent = self._agent

            async def forward(requests: Any, context: Any, m: str = method) -> Any:
                async for response in agent.forward(m, requests, context):
                    yield response

            handler = self._handlers[method] = grpc.stream_stream_rpc_method_handler(forward)
        return handler


def _answers(path: Path) -> bool:
    """Something accepts connections on the unix socket ``path`` (a live agent)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(0.5)
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()
