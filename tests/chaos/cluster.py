"""A membership cluster on a :class:`~tests.chaos.netlab.Lab`, and what its members saw.

Every replica (``a1``..), node (``n1``..) and subscriber (``s1``..) runs as its
own ``membership`` process in its own host namespace; replicas listen on
``<host ip>:7000``. Replica views are read through the probe
(:mod:`tests.chaos.probe`) on the management host, which no fault cuts.

:class:`Feed` checks what one subscriber printed (``watch --json``): it starts
with a snapshot, change epochs are contiguous (several changes may share an
epoch, a later snapshot may jump ahead), no change arrives twice.
:class:`NodeLog` reads what one node printed (ALIVE, fenced, unfenced,
rejoining); :meth:`ChaosCluster.holds_every_lease` what it logged of the
leases it holds.

Time bounds used by the scenarios are here, each with its reasoning. The
figures at default settings are small (D = 0.75 s, a new leader 1 to 2.5 s
after the old one is lost); the slack on top is for a loaded 2-core machine
(scheduling, Python starts, fsync), not a promise of the product.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from arbiter.config import ArbiterConfig
from membership._config import ClientConfig
from membership.testing.localcluster import arbiter_args, membership_command, node_args
from tests.chaos.netlab import Host, Lab, Proc, wait_until

__all__ = [
    "ARBITER_PORT",
    "BACKOFF_MAX",
    "DEAD_WITHIN",
    "ELECTION_TIMEOUT",
    "LEADER_WITHIN",
    "REJOIN_WITHIN",
    "RESTART_GRACE",
    "SETTLE_WITHIN",
    "SLACK",
    "START_WITHIN",
    "ChaosCluster",
    "D",
    "Feed",
    "NodeLog",
    "assert_no_change_since",
    "converge",
    "view_members",
    "window",
]

_CONFIG = ArbiterConfig.local()
ARBITER_PORT = 7000
# Suspicion time D (0.75 s): H x missed heartbeats.
D = _CONFIG.suspect_after
ELECTION_TIMEOUT = _CONFIG.election_timeout  # 1.0 s
RESTART_GRACE = _CONFIG.restart_grace  # 3.0 s
# The SDK's reconnect backoff never waits longer than this between attempts.
BACKOFF_MAX = ClientConfig().backoff_max  # 1.0 s
# Slack for the machine: 2 cores shared with other test runs, a dozen Python
# processes with gRPC per scenario. Observed delays of a second are normal.
SLACK = 4.0

# Processes started to a leader elected and every node ALIVE everywhere: Python
# and gRPC starts take 1 to 3 s each under load, then one election (about 1 to
# 2.5 s).
START_WITHIN = 40.0
# Silence to DEAD committed and seen: D until the last replica of the quorum
# suspects, one Raft round, the subscriber's delivery.
DEAD_WITHIN = D + SLACK
# A leader lost to a new one elected: the README's measured 1.1 to 2.2 s
# (election timeout 1 s, randomised up to 2x, PreVote round), plus slack.
LEADER_WITHIN = 2.5 * ELECTION_TIMEOUT + SLACK
# Heal to a node rejoined (ALIVE at a new incarnation everywhere): its TCP
# connections were dropped silently, so it may first have to notice that
# (ack timeout, TCP_USER_TIMEOUT = keepalive timeout 5 s for a connection with
# unacknowledged bytes), reconnect (backoff up to 1 s; a SYN lost during the
# cut is retried by the kernel after 1, 2, 4 s), then be heard by a quorum.
REJOIN_WITHIN = ClientConfig().keepalive_timeout + 8 * BACKOFF_MAX + SLACK
# Heal to every replica and subscriber at the same view: a subscriber whose
# stream died silently finds out by HTTP/2 keepalive (ping after 10 s idle,
# answered by a reset) or its 12 s idle timeout, then resumes.
SETTLE_WITHIN = ClientConfig().stream_idle_timeout + REJOIN_WITHIN


# --- what nodes printed ---------------------------------------------------------------------

_ALIVE = re.compile(r"^(?P<id>\S+): incarnation (?P<inc>\d+) is (?P<state>\w+)$")
_FENCE = re.compile(r"^(?P<id>\S+): (?P<word>fenced|unfenced) \(fencing epoch (?P<epoch>\d+)\)$")
# Logged (stderr) when the set of arbiters whose leases the node holds changes.
_LEASES = re.compile(r" holds leases from (?P<held>\d+) of (?P<voters>\d+) arbiters ")
_REJOIN = re.compile(
    r"^(?P<id>\S+): incarnation (?P<old>\d+) over \((?P<reason>[^)]*)\); rejoining as (?P<new>\d+)$"
)


@dataclass(frozen=True, slots=True)
class NodeLine:
    t: float  # arrival time (test process monotonic clock)
    kind: str  # "state", "fenced", "unfenced", "rejoin", "other"
    incarnation: int | None = None
    state: str | None = None
    text: str = ""


_QUORUM_LOG = re.compile(
    r": (?P<rid>\S+): in_quorum=(?P<q>True|False) leader=(?P<leader>\S+) term=(?P<term>\d+) "
    r"role=(?P<role>\w+)"
)


class NodeLog:
    """What one ``membership node`` process printed, parsed."""

    def __init__(self, proc: Proc) -> None:
        self.proc = proc
        self.lines: list[NodeLine] = []
        for t, text in proc.timed_lines():
            if m := _ALIVE.match(text):
                self.lines.append(NodeLine(t, "state", int(m["inc"]), m["state"], text))
            elif m := _FENCE.match(text):
                self.lines.append(NodeLine(t, m["word"], text=text))
            elif m := _REJOIN.match(text):
                self.lines.append(NodeLine(t, "rejoin", int(m["new"]), text=text))
            else:
                self.lines.append(NodeLine(t, "other", text=text))

    def since(self, t: float) -> list[NodeLine]:
        return [x for x in self.lines if x.t >= t]

    def fenced_at(self, since: float = 0.0) -> list[float]:
        """Arrival times of "fenced" lines at or after ``since``."""
        return [x.t for x in self.since(since) if x.kind == "fenced"]

    def fenced(self) -> bool:
        """True when the latest fence line says fenced (False before any)."""
        fences = [x for x in self.lines if x.kind in ("fenced", "unfenced")]
        return bool(fences) and fences[-1].kind == "fenced"

    def unfenced(self) -> bool:
        """True once it has printed "unfenced" and not "fenced" since."""
        fences = [x for x in self.lines if x.kind in ("fenced", "unfenced")]
        return bool(fences) and fences[-1].kind == "unfenced"

    def alive_incarnations(self) -> list[int]:
        """Incarnations the node reported ALIVE, in order."""
        return [
            x.incarnation
            for x in self.lines
            if x.kind == "state" and x.state == "ALIVE" and x.incarnation is not None
        ]

    def incarnation(self) -> int | None:
        """The latest incarnation it reported ALIVE at."""
        incs = self.alive_incarnations()
        return incs[-1] if incs else None


# --- what subscribers saw -------------------------------------------------------------------


class Feed:
    """What one ``watch --json`` subscriber printed, and its checks."""

    def __init__(self, proc: Proc) -> None:
        self.proc = proc
        self.name = proc.name
        self.timed: list[tuple[float, dict[str, Any]]] = [
            (t, json.loads(line)) for t, line in proc.timed_lines() if line.startswith("{")
        ]
        self.events = [ev for _, ev in self.timed]

    def check(self) -> None:
        """Asserts the feed's rules: a snapshot first, contiguous epochs, no duplicate.

        Raises:
            AssertionError: naming the subscriber and the offending line.
        """
        last: int | None = None
        opened: set[tuple[str, int, str]] | None = None  # changes seen in epoch `last`
        seen: set[tuple[str, int, str]] = set()
        for i, ev in enumerate(self.events):
            where = f"{self.name} line {i}: {ev}"
            if ev["type"] == "snapshot":
                assert last is None or ev["epoch"] >= last, f"snapshot went back: {where}"
                last, opened = ev["epoch"], None
                seen |= {(m["node_id"], m["incarnation"], m["state"]) for m in ev["members"]}
            elif ev["type"] == "change":
                assert last is not None, f"change before any snapshot: {where}"
                key = (ev["node_id"], ev["incarnation"], ev["state"])
                assert key not in seen, f"duplicate change: {where}"
                if ev["epoch"] == last and opened is not None:
                    pass  # another change of the same committed entry
                else:
                    assert ev["epoch"] == last + 1, f"epoch not {last} + 1 (gap or repeat): {where}"
                    last, opened = ev["epoch"], set()
                opened.add(key)
                seen.add(key)

    def serving(self) -> str | None:
        """The replica that sent the latest event."""
        return self.events[-1]["arbiter"] if self.events else None

    def epoch(self) -> int | None:
        """The epoch of the latest snapshot or change."""
        epochs = [ev["epoch"] for ev in self.events if ev["type"] in ("snapshot", "change")]
        return epochs[-1] if epochs else None

    def members(self) -> dict[str, tuple[int, str]]:
        """node_id -> (incarnation, state) after everything it received."""
        out: dict[str, tuple[int, str]] = {}
        for ev in self.events:
            if ev["type"] == "snapshot":
                out = {m["node_id"]: (m["incarnation"], m["state"]) for m in ev["members"]}
            elif ev["type"] == "change":
                cur = out.get(ev["node_id"])
                if cur is None or ev["incarnation"] >= cur[0]:
                    out[ev["node_id"]] = (ev["incarnation"], ev["state"])
        return out

    def changes(
        self, node_id: str | None = None, state: str | None = None, since: float = 0.0
    ) -> list[dict[str, Any]]:
        """Change events (for one node, one state), received at or after ``since``."""
        return [
            ev
            for t, ev in self.timed
            if ev["type"] == "change"
            and t >= since
            and (node_id is None or ev["node_id"] == node_id)
            and (state is None or ev["state"] == state)
        ]

    def received_at(
        self, pred: Callable[[dict[str, Any]], bool], since: float = 0.0
    ) -> float | None:
        """Arrival time of the first event matching ``pred`` received at or after ``since``."""
        return next((t for t, ev in self.timed if t >= since and pred(ev)), None)


def view_members(view: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """node_id -> (incarnation, state) of a ``view --json`` object."""
    return {m["node_id"]: (m["incarnation"], m["state"]) for m in view["members"]}


# --- the cluster ----------------------------------------------------------------------------


@dataclass
class ChaosCluster:
    """Replicas, nodes and subscribers of one scenario, each on its own lab host."""

    lab: Lab
    arbiters: dict[str, Host] = field(default_factory=dict)
    nodes: dict[str, Proc] = field(default_factory=dict)
    watchers: dict[str, Proc] = field(default_factory=dict)
    replicas: dict[str, Proc] = field(default_factory=dict)
    _probe: Proc | None = None
    _probe_count: int = 0
    _runner: Proc | None = None
    _runner_count: int = 0

    def _membership(self, host: Host, name: str, *argv: str, level: str = "info") -> Proc:
        return host.run(name, membership_command(*argv, log_level=level))

    # --- addresses ---

    def addr(self, rid: str) -> str:
        return self.arbiters[rid].addr(ARBITER_PORT)

    def arbiter_list(self, first: str | None = None) -> str:
        """Every replica's address, optionally ``first``'s first."""
        ids = sorted(self.arbiters)
        if first is not None:
            ids.remove(first)
            ids.insert(0, first)
        return ",".join(self.addr(i) for i in ids)

    def host(self, name: str) -> Host:
        return self.lab.host(name)

    # --- processes ---

    def start_arbiters(self, n: int = 3, *extra: str) -> None:
        """Replicas a1..an on hosts a1..an, ``--preset local``, data dirs in the workdir."""
        self.arbiters = {f"a{i + 1}": self.lab.host(f"a{i + 1}") for i in range(n)}
        addresses = {rid: self.addr(rid) for rid in self.arbiters}
        for rid, host in self.arbiters.items():
            data_dir = self.lab.workdir / f"{rid}.data"
            self.replicas[rid] = self._membership(
                host, rid, *arbiter_args(rid, addresses, data_dir, "--preset", "local", *extra)
            )

    def start_node(self, node_id: str, *extra: str) -> Proc:
        """A node on its own host, heartbeating to every replica (no status probes)."""
        addresses = self.arbiter_list().split(",")
        proc = self._membership(
            self.lab.host(node_id),
            node_id,
            *node_args(node_id, addresses, "--no-status-probes", *extra),
        )
        self.nodes[node_id] = proc
        return proc

    def start_watch(self, name: str, first: str, log_level: str = "warning") -> Proc:
        """A ``watch --json`` subscriber on its own host, listing ``first``'s replica first
        (``log_level`` "debug" logs each resubscription to its stderr)."""
        proc = self._membership(
            self.lab.host(name),
            name,
            *("watch", "--json", "--arbiters", self.arbiter_list(first)),
            level=log_level,
        )
        self.watchers[name] = proc
        return proc

    # --- the arbiter group (README "Replacing an arbiter") ---

    def admin_arbiters(self, *argv: str, via: Iterable[str]) -> subprocess.CompletedProcess[str]:
        """``membership admin arbiters ARGV --arbiters <via's addresses>``, run to completion
        on the management host (which no fault cuts)."""
        addresses = ",".join(self.addr(rid) for rid in via)
        host = self.lab.host("probe", mgmt=True)
        argv_full = membership_command("admin", "arbiters", *argv, "--arbiters", addresses)
        return host.sh(*argv_full, timeout=60.0)

    def query(self, *argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """``membership ARGV`` run to completion on the management host to read state,
        as :meth:`admin_arbiters` runs it but in one long-lived process there
        (:mod:`tests.integration.clirunner`: the CLI's ``main`` with its output
        captured), so that a poll costs no Python start."""
        if self._runner is None:
            host = self.lab.host("probe", mgmt=True)
            argv_runner = [sys.executable, "-m", "tests.integration.clirunner"]
            self._runner = host.run("clirunner", argv_runner)
        self._runner.send_line(json.dumps(list(argv)))
        self._runner_count += 1
        lines = self._runner.wait_lines(self._runner_count, timeout)
        reply = json.loads(lines[self._runner_count - 1])
        return subprocess.CompletedProcess(
            ["membership", *argv], reply["rc"], reply["stdout"], reply["stderr"]
        )

    def roles(self, via: Iterable[str]) -> dict[str, str]:
        """Arbiter id -> "voter" or "learner" as ``admin arbiters list`` gives it ({} when
        the call failed); polled, so through :meth:`query`."""
        addresses = ",".join(self.addr(rid) for rid in via)
        r = self.query("admin", "arbiters", "list", "--json", "--arbiters", addresses)
        if r.returncode != 0:
            return {}
        return {row["id"]: row["role"] for row in map(json.loads, r.stdout.splitlines())}

    def join_arbiter(self, rid: str, via: Iterable[str]) -> Proc:
        """Adds replica ``rid`` on a new host as a learner (``admin arbiters add``) and
        starts it with ``--join`` (``via``'s addresses) on an empty data dir."""
        via = list(via)
        host = self.lab.host(rid)
        address = host.addr(ARBITER_PORT)
        r = self.admin_arbiters("add", f"{rid}={address}", via=via)
        assert r.returncode == 0 and "learner" in r.stdout, (r.stdout, r.stderr)
        self.arbiters[rid] = host
        data_dir = self.lab.workdir / f"{rid}.data"
        assert not data_dir.exists()
        join = ",".join(self.addr(v) for v in via)
        argv = ("arbiter", "--id", rid, "--listen", address, "--join", join)
        self.replicas[rid] = self._membership(
            host, rid, *argv, "--data-dir", str(data_dir), "--preset", "local"
        )
        return self.replicas[rid]

    def forget_arbiter(self, rid: str) -> None:
        """Replica ``rid`` no longer answers views (it was removed, or its machine is gone)."""
        del self.arbiters[rid]

    # --- views through the probe ---

    def views(self, ids: Iterable[str] | None = None, timeout: float = 2.0) -> dict[str, Any]:
        """Each replica's ``view --json`` object, or ``{"error": ...}`` when it did not answer."""
        if self._probe is None:
            host = self.lab.host("probe", mgmt=True)
            self._probe = host.run("probe", [sys.executable, "-m", "tests.chaos.probe"])
        ids = sorted(self.arbiters) if ids is None else list(ids)
        self._probe.send_line(" ".join([str(timeout), *(self.addr(i) for i in ids)]))
        self._probe_count += 1
        lines = self._probe.wait_lines(self._probe_count, timeout + 30)
        answer: dict[str, dict[str, Any]] = json.loads(lines[self._probe_count - 1])
        return {rid: answer[self.addr(rid)] for rid in ids}

    def view(self, rid: str, timeout: float = 2.0) -> dict[str, Any]:
        v: dict[str, Any] = self.views([rid], timeout)[rid]
        return v

    def leader(self, among: Iterable[str] | None = None) -> str | None:
        """A replica that says it leads, in quorum (among ``among``, default all)."""
        for rid, v in self.views(among).items():
            if "error" not in v and v["in_quorum"] and v["leader"] == rid:
                return rid
        return None

    def wait_leader(self, timeout: float, among: Iterable[str] | None = None) -> str:
        ids = None if among is None else list(among)
        return str(wait_until(lambda: self.leader(ids), timeout, f"a leader among {ids or 'all'}"))

    def agreed(
        self, ids: Iterable[str] | None = None, expect: dict[str, str] | None = None
    ) -> dict[str, Any] | None:
        """The common view when every replica in ``ids`` answers, is in quorum, at the
        same epoch and members, and (when given) ``expect`` (node_id -> state) holds."""
        views = self.views(ids)
        vs = list(views.values())
        if any("error" in v or not v["in_quorum"] for v in vs):
            return None
        first: dict[str, Any] = vs[0]
        if any(v["epoch"] != first["epoch"] or view_members(v) != view_members(first) for v in vs):
            return None
        if expect is not None:
            states = {k: s for k, (_, s) in view_members(first).items()}
            if any(states.get(k) != s for k, s in expect.items()):
                return None
        return first

    def wait_agreed(
        self, timeout: float, ids: Iterable[str] | None = None, expect: dict[str, str] | None = None
    ) -> dict[str, Any]:
        ids = None if ids is None else list(ids)
        return dict(
            wait_until(
                lambda: self.agreed(ids, expect),
                timeout,
                f"replicas {ids or 'all'} in quorum at one view with {expect}",
                interval=0.1,
            )
        )

    def start(
        self, nodes: Iterable[str], watchers: dict[str, str] | None = None, arbiters: int = 3
    ) -> dict[str, Any]:
        """Starts replicas and nodes, waits for a leader and every node ALIVE,
        unfenced and holding a lease from every replica (:meth:`wait_every_lease`);
        then starts the subscribers (see :meth:`add_watchers`).

        Args:
            nodes: node ids.
            watchers: subscriber name -> the replica it lists first (and is served by).
            arbiters: how many replicas.

        Returns:
            The view every replica and subscriber holds.
        """
        self.start_arbiters(arbiters)
        node_ids = list(nodes)
        for nid in node_ids:
            self.start_node(nid)
        for nid in node_ids:
            self.wait_node(nid, lambda log: log.unfenced(), START_WITHIN, "unfenced")
        view = self.wait_agreed(START_WITHIN, expect=dict.fromkeys(node_ids, "ALIVE"))
        self.wait_every_lease(START_WITHIN)
        if watchers:
            view = self.add_watchers(watchers)
        return view

    def add_watchers(self, watchers: dict[str, str], log_level: str = "warning") -> dict[str, Any]:
        """Starts subscribers (name -> replica listed first), once the replicas agree,
        and waits until each holds their view, served by its first replica (a
        subscriber that started before the election would have moved to another
        replica and stayed there).

        Returns:
            The view.
        """
        view = self.wait_agreed(START_WITHIN)
        for name, first in watchers.items():
            self.start_watch(name, first, log_level)
        view = self.wait_agreed(START_WITHIN)
        for name, first in watchers.items():
            feed = self.wait_feed_at(name, view, START_WITHIN)
            assert feed.serving() == first, f"{name} is served by {feed.serving()}, not {first}"
        return view

    def quorum_log(self, rid: str) -> list[tuple[bool, str | None, int, str]]:
        """Replica ``rid``'s logged quorum transitions: (in_quorum, leader, term, role)."""
        out = []
        for m in _QUORUM_LOG.finditer(self.replicas[rid].stderr()):
            leader = None if m["leader"] == "None" else m["leader"]
            out.append((m["q"] == "True", leader, int(m["term"]), m["role"]))
        return out

    # --- what they saw ---

    def feed(self, name: str) -> Feed:
        return Feed(self.watchers[name])

    def node_log(self, node_id: str) -> NodeLog:
        return NodeLog(self.nodes[node_id])

    def wait_node(
        self, node_id: str, pred: Callable[[NodeLog], bool], timeout: float, what: str
    ) -> None:
        """Waits until ``pred`` holds for what node ``node_id`` printed."""
        wait_until(lambda: pred(self.node_log(node_id)), timeout, f"{node_id} {what}")

    def holds_every_lease(self, node_id: str) -> bool:
        """True when node ``node_id``'s latest "holds leases from N of M arbiters" log
        line has N == M (False before any)."""
        found = list(_LEASES.finditer(self.nodes[node_id].stderr()))
        return bool(found) and found[-1]["held"] == found[-1]["voters"]

    def wait_every_lease(self, timeout: float) -> None:
        """Waits until every node holds a lease from every replica. Before a replica is
        lost on purpose: ALIVE is not enough, a replica grants a lease only once it
        applied the node's ALIVE, so a node may hold two of three (and be fenced when
        one of those goes while the third's commit waits for an election)."""
        for nid, proc in self.nodes.items():
            if proc.alive():
                wait_until(
                    lambda nid=nid: self.holds_every_lease(nid),
                    timeout,
                    f"{nid} to hold a lease from every replica",
                    interval=0.1,
                )

    def wait_feed_at(self, name: str, view: dict[str, Any], timeout: float) -> Feed:
        """Waits until subscriber ``name`` holds ``view`` (epoch and members)."""

        def at() -> Feed | None:
            f = self.feed(name)
            ok = f.epoch() == view["epoch"] and f.members() == view_members(view)
            return f if ok else None

        feed: Feed = wait_until(at, timeout, f"{name} at epoch {view['epoch']}", interval=0.1)
        return feed

    def check_feeds(self) -> dict[str, Feed]:
        """Every subscriber's feed, checked (contiguous, no duplicate)."""
        feeds = {name: self.feed(name) for name in self.watchers}
        for f in feeds.values():
            f.check()
        return feeds

    def dump(self) -> str:
        parts = [self.lab.dump()]
        for name, p in sorted({**self.nodes, **self.watchers}.items()):
            parts.append(f"--- {name} stdout\n" + "\n".join(p.lines()[-60:]))
        return "\n".join(parts)


def window(seconds: float, check: Callable[[], None], interval: float = 0.25) -> None:
    """Runs ``check`` repeatedly for ``seconds`` (a bounded observation window in which
    something must NOT happen); the first failing check ends it."""
    deadline = time.monotonic() + seconds
    while True:
        check()
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)


# --- assertions shared by the scenarios -----------------------------------------------------


def assert_no_change_since(cluster: ChaosCluster, since: float, epoch: int) -> None:
    """Nothing changed since ``since``: no subscriber got a change, no node printed
    "fenced", every replica that answers in quorum is still at ``epoch``."""
    for name in cluster.watchers:
        got = cluster.feed(name).changes(since=since)
        assert not got, f"{name} got changes: {got}"
    for nid in cluster.nodes:
        fenced = cluster.node_log(nid).fenced_at(since)
        assert not fenced, f"{nid} was fenced: {cluster.nodes[nid].lines()[-5:]}"
    for rid, v in cluster.views().items():
        if "error" not in v and v["in_quorum"]:
            assert v["epoch"] == epoch, f"{rid} moved from epoch {epoch}: {v}"


def converge(cluster: ChaosCluster, expect: dict[str, str], timeout: float) -> dict[str, Any]:
    """Waits until every replica holds one view with ``expect`` (node_id -> state), every
    subscriber holds that view, and every running node is unfenced; checks every feed.

    Returns:
        The view.
    """
    view = cluster.wait_agreed(timeout, expect=expect)
    for name in cluster.watchers:
        cluster.wait_feed_at(name, view, timeout)
    for nid, p in cluster.nodes.items():
        if p.alive():
            cluster.wait_node(nid, lambda log: not log.fenced(), timeout, "not fenced")
    cluster.check_feeds()
    return view
