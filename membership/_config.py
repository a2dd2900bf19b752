"""ClientConfig: every tunable of the SDK, with its default and why. Seconds throughout."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from membership.shared.errors import InvalidArgument
from membership.shared.validation import MIN_KEEPALIVE_TIME, MIN_KEEPALIVE_TIMEOUT

if TYPE_CHECKING:
    from membership.shared.tls import TLSFiles

__all__ = ["MAX_RECEIVE_BYTES", "ClientConfig"]

# The largest message a client accepts, bytes: a whole view (a snapshot, a
# GetView answer) at the replicas' default limits fits with room to spare.
MAX_RECEIVE_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    """Tunables of :class:`membership.MembershipClient`.

    Raises:
        InvalidArgument: from :meth:`validate` when a value or relation is wrong.
    """

    # Heartbeat interval used until an arbiter suggests one in its ack.
    heartbeat_interval: float = 0.15
    # A heartbeat stream whose oldest unacked heartbeat was sent this long
    # ago is abandoned and reopened, even when writes are stuck (failure
    # class "keepalive starved by blocked writes", docs/architecture.md).
    # Counted from the send, so a node that was itself paused keeps its
    # streams and just sends; scaled up with the interval the arbiters
    # suggest. Keep it well below the arbiters' suspicion time D (0.75 s by
    # default) plus the initial backoff.
    ack_timeout: float = 0.6
    # A heartbeat stream whose oldest unacked heartbeat was sent this long ago
    # gets a second stream beside it, on a new TCP connection, and the first
    # of the two to ack wins (membership/_node/heartbeats.py, rule 3): a connection
    # that wedged (no FIN, no RST) is left, not waited on. Scaled with the
    # interval like ack_timeout. Between heartbeat_interval and ack_timeout:
    # at 0.3 s a fresh connection has about 0.3 s to bring an ack before the
    # lease of the last acked heartbeat (D = 0.75 s from its send) runs out.
    hedge_after: float = 0.3
    # A heartbeat stream silent this long is abandoned even when no other
    # arbiter answers either (membership/_node/linkrules.py rule 4; below that, a
    # node whose every link is silent alike keeps its streams: the cause is
    # the arbiters' load or its own process, and reconnecting only adds
    # load), and so is a stream waiting for its first ack (a replica working
    # through a join storm is slow to take a new node). The bound within
    # which a node whose every connection wedged at once gets fresh ones.
    # Scaled with the interval like ack_timeout; above ack_timeout. At 3 s it
    # is 4 x the arbiters' suspicion time D (0.75 s at the default interval):
    # long enough for a replica's backlog in a storm, short beside keepalive
    # (which a wedged connection's blocked writes can hold up, grpc#15871).
    stall_timeout: float = 3.0
    # A stream in slow start (no lease granted on it yet: the node joins, or
    # the stream is new) silent this long is given up (membership/_node/linkrules.py
    # rule 4). An arbiter working through a join storm answers new nodes late;
    # gRPC queues a stream its server has not taken yet, and cancels it after
    # 30 s there. A node that gave up sooner would rejoin that queue at the
    # back, behind every node that did the same. No lease of it is at stake.
    slow_start_timeout: float = 30.0
    # Each lease the node holds ends this long before the arbiter's promise
    # (session rule 2), so the node reports itself fenced at least this long
    # before a quorum of arbiters can suspect it, even when its own process
    # runs late (a loaded machine, a GC pause) by up to this much. Costs as
    # much of every lease: a node must be acked within lease - lease_guard
    # (0.65 s at the default interval), which the ack timeout (0.6 s) asks anyway.
    lease_guard: float = 0.1
    # Reconnect backoff: jittered exponential between these bounds, so that a
    # fleet does not reconnect in step (a reconnect storm). The
    # maximum must stay below the arbiters' restart_grace minus their lease
    # (3 s - 0.75 s by default), so that nodes are back before a restarted
    # replica may suspect them.
    backoff_initial: float = 0.05
    backoff_max: float = 1.0
    # HTTP/2 keepalive, the safety net under the heartbeat's ack_timeout: a
    # connection that brought nothing for keepalive_time is pinged, and closed
    # when the ping stays unanswered (or any byte sent stays unacknowledged by
    # the peer's kernel) for keepalive_timeout. So a half-open connection is
    # closed within about keepalive_time + keepalive_timeout (15 s by
    # default) on both sides, with calls open or not.
    # keepalive_time must be >= MIN_KEEPALIVE_TIME (4 s), which arbiters
    # accept; keepalive_timeout >= MIN_KEEPALIVE_TIMEOUT (1 s), as it is
    # also the sockets' TCP_USER_TIMEOUT. What each layer covers: channel_options().
    keepalive_time: float = 10.0
    keepalive_timeout: float = 5.0
    # Deadline of unary calls (GetView, Leave) per arbiter tried.
    call_timeout: float = 3.0
    # Seconds given to the graceful leave when a node's client exits its
    # ``async with`` block (``leave_on_exit``).
    leave_timeout: float = 5.0
    # A subscription that brings nothing, not even a progress marker, for this
    # long is treated as dead and reopened elsewhere (a frozen replica or a
    # half-open connection sends no error). The arbiters send a marker every
    # progress_interval (1 s by default) on an idle stream; the watcher also
    # keeps a stream for at least 2.5 of the intervals the arbiter announces.
    # Below disconnect_after, so that a frozen serving replica is replaced
    # (hedged to the others) before the watcher would report lost contact.
    stream_idle_timeout: float = 2.5
    # A watcher that hears nothing from an arbiter in a quorum for this long
    # reports Disconnected (``watch`` prints {"type": "disconnected", ...})
    # and Reconnected once it hears one again: "no changes" and "lost
    # contact" look different. Must exceed the arbiters' progress_interval.
    disconnect_after: float = 3.0
    # A new subscription asks the preferred arbiter first and, if it has not
    # answered in a quorum within this many seconds, every other arbiter at
    # once; the first in a quorum serves ("hedged requests").
    subscribe_hedge: float = 0.5
    # After the serving arbiter reports it lost its quorum, a subscriber looks
    # for one that has it every this many seconds.
    failover_probe_interval: float = 1.0
    # A node told it is DEAD starts again at a higher incarnation.
    auto_rejoin: bool = True
    # Keep ``client.view`` current with a background subscription.
    follow_view: bool = True
    # Probe this node's load, CPU, memory and GPUs (NVML, when installed) in a
    # background thread and send them with the heartbeats; values the
    # application sets with ``client.report()`` are sent either way.
    collect_status: bool = True
    # Seconds between two probes. A probe still running at its next turn is
    # skipped, never waited for: a heartbeat is never delayed by it
    # (membership/_node/collector.py).
    status_probe_interval: float = 1.0
    # A node that holds streams to fewer than a quorum of arbiters logs which
    # ones it cannot reach and why, at most this often (seconds).
    reachability_log_interval: float = 5.0
    # Mutual TLS (docs/security.md): the cluster CA, this client's certificate
    # and its key, PEM files. None: MEMBERSHIP_TLS_CA, MEMBERSHIP_TLS_CERT and
    # MEMBERSHIP_TLS_KEY from the environment.
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    # Plaintext, asked for explicitly (--insecure; MEMBERSHIP_INSECURE=1 in the
    # environment does the same). Neither TLS files nor this: MembershipClient
    # raises InvalidArgument (secure by default).
    insecure: bool = False
    # The unix socket of this host's agent (`membership agent --socket PATH`): every
    # call goes through it, named to the arbiter it is for, and the agent's host
    # stream carries this node's heartbeats (docs/agent.md). The socket is
    # plaintext (its file mode is the boundary): the TLS settings are the agent's,
    # and these fields are not read. "" = talk to the arbiters directly.
    via_agent: str = ""

    def validate(self) -> ClientConfig:
        """Checks every value and relation; returns self.

        Raises:
            InvalidArgument: naming the field and the rule.
        """
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise InvalidArgument(f"{f.name} must be a finite number, got {value}")
        for name in (
            "heartbeat_interval",
            "ack_timeout",
            "backoff_initial",
            "backoff_max",
            "keepalive_time",
            "keepalive_timeout",
            "hedge_after",
            "stall_timeout",
            "slow_start_timeout",
            "call_timeout",
            "leave_timeout",
            "stream_idle_timeout",
            "disconnect_after",
            "subscribe_hedge",
            "failover_probe_interval",
            "status_probe_interval",
            "reachability_log_interval",
        ):
            if not getattr(self, name) > 0:
                raise InvalidArgument(f"{name} must be > 0, got {getattr(self, name)}")
        if self.backoff_max < self.backoff_initial:
            raise InvalidArgument("backoff_max must be >= backoff_initial")
        if self.ack_timeout <= self.heartbeat_interval:
            raise InvalidArgument("ack_timeout must exceed heartbeat_interval")
        if not 0 <= self.lease_guard < self.ack_timeout - self.heartbeat_interval:
            raise InvalidArgument(
                f"lease_guard ({self.lease_guard}s) must be >= 0 and below ack_timeout - "
                f"heartbeat_interval ({self.ack_timeout - self.heartbeat_interval:.3g}s)"
            )
        if not self.heartbeat_interval < self.hedge_after < self.ack_timeout:
            raise InvalidArgument(
                f"hedge_after ({self.hedge_after}s) must be between heartbeat_interval "
                f"({self.heartbeat_interval}s) and ack_timeout ({self.ack_timeout}s)"
            )
        for name in ("stall_timeout", "slow_start_timeout"):
            if getattr(self, name) <= self.ack_timeout:
                raise InvalidArgument(
                    f"{name} ({getattr(self, name)}s) must exceed ack_timeout ({self.ack_timeout}s)"
                )
        if self.keepalive_time < MIN_KEEPALIVE_TIME:
            raise InvalidArgument(
                f"keepalive_time ({self.keepalive_time}s) must be >= {MIN_KEEPALIVE_TIME}s: "
                "arbiters accept pings no more often, and answer faster ones with "
                "GOAWAY too_many_pings"
            )
        if self.keepalive_timeout < MIN_KEEPALIVE_TIMEOUT:
            raise InvalidArgument(
                f"keepalive_timeout ({self.keepalive_timeout}s) must be >= "
                f"{MIN_KEEPALIVE_TIMEOUT}s: it is also the sockets' TCP_USER_TIMEOUT, and a "
                "shorter one aborts healthy connections on a few retransmissions"
            )
        return self

    def transport_security(self) -> TLSFiles | None:
        """The TLS files to use, or None for plaintext: these fields first, then
        the environment (:func:`membership.shared.tls.resolve`).

        None also with ``via_agent``.

        Raises:
            InvalidArgument: neither TLS files nor insecure (secure by
                default), both, or only some of the three files.
        """
        from membership.shared.tls import resolve

        if self.via_agent:
            return None  # the agent's socket: plaintext, the agent holds the TLS files
        return resolve(
            ca=self.tls_ca,
            cert=self.tls_cert,
            key=self.tls_key,
            insecure=self.insecure,
            names="config",
        )

    def channel_options(self) -> list[tuple[str, int]]:
        """gRPC channel options for every connection to an arbiter.

        Dead-connection detection, in layers (measured with grpcio 1.85 on
        Linux 6.18; tests/unit/test_keepalive.py keeps it true):

        1. The heartbeat: a stream with no ack for ``ack_timeout`` is
           abandoned (client.py), and the arbiters suspect a silent node
           after D. Nothing below is needed for membership decisions.
        2. HTTP/2 PING: sent after ``keepalive_time`` without a byte read
           (also with no call open), answered or the connection closes
           ``keepalive_timeout`` later. gRPC core arms that timeout with
           ``grpc.http2.ping_timeout_ms`` (default 60 s), not with
           ``keepalive_timeout_ms``, so both are set. This covers a peer
           whose kernel still acknowledges but whose process is gone or
           stuck (a frozen proxy, a stopped process), which TCP never notices.
        3. TCP: gRPC core sets TCP_USER_TIMEOUT = ``keepalive_timeout_ms`` on
           every socket (client and server side) whenever keepalive_time is
           set, so bytes the peer's kernel does not acknowledge for that long
           (the PING itself, a heartbeat, or a receive window kept shut)
           abort the socket in the kernel, even while gRPC's own writes are
           stuck (the keepalive ping itself may be stuck behind them:
           grpc/grpc#15871). It does not set SO_KEEPALIVE, and gRPC offers no
           way to from Python (only a C socket-mutator pointer): there are
           no TCP keepalive probes; the PING of layer 2 is what puts bytes in
           flight on an idle connection.
        """
        return [
            ("grpc.keepalive_time_ms", int(self.keepalive_time * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout * 1000)),
            ("grpc.http2.ping_timeout_ms", int(self.keepalive_timeout * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.initial_reconnect_backoff_ms", int(self.backoff_initial * 1000)),
            ("grpc.max_reconnect_backoff_ms", int(self.backoff_max * 1000)),
            ("grpc.enable_retries", 0),
            # A snapshot or GetView is one message holding the whole view: at
            # the replicas' default limits (5,000 nodes, 4 KiB of labels and
            # up to 64 gauges each) about 50 MiB, far above gRPC's default
            # 4 MiB receive limit (docs/protocol.md, "Limits").
            ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
        ]
