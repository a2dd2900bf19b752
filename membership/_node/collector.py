"""Keeps a node's status current without ever making a heartbeat wait for it.

The collector runs the probes (:mod:`membership._node.probes`) in threads of its
own and publishes a :class:`membership.shared.status.NodeStatus` that a heartbeat
reads without waiting. Collecting must never cost a heartbeat: a heartbeat
that waits for a slow probe of the node's own state gets a healthy node
suspected (failure class "heartbeat blocked behind status collection" in
docs/architecture.md; kubernetes/kubernetes#53207).

Rules:

1. :meth:`StatusCollector.snapshot` never blocks and does no I/O: it returns
   the immutable :class:`NodeStatus` that the probe threads and
   :meth:`StatusCollector.report` last published (one attribute read, no lock).
2. Each provider runs in a daemon worker thread of its own; one daemon
   scheduler thread gives every provider a turn each ``probe_interval``
   seconds. A provider still running when its turn comes is skipped: never
   waited for, never started twice. A provider that hangs for ever holds one
   thread and nothing else.
3. A probed value is dropped once it is older than ``stale_after`` seconds
   (counted from when its provider returned it).
4. The application's values win over probed ones (:meth:`NodeStatus.merged_over`),
   and both keep to the bounds of :mod:`membership.shared.status`.

Why threads of our own and not a ``ThreadPoolExecutor``: the executor joins
every worker at interpreter exit (``threading._register_atexit``), so one
provider blocked for ever (a hung NVML driver, a dead NFS mount) would make the
training process hang at exit. Our threads are daemons and are never joined
while their provider runs. One long-lived thread per provider (rather than a
fresh thread per run) also keeps per-thread state such as NVML's in one place.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final

from membership._node.probes import Provider, default_providers, log_once
from membership.shared.errors import ClosedError, InvalidArgument
from membership.shared.status import (
    MAX_GAUGES,
    PROBED_FIELDS,
    NodeStatus,
    finite_number,
    probed_value,
)

__all__ = ["ProbeStatistics", "StatusCollector", "StatusStatistics"]

# The status feature's logger, shared with the probes (see membership._node.probes).
log = logging.getLogger("membership.status")

_REPORTED_FIELDS: Final = (
    "phase",
    "step",
    "progress",
    "gpu_utilization",
    "healthy",
    "health_reason",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeStatistics:
    """One provider's record.

    Attributes:
        name: the provider's name (its ``__name__`` or class name).
        runs: how many times it was started.
        skipped: turns skipped because it was still running.
        failures: runs that raised or returned something that is not a mapping.
        running: whether it is running now.
        age: seconds since its value was returned, ``None`` when none is held.
    """

    name: str
    runs: int
    skipped: int
    failures: int
    running: bool
    age: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusStatistics:
    """What :meth:`StatusCollector.statistics` returns: one record per provider."""

    probes: tuple[ProbeStatistics, ...]


@dataclass(slots=True, eq=False)
class _Probe:
    """One provider, its worker thread and its latest value (guarded by the collector's lock)."""

    provider: Provider
    owned: bool  # created by the collector, so closed by it
    name: str
    go: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    running: bool = False
    values: Mapping[str, Any] | None = None
    at: float = 0.0  # monotonic seconds when ``values`` was returned
    runs: int = 0
    skipped: int = 0
    failures: int = 0


class StatusCollector:
    """Keeps the node's status current without ever making a heartbeat wait for it.

    Thread-safe. See the module docstring for the rules. Use as a context
    manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(
        self,
        providers: Sequence[Provider] | None = None,
        *,
        probe_interval: float = 1.0,
        stale_after: float | None = None,
    ) -> None:
        """Checks the settings; starts nothing (see :meth:`start`).

        Args:
            providers: the probes to run; ``None`` for :func:`default_providers`
                (which the collector then also closes).
            probe_interval: seconds between two turns of each provider.
            stale_after: seconds after which a probed value is dropped when its
                provider has not returned a newer one; default 3 x probe_interval.

        Raises:
            InvalidArgument: when an interval is not a positive finite number, or
                ``stale_after`` < ``probe_interval`` (values would flicker).
        """
        probe_interval = finite_number("probe_interval", probe_interval)
        if probe_interval <= 0:
            raise InvalidArgument(f"probe_interval must be > 0 seconds, got {probe_interval}")
        stale_after = 3 * probe_interval if stale_after is None else stale_after
        stale_after = finite_number("stale_after", stale_after)
        if stale_after < probe_interval:
            raise InvalidArgument(
                f"stale_after ({stale_after} s) must be >= probe_interval ({probe_interval} s)"
            )
        owned = providers is None
        chosen = default_providers() if providers is None else list(providers)
        for p in chosen:
            if not callable(p):
                raise InvalidArgument(f"a provider must be callable, got {p!r}")
        self._probe_interval = probe_interval
        self._stale_after = stale_after
        self._probes = [
            _Probe(p, owned=owned, name=getattr(p, "__name__", None) or type(p).__name__)
            for p in chosen
        ]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._scheduler: threading.Thread | None = None
        self._closed = False
        self._reported = NodeStatus()
        self._published = NodeStatus()  # replaced whole, never mutated: rule 1

    @property
    def probe_interval(self) -> float:
        """Seconds between two turns of each provider."""
        return self._probe_interval

    @property
    def stale_after(self) -> float:
        """Seconds after which a probed value is dropped."""
        return self._stale_after

    def snapshot(self) -> NodeStatus:
        """The current status: reported values over fresh probed ones. Never blocks."""
        return self._published

    def report(
        self,
        *,
        phase: str | None = None,
        step: int | None = None,
        progress: float | None = None,
        gpu_utilization: float | None = None,
        healthy: bool | None = None,
        reason: str | None = None,
        **gauges: float,
    ) -> None:
        """Sets the application's values; ``None`` leaves a field as it is.

        A value reported here wins over a probed one until :meth:`clear` unsets it.
        All or nothing: on error nothing changes.

        Args:
            phase: training phase, 1 to MAX_NAME_CHARS characters of ``[A-Za-z0-9._/-]``.
            step: training step, 0..MAX_STEP.
            progress: fraction of the job done, 0..1.
            gpu_utilization: 0..1, when the application knows better than NVML.
            healthy: the application's own health flag: ``False`` makes the
                arbiters mark the node DEGRADED (never DEAD) until it reports
                ``True`` (or :meth:`clear` unsets it).
            reason: why it is unhealthy (only with ``healthy=False``), at most
                256 printable characters.
            **gauges: free-form numbers by name (names as for ``phase``); at most
                MAX_GAUGES set at a time, counting those set before.

        Raises:
            InvalidArgument: naming the field and the bound it breaks, or a
                ``reason`` without ``healthy=False``.
        """
        if reason is not None and healthy is not False:
            raise InvalidArgument(
                "reason goes with healthy=False: report(healthy=False, reason=...)"
            )
        if healthy is not None and not isinstance(healthy, bool):
            raise InvalidArgument(f"healthy must be True or False, got {healthy!r}")
        for name, value in gauges.items():
            if name in PROBED_FIELDS:
                raise InvalidArgument(
                    f"{name!r} is probed, not reported: report() takes phase, step, "
                    "progress, gpu_utilization and gauges"
                )
            if value is None:
                raise InvalidArgument(f"gauge {name!r} is None: use clear({name!r}) to unset it")
        changes: dict[str, Any] = {
            k: v
            for k, v in (
                ("phase", phase),
                ("step", step),
                ("progress", progress),
                ("gpu_utilization", gpu_utilization),
                ("healthy", healthy),
            )
            if v is not None
        }
        if healthy is not None:  # a new verdict replaces the old reason
            changes["health_reason"] = reason or None
        with self._lock:
            current = self._reported
            merged = {**current.gauges, **gauges}
            if len(merged) > MAX_GAUGES:
                raise InvalidArgument(
                    f"this report would make {len(merged)} gauges ({len(current.gauges)} already "
                    f"set), the limit is MAX_GAUGES = {MAX_GAUGES}: clear() some first"
                )
            self._reported = dataclasses.replace(current, **changes, gauges=merged)
            self._publish_locked(time.monotonic())

    def clear(self, *names: str) -> None:
        """Unsets reported values: ``phase``, ``step``, ``progress``,
        ``gpu_utilization``, ``healthy`` (and its reason) or gauge names; with
        no names, all of them. Names that are not set are ignored."""
        with self._lock:
            current = self._reported
            if names:
                unset: dict[str, Any] = {n: None for n in names if n in _REPORTED_FIELDS}
                if "healthy" in unset:
                    unset["health_reason"] = None
                gauges = {k: v for k, v in current.gauges.items() if k not in names}
                self._reported = dataclasses.replace(current, **unset, gauges=gauges)
            else:
                self._reported = NodeStatus()
            self._publish_locked(time.monotonic())

    def statistics(self) -> StatusStatistics:
        """Runs, skipped turns and failures of every provider."""
        with self._lock:
            now = time.monotonic()
            return StatusStatistics(
                probes=tuple(
                    ProbeStatistics(
                        name=p.name,
                        runs=p.runs,
                        skipped=p.skipped,
                        failures=p.failures,
                        running=p.running,
                        age=None if p.values is None else now - p.at,
                    )
                    for p in self._probes
                )
            )

    def start(self) -> None:
        """Starts probing in daemon threads; a second call does nothing.

        Raises:
            ClosedError: after :meth:`close`.
        """
        with self._lock:
            if self._closed:
                raise ClosedError("the status collector is closed")
            if self._scheduler is not None:
                return
            for probe in self._probes:
                probe.thread = threading.Thread(
                    target=self._work,
                    args=(probe,),
                    name=f"membership-status-{probe.name}",
                    daemon=True,
                )
                probe.thread.start()
            self._scheduler = threading.Thread(
                target=self._schedule, name="membership-status", daemon=True
            )
            self._scheduler.start()

    def close(self) -> None:
        """Stops probing; idempotent, and returns promptly even when a provider hangs.

        Idle workers end (and close the providers the collector created) before
        this returns; a worker whose provider is still running is left behind as
        a daemon thread and ends, closing its provider, when the provider returns.
        Afterwards :meth:`snapshot` holds the reported values only, and
        :meth:`report` still works.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            for probe in self._probes:
                probe.go.set()
                probe.values = None  # nothing would expire them any more
            self._publish_locked(time.monotonic())
            scheduler = self._scheduler
            busy = {id(p) for p in self._probes if p.running}
        if scheduler is None:  # never started: nothing runs, close what we own here
            for probe in self._probes:
                self._close_provider(probe)
            return
        # The scheduler only waits on self._stop, so it ends at once.
        scheduler.join(timeout=self._probe_interval + 1.0)
        for probe in self._probes:
            if id(probe) not in busy and probe.thread is not None:
                probe.thread.join(timeout=1.0)

    def __enter__(self) -> StatusCollector:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- threads ---------------------------------------------------------------

    def _schedule(self) -> None:
        next_turn = time.monotonic()
        while True:
            with self._lock:
                if self._stop.is_set():  # set under the lock by close()
                    return
                now = time.monotonic()
                if now >= next_turn:
                    for probe in self._probes:
                        if probe.running:
                            probe.skipped += 1  # rule 2: not waited for, not started twice
                        else:
                            probe.running = True
                            probe.runs += 1
                            probe.go.set()
                    next_turn += self._probe_interval
                    if next_turn <= now:  # we were not scheduled for a while: skip missed turns
                        next_turn = now + self._probe_interval
                self._publish_locked(now)
                # Also wake when a held value goes stale, so it is dropped on time
                # (rule 3); after publishing, every held value expires after now.
                expiries = [p.at + self._stale_after for p in self._probes if p.values is not None]
            wake = min([next_turn, *expiries])
            self._stop.wait(max(wake - time.monotonic(), 0.0))

    def _work(self, probe: _Probe) -> None:
        try:
            while True:
                probe.go.wait()
                probe.go.clear()
                if self._stop.is_set():
                    return
                values = self._run(probe)
                with self._lock:
                    probe.running = False
                    if self._stop.is_set():
                        return
                    if values is not None:
                        probe.values = values
                        probe.at = time.monotonic()
                        self._publish_locked(probe.at)
                    else:
                        probe.failures += 1
        finally:
            with self._lock:
                probe.running = False
            self._close_provider(probe)

    def _run(self, probe: _Probe) -> Mapping[str, Any] | None:
        try:
            raw = probe.provider()
        except Exception:
            log_once(
                f"raise-{id(self)}-{probe.name}",
                logging.WARNING,
                "status provider %s failed (reported once)",
                probe.name,
                exc_info=True,
            )
            return None
        if not isinstance(raw, Mapping):
            log_once(
                f"type-{id(self)}-{probe.name}",
                logging.WARNING,
                "status provider %s returned %r, not a mapping",
                probe.name,
                type(raw),
            )
            return None
        values: dict[str, Any] = {}
        for key, value in raw.items():
            try:
                values[key] = probed_value(key, value)
            except InvalidArgument as e:
                log_once(
                    f"value-{id(self)}-{probe.name}-{key}",
                    logging.WARNING,
                    "status provider %s: value dropped: %s",
                    probe.name,
                    e,
                )
        return values

    def _close_provider(self, probe: _Probe) -> None:
        close = getattr(probe.provider, "close", None)
        if probe.owned and callable(close):
            try:
                close()
            except Exception:
                log.debug("closing status provider %s failed", probe.name, exc_info=True)

    def _publish_locked(self, now: float) -> None:
        probed: dict[str, Any] = {}
        for probe in self._probes:
            if probe.values is not None:
                if probe.at + self._stale_after <= now:
                    probe.values = None  # rule 3
                else:
                    probed.update(probe.values)
        self._published = self._reported.merged_over(NodeStatus(**probed))
