"""A gloo process group per membership epoch: formed once per assignment, abandoned at the next.

:class:`EpochGroups` turns the rank assignment the arbiters commit for a job
(``client.assignment``: ranks, world size, and its epoch, the fencing token)
into a ``ProcessGroupGloo``, and gives the training loop collectives it can
abandon the moment the assignment moves on. Rules:

1. **One group per epoch, at most once.** A group is formed for an assignment
   whose epoch is above every epoch this worker formed or tried before, while
   the node is a member (``client.is_member``). A formation or a collective
   that fails is never retried at the same epoch: the worker waits for the
   next one, which every other member of the job sees too, at the same epoch,
   with the same ranks.
2. **Fencing by epoch.** The rendezvous of epoch ``E`` happens under the store
   prefix ``<job>/epoch-E``: workers that disagree on the epoch never meet in
   one group, so a slow worker still at ``E`` cannot corrupt the group of
   ``E + 1``; it blocks until it sees ``E + 1`` itself.
3. **The store is hosted by rank 0 of the epoch.** Every worker runs a
   ``TCPStore`` server from its start and announces its address in its static
   label ``store``; the group of epoch ``E`` meets at the store of the node
   that holds rank 0 in ``E``'s assignment, read from the same view as the
   ranks. A member of the assignment was ALIVE when it was committed, and a
   new assignment names a new host when it dies: no launcher, no shared
   filesystem and no fixed port to keep alive.
4. **Abandon, do not wait.** A collective runs asynchronously; the main thread
   waits on one event that its completion, a new assignment (seen by a
   watcher thread on ``client.watch()``) or a session event (fenced, evicted)
   sets. When the assignment moved, the collective is abandoned at once: its
   group goes to a graveyard (gloo in torch 2.13 cannot abort an operation in
   flight: ``abort()`` and ``shutdown()`` return and leave it blocked until
   its own timeout), and its buffers are never used again. A group in the
   graveyard is released (its sockets and threads) once its last operation
   ended, by failing or at gloo's timeout: released earlier, its destructor
   would wait for that operation. A formation runs
   on a helper thread for the same reason (a peer may die while it connects).
5. **A gloo error is a hint, not a verdict.** A collective that fails
   (``Connection closed by peer`` arrives within milliseconds when a local peer
   is SIGKILLed) says *that* something broke, not *who is left*: the worker
   drops the group and waits for the membership's next assignment, at most
   ``regroup_timeout`` seconds (then :class:`RegroupTimeout`).
6. Being fenced alone abandons nothing: a node that lost its leases for a
   moment (a loaded host) and got them back is still in the same assignment,
   and its peers still wait for it in the collective. Fenced, it starts no
   new group and writes no checkpoint; if the cluster declares it DEAD, its
   assignment ends (``client.assignment`` is None) and rule 4 applies.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

from membership import ClosedError, JobRanks, MembershipError
from membership.sync import MembershipClient

__all__ = ["EpochGroups", "RegroupTimeout", "StoreServer"]

Log = Callable[..., None]


class RegroupTimeout(RuntimeError):
    """No new assignment came within ``regroup_timeout`` seconds after the group was lost."""


class StoreServer:
    """This worker's ``TCPStore`` server on a free port of ``host`` (rule 3).

    Args:
        host: the address other workers reach this one at.
        timeout: seconds a store operation may wait.
    """

    def __init__(self, host: str, timeout: float) -> None:
        self.host = host
        self.store = TCPStore(
            host, 0, None, True, timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False
        )

    @property
    def address(self) -> str:
        """``host:port``, the value of the ``store`` label."""
        return f"{self.host}:{self.store.port}"


class EpochGroups:
    """The process group of this worker's current assignment (module rules).

    Args:
        job: the ``job`` label the workers share.
        host: the address gloo listens on for this worker.
        timeout: seconds gloo and the store wait for a peer: the bound on a
            collective that nobody abandons, never how a death is noticed.
        regroup_timeout: seconds to wait for a new assignment after a
            collective failed with no view change (rule 5).
        log: called as ``log(event, **fields)`` for the timeline.
    """

    def __init__(
        self, job: str, host: str, timeout: float, regroup_timeout: float, log: Log
    ) -> None:
        self.job = job
        self.host = host
        self.timeout = datetime.timedelta(seconds=timeout)
        self.regroup_timeout = regroup_timeout
        self.log = log
        self.client: MembershipClient | None = None
        self.wake = threading.Event()  # completion, new assignment, session event
        self.pg: Any = None  # the ProcessGroupGloo of `epoch`, None between groups
        self.epoch = 0  # the epoch of the latest group formed or tried (rule 1)
        self.rank = 0
        self.world_size = 0
        self.formations = 0
        # Abandoned groups, each with the end of its last operation (rule 4).
        self.graveyard: list[tuple[Any, threading.Event | None]] = []
        self.abandoned = 0  # groups dropped so far
        self._last_op: threading.Event | None = None  # set when the group's last op ended
        self._seen = 0  # the latest assignment epoch the watcher saw
        self._watcher: threading.Thread | None = None
        self._watch: Any = None
        self._device = ProcessGroupGloo.create_device(hostname=host)

    # --- the membership side --------------------------------------------------------

    def on_session_event(self, event: object) -> None:
        """``on_event`` of the client: fencing and evictions wake the main thread."""
        self.log("session", what=type(event).__name__, detail=str(event))
        self.wake.set()

    def attach(self, client: MembershipClient) -> None:
        """Starts the watcher thread on ``client`` (its view moves with the watch)."""
        self.client = client
        self._watch = client.watch()
        self._watcher = threading.Thread(target=self._follow, name="epoch-watcher", daemon=True)
        self._watcher.start()

    def _follow(self) -> None:
        assert self.client is not None
        try:
            for _ in self._watch:
                a = self.client.assignment  # the view this watch just moved
                if a is not None and a.epoch != self._seen:
                    self._seen = a.epoch
                    me = self.client.node_id
                    self.log(
                        "epoch_seen",
                        epoch=a.epoch,
                        world_size=a.world_size,
                        rank=a.ranks.get(me or ""),
                        ranks=dict(a.ranks),
                    )
                self.wake.set()
        except (ClosedError, MembershipError) as e:
            self.log("watch_ended", error=str(e))
        finally:
            self.wake.set()

    def close(self) -> None:
        """Stops the watcher thread (before the client closes)."""
        if self._watch is not None:
            self._watch.close()
        if self._watcher is not None:
            self._watcher.join(5)

    def _assignment(self) -> JobRanks | None:
        assert self.client is not None
        a = self.client.assignment
        if a is None or a.job != self.job or self.client.node_id not in a.ranks:
            return None
        return a

    def moved(self) -> bool:
        """True when the current group is no longer this worker's assignment (rules 4, 6)."""
        a = self._assignment()
        return a is None or a.epoch != self.epoch

    # --- forming ------------------------------------------------------------------

    def form(self, min_world: int = 1) -> None:
        """Blocks until this worker is in a group of its latest assignment (rule 1).

        Args:
            min_world: form only when the job has at least this many members.

        Raises:
            RegroupTimeout: no new assignment within ``regroup_timeout`` seconds.
        """
        assert self.client is not None
        self._drop()
        waited_since = time.monotonic()
        while True:
            self.wake.clear()
            a = self._assignment()
            if (
                a is not None
                and a.epoch > self.epoch
                and a.world_size >= min_world
                and self.client.is_member
            ):
                if self._try_form(a):
                    return
                waited_since = time.monotonic()
                continue
            if self.formations and time.monotonic() - waited_since > self.regroup_timeout:
                raise RegroupTimeout(
                    f"no new assignment of job {self.job} within {self.regroup_timeout:g}s "
                    f"after epoch {self.epoch}"
                )
            self.wake.wait(0.5)

    def _try_form(self, a: JobRanks) -> bool:
        """Forms the group of ``a`` on a helper thread; False when ``a`` was overtaken or
        the formation failed (never retried at ``a.epoch``)."""
        assert self.client is not None
        me = self.client.node_id or ""
        self.epoch, self.rank, self.world_size = a.epoch, a.ranks[me], a.world_size
        host0 = next(n for n, r in a.ranks.items() if r == 0)
        member = self.client.view.get(host0)
        store = member.labels.get("store", "") if member is not None else ""
        t0 = time.monotonic()
        self.log("forming", epoch=a.epoch, rank=self.rank, world_size=a.world_size, store=store)
        box: dict[str, Any] = {}
        done = threading.Event()

        def connect() -> None:
            try:
                host, port = store.rsplit(":", 1)
                client = TCPStore(host, int(port), None, False, timeout=self.timeout)
                prefixed = PrefixStore(f"{self.job}/epoch-{a.epoch}", client)
                opts = ProcessGroupGloo._Options()
                opts._devices = [self._device]
                opts._timeout = self.timeout
                box["pg"] = ProcessGroupGloo(prefixed, self.rank, a.world_size, opts)
            except Exception as e:
                box["error"] = e
            finally:
                done.set()
                self.wake.set()

        threading.Thread(target=connect, name=f"form-{a.epoch}", daemon=True).start()
        while True:
            self.wake.clear()
            if done.is_set():
                break
            if self.moved():
                self.log("form_abandoned", epoch=a.epoch)
                return False
            self.wake.wait(1.0)
        if "error" in box:
            self.log("form_failed", epoch=a.epoch, error=str(box["error"])[:300])
            return False
        self.pg = box["pg"]
        self.formations += 1
        self.log(
            "formed",
            epoch=a.epoch,
            rank=self.rank,
            world_size=a.world_size,
            seconds=round(time.monotonic() - t0, 4),
        )
        return True

    def _drop(self) -> None:
        if self.pg is not None:
            self.graveyard.append((self.pg, self._last_op))
            self.abandoned += 1
            self.pg, self._last_op = None, None
        # Rule 4: release those whose last operation ended (the destructor does not wait).
        self.graveyard = [
            (pg, op) for pg, op in self.graveyard if op is not None and not op.is_set()
        ]

    # --- collectives ---------------------------------------------------------------

    def _wait(self, work: Any, what: str) -> bool:
        """True when ``work`` completed; False when it was abandoned or failed (the group
        is dropped then: call :meth:`form`)."""
        finished = threading.Event()  # the future's, not work.is_completed(): they may lag
        self._last_op = finished

        def done(_: object) -> None:
            finished.set()
            self.wake.set()

        work.get_future().add_done_callback(done)
        while True:
            self.wake.clear()
            if finished.is_set():
                try:
                    work.wait()
                    return True
                except RuntimeError as e:
                    self.log("collective_failed", epoch=self.epoch, op=what, error=str(e)[:300])
                    self._drop()
                    return False
            if self.moved():
                self.log("collective_abandoned", epoch=self.epoch, op=what)
                self._drop()
                return False
            self.wake.wait(1.0)

    def allreduce_sum(self, t: torch.Tensor) -> bool:
        """Sums ``t`` over the group, in place; False when abandoned (``t`` is then
        never to be used again: gloo may still write into it)."""
        return self._wait(self.pg.allreduce([t]), "allreduce")

    def sync_state(self, step: int, state: Callable[[], torch.Tensor], numel: int) -> Any:
        """Agrees on the last consistent step after a (re-)formation: every member's step
        is gathered, the lowest rank among those at the highest step sends its state.

        Args:
            step: this worker's step.
            state: returns this worker's state vector (called only on the sender).
            numel: the state vector's length.

        Returns:
            ``(step, state_vector, sender_rank)``, or None when abandoned.
        """
        mine = torch.tensor([step], dtype=torch.int64)
        steps = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        if not self._wait(self.pg.allgather([steps], [mine]), "allgather"):
            return None
        best = max(int(s) for s in steps)
        src = min(r for r, s in enumerate(steps) if int(s) == best)
        vec = state() if self.rank == src else torch.empty(numel, dtype=torch.float32)
        if not self._wait(self.pg.broadcast(vec, src), "broadcast"):
            return None
        return best, vec, src
