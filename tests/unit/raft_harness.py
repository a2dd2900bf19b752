"""A deterministic network of RaftNodes for tests, in the style of etcd raft's ``network``.

Messages travel through a queue ordered by delivery time; the virtual clock
jumps straight to the next delivery or the earliest ``next_deadline()`` (no
real sleeps). Links can be cut (``cut``, ``isolate``, ``drop``) and healed
(``recover``); replicas can crash and restart from their simulated disk.
Each replica's state machine is the list of entries it applied; a snapshot
of it (``compact``, or automatically every ``compact_every`` applied
entries) encodes that list, so a replica restored from a snapshot is checked
like one that applied every entry. After every event the harness checks the
safety invariants: at most one leader per term, every applied entry equals
the entry committed at that index anywhere, entries are applied once and in
order, and every Ready persists the term, vote, snapshot and entries its
messages depend on. Membership changes: ``add`` starts a replica with an
empty disk that joins (``join=True``), ``change`` proposes a configuration
change at a replica, ``wipe`` loses a crashed replica's disk; a leader that
wants a snapshot for a joining replica gets one at once.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from arbiter.core.raft import (
    ArbiterConfiguration,
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    ProposalDropped,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
    Snapshot,
)


def encode_applied(entries: Sequence[Entry]) -> bytes:
    """The harness state machine's snapshot: every applied entry, in order."""
    return json.dumps([[e.term, e.index, e.data.hex(), e.type.value] for e in entries]).encode()


def decode_applied(data: bytes) -> list[Entry]:
    """Inverse of :func:`encode_applied`."""
    return [
        Entry(term=t, index=i, data=bytes.fromhex(d), type=EntryType(k))
        for t, i, d, k in json.loads(data)
    ]


@dataclass
class Disk:
    """What a replica has made durable: entries follow the snapshot (if any)."""

    hard_state: HardState = field(default_factory=lambda: HardState(term=0, vote=None, commit=0))
    entries: list[Entry] = field(default_factory=list)
    snapshot: Snapshot | None = None

    @property
    def base(self) -> int:
        """Index of the last entry folded into the snapshot (0 without one)."""
        return self.snapshot.index if self.snapshot is not None else 0

    @property
    def last_index(self) -> int:
        return self.base + len(self.entries)


class Network:
    """Replicas ``ids`` connected by a lossy, partitionable, deterministic network.

    Args:
        ids: replica ids.
        seed: derives every replica's Rng and the network's loss decisions.
        config: Raft config for every replica.
        latency: one-way delivery delay in seconds.
        jitter: extra delay, uniform in [0, jitter) seconds (reorders messages).
        loss: probability that a message is lost.
        compact_every: when > 0, a replica compacts its log into a snapshot
            whenever it has applied this many entries since its last one.
    """

    def __init__(
        self,
        ids: Sequence[str],
        *,
        seed: int = 0,
        config: RaftConfig | None = None,
        latency: float = 0.002,
        jitter: float = 0.0,
        loss: float = 0.0,
        compact_every: int = 0,
    ) -> None:
        self.ids = list(ids)
        self.seed = seed
        self.config = config if config is not None else RaftConfig()
        self.latency = latency
        self.jitter = jitter
        self.loss = loss
        self.compact_every = compact_every
        self.now = 0.0
        self.nodes: dict[str, RaftNode] = {}
        self.disks = {i: Disk() for i in ids}
        self.applied: dict[str, list[Entry]] = {i: [] for i in ids}
        self.down: set[str] = set()
        self.cuts: set[tuple[str, str]] = set()
        # Drops every message it returns True for (e.g. one message type), until reset.
        self.drop_if: Callable[[Message], bool] | None = None
        self.trace: list[str] = []
        self.sent: list[Message] = []
        self.leaders: dict[int, str] = {}
        self.committed: dict[int, Entry] = {}
        self.dropped_proposals = 0
        self._queue: list[tuple[float, int, Message]] = []
        self._seq = 0
        self._incarnation = dict.fromkeys(ids, 0)
        self.joined: set[str] = set()
        self._loss_rng = random.Random(f"{seed}/network")
        for i in ids:
            self._start(i)

    # --- replicas ---------------------------------------------------------------

    def _start(self, node_id: str) -> None:
        disk = self.disks[node_id]
        initial = [i for i in self.ids if i not in self.joined]
        self.nodes[node_id] = RaftNode(
            node_id=node_id,
            peers=initial,
            join=node_id in self.joined,
            config=self.config,
            rng=random.Random(f"{self.seed}/{node_id}/{self._incarnation[node_id]}"),
            now=self.now,
            hard_state=disk.hard_state,
            entries=tuple(disk.entries),
            snapshot=disk.snapshot,
        )
        # The state machine is restored from the snapshot, then rebuilt by replaying the log.
        snap = disk.snapshot
        self.applied[node_id] = decode_applied(snap.data) if snap is not None else []

    def crash(self, node_id: str) -> None:
        """Stops a replica; its disk survives."""
        self.down.add(node_id)
        del self.nodes[node_id]

    def restart(self, node_id: str) -> None:
        """Starts a crashed replica again from its disk."""
        self.down.discard(node_id)
        self._incarnation[node_id] += 1
        self._start(node_id)
        self._trace(f"restart {node_id}")

    def add(self, node_id: str) -> None:
        """Starts a new replica with an empty disk, to join (``join=True``)."""
        assert node_id not in self.ids
        self.ids.append(node_id)
        self.joined.add(node_id)
        self.disks[node_id] = Disk()
        self.applied[node_id] = []
        self._incarnation[node_id] = 0
        self._start(node_id)
        self._trace(f"add {node_id}")

    def wipe(self, node_id: str) -> None:
        """Loses the disk of a crashed replica; it can only come back with ``add``."""
        assert node_id in self.down
        self.down.discard(node_id)
        self.ids.remove(node_id)
        del self.disks[node_id]

    def change(
        self, node_id: str, op: ConfChangeOp, replica_id: str, address: str = ""
    ) -> ArbiterConfiguration:
        """Proposes a configuration change at ``node_id`` (errors propagate)."""
        conf = self.nodes[node_id].propose_conf_change(
            ConfChange(op=op, replica_id=replica_id, address=address or _default(op, replica_id)),
            self.now,
        )
        self._flush(node_id)
        return conf

    # --- links -----------------------------------------------------------------------

    def cut(self, a: str, b: str) -> None:
        """Drops every message between ``a`` and ``b``, both ways."""
        self.cuts |= {(a, b), (b, a)}

    def drop(self, src: str, dst: str) -> None:
        """Drops every message from ``src`` to ``dst`` (one way)."""
        self.cuts.add((src, dst))

    def isolate(self, node_id: str) -> None:
        """Cuts ``node_id`` off from everyone."""
        for other in self.ids:
            if other != node_id:
                self.cut(node_id, other)

    def recover(self) -> None:
        """Heals every cut (crashed replicas stay down)."""
        self.cuts.clear()

    # --- snapshots --------------------------------------------------------------------

    def compact(self, node_id: str, index: int | None = None) -> Snapshot:
        """Snapshots ``node_id``'s state machine at ``index`` (default: all applied), durably."""
        node = self.nodes[node_id]
        if index is None:
            index = node.status().applied
        snap = node.compact(index, encode_applied(self.applied[node_id][:index]))
        disk = self.disks[node_id]
        assert disk.base < snap.index <= disk.last_index, "compacting unpersisted entries"
        del disk.entries[: snap.index - disk.base]
        disk.snapshot = snap
        self._trace(f"compact {node_id} to {snap.index}")
        return snap

    # --- driving -----------------------------------------------------------------------

    def propose(self, node_id: str, data: bytes) -> None:
        """Proposes at ``node_id``; ProposalDropped propagates."""
        self.nodes[node_id].propose(data, self.now)
        self._flush(node_id)

    def inject(self, msg: Message) -> None:
        """Delivers ``msg`` to its destination now, bypassing the links."""
        self.nodes[msg.dst].step(msg, self.now)
        self._flush(msg.dst)

    def next_event(self) -> float:
        """Virtual time of the next delivery or timer."""
        t = self._queue[0][0] if self._queue else math.inf
        return min([t, *(n.next_deadline() for n in self.nodes.values())])

    def step_once(self) -> None:
        """Advances the clock to the next event and runs it."""
        t = self.next_event()
        assert t < math.inf, "nothing will ever happen"
        self.now = max(self.now, t)
        if self._queue and self._queue[0][0] <= t:
            _, _, msg = heapq.heappop(self._queue)
            if self._delivered(msg):
                self._trace(f"deliver {msg}")
                try:
                    self.nodes[msg.dst].step(msg, self.now)
                except ProposalDropped:
                    self.dropped_proposals += 1
                self._flush(msg.dst)
        else:
            for i, node in sorted(self.nodes.items()):
                if node.next_deadline() <= self.now:
                    node.tick(self.now)
                    self._trace(f"tick {i} {node.status()}")
                    self._flush(i)
        self.check_invariants()

    def run_for(self, duration: float) -> None:
        """Runs every event up to ``now + duration`` (seconds of virtual time)."""
        end = self.now + duration
        while self.next_event() <= end:
            self.step_once()
        self.now = end

    def run_until(self, pred: Callable[[], bool], timeout: float = 30.0) -> bool:
        """Runs until ``pred()`` holds or ``timeout`` virtual seconds pass; returns ``pred()``."""
        end = self.now + timeout
        while not pred() and self.next_event() <= end:
            self.step_once()
        return pred()

    # --- observation --------------------------------------------------------------------

    def leader(self) -> str | None:
        """The running leader with the highest term, if any."""
        best: tuple[int, str] | None = None
        for i, node in self.nodes.items():
            st = node.status()
            if st.role is Role.LEADER and (best is None or st.term > best[0]):
                best = (st.term, i)
        return best[1] if best else None

    def stable_leader(self) -> str | None:
        """A leader that every running replica reachable from it follows, in its term
        (replicas removed from the group excepted)."""
        lead = self.leader()
        if lead is None:
            return None
        term = self.nodes[lead].status().term
        for i, node in self.nodes.items():
            st = node.status()
            if (lead, i) in self.cuts or st.removed:
                continue
            if st.term != term or st.leader != lead:
                return None
        return lead

    def data_applied(self, node_id: str) -> list[bytes]:
        """The non-no-op commands ``node_id`` has applied, in order (no CONFIG entries)."""
        return [e.data for e in self.applied[node_id] if e.data and e.type is EntryType.NORMAL]

    def check_invariants(self) -> None:
        """Election Safety and State Machine Safety (Raft Fig. 3)."""
        for i, node in self.nodes.items():
            st = node.status()
            if st.role is Role.LEADER:
                holder = self.leaders.setdefault(st.term, i)
                assert holder == i, f"two leaders in term {st.term}: {holder} and {i}"

    # --- internals ------------------------------------------------------------------------

    def _delivered(self, msg: Message) -> bool:
        if msg.src in self.down or msg.dst in self.down or (msg.src, msg.dst) in self.cuts:
            return False
        if msg.dst not in self.nodes:  # a replica never started (or wiped)
            return False
        if self.drop_if is not None and self.drop_if(msg):
            return False
        return not (self.loss and self._loss_rng.random() < self.loss)

    def _flush(self, node_id: str) -> None:
        node = self.nodes[node_id]
        while node.has_ready():
            rd = node.ready()
            self._persist(node_id, rd)
            for msg in rd.messages:
                self._check_depends(node_id, msg)
                self.sent.append(msg)
                self._seq += 1
                delay = self.latency + (self.jitter and self.jitter * self._loss_rng.random())
                heapq.heappush(self._queue, (self.now + delay, self._seq, msg))
            self._apply(node_id, rd.snapshot, rd.committed_entries)
            node.advance(rd)
        st = node.status()
        due = self.compact_every and st.applied - st.snapshot_index >= self.compact_every
        if due or (node.wants_snapshot() and st.applied > st.snapshot_index):
            self.compact(node_id)

    def _persist(self, node_id: str, rd: Ready) -> None:
        disk = self.disks[node_id]
        if rd.snapshot is not None:
            assert rd.snapshot.index > disk.base, "snapshot older than the persisted one"
            disk.snapshot = rd.snapshot
            disk.entries.clear()
        if rd.hard_state is not None:
            assert rd.hard_state.term >= disk.hard_state.term
            disk.hard_state = rd.hard_state
        if rd.entries:
            first = rd.entries[0].index
            assert disk.base < first <= disk.last_index + 1, "gap in persisted entries"
            del disk.entries[first - disk.base - 1 :]
            disk.entries.extend(rd.entries)

    def _check_depends(self, node_id: str, msg: Message) -> None:
        """Rule 7: a message leaves only after what it depends on is durable."""
        assert msg.src == node_id and msg.dst != node_id
        hs = self.disks[node_id].hard_state
        if msg.type is MessageType.PROPOSE:
            return
        granted_pre_vote = msg.type is MessageType.PRE_VOTE_RESP and not msg.reject
        if msg.type is MessageType.PRE_VOTE or granted_pre_vote:
            assert msg.term == hs.term + 1 or granted_pre_vote, msg
        else:
            assert msg.term == hs.term, f"{msg} sent with durable term {hs.term}"
        if msg.type is MessageType.VOTE or (msg.type is MessageType.VOTE_RESP and not msg.reject):
            expected = node_id if msg.type is MessageType.VOTE else msg.dst
            assert hs.vote == expected, f"{msg} sent before the vote for {expected} is durable"
        if msg.type is MessageType.APPEND_RESP and not msg.reject:
            assert msg.index <= self.disks[node_id].last_index, f"{msg} acks unpersisted entries"

    def _apply(self, node_id: str, snapshot: Snapshot | None, entries: Sequence[Entry]) -> None:
        if snapshot is not None:
            restored = decode_applied(snapshot.data)
            assert [e.index for e in restored] == list(range(1, snapshot.index + 1))
            for e in restored:
                assert self.committed.setdefault(e.index, e) == e, f"{node_id} restores {e}"
            self.applied[node_id] = restored
        applied = self.applied[node_id]
        for e in entries:
            assert e.index == len(applied) + 1, f"{node_id} applies {e.index} after {len(applied)}"
            assert self.committed.setdefault(e.index, e) == e, f"{node_id} applies divergent {e}"
            applied.append(e)

    def _trace(self, event: str) -> None:
        self.trace.append(f"{self.now:.6f} {event}")


def elected(ids: list[str], seed: int = 0, **kwargs: object) -> tuple[Network, str]:
    """A network whose leader is known to all and whose no-op is applied everywhere."""
    net = Network(ids, seed=seed, **kwargs)  # type: ignore[arg-type]

    def settled() -> bool:
        lead = net.stable_leader()
        return lead is not None and all(
            n.status().applied == net.nodes[lead].status().last_index for n in net.nodes.values()
        )

    assert net.run_until(settled, timeout=10)
    lead = net.stable_leader()
    assert lead is not None
    return net, lead


def all_applied(net: Network, data: list[bytes], ids: list[str] | None = None) -> bool:
    """True when every node (or those in ``ids``) applied exactly ``data``."""
    return all(net.data_applied(i) == data for i in (ids or list(net.nodes)))


def random_faults(
    net: Network, ids: list[str], seed: int, *, proposals: tuple[int, int] | None = None
) -> Network:
    """Twelve rounds of seeded faults on ``net`` (leader or replica isolated, links
    cut, crashes), each healed at the next round, with proposals in between.

    Args:
        net: the network (or a subclass of it) to run.
        ids: its replica ids.
        seed: the seed of the fault schedule.
        proposals: (least, most) proposals after each run step, drawn per step;
            None: exactly one.

    Returns:
        ``net``, after the last round.
    """
    rng = random.Random(seed)
    for r in range(12):
        net.recover()
        for i in sorted(net.down):
            net.restart(i)
        action = rng.choice(["isolate_leader", "isolate", "cuts", "crash", "none"])
        lead = net.leader()
        if action == "isolate_leader" and lead is not None:
            net.isolate(lead)
        elif action == "isolate":
            net.isolate(rng.choice(ids))
        elif action == "cuts":
            for _ in range(3):
                net.cut(*rng.sample(ids, 2))
        elif action == "crash":
            net.crash(rng.choice(ids))
        for _ in range(3):
            net.run_for(rng.uniform(0.3, 1.0))
            for _ in range(1 if proposals is None else rng.randint(*proposals)):
                with contextlib.suppress(ProposalDropped):
                    net.propose(rng.choice(sorted(net.nodes)), f"{seed}-{r}".encode())
    return net


def _default(op: ConfChangeOp, replica_id: str) -> str:
    """The address ``Network.change`` gives an added replica when none is given."""
    return f"{replica_id}:1" if op is ConfChangeOp.ADD_LEARNER else ""
