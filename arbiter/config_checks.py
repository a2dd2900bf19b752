"""The relations an :class:`arbiter.config.ArbiterConfig` must keep, checked (etcd's
config checks): every value in its range, and the relations between the timings.

Split from :mod:`arbiter.config`, which holds the fields and why each has its
default; :meth:`ArbiterConfig.validate` calls :func:`check`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from arbiter.workers import check_ingest_workers
from membership.config import MIN_KEEPALIVE_TIME, MIN_KEEPALIVE_TIMEOUT
from membership.errors import InvalidArgument
from membership.validation import parse_address, validate_cluster_name

if TYPE_CHECKING:
    from arbiter.config import ArbiterConfig

__all__ = ["check"]


def check(config: ArbiterConfig) -> None:
    """Checks every value of ``config`` and the relations between them.

    Raises:
        InvalidArgument: naming the field and the rule it breaks.
    """
    positive = (
        "heartbeat_interval",
        "observation_retry",
        "raft_heartbeat_interval",
        "election_timeout",
        "progress_interval",
        "status_interval",
        "max_heartbeat_rate",
        "heartbeat_rate_margin",
        "subscriber_write_timeout",
        "heartbeat_budget",
        "keepalive_time",
        "keepalive_timeout",
        "min_ping_interval",
        "loop_lag_warning",
        "shed_lateness",
        "shed_retry_after",
        "max_grace",
    )
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name == "tombstone_retention" and value == math.inf:
            continue  # forget by count only (README, "Bounded history")
        if isinstance(value, float | int) and not math.isfinite(value):
            raise InvalidArgument(f"{f.name} must be a finite number, got {value}")
    for name in positive:
        if not getattr(config, name) > 0:
            raise InvalidArgument(f"{name} must be > 0, got {getattr(config, name)}")
    if config.metrics_listen:
        try:
            parse_address(config.metrics_listen)
        except InvalidArgument as e:
            raise InvalidArgument(f"metrics_listen: {e}") from None
    if config.missed_heartbeats < 2:
        raise InvalidArgument(
            f"missed_heartbeats must be >= 2 (one late heartbeat must not suspect), "
            f"got {config.missed_heartbeats}"
        )
    if config.max_heartbeat_interval < config.heartbeat_interval:
        raise InvalidArgument(
            f"max_heartbeat_interval ({config.max_heartbeat_interval}s) must be >= "
            f"heartbeat_interval ({config.heartbeat_interval}s)"
        )
    if not 0 < config.load_target < 1:
        raise InvalidArgument(f"load_target must be in (0, 1), got {config.load_target}")
    if not config.load_target < config.shed_utilisation <= 1:
        raise InvalidArgument(
            f"shed_utilisation must be in (load_target, 1] (the interval reacts first, "
            f"shedding after), got {config.shed_utilisation} with load_target {config.load_target}"
        )
    for name in ("restart_grace", "observation_batch_interval", "max_ping_strikes"):
        if getattr(config, name) < 0:
            raise InvalidArgument(f"{name} must be >= 0, got {getattr(config, name)}")
    if not 0 < config.lease_fraction <= 1:
        raise InvalidArgument(
            f"lease_fraction must be in (0, 1]: a lease longer than D would promise "
            f"what the detector cannot keep; got {config.lease_fraction}"
        )
    if config.lease < 2 * config.heartbeat_interval:
        raise InvalidArgument(
            f"the lease ({config.lease:.3f}s = missed_heartbeats x heartbeat_interval x "
            f"lease_fraction) must be >= 2 x heartbeat_interval ({config.heartbeat_interval}s): "
            "a shorter lease would fence healthy nodes between two heartbeats"
        )
    if config.election_timeout <= 2 * config.raft_heartbeat_interval:
        raise InvalidArgument(
            f"election_timeout ({config.election_timeout}s) must be > 2 x "
            f"raft_heartbeat_interval ({config.raft_heartbeat_interval}s)"
        )
    if config.detector_kind not in ("missed", "phi"):
        raise InvalidArgument(
            f"detector_kind must be 'missed' or 'phi', got {config.detector_kind!r}"
        )
    if config.snapshot_every < 1:
        raise InvalidArgument(f"snapshot_every must be >= 1, got {config.snapshot_every}")
    if not config.tombstone_retention >= 0 or config.max_tombstones < 0:
        raise InvalidArgument(
            f"tombstone_retention must be >= 0 seconds and max_tombstones >= 0, got "
            f"{config.tombstone_retention} and {config.max_tombstones}"
        )
    if config.history_size < 1 or config.subscriber_queue < 8:
        raise InvalidArgument("history_size must be >= 1 and subscriber_queue >= 8")
    if config.max_heartbeat_rate < 2 / config.heartbeat_interval:
        raise InvalidArgument(
            f"heartbeat_interval ({config.heartbeat_interval}s) must be >= "
            f"{2 / config.max_heartbeat_rate:g}s: streams are cut above max_heartbeat_rate "
            f"({config.max_heartbeat_rate:g}/s), which must allow twice the heartbeat rate"
        )
    if config.max_message_bytes < 48 * 1024:
        raise InvalidArgument(
            f"max_message_bytes must be >= 49152 (a heartbeat at every label and status "
            f"limit must fit, with room), got {config.max_message_bytes}"
        )
    if config.max_peer_message_bytes < config.max_message_bytes:
        raise InvalidArgument(
            f"max_peer_message_bytes ({config.max_peer_message_bytes}) must be >= "
            f"max_message_bytes ({config.max_message_bytes}): it is the limit of the whole port"
        )
    for name in ("max_nodes", "max_heartbeat_streams", "max_subscribers"):
        if getattr(config, name) < 1:
            raise InvalidArgument(f"{name} must be >= 1, got {getattr(config, name)}")
    check_ingest_workers(config.ingest_workers)
    if config.max_concurrent_streams < 4:
        raise InvalidArgument(
            f"max_concurrent_streams must be >= 4 (a client's watch, its hedged "
            f"subscription and a unary call share a connection), "
            f"got {config.max_concurrent_streams}"
        )
    validate_cluster_name(config.cluster)
    if config.min_ping_interval > MIN_KEEPALIVE_TIME:
        raise InvalidArgument(
            f"min_ping_interval ({config.min_ping_interval}s) must be <= {MIN_KEEPALIVE_TIME}s: "
            "nodes may ping that often, and faster pings than min_ping_interval earn "
            "them GOAWAY too_many_pings"
        )
    if config.keepalive_time < MIN_KEEPALIVE_TIME:
        raise InvalidArgument(
            f"keepalive_time ({config.keepalive_time}s) must be >= {MIN_KEEPALIVE_TIME}s: "
            "replicas ping each other at that interval, and another replica accepts "
            "pings no more often"
        )
    if config.keepalive_timeout < MIN_KEEPALIVE_TIMEOUT:
        raise InvalidArgument(
            f"keepalive_timeout ({config.keepalive_timeout}s) must be >= "
            f"{MIN_KEEPALIVE_TIMEOUT}s: it is also the sockets' TCP_USER_TIMEOUT, and a "
            "shorter one aborts healthy connections on a few retransmissions"
        )
    config.raft().validate()
    config.degraded_policy().validate()
