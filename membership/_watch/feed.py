"""Sans-I/O core of a subscriber: which events to pass on, when to resubscribe, when it is blind.

:class:`membership._watch.subscription.Watcher` drives it: it opens subscriptions to
the arbiters, feeds in what they send and how they fail, with the time as an
argument, and yields what this core returns. Nothing here reads a clock,
opens a socket or sleeps (the model is ``session.py`` and h11).

Rules:

1. Order. View changes are passed on in epoch order, each once. A change at
   or below the last epoch held is a duplicate (the overlap of a resumed
   subscription) and is dropped; one beyond ``last + 1`` is a gap: the
   subscription is reopened on the same arbiter from the last epoch held
   (it replays from its history, or sends a snapshot). Never a silent gap.
2. Snapshots replace the view held. A snapshot older than the view held
   comes from a replica that lags: it is not taken, and the subscription
   moves to another arbiter.
3. Contact. The watcher is in contact while it hears from an arbiter that is
   in a quorum (any message: change, snapshot, progress marker, quorum
   status). After ``disconnect_after`` seconds without that,
   :class:`~membership.shared.view.Disconnected` is reported, once; the next
   message from an arbiter in a quorum reports
   :class:`~membership.shared.view.Reconnected`. A watcher can so tell "no
   changes" (progress markers keep coming) from "lost contact".
4. Idle. A subscription that brings nothing, not even the progress marker an
   idle replica sends every progress interval, for ``idle_timeout`` seconds
   is abandoned and opened elsewhere (a frozen replica or a half-open
   connection sends no error). The timeout is at least 2.5 progress
   intervals as the replica announces them, so a slow but live replica is
   kept.
5. Quorum. Quorum transitions of the serving arbiter are passed on as
   :class:`~membership.shared.view.QuorumChanged` (a first status only when it
   says "no quorum"). While the serving arbiter has no quorum, the watcher
   asks for one that has every ``probe_interval`` seconds, and moves there.
6. Future epochs. An arbiter in a quorum that refuses the resume point with
   OUT_OF_RANGE (the epoch is beyond the cluster's: it was reset, or the
   epoch is another cluster's) is believed once two arbiters said so, or one
   said so three times (a lagging follower is not enough to give up on a
   real epoch). Then :class:`~membership.shared.errors.EpochOutOfRange` is raised,
   or, with ``reset_if_ahead``, :class:`~membership.shared.view.ViewReset` is
   passed on and the watcher starts again from a fresh snapshot. An epoch
   the watcher knows the cluster committed (it was served that epoch, or an
   arbiter of this instance reported its own view at it or later) is never
   beyond the cluster's: a refusal of it comes from a replica that has not
   applied it yet (its leader is ahead, or it is loaded), so it is not
   counted, and the subscription moves to another arbiter.
7. Instances. Every subscription names the cluster's instance id (drawn by
   its first leader; a cluster started again on fresh data dirs has
   another). The watcher keeps the first it was served from (or the one it
   was given with its epoch); a subscription of another instance means the
   cluster was reset: its epochs are another history, so it is handled as a
   confirmed future epoch (rule 6), at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from membership.shared.errors import EpochOutOfRange
from membership.shared.view import (
    Disconnected,
    ProgressMarker,
    QuorumChanged,
    Reconnected,
    StatusUpdated,
    View,
    ViewChanged,
    ViewEvent,
    ViewReset,
    ViewSnapshot,
)

__all__ = ["FeedState", "Resubscribe"]

# Rule 4: an idle stream is kept for at least this many announced progress intervals.
_IDLE_INTERVALS = 2.5
# Rule 6: how many OUT_OF_RANGE answers make the watcher give up on its epoch.
_OUT_OF_RANGE_ARBITERS = 2
_OUT_OF_RANGE_ANSWERS = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class Resubscribe:
    """A decision to leave the current subscription and open another.

    Attributes:
        reason: why, in words (for logs and the Disconnected event).
        since_epoch: the epoch to resume after (0: a snapshot first).
        prefer: the arbiter address to try first (None: the usual order).
        avoid: an arbiter address to try last (None: none).
    """

    reason: str
    since_epoch: int
    prefer: str | None = None
    avoid: str | None = None


Incoming = ViewEvent | ProgressMarker


class FeedState:
    """One subscriber's position in the view stream (see the module rules).

    Args:
        since_epoch: the last epoch the caller holds (0: start with a snapshot).
        include_status: pass StatusUpdated events on.
        idle_timeout: seconds without any message after which a subscription
            is abandoned (rule 4; raised to 2.5 announced progress intervals).
        disconnect_after: seconds without contact before Disconnected (rule 3).
        probe_interval: seconds between searches for an arbiter in a quorum
            while the serving one has none (rule 5).
        reset_if_ahead: on a confirmed future epoch, start again from a
            snapshot instead of raising (rule 6).
        arbiters: how many arbiters the watcher was given.
        instance: the cluster instance ``since_epoch`` belongs to ("" unknown).
        now: monotonic seconds at the start.

    Raises:
        ValueError: for a negative epoch or a timeout <= 0.
    """

    def __init__(
        self,
        *,
        since_epoch: int,
        include_status: bool,
        idle_timeout: float,
        disconnect_after: float,
        probe_interval: float,
        reset_if_ahead: bool = False,
        arbiters: int = 1,
        instance: str = "",
        now: float,
    ) -> None:
        if since_epoch < 0:
            raise ValueError(f"since_epoch must be >= 0, got {since_epoch}")
        if min(idle_timeout, disconnect_after, probe_interval) <= 0:
            raise ValueError("timeouts must be > 0")
        self.last_epoch = since_epoch
        self.instance = instance if since_epoch > 0 else ""
        self.view = View()
        self._status = include_status
        self._idle_timeout = idle_timeout
        self._disconnect_after = disconnect_after
        self._probe_interval = probe_interval
        self._reset_if_ahead = reset_if_ahead
        self._arbiters = arbiters
        # The serving subscription: its address, arbiter id, last message time.
        self.serving: str | None = None
        self._serving_id = ""
        self._last_message = now
        self._announced_interval = 0.0
        self._serving_in_quorum: bool | None = None
        self._reported_quorum: bool | None = None
        self._probe_at: float | None = None
        # Rule 3.
        self._last_contact = now
        self._disconnected = False
        self._last_failure = ""
        # Rule 6: addresses that said OUT_OF_RANGE, and how many times in all.
        self._out_of_range: set[str] = set()
        self._out_of_range_answers = 0
        # The highest epoch of this instance known committed: served to this
        # watcher, or an arbiter's own applied epoch as it reported it (rule 6).
        self._cluster_epoch = 0
        self._pending: Resubscribe | None = Resubscribe(reason="start", since_epoch=since_epoch)

    # --- inputs ---------------------------------------------------------------------

    def opened(
        self, address: str, arbiter_id: str, now: float, instance: str = "", epoch: int = 0
    ) -> list[ViewEvent]:
        """A subscription to ``address`` is serving now (the first answer the shell took),
        from the cluster instance ``instance`` ("" when the cluster has none yet), whose
        epoch is ``epoch`` (from its first message).

        Returns:
            ``[ViewReset]`` when that is another instance than the watcher's
            (rule 7) and ``reset_if_ahead`` is on.

        Raises:
            EpochOutOfRange: another instance, and ``reset_if_ahead`` is off.
        """
        if instance and self.instance and instance != self.instance:
            self._cluster_epoch = epoch
            return self._reset(
                f"the cluster was reset: the watcher's epochs are of instance {self.instance}, "
                f"{arbiter_id or address} serves instance {instance}"
            )
        if instance:
            self.instance = instance
        self.serving = address
        self._serving_id = arbiter_id
        self._last_message = now
        self._serving_in_quorum = None
        self._probe_at = None
        self._announced_interval = 0.0
        return []

    def on_event(self, address: str, event: Incoming, now: float) -> list[ViewEvent]:
        """Takes one message from the serving subscription; returns what to pass on.

        Messages from another address (a subscription being replaced) are ignored.
        """
        if address != self.serving:
            return []
        self._last_message = now
        out: list[ViewEvent] = []
        if isinstance(event, QuorumChanged):
            self._cluster_epoch = max(self._cluster_epoch, event.epoch)
            out += self._quorum(event, now)
        elif isinstance(event, ProgressMarker):
            self._announced_interval = max(0.0, event.interval)
            self._cluster_epoch = max(self._cluster_epoch, event.epoch)
            if not event.in_quorum and self._serving_in_quorum:
                # A replica that lost its quorum says so first (a QuorumChanged);
                # a marker saying otherwise means the quorum status was missed.
                out += self._quorum(
                    QuorumChanged(in_quorum=False, arbiter_id=event.arbiter_id), now
                )
        if self._serving_in_quorum:
            out += self._contact(now)
        if isinstance(event, ViewSnapshot):
            out += self._snapshot(event)
        elif isinstance(event, ViewChanged):
            out += self._change(event)
        elif isinstance(event, StatusUpdated) and self._status:
            out.append(event)
        if self._out_of_range and isinstance(event, ViewSnapshot | ViewChanged):
            self._out_of_range.clear()  # the resume point was real after all
            self._out_of_range_answers = 0
        return out

    def on_failure(self, address: str, reason: str, now: float) -> None:
        """A subscription (serving or being opened) to ``address`` failed or ended."""
        self._last_failure = f"{address}: {reason}"
        if address == self.serving:
            self.serving = None
            self._serving_in_quorum = None
            self._pending = self._pending or Resubscribe(
                reason=reason, since_epoch=self.last_epoch, avoid=address
            )

    def on_out_of_range(self, address: str, now: float) -> list[ViewEvent]:
        """``address`` refused the resume point as beyond the cluster's epoch (rule 6).

        Returns:
            ``[ViewReset]`` when the watcher starts again from a snapshot.

        Raises:
            EpochOutOfRange: when the refusal is confirmed and ``reset_if_ahead`` is off.
        """
        if self.last_epoch <= self._cluster_epoch:
            # Committed, as this watcher knows: the arbiter lags (rule 6); ask another.
            reason = (
                f"{address} has not applied epoch {self.last_epoch} yet (the cluster is at "
                f"{self._cluster_epoch} or later); asking another arbiter"
            )
            self.on_failure(address, reason, now)
            self._pending = Resubscribe(reason=reason, since_epoch=self.last_epoch, avoid=address)
            return []
        self._out_of_range.add(address)
        self._out_of_range_answers += 1
        self.on_failure(address, f"epoch {self.last_epoch} is beyond the cluster's", now)
        confirmed = (
            len(self._out_of_range) >= min(_OUT_OF_RANGE_ARBITERS, self._arbiters)
            or self._out_of_range_answers >= _OUT_OF_RANGE_ANSWERS
        )
        if not confirmed:
            self._pending = Resubscribe(
                reason=f"{address} says epoch {self.last_epoch} is beyond the cluster's; "
                "asking another arbiter",
                since_epoch=self.last_epoch,
                avoid=address,
            )
            return []
        return self._reset(
            f"since_epoch {self.last_epoch} is beyond the cluster's epoch "
            f"{self._cluster_epoch} (was the cluster reset, or is the epoch another "
            "cluster's?)"
        )

    def _reset(self, why: str) -> list[ViewEvent]:
        """Rules 6 and 7: the epochs held are not this cluster's; raise, or start afresh."""
        since, cluster = self.last_epoch, self._cluster_epoch
        self._out_of_range.clear()
        self._out_of_range_answers = 0
        if not self._reset_if_ahead:
            raise EpochOutOfRange(
                f"{why}; resume from 0 for a fresh snapshot",
                since_epoch=since,
                cluster_epoch=cluster,
            )
        self.last_epoch = 0
        self.instance = ""
        self.view = View()
        self.serving = None
        self._pending = Resubscribe(reason="reset to a fresh snapshot", since_epoch=0)
        return [ViewReset(since_epoch=since, cluster_epoch=cluster)]

    def quorum_found(self, address: str) -> None:
        """A probe found ``address`` in a quorum while the serving arbiter has none (rule 5)."""
        if self._serving_in_quorum is False and address != self.serving:
            self._pending = Resubscribe(
                reason=f"failing over to {address}, which is in a quorum",
                since_epoch=self.last_epoch,
                prefer=address,
            )

    def tick(self, now: float) -> list[ViewEvent]:
        """Lets time pass: reports a loss of contact (rule 3), abandons an idle stream (rule 4)."""
        out: list[ViewEvent] = []
        silence = now - self._last_contact
        if not self._disconnected and silence >= self._disconnect_after:
            self._disconnected = True
            reason = self._last_failure or (
                f"no message from {self._serving_id or self.serving} for {silence:.1f}s"
                if self.serving
                else "no arbiter answered"
            )
            out.append(
                Disconnected(
                    epoch=self.last_epoch,
                    silence=round(silence, 3),
                    arbiter_id=self._serving_id,
                    reason=reason,
                )
            )
        if self.serving is not None and self._pending is None:
            idle = now - self._last_message
            if idle >= self.idle_timeout:
                self._last_failure = f"{self.serving}: nothing for {idle:.1f}s"
                self._pending = Resubscribe(
                    reason=f"{self._serving_id or self.serving} sent nothing for {idle:.1f}s",
                    since_epoch=self.last_epoch,
                    avoid=self.serving,
                )
        return out

    # --- outputs --------------------------------------------------------------------

    @property
    def idle_timeout(self) -> float:
        """Seconds of silence after which the serving subscription is abandoned (rule 4)."""
        return max(self._idle_timeout, _IDLE_INTERVALS * self._announced_interval)

    @property
    def disconnected(self) -> bool:
        """True between a Disconnected and the next Reconnected."""
        return self._disconnected

    @property
    def pending(self) -> Resubscribe | None:
        """The pending decision to open a new subscription, if any (not cleared)."""
        return self._pending

    def take_resubscribe(self) -> Resubscribe | None:
        """The pending decision to open a new subscription (then cleared), or None."""
        pending, self._pending = self._pending, None
        if pending is not None and pending.since_epoch != self.last_epoch:
            pending = Resubscribe(
                reason=pending.reason,
                since_epoch=self.last_epoch,
                prefer=pending.prefer,
                avoid=pending.avoid,
            )
        return pending

    def wants_probe(self, now: float) -> bool:
        """True when a search for an arbiter in a quorum is due (rule 5); counts it as started."""
        if self._serving_in_quorum is not False or self._probe_at is None or now < self._probe_at:
            return False
        self._probe_at = now + self._probe_interval
        return True

    def next_deadline(self) -> float:
        """The earliest monotonic time at which :meth:`tick` or :meth:`wants_probe` has work."""
        times = [self._last_message + self.idle_timeout] if self.serving is not None else []
        if not self._disconnected:
            times.append(self._last_contact + self._disconnect_after)
        if self._serving_in_quorum is False and self._probe_at is not None:
            times.append(self._probe_at)
        return min(times, default=float("inf"))

    # --- rules ----------------------------------------------------------------------

    def _contact(self, now: float) -> list[ViewEvent]:
        silence = now - self._last_contact
        self._last_contact = now
        self._last_failure = ""
        if not self._disconnected:
            return []
        self._disconnected = False
        return [
            Reconnected(
                epoch=self.last_epoch, arbiter_id=self._serving_id, silence=round(silence, 3)
            )
        ]

    def _quorum(self, event: QuorumChanged, now: float) -> list[ViewEvent]:
        self._serving_in_quorum = event.in_quorum
        out: list[ViewEvent] = []
        if event.in_quorum != self._reported_quorum and (
            self._reported_quorum is not None or not event.in_quorum
        ):
            out.append(event)
        self._reported_quorum = event.in_quorum
        self._probe_at = None if event.in_quorum else now
        return out

    def _snapshot(self, event: ViewSnapshot) -> list[ViewEvent]:
        if event.view.epoch < self.last_epoch:
            self._pending = Resubscribe(
                reason=f"snapshot at epoch {event.view.epoch} is behind the view held "
                f"({self.last_epoch}): that replica lags",
                since_epoch=self.last_epoch,
                avoid=self.serving,
            )
            return []
        self.last_epoch = event.view.epoch
        self._cluster_epoch = max(self._cluster_epoch, self.last_epoch)
        self.view = event.view
        return [event]

    def _change(self, event: ViewChanged) -> list[ViewEvent]:
        if event.epoch <= self.last_epoch:
            return []  # rule 1: already passed on (resume overlap)
        if event.epoch != self.last_epoch + 1:
            self._pending = Resubscribe(
                reason=f"gap: epoch {event.epoch} after {self.last_epoch}",
                since_epoch=self.last_epoch,
                prefer=self.serving,
            )
            return []
        self.last_epoch = event.epoch
        self._cluster_epoch = max(self._cluster_epoch, self.last_epoch)
        self.view = self.view.with_changes(event.epoch, event.changes, event.ranks)
        return [event]
