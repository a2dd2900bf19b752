"""Raft with writes that take time: inputs stepped between ``ready()`` and ``advance()``.

The driver persists a Ready on its writer thread (arbiter/server/consensus/writer.py)
and keeps stepping Raft messages, heartbeats and proposals into the core
meanwhile; it sends the Ready's messages and calls ``advance`` only when the
write is done, and takes the next Ready after that. This runs the Raft core
in exactly that shape: each replica has at most one Ready in flight, whose
write lasts a random virtual time; a crash loses the write in flight. The
harness (tests/unit/raft_harness.py) checks after every event that there is
at most one leader per term, that applied entries agree everywhere, and that
no message leaves before the term, vote and entries it depends on are on disk.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence

import pytest

from arbiter.core.raft import Message, MessageType, RaftConfig, Ready
from tests.unit.raft_harness import Network, random_faults

IDS5 = ["a", "b", "c", "d", "e"]


def _must_persist(rd: Ready) -> bool:
    return rd.snapshot is not None or rd.hard_state is not None or bool(rd.entries)


class SlowDiskNetwork(Network):
    """A :class:`Network` whose replicas write each Ready for ``0..max_write`` seconds.

    Args:
        ids: replica ids.
        max_write: longest write (virtual seconds).
        send_early: a broken driver, for checking the checks: the Ready's
            messages leave when its write starts.
        **kwargs: as for :class:`Network`.
    """

    def __init__(
        self,
        ids: Sequence[str],
        *,
        max_write: float = 0.05,
        send_early: bool = False,
        **kwargs: object,
    ) -> None:
        self.max_write = max_write
        self.send_early = send_early
        self._writes: dict[str, tuple[float, Ready]] = {}
        self._write_rng = random.Random(f"{kwargs.get('seed', 0)}/writes")
        self.writes_done = 0
        self.inputs_during_writes = 0
        super().__init__(ids, **kwargs)  # type: ignore[arg-type]

    # --- the driver's shape ---

    def _flush(self, node_id: str) -> None:
        if node_id in self._writes:
            self.inputs_during_writes += 1  # stays in the core for the next Ready
            return
        node = self.nodes[node_id]
        while node.has_ready():
            rd = node.ready()
            if _must_persist(rd):
                done = self.now + self._write_rng.uniform(0.0, self.max_write)
                self._writes[node_id] = (done, rd)
                if self.send_early:
                    self._send(node_id, rd)
                return
            self._finish(node_id, rd)
        st = node.status()
        if self.compact_every and st.applied - st.snapshot_index >= self.compact_every:
            self.compact(node_id)

    def _finish(self, node_id: str, rd: Ready) -> None:
        if not self.send_early or not _must_persist(rd):
            self._send(node_id, rd)
        self._apply(node_id, rd.snapshot, rd.committed_entries)
        self.nodes[node_id].advance(rd)

    def _send(self, node_id: str, rd: Ready) -> None:
        for msg in rd.messages:
            self._check_depends(node_id, msg)
            self.sent.append(msg)
            self._seq += 1
            delay = self.latency + (self.jitter and self.jitter * self._loss_rng.random())
            heapq.heappush(self._queue, (self.now + delay, self._seq, msg))

    def _check_depends(self, node_id: str, msg: Message) -> None:
        """Rule 6 (Raft Fig. 2) for a core stepped while a write is in flight.

        A Ready may carry messages made in an earlier term than its hard
        state: a leader's APPEND queued, then a higher term heard before the
        Ready was taken. Only the latest hard state is written, so what must
        hold as a message leaves is that the durable term is at least the
        message's, and that a vote it depends on is durable in that term.
        A lower-term message is harmless: with the higher term on disk the
        replica never acts in the message's term again, even after a crash
        (etcd raft sends such messages too).
        """
        assert msg.src == node_id and msg.dst != node_id
        disk = self.disks[node_id]
        hs = disk.hard_state
        if msg.type is MessageType.PROPOSE:
            return
        granted_pre_vote = msg.type is MessageType.PRE_VOTE_RESP and not msg.reject
        if msg.type is MessageType.PRE_VOTE or granted_pre_vote:
            assert msg.term <= hs.term + 1 or granted_pre_vote, msg
            return
        assert msg.term <= hs.term, f"{msg} sent with durable term {hs.term}"
        if msg.term == hs.term and (
            msg.type is MessageType.VOTE or (msg.type is MessageType.VOTE_RESP and not msg.reject)
        ):
            expected = node_id if msg.type is MessageType.VOTE else msg.dst
            assert hs.vote == expected, f"{msg} sent before the vote for {expected} is durable"
        if msg.type is MessageType.APPEND_RESP and not msg.reject:
            assert msg.index <= disk.last_index, f"{msg} acks unpersisted entries"

    def _write_done(self, node_id: str) -> None:
        _, rd = self._writes.pop(node_id)
        self._persist(node_id, rd)
        self.writes_done += 1
        self._trace(f"written {node_id}")
        self._finish(node_id, rd)
        self._flush(node_id)

    # --- events ---

    def _next_write(self) -> tuple[float, str | None]:
        return min(((t, i) for i, (t, _) in self._writes.items()), default=(math.inf, None))

    def next_event(self) -> float:
        return min(super().next_event(), self._next_write()[0])

    def step_once(self) -> None:
        t, node_id = self._next_write()
        if node_id is not None and t <= super().next_event():
            self.now = max(self.now, t)
            self._write_done(node_id)
            self.check_invariants()
        else:
            super().step_once()

    def crash(self, node_id: str) -> None:
        self._writes.pop(node_id, None)  # the write in flight never reached the disk
        super().crash(node_id)


def _chaos(seed: int, *, send_early: bool = False) -> SlowDiskNetwork:
    ids = IDS5 if seed % 2 else IDS5[:3]
    config = RaftConfig(pre_vote=seed % 3 != 0, check_quorum=seed % 4 != 0)
    net = SlowDiskNetwork(
        ids,
        seed=seed,
        loss=0.1,
        jitter=0.2 if seed % 3 == 1 else 0.0,
        config=config,
        # Writes from a few ms to longer than a Raft heartbeat interval (0.1 s).
        max_write=(0.01, 0.05, 0.3)[seed % 3],
        compact_every=5 if seed % 4 == 1 else 0,
        send_early=send_early,
    )
    # Several proposals per step: some land while a write is in flight.
    return random_faults(net, ids, seed, proposals=(1, 3))


@pytest.mark.parametrize("seed", range(24))
def test_raft_slow_disk_safety_and_convergence_with_inputs_during_writes(seed: int) -> None:
    net = _chaos(seed)
    assert net.inputs_during_writes > 0  # the interleaving under test did happen
    net.recover()
    for i in sorted(net.down):
        net.restart(i)
    net.loss = 0.0

    def converged() -> bool:
        applied = {tuple(net.applied[i]) for i in net.ids}
        return len(applied) == 1 and b"final" in net.data_applied(net.ids[0])

    # A proposal taken by a leader that is deposed at once is lost (Raft
    # promises nothing for it), so propose again, as clients do.
    for _ in range(5):
        assert net.run_until(lambda: net.stable_leader() is not None, timeout=30)
        lead = net.stable_leader()
        assert lead is not None
        net.propose(lead, b"final")
        if net.run_until(converged, timeout=10):
            break
    assert converged(), {i: net.nodes[i].status() for i in net.ids}


def test_raft_slow_disk_checks_catch_a_driver_that_sends_before_the_write() -> None:
    caught = 0
    for seed in range(8):
        try:
            _chaos(seed, send_early=True)
        except AssertionError as e:
            assert "sent" in str(e) or "acks unpersisted" in str(e), e
            caught += 1
    assert caught >= 4, f"only {caught} of 8 broken runs were caught"
