"""Prometheus metrics of one replica (``membership arbiter --metrics-listen HOST:PORT``).

Rules:

1. The hot path never calls prometheus-client. Heartbeats, acks and the
   heartbeat inter-arrival histogram are counted with plain integer
   increments on :class:`Counters` (one object per replica, owned by the
   driver, touched only on the event loop thread); :class:`ReplicaCollector`
   reads them when Prometheus scrapes, on the HTTP server's thread: an int
   or a list copied there is read atomically under the GIL, and a scrape
   that sees a histogram mid-update is off by one observation at most (the
   next scrape is exact). The replica's state (Raft, the view, the
   detector's suspects) is read on the event loop thread, since the cores
   are not thread-safe: a callback scheduled there, waited for up to
   ``STATE_TIMEOUT`` seconds. A loop stalled longer gets the previous
   reading of the state (and a WARNING), while the counters and histograms,
   loop lag included, are still served fresh: a stalled replica is what the
   metrics must still show.
2. Every replica has its own :class:`prometheus_client.CollectorRegistry`,
   so several replicas (tests) run in one process; the process-wide default
   registry (process and GC metrics of prometheus-client) is not served.
3. Names follow the Prometheus conventions (https://prometheus.io/docs/practices/naming/):
   the ``membership_`` prefix, base units in the name (``_seconds``), ``_total``
   for counters. Counters start at 0 when the process starts (``rate()``
   handles the reset); a restarted replica replaying its log counts no
   death again.
4. Off by default (``metrics_listen = ""``): the endpoint is plain HTTP
   without authentication (the gRPC port's mutual TLS does not cover it),
   and it tells whoever reaches it the cluster's size, leader and churn; an
   operator opens it on purpose, on an address that only the scraper
   reaches. README.md lists every metric with its meaning.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
)
from prometheus_client.registry import Collector

from arbiter.server.consensus.counters import (
    Buckets,
    Counters,
)
from arbiter.server.net.addresses import split_host_port
from arbiter.server.ops.operated import OperatedReplica
from membership.shared.view import DEGRADED_CAUSES

__all__ = [
    "RAFT_ROLES",
    "Buckets",
    "Counters",
    "MetricsServer",
    "ReplicaCollector",
    "serve",
]

log = logging.getLogger("arbiter.metrics")

# Raft roles as the ``role`` label of membership_raft_role (1 for the current one).
RAFT_ROLES = ("follower", "pre_candidate", "candidate", "leader")
# The member states of membership_nodes{state=...}.
NODE_STATES = ("ALIVE", "DEAD", "LEFT")
# The causes of membership_degraded_nodes{reason=...} (arbiter/core/degraded.py).
DEGRADED_REASONS = DEGRADED_CAUSES

# Gauges read from the replica's state: (name, help). Their values come from
# _state(), on the event loop thread (rule 1).
_GAUGES = (
    ("membership_epoch", "Epoch of the view this replica has applied."),
    (
        "membership_in_quorum",
        "1 while this replica is in a quorum (has a leader it can reach), else 0.",
    ),
    ("membership_raft_term", "Current Raft term."),
    ("membership_raft_commit_index", "Raft commit index."),
    ("membership_raft_applied_index", "Highest Raft log index applied to the state machine."),
    ("membership_suspected_nodes", "Nodes this replica's own failure detector currently suspects."),
    ("membership_subscribers", "Subscriptions (watch streams) open on this replica."),
    ("membership_heartbeat_streams", "Heartbeat streams open on this replica."),
    ("membership_arbiters", "Replicas in the arbiter configuration this replica knows."),
)
# Seconds a scrape waits for the event loop to read the replica's state; a
# loop stalled longer gets the previous reading (rule 1).
STATE_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class _State:
    """The replica's state as read on the event loop thread at one scrape."""

    gauges: dict[str, float]
    role: str
    nodes: dict[str, int]
    observations_proposed: int
    degraded: dict[str, int]


def _state(server: OperatedReplica) -> _State:
    """Reads the replica's state (on the event loop thread: the cores are not thread-safe)."""
    d = server.driver
    st = d.raft.status()
    nodes = dict.fromkeys(NODE_STATES, 0)
    for m in d.state.view().members:
        nodes[m.state.value] = nodes.get(m.state.value, 0) + 1
    degraded = dict.fromkeys(DEGRADED_REASONS, 0)
    for marks in server.api.degraded.marks().values():
        for mark in marks:
            degraded[mark.cause] = degraded.get(mark.cause, 0) + 1
    values = (
        d.state.epoch,
        d.status().in_quorum,
        st.term,
        st.commit,
        st.applied,
        len(d.local_suspects()),
        server.api.subscriptions,
        server.api.heartbeat_streams,
        len(server.configuration()["voters"]),
    )
    return _State(
        gauges={name: float(v) for (name, _), v in zip(_GAUGES, values, strict=True)},
        role=st.role.value,
        nodes=nodes,
        observations_proposed=d.replica.observations_proposed,
        degraded=degraded,
    )


class ReplicaCollector(Collector):
    """Reads one replica's state and :class:`Counters` at scrape time (rule 1).

    Args:
        server: the running replica (its driver, API servicer and configuration).
        loop: the replica's event loop, where its state is read.
    """

    def __init__(self, server: OperatedReplica, loop: asyncio.AbstractEventLoop) -> None:
        self._server = server
        self._loop = loop
        self._last: _State | None = None

    def _read_state(self) -> _State | None:
        """The state read on the loop, or the previous one if the loop does not answer."""
        fut: concurrent.futures.Future[_State] = concurrent.futures.Future()

        def read() -> None:
            try:
                fut.set_result(_state(self._server))
            except BaseException as e:
                fut.set_exception(e)

        try:
            self._loop.call_soon_threadsafe(read)
            self._last = fut.result(timeout=STATE_TIMEOUT)
        except concurrent.futures.TimeoutError:
            log.warning(
                "%s: metrics scrape: the event loop did not answer within %gs; serving the "
                "previous reading of its state",
                self._server.replica_id,
                STATE_TIMEOUT,
            )
        except RuntimeError:  # the loop is closed: the replica stopped
            pass
        return self._last

    def collect(self) -> Iterator[Any]:
        """Every metric of the replica (README.md lists them)."""
        rid = self._server.replica_id
        state = self._read_state()
        if state is not None:
            yield from self._state_families(rid, state)
        c = self._server.driver.counters
        for name, doc, value in (
            ("membership_heartbeats_received", "Heartbeats received.", c.heartbeats),
            ("membership_acks_sent", "Heartbeat acks sent.", c.acks),
            (
                "membership_deaths",
                "Members this replica applied as DEAD (the same on every replica).",
                c.deaths,
            ),
            (
                "membership_driver_turn_failures",
                "Driver loop turns that raised (a bug: logged, detection went on).",
                c.turn_failures,
            ),
        ):
            yield _counter(name, doc, rid, value)
        for buckets, name, doc in (
            (
                c.interarrival,
                "membership_heartbeat_interarrival_seconds",
                "Seconds between two heartbeats of one stream.",
            ),
            (c.fsync, "membership_fsync_duration_seconds", "Seconds per durable write of a Ready."),
            (
                c.loop_lag,
                "membership_event_loop_lag_seconds",
                "Seconds the event loop woke up late (monitor period 0.05 s).",
            ),
            (
                c.delivery,
                "membership_commit_to_subscriber_seconds",
                "Seconds from applying a committed view change to handing it to a subscriber.",
            ),
        ):
            yield buckets.family(name, doc, rid)
        yield from _ingest_families(rid, getattr(self._server, "ingest", None))

    @staticmethod
    def _state_families(rid: str, state: _State) -> Iterator[Any]:
        for name, doc in _GAUGES:
            fam = GaugeMetricFamily(name, doc, labels=["arbiter"])
            fam.add_metric([rid], state.gauges[name])
            yield fam
        fam = GaugeMetricFamily(
            "membership_raft_role",
            "1 for this replica's current Raft role (label role), 0 for the others.",
            labels=["arbiter", "role"],
        )
        for r in RAFT_ROLES:
            fam.add_metric([rid, r], 1.0 if r == state.role else 0.0)
        yield fam
        fam = GaugeMetricFamily(
            "membership_nodes",
            "Members of the applied view by state (DEAD and LEFT are tombstones).",
            labels=["arbiter", "state"],
        )
        for node_state, n in state.nodes.items():
            fam.add_metric([rid, node_state], float(n))
        yield fam
        fam = GaugeMetricFamily(
            "membership_degraded_nodes",
            "ALIVE members this replica marks DEGRADED, by reason (jitter, step_rate, "
            "unhealthy; a node may count under several): status, never a view change.",
            labels=["arbiter", "reason"],
        )
        for reason, n in state.degraded.items():
            fam.add_metric([rid, reason], float(n))
        yield fam
        yield _counter(
            "membership_observations_proposed",
            "Observations (ALIVE or SUSPECT opinions) this replica proposed to the log.",
            rid,
            state.observations_proposed,
        )


def _ingest_families(rid: str, pool: Any) -> Iterator[Any]:
    """The ingest workers' figures (``--ingest-workers``): plain numbers the loop
    updates at each batch, read here (rule 1)."""
    workers = [] if pool is None else pool.statistics()
    fam = GaugeMetricFamily(
        "membership_ingest_workers",
        "Heartbeat-ingest worker processes of this replica (0: heartbeats in its own).",
        labels=["arbiter"],
    )
    fam.add_metric([rid], float(len(workers)))
    yield fam
    if not workers:
        return
    heartbeats = CounterMetricFamily(
        "membership_ingest_worker_heartbeats",
        "Heartbeats answered for each ingest worker slot (label worker).",
        labels=["arbiter", "worker"],
    )
    busy = GaugeMetricFamily(
        "membership_ingest_worker_utilisation",
        "Each ingest worker's loop utilisation (0 to 1), as of its last batch.",
        labels=["arbiter", "worker"],
    )
    for w in workers:
        heartbeats.add_metric([rid, str(w.index)], float(w.heartbeats))
        busy.add_metric([rid, str(w.index)], w.utilisation)
    yield heartbeats
    yield busy


def _counter(name: str, doc: str, rid: str, value: float) -> CounterMetricFamily:
    counter = CounterMetricFamily(name, doc, labels=["arbiter"])
    counter.add_metric([rid], float(value))
    return counter


class MetricsServer:
    """Serves one replica's registry at ``http://HOST:PORT/metrics`` from a daemon thread.

    Created on the replica's running event loop (where its state is read).

    Args:
        server: the replica to describe.
        listen: ``host:port`` to bind; :attr:`port` is the port bound.
    """

    def __init__(self, server: OperatedReplica, listen: str) -> None:
        self.listen = listen
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ReplicaCollector(server, asyncio.get_running_loop()))
        self.port = 0
        self._http: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Binds and starts serving.

        Raises:
            OSError: ``cannot serve metrics on ADDRESS: <reason>``.
        """
        host, port = split_host_port(self.listen)
        try:
            self._http, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise OSError(f"cannot serve metrics on {self.listen}: {e.strerror or e}") from None
        self.port = int(self._http.server_address[1])

    async def stop(self) -> None:
        """Stops serving and releases the port (idempotent).

        The HTTP server notices a shutdown at its next poll (up to 0.5 s):
        waited for in a thread, so the event loop goes on meanwhile.
        """
        http, self._http = self._http, None
        if http is not None:
            await asyncio.to_thread(http.shutdown)
            http.server_close()
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.join, 2.0)


def serve(server: OperatedReplica) -> MetricsServer | None:
    """Starts serving ``server``'s metrics at ``config.metrics_listen``; None when it is "".

    Raises:
        OSError: the address cannot be bound (:meth:`MetricsServer.start`).
    """
    listen = server.config.metrics_listen
    if not listen:
        return None
    metrics = MetricsServer(server, listen)
    metrics.start()
    return metrics


def where(metrics: MetricsServer | None) -> str:
    """``http://HOST:PORT/metrics`` for the replica's start line, or ``off``."""
    if metrics is None:
        return "off (--metrics-listen)"
    host = metrics.listen.rpartition(":")[0]
    return f"http://{host}:{metrics.port}/metrics"
