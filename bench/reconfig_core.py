"""Adding a replica to a group with N members, in the sans-I/O core: snapshot and catch-up.

Three :class:`arbiter.core.replica.Replica` cores exchange messages in
memory (one-way latency ``--latency`` seconds of virtual time) while N nodes
heartbeat every replica every 0.1 s, until all N are ALIVE; then a fourth
replica starts empty (``join=True``) and the leader is asked to
``add_learner`` it. Reported, per N:

- virtual seconds from the proposal to the learner's restore of the
  leader's snapshot, and to the committed promotion (the leader promotes a
  learner that has caught up: ``arbiter/core/raft/membership.py`` rule 4;
  checked at each heartbeat, so this is a few heartbeat intervals);
- the snapshot's size;
- the CPU the joiner spends restoring the snapshot (decode, canonical check,
  rebuild) as a ratio to a baseline measured in the same run: the leader's
  own compaction of the same state (``MembershipState.to_bytes``), which it
  does every ``snapshot_every`` entries anyway.

Not measured here: the transfer of the snapshot in 48 KiB chunks over gRPC
and the fsyncs of a real replica (the shell's part: ``tests/chaos``).

Usage: python bench/reconfig_core.py [--nodes 100,1000] [--latency 0.0005] [--repeat 5]
"""

from __future__ import annotations

import argparse
import heapq
import random
import time

from arbiter.core.detection import MissedHeartbeatDetector
from arbiter.core.raft import Message, RaftConfig, Role
from arbiter.core.replica import Replica, ReplicaSettings, restore_state
from membership.shared.view import MemberState

ADDRS = {"a1": "h:1", "a2": "h:2", "a3": "h:3"}


def _replica(rid: str, join: bool = False) -> Replica:
    return Replica(
        replica_id=rid,
        replica_ids=list(ADDRS),
        addresses=ADDRS,
        join=join,
        raft_config=RaftConfig(),
        settings=ReplicaSettings(
            lease=0.5,
            observation_retry=0.2,
            restart_grace=0.0,
            heartbeat_interval=0.1,
            snapshot_every=1000,
        ),
        detector=MissedHeartbeatDetector(interval=0.1, missed_limit=5),
        rng=random.Random(rid),
        now=0.0,
        seq_base=1,
    )


class Group:
    """Replicas on a virtual clock; messages arrive ``latency`` seconds after they leave."""

    def __init__(self, nodes: int, latency: float) -> None:
        self.now = 0.0
        self.latency = latency
        self.reps = {r: _replica(r) for r in ADDRS}
        self.nodes = [f"n{i}" for i in range(nodes)]
        self.queue: list[tuple[float, int, Message]] = []
        self.seq = 0
        self.restored_at: float | None = None

    def _flush(self, rep: Replica) -> None:
        while rep.has_ready():
            rd = rep.ready()
            if rd.snapshot is not None and self.restored_at is None:
                self.restored_at = self.now
            for m in rd.messages:
                self.seq += 1
                heapq.heappush(self.queue, (self.now + self.latency, self.seq, m))
            rep.advance(rd)
        rep.maybe_compact()

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        next_beat = self.now
        while self.now < end:
            step = min(self.now + 0.01, end)
            while self.queue and self.queue[0][0] <= step:
                t, _, msg = heapq.heappop(self.queue)
                self.now = max(self.now, t)
                if msg.dst in self.reps:
                    self.reps[msg.dst].step(msg, self.now)
                    self._flush(self.reps[msg.dst])
            self.now = step
            if self.now >= next_beat:
                next_beat += 0.1
                for rep in self.reps.values():
                    for n in self.nodes:
                        rep.heartbeat(n, 1, {}, self.now)
            for rep in self.reps.values():
                rep.tick(self.now)
                self._flush(rep)

    def leader(self) -> Replica:
        return next(r for r in self.reps.values() if r.status().role is Role.LEADER)


def measure(nodes: int, latency: float, repeat: int) -> str:
    g = Group(nodes, latency)
    g.run(1.5)
    while True:
        lead = g.leader()
        alive = [m for m in lead.state.view().members if m.state is MemberState.ALIVE]
        if len(alive) == nodes:
            break
        g.run(0.5)
    joiner = _replica("a4", join=True)
    g.reps["a4"] = joiner
    start = g.now
    lead.propose_config_change("add_learner", "a4", "h:4", g.now)
    g._flush(lead)
    while not lead.applied_configuration.is_voter("a4") or g.restored_at is None:
        g.run(0.01)
    promoted = g.now - start
    restored = g.restored_at - start
    snap = lead.raft.snapshot()
    state = lead.state
    base, cost = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        state.to_bytes()
        base.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        restore_state(snap)
        cost.append(time.perf_counter() - t0)
    b, c = min(base), min(cost)
    return (
        f"{nodes:>6} members: snapshot {len(snap.data) / 1024:8.1f} KiB; restored "
        f"{restored:.3f} s and promoted {promoted:.3f} s (virtual) after add_learner; "
        f"restore CPU {c * 1e3:.1f} ms = {c / b:.2f} x one compaction ({b * 1e3:.1f} ms)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="100,1000")
    p.add_argument("--latency", type=float, default=0.0005)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    for n in (int(x) for x in a.nodes.split(",")):
        print(measure(n, a.latency, a.repeat), flush=True)


if __name__ == "__main__":
    main()
