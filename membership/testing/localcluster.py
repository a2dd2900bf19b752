"""A cluster of real ``membership`` processes on one machine, for the demo, tests and benchmarks.

What it gives:

- :func:`free_ports`, :func:`die_with_parent` (a ``preexec_fn`` that ties a
  child to its parent's life, Linux's PR_SET_PDEATHSIG);
- command lines: :func:`membership_command`, :func:`arbiter_args`,
  :func:`node_args`, :func:`peers_flag` (also used by the chaos suite, which
  runs the same commands inside network namespaces);
- :class:`LocalCluster`: replicas ``a1..an`` on free loopback ports, each with
  its own data dir in the work folder, nodes, any other ``membership``
  command; :meth:`LocalCluster.stop_all` (nodes first, so that they leave,
  then the replicas) and :meth:`LocalCluster.kill_all`;
- :func:`wait_leader` and :class:`ViewFollower`, through the SDK.

Rules:

1. Every child runs in a session of its own (a Ctrl-C at the terminal reaches
   the parent only, which stops its children in order), with stdin closed,
   and gets SIGKILL when its parent dies, even when no cleanup runs (Linux).
2. A child's stdout and stderr go to files in the work folder:
   ``<name>.out`` and ``<name>.err``, or one ``<name>.log`` with
   ``merge_output``.
3. :meth:`LocalCluster.kill_all` leaves no child behind (SIGKILL, then
   reaped); it never raises.
4. Security: with ``tls=True`` the cluster makes a CA and certificates in
   ``<workdir>/tls`` (:mod:`membership.testing.pki`; files as ``membership certs
   init`` names them) and gives every child its own: an arbiter the
   certificate of its ``--id``, a node that of its ``--id`` (issued when
   first started), any other command the ``admin`` certificate (it may read
   and administer); :meth:`LocalCluster.client_config` is the same for an
   SDK client in this process. ``tls=False`` passes ``--insecure`` to every
   child; None (the default) passes neither: the environment decides
   (``MEMBERSHIP_TLS_*``, ``MEMBERSHIP_INSECURE``; the test suite sets
   ``MEMBERSHIP_INSECURE=1``). A command line that already has ``--tls-ca``
   or ``--insecure`` is left as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from membership.shared.view import MemberState, ViewChanged, ViewEvent, ViewSnapshot

__all__ = [
    "Child",
    "LocalCluster",
    "ViewFollower",
    "arbiter_args",
    "die_with_parent",
    "free_ports",
    "membership_command",
    "node_args",
    "peers_flag",
    "wait_leader",
]

_PR_SET_PDEATHSIG = 1


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """Returns ``n`` distinct TCP ports that were free on ``host`` a moment ago."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def die_with_parent() -> None:  # pragma: no cover - runs in the child
    """``preexec_fn`` for subprocess: the child gets SIGKILL when its parent dies.

    Linux only (prctl PR_SET_PDEATHSIG); does nothing elsewhere.
    """
    if sys.platform != "linux":
        return
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def membership_command(*args: str, log_level: str | None = None) -> list[str]:
    """The argv of ``membership ARGS`` run by this interpreter (``python -m membership``)."""
    level = ["--log-level", log_level] if log_level else []
    return [sys.executable, "-m", "membership", *level, *args]


def peers_flag(arbiters: Mapping[str, str]) -> str:
    """The ``--peers`` value of replicas ``{id: "host:port"}``: ``a1=host:port,...``."""
    return ",".join(f"{rid}={addr}" for rid, addr in arbiters.items())


def arbiter_args(
    replica_id: str,
    arbiters: Mapping[str, str],
    data_dir: Path | str,
    *extra: str,
    listen: str | None = None,
) -> list[str]:
    """``arbiter --id ... --listen ... --peers ... --data-dir ...`` and ``extra``.

    Heartbeat ingest stays in the replica's process (``--ingest-workers 0``) unless
    ``extra`` gives ``--ingest-workers``: the arbiter's own default, ``auto``, runs one
    worker process per core, which a local cluster of 3 replicas, its tests and the
    chaos suite do not need (3 more processes a replica, and their start-up).

    Args:
        replica_id: this replica's id, a key of ``arbiters``.
        arbiters: every replica, id -> ``host:port``.
        data_dir: its data directory.
        extra: more flags.
        listen: the address to listen on (default: its own ``arbiters`` entry).
    """
    given = any(a == "--ingest-workers" or a.startswith("--ingest-workers=") for a in extra)
    return [
        "arbiter",
        *("--id", replica_id, "--listen", listen or arbiters[replica_id]),
        *("--peers", peers_flag(arbiters), "--data-dir", str(data_dir)),
        *(() if given else ("--ingest-workers", "0")),
        *extra,
    ]


def node_args(
    node_id: str,
    addresses: Iterable[str],
    *extra: str,
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    """``node --id ID --arbiters A,B,C [--label k=v ...]`` and ``extra``."""
    argv = ["node", "--id", node_id, "--arbiters", ",".join(addresses)]
    for k, v in (labels or {}).items():
        argv += ["--label", f"{k}={v}"]
    return [*argv, *extra]


@dataclass
class Child:
    """One child process; its stdout and stderr are files (``err`` is None when merged)."""

    name: str
    popen: subprocess.Popen[bytes]
    out: Path
    err: Path | None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def lines(self) -> list[str]:
        """Complete lines written to stdout so far."""
        text = self.out.read_text(errors="replace")
        return text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]

    def json_lines(self) -> list[dict[str, Any]]:
        """Stdout lines that are JSON objects, parsed."""
        return [json.loads(line) for line in self.lines() if line.startswith("{")]

    def stderr(self) -> str:
        """Everything written to stderr so far (stdout too when merged)."""
        return (self.err or self.out).read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        """Sends ``sig`` to the process if it still runs."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL (a stopped process too) and reap."""
        self.signal(signal.SIGKILL)
        self.popen.wait()


@dataclass
class LocalCluster:
    """Replicas, nodes and other ``membership`` commands as child processes (module rules).

    Args:
        workdir: folder for the children's output and the replicas' data dirs
            (``<id>.data``); it must exist.
        arbiter_args: extra flags for every replica.
        log_level: ``--log-level`` of every child (None: the command's default).
        merge_output: stdout and stderr of a child in one ``<name>.log``.
        env: environment of the children (default: this process's).
        tls: True for mutual TLS with certificates made here, False for
            ``--insecure``, None to leave it to the environment (rule 4).
        cluster: the cluster name of the certificates (the replicas'
            ``--cluster``; give it in ``arbiter_args`` too when not ``default``).
    """

    workdir: Path
    arbiter_args: Sequence[str] = ()
    log_level: str | None = "info"
    merge_output: bool = False
    env: Mapping[str, str] | None = None
    tls: bool | None = None
    cluster: str = "default"
    arbiters: dict[str, str] = field(default_factory=dict)
    children: dict[str, Child] = field(default_factory=dict)
    _certs: Any = None

    @property
    def certs(self) -> Any:
        """The cluster's :class:`~membership.testing.pki.ClusterCertificates` in
        ``<workdir>/tls``."""
        from membership.testing.pki import ClusterCertificates

        if self._certs is None:
            self._certs = ClusterCertificates(self.workdir / "tls", self.cluster)
        return self._certs

    def security_flags(self, argv: Sequence[str]) -> list[str]:
        """The flags rule 4 adds to ``membership ARGV``."""
        if self.tls is None or "--tls-ca" in argv or "--insecure" in argv or not argv:
            return []
        command = argv[0]
        if command not in ("arbiter", "node", "watch", "view", "admin"):
            return []
        if not self.tls:
            return ["--insecure"]
        name = argv[list(argv).index("--id") + 1] if "--id" in argv else "admin"
        role = {"arbiter": "arbiter", "node": "node"}.get(command, "admin")
        return self.certs.files(name, role).flags()

    def client_config(self, **fields: Any) -> Any:
        """A :class:`membership._config.ClientConfig` for an SDK client of this cluster
        in this process (rule 4: the ``admin`` certificate, ``insecure``, or the
        environment's choice), with ``fields``."""
        from membership._config import ClientConfig

        if self.tls:
            files = self.certs.files("admin", "admin")
            fields = {
                "tls_ca": str(files.ca),
                "tls_cert": str(files.cert),
                "tls_key": str(files.key),
                **fields,
            }
        elif self.tls is False:
            fields = {"insecure": True, **fields}
        return ClientConfig(**fields)

    @property
    def addresses(self) -> list[str]:
        """Every replica's address, in id order."""
        return [self.arbiters[k] for k in sorted(self.arbiters)]

    def arbiter_list(self, first: str | None = None) -> str:
        """The ``--arbiters`` value: every address, ``first``'s first when given."""
        ids = sorted(self.arbiters)
        if first is not None:
            ids.remove(first)
            ids.insert(0, first)
        return ",".join(self.arbiters[i] for i in ids)

    def data_dir(self, replica_id: str) -> Path:
        """Where replica ``replica_id`` keeps its Raft state."""
        return self.workdir / f"{replica_id}.data"

    def spawn_command(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> Child:
        """Starts any command as child ``name`` (rules 1 and 2); replaces a stopped one."""
        old = self.children.get(name)
        if old is not None and old.alive():
            raise RuntimeError(f"{name} is already running (pid {old.pid})")
        if self.merge_output:
            out, err = self.workdir / f"{name}.log", None
        else:
            out, err = self.workdir / f"{name}.out", self.workdir / f"{name}.err"
        environ = dict(env if env is not None else self.env if self.env is not None else os.environ)
        with contextlib.ExitStack() as files:
            fo = files.enter_context(open(out, "ab"))
            fe = files.enter_context(open(err, "ab")) if err is not None else None
            popen = subprocess.Popen(
                list(argv),
                stdout=fo,
                stderr=fe if fe is not None else subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
                env={**environ, "PYTHONUNBUFFERED": "1"},
            )
        child = Child(name, popen, out, err)
        self.children[name] = child
        return child

    def spawn(self, name: str, *args: str, log_level: str | None = None) -> Child:
        """Starts ``membership ARGS`` as child ``name`` (with rule 4's flags)."""
        args = (*args, *self.security_flags(args))
        return self.spawn_command(
            name, membership_command(*args, log_level=log_level or self.log_level)
        )

    def start_arbiters(self, n: int = 3, *extra: str) -> dict[str, str]:
        """Starts replicas a1..an on free loopback ports, each with its data dir.

        Returns:
            The replicas, id -> address (also :attr:`arbiters`).
        """
        ports = free_ports(n)
        self.arbiters = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
        for rid in self.arbiters:
            self.start_arbiter(rid, *extra)
        return dict(self.arbiters)

    def start_arbiter(self, replica_id: str, *extra: str) -> Child:
        """Starts (or restarts, on its data dir) one replica of :attr:`arbiters`."""
        return self.spawn(
            replica_id,
            *arbiter_args(
                replica_id,
                self.arbiters,
                self.data_dir(replica_id),
                *self.arbiter_args,
                *extra,
            ),
        )

    def start_node(
        self, node_id: str, *extra: str, labels: Mapping[str, str] | None = None
    ) -> Child:
        """Starts ``membership node`` heartbeating to every replica."""
        return self.spawn(node_id, *node_args(node_id, self.addresses, *extra, labels=labels))

    def kill(self, name: str) -> None:
        """SIGKILLs one child and reaps it."""
        self.children[name].kill()

    def _stop_order(self) -> list[list[Child]]:
        replicas = [c for n, c in self.children.items() if n in self.arbiters]
        others = [c for n, c in self.children.items() if n not in self.arbiters]
        return [others, replicas]

    def stop_all(self, timeout: float = 5.0) -> None:
        """SIGTERM to every child, nodes first (so that they can leave), then the
        replicas; SIGKILL for whatever still runs ``timeout`` seconds after its SIGTERM."""
        for group in self._stop_order():
            for c in group:
                c.signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for c in group:
                try:
                    c.popen.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    c.kill()

    async def wait_stopped_all(self, timeout: float = 5.0, interval: float = 0.05) -> None:
        """:meth:`stop_all` without blocking the event loop (polls every ``interval`` s)."""
        for group in self._stop_order():
            for c in group:
                c.signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while any(c.alive() for c in group) and time.monotonic() < deadline:
                await asyncio.sleep(interval)
            for c in group:
                if c.alive():
                    c.kill()
                c.popen.wait()

    def kill_all(self, reap: bool = True) -> None:
        """SIGKILL to every child, then reap them all (rule 3).

        Args:
            reap: wait for each child to be gone (up to 10 s each). False
                only sends the signals: for a process about to exit at once,
                whose children are then reaped by init (a killed process runs
                no more code; on a loaded machine the kernel may take seconds
                to tear it down, which the exit need not wait for).
        """
        for c in self.children.values():
            with contextlib.suppress(OSError):
                c.signal(signal.SIGKILL)
        if not reap:
            return
        for c in self.children.values():
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                c.popen.wait(10)


async def wait_leader(client: Any, timeout: float, interval: float = 0.1) -> Any:
    """Waits until an arbiter answers in a quorum, with a leader.

    Args:
        client: a :class:`membership.MembershipClient` listing the replicas.
        timeout: seconds.
        interval: seconds between two tries.

    Returns:
        The :class:`membership.ViewInfo` of that arbiter.

    Raises:
        TimeoutError: no leader within ``timeout``.
    """
    from membership.shared.errors import UnavailableError

    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(UnavailableError):
            info = await client.get_view()
            if info.in_quorum and info.leader_id:
                return info
        if time.monotonic() > deadline:
            raise TimeoutError(f"no leader elected within {timeout:g}s")
        await asyncio.sleep(interval)


class ViewFollower:
    """Follows the view through the SDK's ``watch()``: who is ALIVE, when each death arrived.

    Args:
        client: a :class:`membership.MembershipClient`.
        show: called with each event as it arrives (default: nothing).
    """

    def __init__(self, client: Any, show: Callable[[ViewEvent], None] | None = None) -> None:
        self.client = client
        self.show = show
        self.deaths: dict[str, float] = {}  # node id -> monotonic arrival of its latest DEAD
        self.alive: set[str] = set()
        self.epoch = 0
        self._changed = asyncio.Event()

    async def run(self) -> None:
        """Follows the view until cancelled."""
        async for ev in self.client.watch():
            self._apply(ev)
            if self.show is not None:
                self.show(ev)
            self._changed.set()

    def _apply(self, ev: ViewEvent) -> None:
        if isinstance(ev, ViewSnapshot):
            self.epoch = ev.view.epoch
            self.alive = {m.node_id for m in ev.view.alive()}
        elif isinstance(ev, ViewChanged):
            self.epoch = ev.epoch
            now = time.monotonic()
            for c in ev.changes:
                if c.state is MemberState.ALIVE:
                    self.alive.add(c.node_id)
                else:
                    self.alive.discard(c.node_id)
                if c.state is MemberState.DEAD and not c.forgotten:  # not a tombstone leaving
                    self.deaths[c.node_id] = now

    async def wait_for(self, pred: Callable[[], object], timeout: float, what: str) -> None:
        """Waits until ``pred()`` is true, re-checked after every event.

        Raises:
            TimeoutError: naming ``what`` after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while not pred():
            self._changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{what}: not within {timeout:g}s")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._changed.wait()
