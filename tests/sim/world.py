"""The simulated world: replicas, nodes, subscribers, the network and the fault API.

One seed determines everything: every random stream is derived from it by
name (``f"{seed}/net"``, ``f"{seed}/r1/2"``, ...), events at equal times run
in scheduling order, and nothing iterates a set. The fault methods are what
scenario files and the random schedule (``faults``) call; each writes a trace
line, and the trace (with the count of events run) is hashed so that two runs
of one seed can be compared.

Membership changes (``reconfig``): ``add_replica`` starts a replica with an
empty disk that joins, ``retire_replica`` stops a removed one for good,
``wipe_replica`` loses a replica's machine. ``replica_ids`` lists the
replicas that are members (not retired), ``initial_ids`` the first group.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import random
from dataclasses import dataclass

from arbiter.config import ArbiterConfig
from arbiter.core.raft import ArbiterConfiguration, Message, RaftConfig, Role
from arbiter.core.retention import RetentionPolicy
from arbiter.core.tally import GraceOutcome
from membership.shared.view import MemberState, View
from tests.sim.clock import EventQueue
from tests.sim.invariants import Checker
from tests.sim.network import NetProfile, Network
from tests.sim.nodes import Ack, Heartbeat, NodeStatus, SimNode
from tests.sim.reconfig import Operator
from tests.sim.replicas import SETTINGS_HAVE_SNAPSHOT_EVERY, SNAPSHOT_EVERY, Disk, SimReplica
from tests.sim.subscribers import SimSubscriber

__all__ = ["Mutants", "World"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Mutants:
    """Deliberate breakages of the simulated shell, to show the checker catches them.

    Attributes:
        vote_after_send: Ready's hard state reaches the disk only after the
            messages that depend on it were sent (breakage b).
        no_check_quorum: Raft runs without CheckQuorum (breakage d).
        deaf_to_stalls: a starved replica ticks its detectors without the
            lateness its own stall gave it (breakage g; ``replicas`` rule 7).
        deaf_to_accepts: a replica slow to accept streams reads its lag without
            the accept lag (breakage h; ``replicas`` rule 8, readlag rule 2a).
    """

    vote_after_send: bool = False
    no_check_quorum: bool = False
    deaf_to_stalls: bool = False
    deaf_to_accepts: bool = False


class World:
    """Everything in one simulation run.

    Args:
        seed: the run's seed.
        replicas: number of arbiter replicas.
        nodes: number of nodes.
        subscribers: number of subscribers.
        profile: the network's behaviour (a clean LAN by default).
        mutants: deliberate breakages (none by default).
        echo: print trace lines as they happen.
        verbose: trace more (every subscriber item).
        history: view changes each replica's feed retains.
        drift: bound on the nodes' clock-rate error (0.0001 = 100 ppm); each
            node draws its rate in [1 - drift, 1 + drift].
        retention: when replicas forget DEAD and LEFT records (None: the
            lan preset's, an hour or 5,000 records).
    """

    def __init__(
        self,
        seed: int,
        *,
        replicas: int = 3,
        nodes: int = 3,
        subscribers: int = 2,
        profile: NetProfile | None = None,
        mutants: Mutants | None = None,
        echo: bool = False,
        verbose: bool = False,
        history: int = 3,
        drift: float = 0.0,
        retention: RetentionPolicy | None = None,
    ) -> None:
        self.seed = seed
        self.mutants = mutants or Mutants()
        self.config = ArbiterConfig.lan()
        raft = self.config.raft()
        if self.mutants.no_check_quorum:
            raft = RaftConfig(
                heartbeat_interval=raft.heartbeat_interval,
                election_timeout=raft.election_timeout,
                check_quorum=False,
            )
        self.raft_config = raft
        compaction = {"snapshot_every": SNAPSHOT_EVERY} if SETTINGS_HAVE_SNAPSHOT_EVERY else {}
        self.settings = dataclasses.replace(self.config.replica_settings(), **compaction)
        # Bounded history (arbiter/core/retention.py): nodes then also restart
        # from stale checkpoints at times (nodes rule 3).
        self.stale_restarts: random.Random | None = None
        if retention is not None:
            self.settings = dataclasses.replace(self.settings, retention=retention)
            self.stale_restarts = random.Random(f"{seed}/stale")
        self.history = history
        self.echo = echo
        self.verbose = verbose
        self.q = EventQueue()
        self.replica_ids = [f"r{i + 1}" for i in range(replicas)]
        self.initial_ids = list(self.replica_ids)
        self.addresses = {r: f"{r}.sim:7000" for r in self.replica_ids}
        node_ids = [f"n{i + 1}" for i in range(nodes)]
        sub_ids = [f"s{i + 1}" for i in range(subscribers)]
        self.net = Network(
            self.q,
            [*self.replica_ids, *node_ids, *sub_ids],
            random.Random(f"{seed}/net"),
            profile or NetProfile(),
        )
        self.sub_rng = random.Random(f"{seed}/subs")
        self.labels = {"job": "j1", "rack": "a"}
        self.trace_ranks = False  # scenario files turn it on (ranks rule 5 in the trace)
        self.grace_asks: dict[str, tuple[str, str, int]] = {}  # id -> (node, asked, boot)
        self.grace_rng: random.Random | None = None  # faults rule 6: nodes ask for windows
        self.lines: list[str] = []
        self._hash = hashlib.sha256()
        self.checker = Checker(self)
        self.replicas = {r: SimReplica(self, r) for r in self.replica_ids}
        phases = random.Random(f"{seed}/phases")
        hb = self.config.heartbeat_interval
        self.nodes = {
            n: SimNode(self, n, phases.uniform(0, hb), 1.0 + phases.uniform(-drift, drift))
            for n in node_ids
        }
        self.subs = {s: SimSubscriber(self, s) for s in sub_ids}
        self.topology_since = 0.0
        self.operator = Operator(self)

    # --- running ------------------------------------------------------------------------

    def boot(self) -> None:
        """Starts every replica and node; subscriber i subscribes to replica i."""
        for r in self.replicas.values():
            r.start()
        for n in self.nodes.values():
            n.start()
        for i, s in enumerate(self.subs.values()):
            s.connect(self.replicas[self.replica_ids[i % len(self.replica_ids)]])

    def run_until(self, t: float) -> None:
        """Runs every event due up to virtual time ``t``, then sets the clock to ``t``."""
        q = self.q
        while (nt := q.next_time()) is not None and nt <= t:
            q.run_next()
        q.now = max(q.now, t)

    def trace(self, line: str) -> None:
        """Records one readable trace line at the current time."""
        text = f"{self.q.now:8.3f} {line}"
        self.lines.append(text)
        self._hash.update(text.encode())
        if self.echo:
            print(text, flush=True)

    def digest(self) -> str:
        """A hash of the trace so far and of how many events ran."""
        h = self._hash.copy()
        h.update(f"|{self.q.taken}|{self.net.sent}|{self.net.lost}".encode())
        return h.hexdigest()

    # --- deliveries (called by the network) --------------------------------------------------

    def deliver_raft(self, msg: Message) -> None:
        """A Raft message reaches its replica."""
        self.replicas[msg.dst].on_raft(msg)

    def deliver_heartbeat(self, hb: Heartbeat) -> None:
        """A heartbeat reaches its replica."""
        self.replicas[hb.replica_id].on_heartbeat(hb)

    def deliver_ack(self, ack: Ack) -> None:
        """An ack reaches its node."""
        self.nodes[ack.node_id].on_ack(ack)

    # --- faults ----------------------------------------------------------------------------------

    def _fault(self, what: str, *, topology: bool) -> None:
        self.trace(f"fault: {what}")
        if topology:
            self.topology_since = self.q.now
        for s in self.subs.values():
            feed = s.feed
            if feed is not None:
                rid = feed.replica.id
                if not (self.net.connected(rid, s.id) and self.net.connected(s.id, rid)):
                    s.broken(feed)

    def add_replica(self, rid: str) -> SimReplica:
        """Starts a new replica ``rid`` with an empty disk, to join the group."""
        assert rid not in self.replicas
        others = [*self.replicas, *self.nodes, *self.subs]
        self.net.add_endpoint(rid, others, random.Random(f"{self.seed}/net/{rid}"))
        r = SimReplica(self, rid, join=True)
        self.replicas[rid] = r
        self.replica_ids.append(rid)
        self.addresses[rid] = f"{rid}.sim:7000"
        self._fault(f"add replica {rid} (empty disk)", topology=True)
        r.start()
        return r

    def retire_replica(self, rid: str) -> None:
        """Stops a replica whose removal is committed, for good."""
        r = self.replicas[rid]
        if r.core is not None:
            r.crash()
        r.retired = True
        if rid in self.replica_ids:
            self.replica_ids.remove(rid)
        self._fault(f"retire {rid}", topology=True)

    def wipe_replica(self, rid: str) -> None:
        """The replica's machine is gone: killed, disk lost; never started again."""
        r = self.replicas[rid]
        if r.core is not None:
            r.crash()
        r.disk = Disk()
        r.gone = True
        self._fault(f"machine of {rid} gone (killed, disk lost)", topology=True)

    def listed_arbiters(self) -> list[str]:
        """The arbiters an operator lists for a node: the committed configuration's."""
        return list(self.checker.conf.ids)

    def crash_replica(self, rid: str) -> None:
        """kill -9 of a replica."""
        r = self.replicas[rid]
        if r.core is not None:
            r.crash()
            self._fault(f"crash {rid}", topology=True)

    def restart_replica(self, rid: str) -> None:
        """Starts a crashed replica from its disk."""
        r = self.replicas[rid]
        if r.core is None and not (r.retired or r.gone):
            self._fault(f"restart {rid}", topology=True)
            r.start()

    def crash_node(self, nid: str) -> None:
        """kill -9 of a node."""
        n = self.nodes[nid]
        if n.status is not NodeStatus.CRASHED:
            n.crash()
            self._fault(f"crash {nid}", topology=False)

    def restart_node(self, nid: str) -> None:
        """Starts a crashed node at a higher incarnation."""
        n = self.nodes[nid]
        if n.status is NodeStatus.CRASHED:
            self._fault(f"restart {nid}", topology=False)
            n.start()

    def pause_node(self, nid: str) -> None:
        """SIGSTOP of a node."""
        n = self.nodes[nid]
        if n.status is NodeStatus.UP:
            n.pause()
            self._fault(f"pause {nid}", topology=False)

    def resume_node(self, nid: str) -> None:
        """SIGCONT of a node."""
        n = self.nodes[nid]
        if n.status is NodeStatus.PAUSED:
            self._fault(f"resume {nid}", topology=False)
            n.resume()

    def grace(self, nid: str, seconds: float, via: str | None = None) -> float:
        """Node ``nid`` asks replica ``via`` (the leader by default) for a grace window of
        ``seconds`` (0: its end), as ``Membership.Grace`` proposes it; returns the seconds
        proposed (capped by ``max_grace``). The node first stops counting its grants
        (session rule 10).

        Raises:
            ProposalDropped: ``via`` knows no leader.
        """
        lead = self.leader() if via is None else self.replicas[via]
        assert lead is not None and lead.core is not None, "no replica to ask"
        incarnation = self.nodes[nid].ask_grace()
        now = self.q.now
        rid = f"grace-{len(self.grace_asks)}"
        self.grace_asks[rid] = (nid, lead.id, lead.boots)
        granted = lead.core.propose_grace(nid, incarnation, seconds, "sim", rid, now, wall=now)
        self.trace(f"{nid}#{incarnation} asks {lead.id} for a grace window of {granted:g}s")
        lead.poke()
        return granted

    def grace_answered(self, rid: str, outcome: GraceOutcome) -> None:
        """Replica ``rid`` applied a grace ask: the one asked answers the node (the
        answer's network trip is left out: the node learns it when it is applied)."""
        nid, asked, boot = self.grace_asks[outcome.request_id]
        if (rid, self.replicas[rid].boots) != (asked, boot):
            return  # another replica, or the one asked after a restart: the call is gone
        del self.grace_asks[outcome.request_id]
        node = self.nodes[nid]
        if node.session is not None and outcome.accepted:
            node.session.grace_answered(outcome.index, outcome.record is not None)
            self.trace(f"{nid} is told its grace window is committed at {outcome.index}")

    def partition(self, *groups: list[str]) -> None:
        """Cuts every link between the groups, both ways (others stay connected)."""
        self.net.partition(*groups)
        self._fault("partition " + " | ".join(" ".join(g) for g in groups), topology=True)

    def cut(self, src: str, dst: str, *, both: bool = False) -> None:
        """Cuts ``src -> dst`` (and back with ``both``)."""
        if both:
            self.net.cut_both(src, dst)
        else:
            self.net.cut(src, dst)
        arrow = "<->" if both else "->"
        self._fault(
            f"cut {src} {arrow} {dst}", topology=src in self.replicas and dst in self.replicas
        )

    def isolate(self, x: str) -> None:
        """Cuts ``x`` from every other endpoint, both ways."""
        others = [e for e in (*self.replicas, *self.nodes, *self.subs) if e != x]
        self.net.partition([x], others)
        self._fault(f"isolate {x}", topology=True)

    def heal(self) -> None:
        """Removes every cut."""
        self.net.heal()
        self._fault("heal", topology=True)

    def disconnect_sub(self, sid: str) -> None:
        """Closes a subscriber's stream; it stays away until ``connect_sub``."""
        self.subs[sid].disconnect(manual=True)
        self._fault(f"disconnect {sid}", topology=False)

    def connect_sub(self, sid: str, rid: str) -> None:
        """Resumes a subscriber on replica ``rid`` from its last epoch."""
        self.subs[sid].manual = False
        self.subs[sid].connect(self.replicas[rid])

    # --- state and liveness ----------------------------------------------------------------------

    def leader(self) -> SimReplica | None:
        """The up replica that is leader and in quorum now, if any."""
        now = self.q.now
        for r in self.replicas.values():
            if r.core is not None and r.role is Role.LEADER and r.core.in_quorum(now):
                return r
        return None

    def configurations(self) -> list[ArbiterConfiguration]:
        """The committed configuration and every one in force on an up replica, by index."""
        confs = {self.checker.conf.index: self.checker.conf}
        for r in self.replicas.values():
            if r.core is not None and r.joined:
                c = r.core.configuration
                confs.setdefault(c.index, c)
        return [confs[i] for i in sorted(confs)]

    def majority_connected(self) -> bool:
        """True if, for every configuration in play (``configurations``), a majority of
        its voters are up and pairwise connected both ways."""
        up = [r for r, x in self.replicas.items() if x.core is not None]
        c = self.net.connected
        for conf in self.configurations():
            voters = [r for r in up if r in conf.voters]
            if not any(
                all(c(a, b) and c(b, a) for a, b in itertools.combinations(group, 2))
                for group in itertools.combinations(voters, conf.quorum)
            ):
                return False
        return True

    def check_leader(self, bound: float) -> None:
        """L1 (see ``invariants``)."""
        if self.q.now - self.topology_since < bound or not self.majority_connected():
            return
        if self.leader() is None:
            roles = "; ".join(r.describe(self.q.now) for r in self.replicas.values())
            self.checker.fail(
                f"L1: no leader in quorum {bound:g}s after the last topology change "
                f"with a connected majority ({roles})"
            )

    def check_settled(self, since: float) -> None:
        """L2 (see ``invariants``); ``since`` is when the last fault healed."""
        fail = self.checker.fail
        views: list[tuple[str, View]] = []
        for r in self.replicas.values():
            if r.retired or r.gone:
                continue
            if r.core is None:
                fail(f"L2: {r.id} is still down")
            else:
                views.append((r.id, r.core.state.view()))
        rid, view = views[0]
        for other, v in views[1:]:
            if v != view:
                fail(f"L2: {rid} holds epoch {view.epoch}, {other} epoch {v.epoch}")
        for n in self.nodes.values():
            m = view.get(n.id)
            s = n.session
            if s is not None and n.status is NodeStatus.UP:
                if m is None or m.state is not MemberState.ALIVE or m.incarnation != s.incarnation:
                    fail(f"L2: {n.id}#{s.incarnation} runs but the view has {m}, since {since:.3f}")
            elif n.status is NodeStatus.CRASHED and m is not None and m.state is MemberState.ALIVE:
                fail(
                    f"L2: {n.id} crashed (last incarnation {n.last_incarnation}) but is "
                    f"ALIVE#{m.incarnation} at epoch {view.epoch}, since {since:.3f}"
                )
        for sub in self.subs.values():
            if sub.view != view:
                fail(f"L2: {sub.id} holds epoch {sub.epoch}, the replicas {view.epoch}")

    def status_lines(self) -> list[str]:
        """One line per replica, node and subscriber."""
        now = self.q.now
        out = [r.describe(now) for r in self.replicas.values() if not r.retired]
        out += [n.describe(now) for n in self.nodes.values()]
        for s in self.subs.values():
            at = s.feed.replica.id if s.feed is not None else "nobody"
            out.append(f"{s.id}: epoch {s.epoch} via {at}")
        return out
