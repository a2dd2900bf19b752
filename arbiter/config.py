"""ArbiterConfig: every tunable of an arbiter replica, with its default and why.

Timings are in seconds. The relations that must hold between them are
checked by :meth:`ArbiterConfig.validate` (the style of etcd's config checks;
they are in :mod:`arbiter.config`).

Detection time D (kill of a node to its suspicion by a replica) is about
``heartbeat_interval * missed_heartbeats``; a DEAD is committed one Raft round
trip later (milliseconds on a LAN) once a quorum of replicas suspect.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from arbiter.core.degraded import DegradedPolicy
from arbiter.core.detection import (
    FailureDetector,
    LoadPolicy,
    MissedHeartbeatDetector,
    PhiAccrualDetector,
    threshold_sigmas,
)
from arbiter.core.raft import RaftConfig
from arbiter.core.replica import ReplicaSettings
from arbiter.core.retention import RetentionPolicy
from arbiter.workers import check_ingest_workers
from membership.shared.errors import InvalidArgument
from membership.shared.validation import (
    MIN_KEEPALIVE_TIME,
    MIN_KEEPALIVE_TIMEOUT,
    parse_address,
    validate_cluster_name,
)

__all__ = ["ArbiterConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ArbiterConfig:
    """Tunables of one arbiter replica. Use :meth:`lan` (the default) or :meth:`local`.

    Raises:
        InvalidArgument: from :meth:`validate` when a value or relation is wrong.
    """

    # Name of the cluster; a replica refuses Raft traffic from another cluster.
    cluster: str = "default"

    # --- failure detection -------------------------------------------------
    # Interval the replica suggests to nodes between heartbeats (seconds).
    # Smaller = faster detection, more traffic: each replica handles
    # nodes / heartbeat_interval messages per second.
    heartbeat_interval: float = 0.15
    # A node is suspected after this many intervals without a heartbeat.
    # D = heartbeat_interval * missed_heartbeats (0.75 s by default). Must
    # exceed the longest pause a node may take without being suspected.
    missed_heartbeats: float = 5.0
    # Heartbeats per second one replica should handle: the prior of the
    # adaptive interval. Beyond heartbeat_budget * heartbeat_interval nodes
    # (750 by default) the interval suggested in acks grows (25 % steps) so
    # that nodes / interval stays within the budget; D and the leases grow
    # with it. The replica's measured load then moves it off this by whole
    # steps (load_target). The rules and a table per cluster size:
    # arbiter/core/detection/interval.py; README "Heartbeat budget".
    heartbeat_budget: float = 5000.0
    # The cap of the suggested interval up to heartbeat_budget *
    # max_heartbeat_interval nodes (3,000) (seconds); beyond, the cap grows
    # with the node count so the budget holds (interval rule 3). The longest
    # interval ever suggested or accepted is the load cap at max_nodes
    # (interval_ceiling: 3.58 s at 10,000 nodes), and the restart grace is
    # raised to the lease at it (grace).
    max_heartbeat_interval: float = 0.6
    # Utilisation (the fraction of the time the replica's event loop is busy,
    # on a CPU or waiting for one: arbiter/server/load/monitor.py) the adaptive
    # interval aims at: above target x 1.25 it grows at once by enough steps,
    # below target / 1.5 for 10 s it comes down one step (interval rule 4).
    load_target: float = 0.6
    # New nodes' streams are refused with RESOURCE_EXHAUSTED and the trailing
    # metadata grpc-retry-pushback-ms (gRFC A6) while the loop is on a CPU >
    # shed_utilisation of the time (1.0: never) or its backlog (loop lateness
    # averaged over 2 s, or ingest backlog) is >= shed_lateness seconds
    # (shedding.py): before acks reach the SDK's hedge time (0.3 s). Known nodes
    # always go on. The hint: shed_retry_after s, x1 to x2 at random (no herd).
    shed_utilisation: float = 0.9
    shed_lateness: float = 0.1
    shed_retry_after: float = 1.0
    # Which failure detector a replica runs: "missed" (suspect after
    # missed_heartbeats silent intervals) or "phi" (phi accrual, Hayashibara
    # et al. 2004 as in Akka: adapts to the jitter each node shows). Both are
    # tuned to the same D for a clean silence after regular heartbeats; phi
    # then waits longer for nodes whose heartbeats jitter. See detector().
    detector_kind: str = "missed"
    # Lease granted with each ack, as a fraction of D. The replica promises
    # not to suspect the node before the lease runs out, so it must be <= 1.
    # No margin on top for a node already cut from one replica (issue 9,
    # item 8): such a node rests on the leases of the others, and one of them
    # deaf for about a lease (0.6 to 0.75 s at the defaults: the lease less
    # the heartbeat phase) fences it. That is the fence doing its job: the
    # node cannot tell a late replica from one that is cut off and about to
    # suspect it, and a node that believes it holds a quorum of leases must
    # never be DEAD (the fencing rule, docs/architecture.md), so it may not count a late lease. A
    # longer lease needs a longer D for every node. Replicas are kept from
    # going deaf instead (fsync off the loop: arbiter/server/consensus/writer.py; stalls
    # logged: arbiter/server/load/looplag.py); five replicas leave such a node a
    # margin of one late replica.
    lease_fraction: float = 1.0
    # After a restart with durable state a replica casts no suspicion for this
    # long (seconds) at least; a first start (empty data dir) has none. It is
    # raised to the longest lease (grace: the lease at interval_ceiling, 17.9 s
    # with max_nodes 10,000; 3 s with the local preset's 1,500).
    # It must cover one maximum lease (a promise: core/observer.py rule 5) plus the
    # nodes' reconnect after an outage (backoff <= 1 s by default). Trade-off: a
    # node that died during the outage is declared DEAD up to this much later.
    restart_grace: float = 3.0
    # Observations not committed after this long are proposed again (seconds),
    # while commits are fast; slow commits lengthen it, up to 8x (RFC 6298's
    # timer: arbiter/core/retry.py), so retries never outrun the log.
    observation_retry: float = 0.5
    # Seconds between the leader's batches of joins (core/batching.py); 0: all at once.
    observation_batch_interval: float = 0.2
    # The longest grace window a node may ask for (seconds; Membership.Grace,
    # core/grace_windows.py): an ask for more gets this much. A node that dies
    # in its window is declared DEAD at its end + D at the latest, not D after.
    max_grace: float = 300.0

    # --- Raft ----------------------------------------------------------------
    # Leader heartbeat interval (seconds).
    raft_heartbeat_interval: float = 0.1
    # Election timeout (seconds); each follower draws its own in [T, 2T).
    # Leader failover takes about 1 to 2 T. Must exceed 2 x raft_heartbeat_interval.
    election_timeout: float = 1.0
    # Applied log entries between two snapshots of the state machine; the
    # entries a snapshot covers are then deleted from the log (Raft §7). A
    # snapshot costs one serialisation of the state (O(nodes x arbiters)
    # observations) and one fsync; a smaller value keeps the log and restart
    # replay short, a larger one makes snapshots rarer. A replica that falls
    # behind the leader's last snapshot catches up by receiving the snapshot.
    snapshot_every: int = 1000

    # --- subscribers -----------------------------------------------------------
    # Committed changes kept in memory for subscribers that resume by epoch.
    # An older resume point gets a fresh snapshot instead (never a gap).
    history_size: int = 1024
    # Events queued per subscriber before it is considered too slow: its
    # queue is dropped and it is sent a fresh snapshot (bounded memory).
    subscriber_queue: int = 256
    # A progress marker with the committed epoch is sent on an idle stream
    # this often (seconds), so idle middleboxes keep it and the subscriber
    # can tell a silent stream from a dead one: subscribers abandon a stream
    # silent for 2.5 intervals (3 s at least) and report that they lost
    # contact after 3 s (membership._config.ClientConfig). Costs one small
    # message per idle subscriber per interval.
    progress_interval: float = 1.0
    # Subscribers that opt in to status events receive the nodes whose status
    # or suspicions changed at most this often (seconds); they may ask for
    # less often, never more. Coalesced per node: only the latest is sent.
    status_interval: float = 1.0
    # DEGRADED, a node that heartbeats but is unhealthy: status, never a view
    # change (rules and trade-offs: arbiter/core/degraded.py; README "Degraded
    # nodes"). Jitter: above degraded_jitter_factor x the other nodes' median
    # and degraded_jitter_floor x its interval, once degraded_min_samples
    # heartbeats are in (~5 s at 0.15 s). Step rate: below
    # degraded_step_fraction x the median of its job's other members, over
    # degraded_step_window seconds in which their median advanced at least
    # degraded_min_steps steps (so a node is judged a window after it starts).
    degraded_jitter_factor: float = 4.0
    degraded_jitter_floor: float = 0.2
    degraded_min_samples: int = 32
    degraded_step_fraction: float = 0.5
    degraded_step_window: float = 30.0
    degraded_min_steps: int = 10

    # --- bounded history (README "Bounded history"; arbiter/core/retention.py) ---
    # Seconds a DEAD or LEFT record stays in the view after its change (on the
    # leader's clock, from when it first saw the record: never sooner, later by
    # a leader's downtime). An hour keeps who died, with the evidence, through
    # an incident's post-mortem (`membership view --state DEAD,LEFT`), and
    # covers a job's restarts; then the leader proposes a replicated Forget.
    # The incarnation stays refused (a floor of ~200 bytes per id).
    tombstone_retention: float = 3600.0
    # The most DEAD and LEFT records kept; beyond it the oldest (by epoch) are
    # forgotten at once, whatever their age. Bounds a churn storm (a
    # 1,000-rank job restarting every minute makes 60,000 an hour). As many as
    # max_nodes, so that a whole cluster failing at once (a 2,000-rank job
    # killed) stays visible for the retention, and the view holds at most
    # twice max_nodes rows: a tombstone costs ~1.8 KB of replica memory (its
    # record and one observation per replica) and ~230 bytes of every
    # snapshot (bench/tombstones.py; plus its share of every GetView and
    # subscriber snapshot), so 5,000 are ~9 MB and ~1.2 MB of snapshot.
    max_tombstones: int = 5_000

    # --- limits: the wire contract (docs/protocol.md; arbiter/server/api/limits.py) --
    # Each is enforced on every call; breaking one ends only the offending
    # call, with a status whose message starts with the limit's name.
    #
    # Largest request a node, subscriber or other client may send, on every
    # RPC but the replicas' own (bytes): a larger one ends its call with
    # RESOURCE_EXHAUSTED "max_message_bytes: ..." before it is decoded
    # (arbiter/server/api/decoding.py). A heartbeat at every label and status
    # limit (membership/shared/validation.py) is under 12 KiB; 64 KiB leaves room
    # and keeps what one call can make the replica decode small.
    max_message_bytes: int = 64 * 1024
    # Largest message gRPC takes in at all (bytes; its
    # grpc.max_receive_message_length, checked before anything is buffered
    # further), which is also the limit of Raft traffic between replicas: a
    # log entry carries one replica's batch of observations, about 100 bytes
    # per node plus its labels (1,000 nodes joining at once make a 104 KB
    # entry, which the 64 KiB client limit would refuse, halting
    # replication), and an append carries up to 64 entries. gRPC's own
    # default, 4 MiB.
    max_peer_message_bytes: int = 4 * 1024 * 1024
    # Heartbeats per second one stream may send (a token bucket holding one
    # second's worth, so short bursts pass). A node asked for the shortest
    # interval sends 1 / heartbeat_interval (6.7/s): 20 is three times that,
    # so timer jitter, a replica's own stall (heartbeats read in a burst
    # after it) and reconnects never come near it. Beyond it the stream is
    # throttled: each heartbeat waits for its token (its ack comes later,
    # and the replica never handles more than this many per second on it);
    # the node is told the interval to follow in every ack.
    max_heartbeat_rate: float = 20.0
    # A stream throttled without a pause for this long (seconds) is ended with
    # RESOURCE_EXHAUSTED: it ignores both the acks' interval and the delay.
    # Long enough for any burst to drain at max_heartbeat_rate (one second's
    # worth of tokens drains in one second), short enough that a flood ends
    # quickly (it costs max_heartbeat_rate heartbeats per second meanwhile).
    heartbeat_rate_margin: float = 2.0
    # Node ids one replica tracks (those its failure detector has an opinion
    # of). A heartbeat stream for a new id beyond it gets RESOURCE_EXHAUSTED;
    # ids it already tracks, or that the view records, keep working. Past
    # heartbeat_budget * max_heartbeat_interval nodes (3,000) a replica
    # keeps the budget only with a longer interval (interval rule 3); 10,000
    # bounds what a client spraying ids can make a replica hold: ~5 KiB per id
    # (bench/limits_memory.py), 52 MiB. It sets the longest interval and so the
    # restart grace (grace): raise it for larger clusters, lower it for small.
    max_nodes: int = 10_000
    # Heartbeat streams open on one replica at once. Two per node at
    # max_nodes: a node opens a second stream beside a late one (hedging,
    # membership/_node/heartbeats.py), and after a network blip the server keeps a
    # node's old stream until keepalive ends it (15 s) while the node's new
    # one is open. A stream costs about 28 KiB here (gRPC's call and HTTP/2
    # stream, the handler: bench/limits_memory.py), so the limit bounds them
    # to some 540 MiB. Beyond it RESOURCE_EXHAUSTED (the node tries again
    # after its backoff; its other replicas are unaffected).
    max_heartbeat_streams: int = 20_000
    # Entries (node ids) in one request of a host stream (HostHeartbeat, an
    # agent's): beyond it the request's extra entries are refused alone
    # (RESOURCE_EXHAUSTED), the first max_host_entries served.
    max_host_entries: int = 1024
    # Subscribe calls open on one replica at once. Each costs about 44 KiB
    # (bench/limits_memory.py), plus its queue (at most subscriber_queue
    # events, or one snapshot), and a share of every change's fan-out; a
    # watcher uses one (two for a moment while it fails over). 1,000: 43 MiB
    # and one change sent 1,000 times, still far from the heartbeat load.
    # Beyond it RESOURCE_EXHAUSTED: the SDK subscribes to another replica.
    max_subscribers: int = 1000
    # Concurrent streams per client connection (HTTP/2
    # SETTINGS_MAX_CONCURRENT_STREAMS, gRPC's grpc.max_concurrent_streams). A
    # gRPC client queues its calls beyond it until a stream ends; a client
    # that ignores the setting gets RST_STREAM(REFUSED_STREAM) for each
    # stream too many (its call fails UNAVAILABLE). The SDK opens one stream
    # per heartbeat connection and a few calls on its shared one; 100 is the
    # smallest value RFC 9113 (section 6.5.2) recommends.
    max_concurrent_streams: int = 100
    # A subscriber whose stream takes no event for this long (seconds) is not
    # reading: its subscription ends with RESOURCE_EXHAUSTED (the status
    # comes after what gRPC already buffered for it, should it ever read),
    # and its slot, queue and handler are released at once. Meanwhile its
    # queue is bounded by subscriber_queue and what gRPC holds by the
    # window its client announced (64 KiB, up to a few MiB once grown) plus
    # one event; gRPC keeps that one event until the client reads or its
    # connection ends (keepalive). A reading subscriber takes an event
    # within a round trip: even a snapshot of max_nodes members (about
    # 0.5 MiB) on a 1 Mbit/s link takes 4 s.
    subscriber_write_timeout: float = 10.0

    # --- transport -------------------------------------------------------------
    # HTTP/2 keepalive, the safety net under the heartbeats (seconds): the
    # replica pings a connection (from a node, a subscriber or another
    # replica, in both roles) that brought nothing for keepalive_time, and
    # closes it when the ping stays unanswered (or any byte sent stays
    # unacknowledged by the peer's kernel) for keepalive_timeout. So a
    # half-open connection is released within about keepalive_time +
    # keepalive_timeout (15 s by default): a dead subscriber's stream or a
    # half-open one is not kept for ever (failure classes "half-open stream"
    # and "dead subscriber holds server resources" in docs/architecture.md).
    # keepalive_timeout is also every socket's TCP_USER_TIMEOUT (set by gRPC
    # core); >= MIN_KEEPALIVE_TIMEOUT (1 s). keepalive_time is also the ping
    # interval of this replica's channels to the other replicas, so it must
    # be >= MIN_KEEPALIVE_TIME (4 s), which every arbiter accepts.
    # What each layer covers: membership._config.ClientConfig.channel_options.
    keepalive_time: float = 10.0
    keepalive_timeout: float = 5.0
    # The server accepts a client's pings this often at most (seconds), and
    # answers max_ping_strikes + 1 faster ones (on a connection it sent no
    # data on meanwhile) with GOAWAY too_many_pings. Must be <=
    # MIN_KEEPALIVE_TIME (4 s), the fastest keepalive the SDK may be given:
    # the SDK's default (10 s) leaves room for any timer jitter.
    min_ping_interval: float = 4.0
    # Pings faster than min_ping_interval tolerated per connection; 0 tolerates
    # any rate (never a too_many_pings GOAWAY, and no protection against a
    # client that floods pings). gRPC's own default is 2.
    max_ping_strikes: int = 2
    # Seconds given to open streams on shutdown before they are cancelled.
    shutdown_grace: float = 1.0
    # Loop lag (seconds) logged at WARNING with what the loop thread was doing
    # (arbiter/server/load/looplag.py): a stall is deafness, no ack leaves meanwhile.
    loop_lag_warning: float = 0.2
    # host:port to serve Prometheus metrics on at /metrics (plain HTTP;
    # arbiter/server/ops/metrics.py lists them); "" serves none. Off by default:
    # the endpoint has no authentication (the gRPC port's mutual TLS does not
    # cover it) and tells whoever reaches it the group's leader, size and
    # churn, so an operator opens it on purpose, where only the scraper reaches.
    metrics_listen: str = ""
    # Heartbeat-ingest worker processes on --listen (arbiter/server/ingest), which
    # proxy every other RPC to this process; "auto" (lan): one a core (arbiter/workers.py).
    ingest_workers: int | str = 0

    @classmethod
    def lan(cls, **overrides: object) -> ArbiterConfig:
        """Defaults for replicas and nodes on one data-centre network (ingest workers: auto)."""
        return dataclasses.replace(cls(ingest_workers="auto"), **overrides)  # type: ignore[arg-type]

    @classmethod
    def local(cls, **overrides: object) -> ArbiterConfig:
        """Defaults for a cluster on one machine (demo, tests): same timings, smaller buffers."""
        # 1,500 nodes: longest interval 0.6 s, grace 3 s. Shared cores (the busy
        # fraction counts the wait for one): shed only on a 2 s backlog.
        local = {"max_nodes": 1_500, "shed_utilisation": 1.0, "shed_lateness": 2.0}
        base = cls(history_size=256, subscriber_queue=128, **local)  # type: ignore[arg-type]
        return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]

    @property
    def suspect_after(self) -> float:
        """D, seconds of silence after which a replica suspects a node."""
        return self.heartbeat_interval * self.missed_heartbeats

    @property
    def lease(self) -> float:
        """Seconds of lease granted with each ack (<= D)."""
        return self.suspect_after * self.lease_fraction

    @property
    def interval_ceiling(self) -> float:
        """The longest interval ever suggested or accepted, seconds (interval rule 5)."""
        return self.replica_settings().ceiling

    @property
    def max_lease(self) -> float:
        """Seconds of lease granted to a node heartbeating at :attr:`interval_ceiling`."""
        return self.lease * self.interval_ceiling / self.heartbeat_interval

    @property
    def grace(self) -> float:
        """The restart grace in force, seconds: ``restart_grace`` raised to the longest
        lease, so that a lease granted before a crash is honoured after it at any
        cluster size (observer rule 5; interval rule 6)."""
        return max(self.restart_grace, self.max_lease)

    def load_policy(self) -> LoadPolicy:
        """The load rule's thresholds around :attr:`load_target` (interval rule 4)."""
        t = self.load_target
        return LoadPolicy(target=t, high=min(1.0, t * 1.25), low=t / 1.5)

    def raft(self) -> RaftConfig:
        """The Raft core's share of this configuration."""
        return RaftConfig(
            heartbeat_interval=self.raft_heartbeat_interval,
            election_timeout=self.election_timeout,
        )

    def replica_settings(self) -> ReplicaSettings:
        """The replica core's share of this configuration (leases, retries, grace, compaction)."""
        return ReplicaSettings(
            lease=self.lease,
            observation_retry=self.observation_retry,
            restart_grace=self.restart_grace,
            heartbeat_interval=self.heartbeat_interval,
            snapshot_every=self.snapshot_every,
            heartbeat_budget=self.heartbeat_budget,
            max_heartbeat_interval=self.max_heartbeat_interval,
            max_nodes=self.max_nodes,
            load_policy=self.load_policy(),
            observation_batch_interval=self.observation_batch_interval,
            max_grace=self.max_grace,
            retention=RetentionPolicy(
                retention=self.tombstone_retention,
                max_tombstones=self.max_tombstones,
                retry_after=self.observation_retry,
            ),
        )

    def degraded_policy(self) -> DegradedPolicy:
        """The DEGRADED rules' thresholds (arbiter/core/degraded.py): its fields, prefixed
        ``degraded_`` here."""
        names = [f.name for f in dataclasses.fields(DegradedPolicy)]
        return DegradedPolicy(**{n: getattr(self, f"degraded_{n}") for n in names})

    def detector(self) -> FailureDetector:
        """A new failure detector of kind :attr:`detector_kind` with this configuration's
        timings (:func:`arbiter.config.make_detector` says how each is tuned to D)."""
        return make_detector(self.detector_kind, self.heartbeat_interval, self.missed_heartbeats)

    def validate(self) -> ArbiterConfig:
        """Checks every value and the relations between them.

        Returns:
            self, so that ``ArbiterConfig(...).validate()`` chains.

        Raises:
            InvalidArgument: naming the field and the rule it breaks.
        """
        check(self)
        return self


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
    for name in ("max_nodes", "max_heartbeat_streams", "max_subscribers", "max_host_entries"):
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


# Phi accrual parameters, fixed (not tunables): Akka's threshold and window,
# and a deviation floor of a quarter interval (the cold-start deviation).
_PHI_THRESHOLD = 8.0
_PHI_MAX_SAMPLES = 200
_PHI_MIN_STD_FRACTION = 0.25


def make_detector(kind: str, interval: float, missed: float) -> FailureDetector:
    """A new failure detector of ``kind`` for heartbeats every ``interval`` seconds,
    suspecting after ``missed`` intervals (D = interval x missed).

    ``"missed"``: :class:`MissedHeartbeatDetector` suspecting after
    ``missed_heartbeats`` intervals, i.e. at D.

    ``"phi"``: :class:`PhiAccrualDetector` with threshold 8, a window of
    200 samples, ``min_std_deviation = H / 4`` and a first-heartbeat
    estimate of H (H = heartbeat_interval). Its acceptable pause is chosen
    so that a clean silence after perfectly regular heartbeats (fitted
    deviation below the floor) is suspected at D, like the missed-count
    detector: the phi deadline is ``H + pause + y8 * H / 4`` where
    ``y8 ~ 5.23`` is the number of deviations at which phi reaches 8, so
    ``pause = D - H - y8 * H / 4`` (about 2.69 H, 0.40 s, by default).
    Jittery heartbeats raise the deviation and so delay suspicion beyond
    D; a node killed after its first heartbeat (window seeded with
    deviation H / 4) is suspected at D too. If D < H * (1 + y8 / 4)
    (missed_heartbeats below ~2.31) the pause is 0 and suspicion comes at
    ``H * (1 + y8 / 4)``, a little after D; a hold (lease) is honoured
    either way.
    """
    suspect_after = interval * missed
    if kind == "phi":
        h = interval
        min_std = h * _PHI_MIN_STD_FRACTION
        y = threshold_sigmas(_PHI_THRESHOLD)
        return PhiAccrualDetector(
            interval=h,
            threshold=_PHI_THRESHOLD,
            max_sample_size=_PHI_MAX_SAMPLES,
            min_std_deviation=min_std,
            acceptable_heartbeat_pause=max(0.0, suspect_after - h - y * min_std),
            first_heartbeat_estimate=h,
        )
    return MissedHeartbeatDetector(interval=interval, missed_limit=missed)
