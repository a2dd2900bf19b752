"""ClientConfig: every tunable of the SDK, with its default and why. Seconds throughout."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from membership.errors import InvalidArgument

__all__ = ["ClientConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    """Tunables of :class:`membership.MembershipClient`.

    Raises:
        InvalidArgument: from :meth:`validate` when a value or relation is wrong.
    """

    # Heartbeat interval used until an arbiter suggests one in its ack.
    heartbeat_interval: float = 0.15
    # A heartbeat stream that brings no ack for this long is abandoned and
    # reopened, even when writes are stuck (C03). Keep it well below the
    # arbiters' suspicion time D (0.75 s by default) plus the initial backoff.
    ack_timeout: float = 0.6
    # Reconnect backoff: jittered exponential between these bounds (C19). The
    # maximum must stay below the arbiters' restart_grace minus their lease
    # (3 s - 0.75 s by default), so that nodes are back before a restarted
    # replica may suspect them.
    backoff_initial: float = 0.05
    backoff_max: float = 1.0
    # HTTP/2 keepalive: ping after this long without traffic; must be >= the
    # arbiter's min_ping_interval (4 s by default) or GOAWAY too_many_pings (C05).
    keepalive_time: float = 10.0
    keepalive_timeout: float = 5.0
    # Deadline of unary calls (GetView, Leave) per arbiter tried.
    call_timeout: float = 3.0
    # A subscription that brings nothing, not even a progress marker, for this
    # long is treated as dead and reopened elsewhere (C01, C06). Must exceed
    # the arbiters' progress_interval (5 s by default).
    stream_idle_timeout: float = 12.0
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
    # skipped, never waited for: a heartbeat is never delayed by it (C26).
    status_probe_interval: float = 1.0

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
            "call_timeout",
            "stream_idle_timeout",
            "failover_probe_interval",
            "status_probe_interval",
        ):
            if not getattr(self, name) > 0:
                raise InvalidArgument(f"{name} must be > 0, got {getattr(self, name)}")
        if self.backoff_max < self.backoff_initial:
            raise InvalidArgument("backoff_max must be >= backoff_initial")
        if self.ack_timeout <= self.heartbeat_interval:
            raise InvalidArgument("ack_timeout must exceed heartbeat_interval")
        return self

    def channel_options(self) -> list[tuple[str, int]]:
        """gRPC channel options for every connection to an arbiter."""
        return [
            ("grpc.keepalive_time_ms", int(self.keepalive_time * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.initial_reconnect_backoff_ms", int(self.backoff_initial * 1000)),
            ("grpc.max_reconnect_backoff_ms", int(self.backoff_max * 1000)),
            ("grpc.enable_retries", 0),
        ]
