"""Data-driven scenario files in the style of etcd raft's interaction tests.

A file is a sequence of blocks::

    # comments start with a hash
    command arg arg key=value
    ----
    the expected output, one line per trace line or answer

A block's output ends at the first blank line. ``run_file`` executes each
command on one world, collects what it printed, and compares it with the
expected text; ``SIM_REWRITE=1`` rewrites the files with the actual output
instead. Every invariant of ``invariants`` is checked after every step, and a
``check`` command fails the scenario at once, whatever the file says.

Commands (``T`` is seconds of virtual time):

``cluster replicas=3 nodes=2 subscribers=1 seed=1 history=3``
    builds and boots the world (a clean network, no random faults).
``run T`` | ``wait leader|dead N|alive N|fenced N|unfenced N [max=T]``
    advances the clock (``wait`` stops as soon as the condition holds and
    fails if it does not hold within ``max``, default 10).
``partition A B | C D`` | ``cut A->B`` | ``cut A<->B`` | ``isolate X`` | ``heal``
``crash X..`` | ``restart X..`` | ``pause N`` | ``resume N``
``disconnect S`` | ``connect S R``
``status`` | ``views`` | ``suspects N`` | ``ranks``
``grace N SECONDS [via=R]``
    node N asks replica R (the leader) for a grace window (0: its end).
``operate STEP R [STEP R ...]``
    hands the operator (``reconfig``) one membership operation, steps
    ``add``, ``voter``, ``promote``... as in ``reconfig`` (``wipe``, ``add``,
    ``voter``, ``remove``), e.g. ``operate wipe r3 add r4 voter r4 remove r3``.
``@leader`` and ``@followers`` in a command name the leader in quorum and
the other replicas, ``@down`` the crashed replicas, when the command runs.
``check alive|dead|fenced|unfenced|never-dead|never-suspected|leader|voters ARG``

``alive N``: every running replica's view has N ALIVE at its session's
incarnation; ``dead N``: DEAD at some incarnation; ``leader R1,R2``: the
leader in quorum is one of them; ``never-dead N``: no DEAD of N was ever
committed; ``never-suspected N``: no SUSPECT observation of N was ever
committed; ``voters R1,R2``: the committed configuration's voters are these
(no learner) and the operator is idle (also a ``wait`` condition).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from membership.shared.view import MemberState
from tests.sim.network import NetProfile
from tests.sim.world import World

__all__ = ["ScenarioError", "run_file"]

_TIME = re.compile(r"^\s*(\d+\.\d+) ")


class ScenarioError(AssertionError):
    """A scenario command failed, or its output is not the expected one."""


def _blocks(text: str) -> list[tuple[int, str, list[str]]]:
    """Splits a file into ``(line number, command, expected lines)``."""
    out: list[tuple[int, str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if not line or line.startswith("#"):
            i += 1
            continue
        start, command = i + 1, line
        i += 1
        if i >= len(lines) or lines[i].strip() != "----":
            raise ScenarioError(f"line {start}: '----' expected after {command!r}")
        i += 1
        expected: list[str] = []
        while i < len(lines) and lines[i].strip():
            expected.append(lines[i].rstrip())
            i += 1
        out.append((start, command, expected))
    return out


class _Runner:
    def __init__(self) -> None:
        self.w: World | None = None

    @property
    def world(self) -> World:
        if self.w is None:
            raise ScenarioError("no cluster yet: start with 'cluster'")
        return self.w

    def execute(self, command: str) -> list[str]:
        if "@down" in command:
            down = [r.id for r in self.world.replicas.values() if r.core is None]
            command = command.replace("@down", " ".join(down))
        if "@leader" in command or "@followers" in command:
            lead = self.world.leader()
            if lead is None:
                raise ScenarioError(f"{command!r}: no leader to name")
            rest = " ".join(r for r in self.world.replica_ids if r != lead.id)
            command = command.replace("@leader", lead.id).replace("@followers", rest)
        words = command.split()
        args = [a for a in words[1:] if "=" not in a]
        kw = dict(a.split("=", 1) for a in words[1:] if "=" in a)
        w = self.w
        mark = len(w.lines) if w is not None else 0
        answer = self._dispatch(words[0], args, kw)
        w = self.world
        traced = [_TIME.sub(r"\1 ", line).strip() for line in w.lines[mark:]]
        return traced + answer

    def _dispatch(self, name: str, args: list[str], kw: dict[str, str]) -> list[str]:
        if name == "cluster":
            self.w = World(
                int(kw.get("seed", "1")),
                replicas=int(kw.get("replicas", "3")),
                nodes=int(kw.get("nodes", "2")),
                subscribers=int(kw.get("subscribers", "1")),
                history=int(kw.get("history", "3")),
                profile=NetProfile(),
                verbose=True,
            )
            self.w.boot()
            return []
        w = self.world
        simple: dict[str, Callable[[str], None]] = {
            "isolate": w.isolate,
            "pause": w.pause_node,
            "resume": w.resume_node,
            "disconnect": w.disconnect_sub,
        }
        if name in simple:
            simple[name](args[0])
        elif name == "crash":
            for x in args:
                (w.crash_replica if x in w.replicas else w.crash_node)(x)
        elif name == "restart":
            for x in args:
                (w.restart_replica if x in w.replicas else w.restart_node)(x)
        elif name == "heal":
            w.heal()
        elif name == "connect":
            w.connect_sub(args[0], args[1])
        elif name == "partition":
            groups = " ".join(args).split("|")
            w.partition(*(g.split() for g in groups))
        elif name == "cut":
            both = "<->" in args[0]
            a, b = re.split("<->|->", args[0])
            w.cut(a, b, both=both)
        elif name == "run":
            w.run_until(w.q.now + float(args[0]))
        elif name == "wait":
            return self._wait(args, float(kw.get("max", "10")))
        elif name == "status":
            return w.status_lines()
        elif name == "views":
            return [self._view_line(rid) for rid in w.replicas]
        elif name == "ranks":
            return [self._ranks_line(rid) for rid in w.replicas]
        elif name == "grace":
            w.grace(args[0], float(args[1]), kw.get("via"))
        elif name == "suspects":
            return [self._suspects_line(rid, args[0]) for rid in w.replicas]
        elif name == "operate":
            w.operator.submit(list(zip(args[::2], args[1::2], strict=True)))
        elif name == "check":
            return [self._check(args[0], args[1] if len(args) > 1 else "")]
        else:
            raise ScenarioError(f"unknown command {name!r}")
        return []

    # --- conditions ---------------------------------------------------------------------

    def _view_line(self, rid: str) -> str:
        core = self.world.replicas[rid].core
        if core is None:
            return f"{rid}: down"
        v = core.state.view()
        members = ", ".join(f"{m.node_id}#{m.incarnation} {m.state.value}" for m in v.members)
        return f"{rid} epoch {v.epoch}: {members or '(empty)'}"

    def _ranks_line(self, rid: str) -> str:
        core = self.world.replicas[rid].core
        if core is None:
            return f"{rid}: down"
        v = core.state.view()
        jobs = "; ".join(
            f"{j.job}@{j.epoch} " + " ".join(f"{n}={r}" for n, r in j.ranks.items()) for j in v.jobs
        )
        return f"{rid} epoch {v.epoch}: {jobs or '(no job)'}"

    def _suspects_line(self, rid: str, node_id: str) -> str:
        r = self.world.replicas[rid]
        if r.core is None:
            return f"{rid}: down"
        committed = ", ".join(r.core.state.suspected_by(node_id)) or "nobody"
        local = "suspects" if node_id in r.core.observer.suspects() else "trusts"
        return f"{rid} {local} {node_id}; committed suspicions: {committed}"

    def _holds(self, what: str, arg: str) -> bool:
        w = self.world
        if what == "voters":
            conf = w.checker.conf
            return not conf.learners and not w.operator.busy and list(conf.voters) == arg.split(",")
        if what == "leader":
            lead = w.leader()
            return lead is not None and (not arg or lead.id in arg.split(","))
        if what in ("fenced", "unfenced"):
            node = w.nodes[arg]
            s = node.session
            return s is not None and s.fenced(node.local(w.q.now)) == (what == "fenced")
        if what not in ("alive", "dead"):
            raise ScenarioError(f"unknown condition {what!r}")
        up = [r.core for r in w.replicas.values() if r.core is not None]
        s = w.nodes[arg].session
        for core in up:
            m = core.state.member(arg)
            if what == "dead" and (m is None or m.state is not MemberState.DEAD):
                return False
            if what == "alive" and (
                s is None
                or m is None
                or m.state is not MemberState.ALIVE
                or m.incarnation != s.incarnation
            ):
                return False
        return bool(up)

    def _wait(self, args: list[str], limit: float) -> list[str]:
        w = self.world
        what, arg = args[0], args[1] if len(args) > 1 else ""
        start = w.q.now
        end = start + limit
        q = w.q
        while not self._holds(what, arg):
            nt = q.next_time()
            if nt is None or nt > end:
                raise ScenarioError(f"wait {what} {arg}: not within {limit:g}s")
            q.run_next()
        return [f"{what} {arg}".strip() + f" after {w.q.now - start:.3f}s"]

    def _check(self, what: str, arg: str) -> str:
        w = self.world
        c = w.checker
        if what == "never-dead":
            deaths = sorted(k for n, k in c.dead if n == arg)
            ok, detail = not deaths, f"{arg} was DEAD at incarnations {deaths}"
        elif what == "never-suspected":
            by = sorted(f"{r}#{k}" for n, r, k in c.suspected if n == arg)
            ok, detail = not by, f"{arg} was suspected in committed observations {by}"
        else:
            ok, detail = self._holds(what, arg), f"{what} {arg} does not hold"
        if not ok:
            raise ScenarioError(f"check {what} {arg}: {detail}")
        return "ok"


def run_file(path: Path, *, rewrite: bool | None = None, compare: bool = True) -> None:
    """Runs one scenario file and compares (or, with ``rewrite``, rewrites) its output.

    Args:
        path: the scenario file.
        rewrite: write the actual output into the file (default: ``SIM_REWRITE=1``).
        compare: compare with the expected output (False: only run the commands
            and their checks, e.g. for a file whose expected output is unknown).

    Raises:
        ScenarioError: a command failed or printed something else than expected.
        InvariantViolation: an invariant broke during the scenario.
    """
    if rewrite is None:
        rewrite = os.environ.get("SIM_REWRITE") == "1"
    text = path.read_text()
    runner = _Runner()
    out: list[tuple[str, list[str]]] = []
    diffs: list[str] = []
    for lineno, command, expected in _blocks(text):
        actual = runner.execute(command) or ["ok"]
        if compare and actual != expected:
            diffs.append(
                f"{path.name}:{lineno}: {command}\n--- expected\n"
                + "\n".join(expected)
                + "\n--- actual\n"
                + "\n".join(actual)
            )
        out.append((command, actual))
    if rewrite:
        path.write_text(_render(text, out))
    elif diffs:
        raise ScenarioError("\n\n".join(diffs) + "\n\n(SIM_REWRITE=1 rewrites the files)")


def _render(text: str, results: list[tuple[str, list[str]]]) -> str:
    """The file's text with each block's output replaced by ``results``, comments kept."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    k = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            out.append(line)
            i += 1
            continue
        _, actual = results[k]
        k += 1
        out += [line, "----", *actual]
        i += 2
        while i < len(lines) and lines[i].strip():
            i += 1
    return "\n".join(out) + "\n"
