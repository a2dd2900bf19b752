"""The consensus process's side of ``--ingest-workers K``: spawn, answer, supervise.

Rules:

1. Port: the replica checks ``--listen`` is free (a plain bind, without
   SO_REUSEPORT) before anything else, then serves its own gRPC server on a
   unix socket in a fresh 0700 directory only (:meth:`IngestPool.bind`):
   ``SOCKET_DIR`` in its data dir (which its flock makes its own: one left
   by a replica killed with SIGKILL is removed at the next start, and goes
   with the data dir), or a new temporary directory without one. The socket
   is named through the directory's descriptor, ``/proc/self/fd/N/...``
   (inherited by the workers at the same number), so a data dir of any
   length fits a unix address (108 bytes); the 0700 directory still keeps
   every other user out;
   the K workers bind ``--listen`` together. So Raft, the tally and every
   proxied call run here, and heartbeat streams run in the workers.
2. Start: the workers are spawned (``python -m arbiter.server.ingest``, a
   socketpair's end passed with ``pass_fds``) and the replica starts only
   once every one of them serves the port (HELLO); a worker that cannot
   bind it fails the start with OSError.
3. Verdicts: each BATCH is answered at once, in order, with one
   ``Driver.on_heartbeat`` per heartbeat (the observer, detectors, leases
   and sequence numbers stay where they are without workers), the
   ``max_nodes`` check and shedding (:func:`arbiter.server.api.shedding.check_shedding`,
   with that worker's time on a CPU) for a stream's first heartbeat, the status
   board updated with the statuses that came along, and the replica's
   status for the acks (the arbiter set only when the worker does not have
   its index yet). The batch's counts add up in the driver's counters, and
   its streams open in the servicer's ``heartbeat_streams`` (the metric),
   its inter-arrival histogram in the driver's.
   Its load is the worker's latest: the driver's load monitor reads the
   maximum over the workers serving (:meth:`IngestPool.utilisation`,
   :meth:`IngestPool.cpu`; monitor.py rule 1), so the suggested interval follows
   the load of the processes that carry the heartbeats.
4. Local health: :class:`arbiter.server.ingest.lateness.Horizon` is the
   driver's lateness source; a worker overdue by more than
   ``WEDGED_AFTER`` seconds is killed (and restarted by rule 5). Until
   then this replica suspects nobody (the others still decide, by quorum);
   long enough that a machine so loaded a worker waits seconds for a CPU
   does not get its workers killed, short enough that a stopped worker
   does not keep this replica's detectors still for long.
5. Supervision: a worker that dies (its channel closes) while the replica
   runs is logged at WARNING and restarted, after a backoff that doubles
   from 0.1 s up to 2 s while restarts keep failing fast; its nodes reconnect
   to the port (another worker, or the new one) and their leases cover the
   gap.
6. Stop: STOP to every worker (their streams end with UNAVAILABLE, their
   servers stop within the shutdown grace), then each is waited for and
   killed if still there 2 s later; the socket directory is removed.
   ``reload_tls`` passes SIGHUP's reload on to every worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc

from arbiter.core.labelsets import LabelSets
from arbiter.server.api import limits
from arbiter.server.api.shedding import Shed, check_shedding
from arbiter.server.consensus.arbiterset import to_protos
from arbiter.server.ingest import frames
from arbiter.server.ingest.lateness import Horizon
from membership.shared.convert import state_to_pb
from membership.shared.view import MemberState
from membership.v1 import membership_pb2 as pb

__all__ = ["SOCKET_DIR", "WEDGED_AFTER", "IngestPool", "WorkerStatistics"]

log = logging.getLogger("arbiter.ingest")

SOCKET_DIR = "ingest"  # in the data dir: the consensus process's unix socket (rule 1)
_SUN_PATH = 108  # bytes of a unix socket's path at most, its NUL included (Linux)
WEDGED_AFTER = 5.0  # seconds a worker may go without a batch before it is killed (rule 4)
_START_TIMEOUT = 30.0  # seconds for a worker to serve the port (its imports, on a busy machine)
_PRUNE_EVERY = 10.0  # seconds between two prunes of the status board (statusboard.py rule 2)
_STATE = {state: state_to_pb(state) for state in MemberState}


@dataclass(slots=True)
class WorkerStatistics:
    """One worker slot's figures, for tests and logs.

    Attributes:
        index: the slot (0..K-1).
        pid: the running worker's pid (0 while none runs).
        starts: workers started in this slot.
        streams: heartbeat streams open in it, as of its last batch.
        heartbeats: heartbeats it answered through this process.
        batches: batches it sent.
        utilisation: its loop's utilisation (0 to 1), as of its last batch.
        cpu: the same on a CPU only (shedding's).
    """

    index: int
    pid: int = 0
    starts: int = 0
    streams: int = 0
    heartbeats: int = 0
    batches: int = 0
    utilisation: float = 0.0
    cpu: float = 0.0


@dataclass(slots=True)
class _Slot:
    stats: WorkerStatistics
    proc: asyncio.subprocess.Process | None = None
    writer: asyncio.StreamWriter | None = None
    config_sent: int = -1
    labels: dict[int, Mapping[str, str]] = field(default_factory=dict)
    ready: asyncio.Future[None] | None = None
    task: asyncio.Task[None] | None = None


class IngestPool:
    """K ingest workers of one replica (module rules).

    Args:
        server: the :class:`arbiter.server.app.ArbiterServer` being started
            (its driver, API servicer, configuration, TLS files and identity).
        workers: K >= 1.
    """

    def __init__(self, server: Any, workers: int) -> None:
        self._server = server
        self.workers = workers
        self.horizon = Horizon()
        self.socket_dir = ""
        self._dir_fd = -1  # the socket directory's descriptor (rule 1)
        self._slots = [_Slot(WorkerStatistics(i)) for i in range(workers)]
        self._labelsets = LabelSets()  # one copy of each label set for every stream
        self._stopping = False
        self._watchdog: asyncio.Task[None] | None = None
        self._pruned_at = time.monotonic()

    def statistics(self) -> list[WorkerStatistics]:
        """Every slot's figures now."""
        return [slot.stats for slot in self._slots]

    def utilisation(self, now: float = 0.0) -> float:
        """The highest loop utilisation of the workers serving, 0 to 1 (rule 3: the
        driver's load source)."""
        return max((slot.stats.utilisation for slot in self._slots), default=0.0)

    def cpu(self, now: float = 0.0) -> float:
        """The highest time on a CPU of the workers serving, 0 to 1 (rule 3)."""
        return max((slot.stats.cpu for slot in self._slots), default=0.0)

    # --- start ----------------------------------------------------------------------

    def bind(self, grpc_server: grpc.aio.Server) -> None:
        """Rule 1: the replica's own server on a unix socket in a new 0700 directory."""
        self.socket_dir = self._socket_dir()
        self._dir_fd = os.open(self.socket_dir, os.O_RDONLY | os.O_DIRECTORY)
        path = self._socket_path()
        if grpc_server.add_insecure_port(f"unix:{path}") == 0:
            raise OSError(f"cannot listen on unix:{path}")

    def _socket_dir(self) -> str:
        """Rule 1: SOCKET_DIR in the data dir, emptied, mode 0700; else a temporary one."""
        data_dir = getattr(self._server, "data_dir", None)
        if data_dir is None:
            return tempfile.mkdtemp(prefix="arbiter-ingest-")  # mode 0700
        path = os.path.abspath(os.path.join(data_dir, SOCKET_DIR))
        shutil.rmtree(path, ignore_errors=True)  # a killed replica's
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # whatever the umask
        return path

    def _socket_path(self) -> str:
        """Rule 1: the socket through the directory's descriptor when /proc has it
        (any length of data dir), else its own path."""
        via_fd = f"/proc/self/fd/{self._dir_fd}/consensus.sock"
        if os.path.isdir(f"/proc/self/fd/{self._dir_fd}"):
            return via_fd
        path = os.path.join(self.socket_dir, "consensus.sock")
        if len(path.encode()) >= _SUN_PATH:
            raise OSError(f"the ingest socket's path is too long for a unix address: {path}")
        return path

    async def start(self) -> None:
        """Rule 2: spawns every worker and waits until each serves the port.

        Raises:
            OSError: a worker could not bind the port, or did not start in time.
        """
        self._server.driver.add_lateness_source(self.horizon.lateness)
        # lateness rule 1a: for detection only, not shedding's backlog
        self._server.driver.add_lateness_source(self.horizon.hearing, backlog=False)
        self._server.driver.load.add_source(self.utilisation, self.cpu)
        try:
            await asyncio.gather(*(self._spawn(slot) for slot in self._slots))
        except BaseException:
            await self.stop()
            raise
        self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    def _settings(self, index: int) -> dict[str, Any]:
        s = self._server
        root = logging.getLogger()
        formats = {type(h.formatter).__name__ for h in root.handlers}
        tls = s.tls
        return {
            "index": index,
            "workers": self.workers,
            "config": asdict(s.config),
            "replica_id": s.replica_id,
            "identity": s.identity,
            "listen": s.listen,
            "socket": self._socket_path(),
            "tls": None
            if tls is None
            else (str(tls.files.ca), str(tls.files.cert), str(tls.files.key)),
            "log_level": logging.getLevelName(root.getEffectiveLevel()).lower(),
            "log_format": "json" if "JsonFormatter" in formats else "text",
        }

    async def _spawn(self, slot: _Slot) -> None:
        ours, theirs = socket.socketpair()
        index = slot.stats.index
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "arbiter.server.ingest",
                "--fd",
                str(theirs.fileno()),
                pass_fds=(theirs.fileno(), self._dir_fd),  # rule 1: the same number there
                stdin=asyncio.subprocess.DEVNULL,
                # No preexec_fn: it forces a full fork of this process, whose
                # loop waits for the exec (0.3 s measured under load); without
                # one the child is spawned with vfork. The worker ties itself
                # to this process first thing (worker.py rule 5).
            )
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        slot.proc, slot.writer, slot.config_sent, slot.labels = proc, writer, -1, {}
        slot.stats.pid = proc.pid
        slot.stats.starts += 1
        writer.write(frames.encode(frames.SETUP, self._settings(index)))
        slot.ready = asyncio.get_running_loop().create_future()
        slot.task = asyncio.get_running_loop().create_task(
            self._serve(slot, reader, writer), name=f"ingest-worker-{index}"
        )
        try:
            async with asyncio.timeout(_START_TIMEOUT):
                await asyncio.shield(slot.ready)
        except TimeoutError:
            raise OSError(
                f"ingest worker {index} (pid {proc.pid}) did not serve {self._server.listen} "
                f"within {_START_TIMEOUT:g}s"
            ) from None

    # --- serving --------------------------------------------------------------------

    async def _serve(
        self, slot: _Slot, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Reads one worker's frames until its channel closes; then rule 5."""
        index = slot.stats.index
        why = "its channel closed"
        try:
            while True:
                msg = await frames.read_frame(reader)
                kind = msg[0]
                if kind == frames.BATCH:
                    self._answer(slot, msg)
                elif kind == frames.HELLO:
                    self.horizon.joined(index, msg[3])
                    log.info(
                        "ingest worker %d (pid %d) serves %s", index, msg[2], self._server.listen
                    )
                    if slot.ready is not None and not slot.ready.done():
                        slot.ready.set_result(None)
                elif kind == frames.FAILED:
                    why = msg[1]
                    if slot.ready is not None and not slot.ready.done():
                        slot.ready.set_exception(OSError(msg[1]))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except frames.FrameError as e:
            why = f"it sent a bad frame ({e})"
            log.error("ingest worker %d: %s", index, why)
        except Exception:
            why = "answering it failed"
            log.exception("ingest worker %d: answering its batch failed", index)
        finally:
            self.horizon.left(index)
            writer.close()
        proc = slot.proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            code = await proc.wait()
        else:
            code = None
        self._server.api.heartbeat_streams -= slot.stats.streams
        slot.proc, slot.writer, slot.stats.pid, slot.stats.streams = None, None, 0, 0
        slot.stats.utilisation = slot.stats.cpu = 0.0
        if slot.ready is not None and not slot.ready.done():
            slot.ready.set_exception(OSError(f"ingest worker {index} exited ({why}, code {code})"))
            return
        if self._stopping:
            return
        log.warning(
            "ingest worker %d (pid %s) died (%s, exit code %s): restarting it; its nodes reconnect",
            index,
            None if proc is None else proc.pid,
            why,
            code,
        )
        delay = 0.1
        while not self._stopping:
            started = time.monotonic()
            try:
                await self._spawn(slot)
                return
            except OSError as e:
                log.warning(
                    "ingest worker %d: restart failed (%s); again in %.1fs", index, e, delay
                )
            if time.monotonic() - started < 1.0:
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)

    def _answer(self, slot: _Slot, msg: tuple[Any, ...]) -> None:
        """Rule 3: one BATCH, answered with its VERDICTS."""
        _, batch_id, sent_at, entries, closed, counts, (busy, on_cpu), hist, late = msg
        driver = self._server.driver
        api = self._server.api
        labels_of = slot.labels
        for token in closed:
            labels_of.pop(token, None)
        verdicts: list[Any] = []
        max_nodes = self._server.config.max_nodes
        now = time.monotonic()
        board = api.board
        for token, node_id, incarnation, labels, interval, first, status in entries:
            if labels is not None:  # kept per stream: shared, as the servicer's checks
                labels_of[token] = self._labelsets.mapping(labels)
            if first:
                node_id = sys.intern(node_id)  # the one the records of the node keep
                try:
                    limits.check_new_node(driver, max_nodes, node_id)
                    check_shedding(driver, node_id, now, cpu=on_cpu)
                except Shed as e:
                    verdicts.append((str(e), e.pushback_ms))
                    continue
                except limits.LimitExceeded as e:
                    verdicts.append((str(e), 0))
                    continue
            v = driver.on_heartbeat(
                node_id, incarnation, labels_of.get(token, {}), interval or None
            )
            if v.accepted:
                if status is not None:
                    board.update(node_id, incarnation, pb.NodeStatus.FromString(status), now)
                else:  # heard all the same (statusboard rule 4)
                    board.heard(node_id, incarnation, now)
            verdicts.append(
                (v.accepted, _STATE[v.state], v.incarnation, v.lease, v.grace, v.grace_id)
            )
        self.horizon.heard(slot.stats.index, sent_at, late)
        heartbeats, acks, streams = counts
        counters = driver.counters
        counters.heartbeats += heartbeats
        counters.acks += acks
        if hist is not None:  # the streams' inter-arrival times, counted in the worker
            ia, (bucket_counts, seconds) = counters.interarrival, hist
            for i, n in enumerate(bucket_counts):
                ia.counts[i] += n
            ia.sum += seconds
        stats = slot.stats
        stats.utilisation, stats.cpu = busy, on_cpu
        # The streams open here are the workers' (the metric reads the servicer's count).
        api.heartbeat_streams += streams - stats.streams
        stats.streams, stats.batches = streams, stats.batches + 1
        stats.heartbeats += len(entries)
        if now - self._pruned_at > _PRUNE_EVERY:
            self._pruned_at = now
            board.prune(now)
        writer = slot.writer
        if writer is None or not entries:
            return
        arbiters_now = api.arbiters()
        arbiters = None
        if arbiters_now.index != slot.config_sent:
            slot.config_sent = arbiters_now.index
            arbiters = tuple((a.id, a.address, a.voter) for a in to_protos(arbiters_now))
        st = driver.status()
        status_items = (
            st.epoch,
            st.in_quorum,
            st.leader_id or "",
            driver.suggested_interval(),
            driver.state.instance,
            arbiters_now.index,
            arbiters,
        )
        writer.write(frames.encode(frames.VERDICTS, batch_id, tuple(verdicts), status_items))

    async def _watch(self) -> None:
        """Rule 4: kills a worker overdue by more than WEDGED_AFTER (rule 5 restarts it)."""
        while not self._stopping:
            await asyncio.sleep(0.5)
            for index in self.horizon.overdue(time.monotonic(), WEDGED_AFTER):
                slot = self._slots[index]
                if slot.proc is not None and slot.proc.returncode is None:
                    log.warning(
                        "ingest worker %d (pid %d) sent nothing for over %.1fs: killing it",
                        index,
                        slot.proc.pid,
                        WEDGED_AFTER,
                    )
                    self.horizon.left(index)
                    with contextlib.suppress(ProcessLookupError):
                        slot.proc.send_signal(signal.SIGKILL)

    # --- stop -----------------------------------------------------------------------

    def reload_tls(self) -> None:
        """Rule 6: every worker re-reads its TLS files (for new connections)."""
        for slot in self._slots:
            if slot.writer is not None:
                slot.writer.write(frames.encode(frames.RELOAD_TLS))

    async def stop(self) -> None:
        """Rule 6: STOP to every worker, wait (kill after 2 s past the grace), clean up."""
        self._stopping = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        for slot in self._slots:
            if slot.writer is not None:
                with contextlib.suppress(Exception):
                    slot.writer.write(frames.encode(frames.STOP))
        limit = self._server.config.shutdown_grace + 2.0
        for slot in self._slots:
            proc = slot.proc
            if proc is not None and proc.returncode is None:
                try:
                    async with asyncio.timeout(limit):
                        await proc.wait()
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            if slot.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await slot.task
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1
        if self.socket_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
