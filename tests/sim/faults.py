"""The random fault schedule of a seeded run, and the liveness bounds it checks.

A run of S seconds has a fault phase ``[1, S - TAIL)`` and a healed tail.

Rules:

1. Replica faults come in episodes: one topology fault (partitions of every
   kind, one-way cuts around the leader, crashes, crash of every replica)
   held for a random time, then healed; then a calm gap. The topology is
   constant within an episode, so L1 is tested on every long episode.
2. Node faults are an independent stream: pauses (many of them close to the
   detection time D, where leases and suspicions race), crashes with or
   without a restart, nodes cut from one replica (one or both ways) or from a
   majority, and subscriber streams broken.
3. At ``S - TAIL`` everything heals: cuts removed, replicas restarted, nodes
   resumed, each crashed node restarted with probability 1/2; random loss
   stops (delays, jitter and duplicates go on). L2 is checked
   ``LIVENESS_BOUND`` seconds later and at the end; L1 every quarter second.
4. Every choice comes from the schedule's own random stream, and faults that
   name "the leader" resolve it when they happen, so a seed replays exactly.
5. Reconfiguration episodes (``reconfig``) hand the operator one membership
   operation (add a learner, which the leader promotes once caught up;
   remove a voter, the leader perhaps; replace one, add then remove, with
   its machine gone first or not; grow to five voters; shrink back to
   three), keeping three to five voters and at most seven replicas in all,
   and half of the time break the topology during the change (crash or
   isolate the leader, crash the new replica, a minority partition). Added
   replicas start with an empty disk. No new operation starts after the
   final heal; one under way finishes.
6. Grace windows (one seed in three, a stream of its own: the other seeds
   run as before): half of a node's pauses are announced, a window of 0.5
   to 4 s asked of a random up replica (of the leader when that one knows
   none) 0.2 s before the pause; now and then a node ends its window early.
   S6 then checks that a node counting a window's leases is never DEAD.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from arbiter.config import ArbiterConfig
from arbiter.core.raft import ProposalDropped
from tests.sim.nodes import NodeStatus
from tests.sim.reconfig import Operator
from tests.sim.world import World

__all__ = ["LEADER_BOUND", "LIVENESS_BOUND", "TAIL", "FaultSchedule"]

T = 1.0  # election timeout of ArbiterConfig.lan()
D = 0.75  # detection time of ArbiterConfig.lan(): 0.15 s x 5; also the lease
RETRY = 0.5  # observation retry of ArbiterConfig.lan()

LEADER_BOUND = 8 * T
"""L1: a stable topology with a connected majority has a leader in quorum within this.

CheckQuorum deposes an unreachable leader within T; the followers' timers
(drawn in [T, 2T)) then fire within 2T more; that is 3T, plus two more
rounds of 2T for split or refused votes, plus a second of slack."""

GRACE = ArbiterConfig.lan().restart_grace  # no suspicion this long after a restart (3 s)

LIVENESS_BOUND = 3 * T + GRACE + D + 2 * RETRY + 3.0
"""L2: after the last heal, settled views within this many seconds (10.75 s).

A leader within 3T; a replica restarted at the heal casts no suspicion for its
restart grace and suspects a silent node D later; an observation lost
with a leader is proposed again after RETRY (twice); three seconds of slack for
a node that learns it is DEAD, rejoins, and is admitted."""

TAIL = LIVENESS_BOUND + 3.0


class FaultSchedule:
    """Drives a world's faults from one random stream (module rules).

    Args:
        world: the world to break.
        rng: the schedule's random stream.
        seconds: the run's length; faults stop at ``seconds - TAIL``.
    """

    def __init__(self, world: World, rng: random.Random, seconds: float) -> None:
        self.w = world
        self.rng = rng
        self.seconds = seconds
        self.heal_at = max(1.0, seconds - TAIL)
        self.healed = False
        self.operator: Operator = world.operator

    def start(self) -> None:
        """Schedules the first faults and every check."""
        q = self.w.q
        q.at(1.0 + self.rng.uniform(0, 2), self._episode)
        q.at(1.0 + self.rng.uniform(0, 1), self._node_fault)
        q.at(self.heal_at, self._heal_all)
        t = 0.25
        while t <= self.seconds:
            q.at(t, self.w.check_leader, LEADER_BOUND)
            t += 0.25
        for t in (self.heal_at + LIVENESS_BOUND, self.seconds):
            if t <= self.seconds:
                q.at(t, self.w.check_settled, self.heal_at)

    # --- helpers --------------------------------------------------------------------------

    def _later(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        """Runs ``fn(*args)`` after ``delay`` seconds, unless the final heal came first."""
        self.w.q.at(self.w.q.now + delay, self._guarded, fn, args)

    def _guarded(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if not self.healed:
            fn(*args)

    def _leader_id(self) -> str:
        lead = self.w.leader()
        return lead.id if lead is not None else self.rng.choice(self.w.replica_ids)

    # --- replica episodes (rule 1) -----------------------------------------------------------

    def _episode(self) -> None:
        if self.healed:
            return
        w, rng = self.w, self.rng
        ids = w.replica_ids
        hold = rng.choice((rng.uniform(0.5, 4.0), rng.uniform(4.0, 12.0)))
        kind = rng.choice(
            (
                "calm",
                "isolate_leader",
                "leader_deaf",
                "leader_mute",
                "minority",
                "bridge",
                "random_cuts",
                "crash",
                "crash_leader",
                "crash_all",
                "reconfig",
            )
        )
        if kind == "reconfig":
            kind = self._reconfig(hold)
        lead = self._leader_id()
        others = [r for r in ids if r != lead]
        if kind == "isolate_leader":
            w.partition([lead], others)
        elif kind == "leader_deaf":
            for r in others:
                w.cut(r, lead)
        elif kind == "leader_mute":
            for r in others:
                w.cut(lead, r)
        elif kind == "minority":
            shuffled = rng.sample(ids, len(ids))
            k = len(ids) // 2
            nodes = list(w.nodes)
            side = [n for n in nodes if rng.random() < 0.5]
            w.partition(shuffled[:k] + side, shuffled[k:] + [n for n in nodes if n not in side])
        elif kind == "bridge":
            shuffled = rng.sample(ids, len(ids))
            half = (len(ids) - 1) // 2
            w.partition(shuffled[1 : 1 + half], shuffled[1 + half :])
        elif kind == "random_cuts":
            for a in ids:
                for b in ids:
                    if a != b and rng.random() < 0.3:
                        w.cut(a, b)
        elif kind in ("crash", "crash_leader"):
            rid = lead if kind == "crash_leader" else rng.choice(ids)
            w.crash_replica(rid)
            # Within the lease (restart grace matters) or well after it.
            hold = rng.choice((rng.uniform(0.05, D), rng.uniform(D, 5.0)))
        elif kind == "crash_all":
            for r in ids:
                w.crash_replica(r)
            hold = rng.uniform(0.05, 3.0)
        self._later(hold, self._end_episode)

    def _reconfig(self, hold: float) -> str:
        """Rule 5: submits one operation; returns the topology fault to hold with it."""
        w, rng, op = self.w, self.rng, self.operator
        conf = w.checker.conf
        voters = list(conf.voters)
        if op.busy or len(w.replicas) >= 7 or conf.learners:
            return "calm"
        fresh = f"r{len(w.replicas) + 1}"
        kinds = ["replace", "replace_gone"]
        kinds += ["add", "grow"] if len(voters) < 5 else []
        kinds += ["remove", "shrink"] if len(voters) > 3 else []
        what = rng.choice(kinds)
        old = rng.choice(voters) if rng.random() < 0.7 else self._leader_id()
        if old not in voters:
            old = voters[0]
        if what == "add":
            steps = [("add", fresh), ("voter", fresh)]
        elif what == "grow":
            other = f"r{len(w.replicas) + 2}"
            steps = [("add", fresh), ("voter", fresh)]
            if len(voters) < 4:
                steps += [("add", other), ("voter", other)]
        elif what == "remove":
            steps = [("remove", old)]
        elif what == "shrink":
            steps = [("remove", r) for r in rng.sample(voters, len(voters) - 3)]
        else:
            steps = [("add", fresh), ("voter", fresh), ("remove", old)]
            if what == "replace_gone":
                steps.insert(0, ("wipe", old))
        op.submit(steps)
        if rng.random() < 0.5:
            return "calm"
        during = rng.choice(("crash_leader", "isolate_leader", "minority", "crash_new"))
        if during == "crash_new":
            self._later(rng.uniform(0.05, 1.5), self._crash_if_running, fresh)
            return "calm"
        return during

    def _crash_if_running(self, rid: str) -> None:
        if rid in self.w.replicas:
            self.w.crash_replica(rid)

    def _end_episode(self) -> None:
        w = self.w
        if w.net.cuts:
            w.heal()
        for rid in w.replica_ids:
            if w.replicas[rid].core is None:
                self._later(self.rng.uniform(0.0, 0.3), w.restart_replica, rid)
        self._later(self.rng.uniform(0.5, 6.0), self._episode)

    # --- node faults (rule 2) ---------------------------------------------------------------------

    def _node_fault(self) -> None:
        if self.healed:
            return
        w, rng = self.w, self.rng
        nid = rng.choice(list(w.nodes))
        node = w.nodes[nid]
        kind = rng.choice(("pause", "pause_near_d", "crash", "cut_one", "cut_majority", "sub"))
        if kind in ("pause", "pause_near_d") and node.status is NodeStatus.UP:
            if kind == "pause":
                hold = rng.choice((rng.uniform(0.02, 0.4), rng.uniform(1.0, 3.0)))
            else:
                hold = rng.uniform(D - 0.1, D + 0.3)
            graces = w.grace_rng
            if graces is not None and graces.random() < 0.5 and self._ask_grace(nid, graces):
                self._later(0.2, self._pause_for, nid, hold)  # rule 6: acks carry it first
            else:
                self._pause_for(nid, hold)
        elif kind == "crash" and node.status is not NodeStatus.CRASHED:
            w.crash_node(nid)
            if rng.random() < 0.7:
                self._later(rng.uniform(0.05, 4.0), w.restart_node, nid)
        elif kind == "cut_one":
            rid = rng.choice(w.replica_ids)
            way = rng.choice(("both", "in", "out"))
            links = [(nid, rid), (rid, nid)] if way == "both" else []
            links = links or ([(nid, rid)] if way == "in" else [(rid, nid)])
            self._cut_for(links, rng.uniform(0.3, 4.0))
        elif kind == "cut_majority":
            k = len(w.replica_ids) // 2 + 1
            links = [link for r in rng.sample(w.replica_ids, k) for link in ((nid, r), (r, nid))]
            self._cut_for(links, rng.choice((rng.uniform(0.2, 1.2), rng.uniform(1.2, 4.0))))
        elif kind == "sub" and w.subs:
            sub = w.subs[rng.choice(list(w.subs))]
            if sub.feed is not None:
                sub.broken(sub.feed)
        self._later(rng.uniform(0.3, 3.0), self._node_fault)

    def _pause_for(self, nid: str, hold: float) -> None:
        w = self.w
        if w.nodes[nid].status is NodeStatus.UP and not self.healed:
            w.pause_node(nid)
            self._later(hold, w.resume_node, nid)

    def _ask_grace(self, nid: str, graces: random.Random) -> bool:
        """Rule 6: ``nid`` asks a random up replica for a window (or, 1 in 5, its end)."""
        w = self.w
        up = [r for r in w.replica_ids if w.replicas[r].core is not None]
        if not up or w.nodes[nid].session is None:
            return False
        seconds = 0.0 if graces.random() < 0.2 else round(graces.uniform(0.5, 4.0), 2)
        try:
            w.grace(nid, seconds, via=graces.choice(up))
        except ProposalDropped:
            return False
        return seconds > 0

    def _cut_for(self, links: list[tuple[str, str]], hold: float) -> None:
        w = self.w
        for src, dst in links:
            w.cut(src, dst)
        self._later(hold, self._uncut, links)

    def _uncut(self, links: list[tuple[str, str]]) -> None:
        for link in links:
            self.w.net.cuts.discard(link)
        self.w.trace("fault: uncut " + " ".join(f"{a}->{b}" for a, b in links))

    # --- the end of the faults (rule 3) -----------------------------------------------------------

    def _heal_all(self) -> None:
        w, rng = self.w, self.rng
        self.healed = True
        w.trace("fault: final heal")
        w.net.lossy = False
        w.heal()
        for rid in w.replica_ids:
            w.restart_replica(rid)
        for nid, node in w.nodes.items():
            if node.status is NodeStatus.PAUSED:
                w.resume_node(nid)
            elif node.status is NodeStatus.CRASHED and rng.random() < 0.5:
                w.restart_node(nid)
