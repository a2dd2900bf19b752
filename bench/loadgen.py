"""Builds and drives the Go load generator of the scale benchmark (``bench/loadgen/``).

Python cannot produce the load of 10,000 nodes on this machine (50,000
heartbeats/s to 3 replicas at 0.6 s), so the load is a Go program built from
Debian's packages (golang-go, golang-google-grpc-dev,
golang-google-protobuf-dev; installed with apt-get when missing) offline, in
GOPATH mode against ``/usr/share/gocode``. What it does, its flags and its
output: ``bench/loadgen/main.go``'s package comment.

- :func:`binary` builds it once into ``bench/.build/`` (gitignored), named by
  the hash of its sources, so an edit rebuilds it;
- :class:`Fleet` runs ``--count`` simulated nodes over P ``loadgen hb``
  processes, sends ``join`` and ``kill`` commands, and sums their reports;
- :class:`Process` is one ``loadgen`` process of any mode (``sub``, ``etcd``),
  its JSON lines timestamped as they arrive.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from detection_common import Procs, cpu_seconds, say

from membership.testing.localcluster import die_with_parent

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "bench" / "loadgen"
BUILD = ROOT / "bench" / ".build"
GOPATH = Path("/usr/share/gocode")
PACKAGES = ("golang-go", "golang-google-grpc-dev", "golang-google-protobuf-dev")


def _apt_install(pkgs: Sequence[str]) -> None:
    """apt-get install (with sudo -n when not root), then update and retry once."""
    apt = shutil.which("apt-get")
    if apt is None:
        raise RuntimeError(f"the load generator needs {' '.join(pkgs)} and there is no apt-get")
    cmd = [apt, "install", "-y", "-q", "--no-install-recommends", *pkgs]
    if os.geteuid() != 0:
        cmd = ["sudo", "-n", *cmd]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    say(f"loadgen: installing {' '.join(pkgs)} with apt-get (Debian packages) ...")
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run([*cmd[: cmd.index(apt) + 1], "update", "-q"], env=env, capture_output=True)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"apt-get install {' '.join(pkgs)} failed: {r.stderr[-400:]}")


_built: Path | None = None


def binary() -> Path:
    """The load generator's path, built (and its Debian packages installed) when missing;
    the same binary for the whole run of this process, even if the sources change meanwhile.

    Raises:
        RuntimeError: the packages cannot be installed or the build fails.
    """
    global _built
    if _built is None:
        _built = _build()
    return _built


def _build() -> Path:
    sources = sorted(SOURCE.glob("*.go"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
    out = BUILD / f"loadgen-{digest}"
    if out.exists():
        return out
    if shutil.which("go") is None or not (GOPATH / "src/google.golang.org/grpc").is_dir():
        _apt_install(PACKAGES)
    BUILD.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": str(GOPATH),
        "GOCACHE": str(BUILD / "gocache"),
        "GOFLAGS": "",
    }
    say(f"loadgen: building {out.relative_to(ROOT)} (go build, offline, GOPATH={GOPATH}) ...")
    r = subprocess.run(
        ["go", "build", "-o", str(out), "."], cwd=SOURCE, env=env, capture_output=True, text=True
    )
    if r.returncode != 0:
        raise RuntimeError(f"go build failed:\n{r.stderr}")
    return out


class Process:
    """One ``loadgen MODE ...`` process: stdin for commands, JSON lines on stdout.

    Every line is parsed and stamped with ``time.monotonic()`` on arrival
    (``_t``); ``report``/``final`` lines replace :attr:`report`, every other
    line goes to :attr:`events` and to ``on_event`` (called on the reader thread).
    """

    def __init__(
        self,
        procs: Procs,
        name: str,
        argv: Sequence[str],
        log: Path,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        nice: int = 0,
    ) -> None:
        self.name = name
        self.report: dict[str, Any] = {}
        self.final: dict[str, Any] | None = None
        self.events: list[dict[str, Any]] = []
        self.ready = threading.Event()
        self._cond = threading.Condition()
        self._on_event = on_event
        errlog = open(log.with_suffix(".err"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*(["nice", "-n", str(nice)] if nice else []), str(binary()), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errlog,
            start_new_session=True,
            preexec_fn=die_with_parent,  # SIGKILLed if this driver dies, even uncleanly
        )
        errlog.close()
        procs.all.append(self.proc)
        self._log = open(log, "a")  # noqa: SIM115
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        """The process id."""
        return self.proc.pid

    def cpu(self) -> float:
        """Its CPU seconds so far (/proc)."""
        return cpu_seconds(self.proc.pid)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            t = time.monotonic()
            self._log.write(raw.decode(errors="replace"))
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            line["_t"] = t
            ev = line.get("ev")
            with self._cond:
                if ev == "report":
                    self.report = line
                elif ev == "final":
                    self.final = line
                else:
                    self.events.append(line)
                    if ev == "ready":
                        self.ready.set()
                self._cond.notify_all()
            if self._on_event is not None and ev not in ("report", "final"):
                self._on_event(line)
        self._log.close()
        with self._cond:
            self._cond.notify_all()

    def send(self, command: str) -> None:
        """Writes one command line on its stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def wait_for(self, pred: Callable[[], bool], timeout: float) -> bool:
        """Waits until ``pred()`` (called under the lock, after each line) or the timeout."""
        with self._cond:
            return self._cond.wait_for(pred, timeout)

    def event(
        self, kind: str, node: str, timeout: float, since: float = 0.0
    ) -> dict[str, Any] | None:
        """The first ``kind`` event line about ``node`` whose ``t`` is at least ``since``,
        waiting up to ``timeout`` s for it."""

        def find() -> dict[str, Any] | None:
            return next(
                (
                    e
                    for e in self.events
                    if e.get("ev") == kind and e.get("node") == node and e["t"] >= since
                ),
                None,
            )

        self.wait_for(lambda: find() is not None, timeout)
        with self._cond:
            return find()

    def find(self, pred: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any] | None:
        """The first event line for which ``pred`` is true, waiting up to ``timeout`` s for it."""

        def first() -> dict[str, Any] | None:
            return next((e for e in self.events if pred(e)), None)

        self.wait_for(lambda: first() is not None, timeout)
        with self._cond:
            return first()

    def stop(self, timeout: float = 10.0) -> dict[str, Any] | None:
        """Sends ``quit``, waits for the final report, reaps the process; returns the report."""
        with contextlib.suppress(OSError, ValueError):
            self.send("quit")
        self.wait_for(lambda: self.final is not None, timeout)
        Procs.kill(self.proc)
        self._reader.join(5)
        return self.final


class Fleet:
    """``count`` simulated nodes ``<prefix>0..`` over ``processes`` ``loadgen hb`` processes.

    Args:
        procs: where the processes are registered (killed by ``procs.kill_all``).
        arbiters: the addresses every node heartbeats to.
        count: nodes in all.
        processes: loadgen processes (the nodes are spread evenly).
        logdir: each process logs to ``<name>-<i>.log`` (stdout) and ``.err``.
        extra: more ``hb`` flags (``--wait-join``, ``--interval-rule own`` ...).
        nice: the processes' nice value (0: this script's).
    """

    def __init__(
        self,
        procs: Procs,
        arbiters: Sequence[str],
        count: int,
        processes: int,
        logdir: Path,
        *extra: str,
        name: str = "loadgen",
        prefix: str = "n",
        on_event: Callable[[dict[str, Any]], None] | None = None,
        nice: int = 0,
    ) -> None:
        self.count = count
        self.prefix = prefix
        processes = max(1, min(processes, count))
        base, rest = divmod(count, processes)
        self.parts: list[tuple[int, int, Process]] = []
        first = 0
        for i in range(processes):
            n = base + (1 if i < rest else 0)
            argv = [
                "hb",
                *("--arbiters", ",".join(arbiters), "--prefix", prefix),
                *("--first", str(first), "--count", str(n)),
                *extra,
            ]
            self.parts.append(
                (
                    first,
                    n,
                    Process(procs, f"{name}-{i}", argv, logdir / f"{name}-{i}.log", on_event, nice),
                )
            )
            first += n

    def ids(self) -> list[str]:
        """Every node id."""
        return [f"{self.prefix}{i}" for i in range(self.count)]

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until every process has dialled its connections (its ``ready`` line).

        Raises:
            RuntimeError: a process did not get ready in time.
        """
        deadline = time.monotonic() + timeout
        for _, _, p in self.parts:
            if not p.ready.wait(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"{p.name} not ready within {timeout:.0f} s")

    def join(self) -> float:
        """Starts every node not yet started; returns the monotonic time of the command."""
        t = time.monotonic()
        for _, _, p in self.parts:
            p.send("join")
        return t

    def kill(self, node: str) -> Process:
        """Stops ``node`` abruptly (its process prints the kill time); returns that process."""
        i = int(node[len(self.prefix) :])
        for first, n, p in self.parts:
            if first <= i < first + n:
                p.send(f"kill {node}")
                return p
        raise KeyError(node)

    def gaps(self, nodes: Sequence[str], timeout: float = 10.0) -> dict[str, dict[str, Any]]:
        """Each node's longest own send gaps (the ``gaps`` command of hb.go): per node
        ``{"max_ratio": gap / interval, "links": [{"addr", "max_gap_s", "max_ratio",
        "interval_s"}]}``; a node whose process did not answer within ``timeout``
        seconds is left out."""
        out: dict[str, dict[str, Any]] = {}
        since = time.monotonic()
        asked: list[tuple[str, Process]] = []
        for v in nodes:
            i = int(v[len(self.prefix) :])
            for first, n, p in self.parts:
                if first <= i < first + n:
                    p.send(f"gaps {v}")
                    asked.append((v, p))
        deadline = since + timeout
        for v, p in asked:
            e = p.find(
                lambda e, v=v: e.get("ev") == "gaps" and e.get("node") == v and e["_t"] >= since,
                max(0.0, deadline - time.monotonic()),
            )
            if e is not None:
                out[v] = e
        return out

    def cpu(self) -> float:
        """CPU seconds of every loadgen process so far."""
        return sum(p.cpu() for _, _, p in self.parts)

    def reports(self) -> list[dict[str, Any]]:
        """The latest report of every process (those that reported yet)."""
        return [p.report for _, _, p in self.parts if p.report]

    def totals(self) -> dict[str, Any]:
        """The processes' latest reports summed: per arbiter (in order) sent, stale (replaced
        unwritten: the replica did not read), acks,
        required and sent rates, states, errors, epochs; and the worst lateness and ack
        latency percentiles of any process (each process's are over its last window)."""
        reps = self.reports()
        arbs: list[dict[str, Any]] = []
        for r in reps:
            for k, a in enumerate(r["arbiters"]):
                if len(arbs) <= k:
                    arbs.append(
                        {"addr": a["addr"], "sent": 0, "stale": 0, "acks": 0, "required_rate": 0.0,
                         "sent_rate": 0.0, "ack_rate": 0.0, "states": {}, "errors": {},
                         "epoch": 0, "ack_p50_ms": 0.0, "ack_p99_ms": 0.0}
                    )  # fmt: skip
                t = arbs[k]
                for f in ("sent", "stale", "acks", "required_rate", "sent_rate", "ack_rate"):
                    t[f] += a.get(f, 0)
                for f in ("states", "errors"):
                    for s, v in a[f].items():
                        t[f][s] = t[f].get(s, 0) + v
                t["epoch"] = max(t["epoch"], a["epoch"])
                t["ack_p50_ms"] = max(t["ack_p50_ms"], a["ack_ms"]["p50"])
                t["ack_p99_ms"] = max(t["ack_p99_ms"], a["ack_ms"]["p99"])
        return {
            "arbiters": arbs,
            "required_rate": sum(r["required_rate"] for r in reps),
            "sent_rate": sum(r["sent_rate"] for r in reps),
            "late_p50_ms": max((r["late_ms"]["p50"] for r in reps), default=0.0),
            "late_p99_ms": max((r["late_ms"]["p99"] for r in reps), default=0.0),
            "late_max_ms": max((r["late_ms"]["max"] for r in reps), default=0.0),
            "rejoins": sum(r["rejoins"] for r in reps),
            "live": sum(r["live"] for r in reps),
        }

    def events(self, kind: str) -> list[dict[str, Any]]:
        """Every event line of that kind (``killed``, ``rejoin``, ``joined`` ...) so far."""
        return [e for _, _, p in self.parts for e in list(p.events) if e.get("ev") == kind]

    def stop(self) -> list[dict[str, Any]]:
        """Stops every process; returns their final reports."""
        return [f for _, _, p in self.parts if (f := p.stop()) is not None]
