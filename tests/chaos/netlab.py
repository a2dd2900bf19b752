"""A test network of Linux network namespaces: hosts, a switch, faults by iptables.

Layout of one :class:`Lab`:

- a *hub* namespace holding a Linux bridge ``br0`` (the switch);
- one namespace per host (a replica, a node, a subscriber, the probe), with
  loopback up and a veth ``eth0`` plugged into the bridge, addressed
  ``10.213.X.K/24``. Nothing else is routed: a process in a host namespace
  reaches only the addresses of the lab's other hosts (and its own loopback).

Because every device lives in namespaces the lab created (none in the root
namespace), names cannot clash with another lab, another test run or another
session on the machine; the namespaces themselves are named
``mbrchaos-<pid>-<n>-<host>`` (pid of the test process, lab counter), so
parallel runs never collide and leftovers of a crashed run are recognised by
their dead pid and removed (:func:`cleanup_leftovers`).

Faults, all from the test process:

- links: :meth:`Host.cut` (both ways, or one way ``"in"``/``"out"``),
  :meth:`Host.isolate`, :meth:`Lab.partition`, :meth:`Host.heal`,
  :meth:`Host.heal_all`, :meth:`Lab.heal_all`. They are iptables DROP rules on
  the INPUT chain of the *receiving* host's namespace, so packets leave their
  sender normally and vanish on the way: a pulled cable (no RST, no ICMP, TCP
  sees only silence). A DROP on the sender's OUTPUT chain would instead fail
  its send() or connect() at once with EPERM, which no real network does.
  Each namespace's rule set is loaded with ``iptables-restore``, in one step.
- processes (:class:`Proc`): :meth:`Proc.pause` / :meth:`Proc.resume`
  (SIGSTOP/SIGCONT), :meth:`Proc.kill` (SIGKILL), :meth:`Proc.restart` (the
  same command line again, so an arbiter comes back on its data dir).
- a machine gone: :meth:`Lab.remove_host` kills its processes and deletes its
  namespace (its address then answers nothing, not even ARP).
- delay, jitter and half-open links: :meth:`Host.proxy` runs
  ``python -m tests.support.netproxy`` in a namespace (there is no netem on
  these machines); :meth:`Proxy.freeze` / :meth:`Proxy.heal`.

Rules the lab keeps:

1. Every process is started through ``ip netns exec`` (which execs in place:
   the Popen pid is the program's), in a session of its own (so a group kill
   reaches everything it started), with PR_SET_PDEATHSIG = SIGKILL (so it dies
   with the test process even when no cleanup runs).
2. :meth:`Lab.close` kills every process, then every process still found in a
   lab namespace, then deletes the namespaces (the veths and the bridge go with
   them). It is idempotent, never raises, and runs on ``with`` exit and at
   interpreter exit.
3. :func:`unavailable` says why a lab cannot be built here (not root, no
   ``ip netns``, no iptables); the chaos tests skip with that reason.

Example::

    with Lab(tmp_path) as lab:
        a, b = lab.host("a"), lab.host("b")
        server = b.run("server", [sys.executable, "-m", "http.server", "--bind", b.ip])
        a.cut(b)            # both ways
        a.heal(b)
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from membership.testing.localcluster import die_with_parent
from tests.integration.harness import wait_until

__all__ = [
    "PREFIX",
    "Host",
    "Lab",
    "LabError",
    "Proc",
    "Proxy",
    "cleanup_leftovers",
    "unavailable",
    "wait_until",
]

PREFIX = "mbrchaos"
Direction = Literal["both", "in", "out"]

_counter = itertools.count(1)
_SUBNET_BASE = "10.213"
# Seconds an ``ip``/``iptables`` command may take on a loaded machine.
_CMD_TIMEOUT = 30.0


class LabError(RuntimeError):
    """A namespace, link or rule could not be set up."""


def _ip(*args: str, check: bool = True, stdin: str | None = None) -> str:
    """Runs ``ip ARGS``; returns stdout.

    Raises:
        LabError: when it fails and ``check`` is set.
    """
    r = subprocess.run(
        ["ip", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=_CMD_TIMEOUT,
    )
    if check and r.returncode != 0:
        raise LabError(f"ip {' '.join(args)}: {r.stderr.strip() or r.returncode}")
    return r.stdout


# --- availability and leftovers ---------------------------------------------------------------

_unavailable: str | None = None
_checked = False


def unavailable() -> str | None:
    """Why no lab can be built on this machine, or None when one can (checked once)."""
    global _unavailable, _checked
    if _checked:
        return _unavailable
    _checked = True
    if os.geteuid() != 0:
        _unavailable = "chaos tests need root (network namespaces and iptables)"
    elif shutil.which("ip") is None:
        _unavailable = "chaos tests need iproute2's `ip` (apt-get install iproute2)"
    elif shutil.which("iptables") is None or shutil.which("iptables-restore") is None:
        _unavailable = "chaos tests need iptables (apt-get install iptables)"
    else:
        name = f"{PREFIX}-{os.getpid()}-probe"
        try:
            _ip("netns", "add", name)
            try:
                _ip("-n", name, "link", "add", "br0", "type", "bridge")
                _ip("-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
                r = subprocess.run(
                    ["ip", "netns", "exec", name, "iptables", "-S"],
                    capture_output=True,
                    text=True,
                    timeout=_CMD_TIMEOUT,
                )
                if r.returncode != 0:
                    _unavailable = (
                        f"iptables does not work inside a network namespace: {r.stderr.strip()}"
                    )
            finally:
                _ip("netns", "del", name, check=False)
        except (LabError, OSError, subprocess.SubprocessError) as e:
            _unavailable = f"cannot create network namespaces, bridges or veths here: {e}"
    return _unavailable


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_netns_pids(netns: str) -> None:
    for word in _ip("netns", "pids", netns, check=False).split():
        with contextlib.suppress(ValueError, OSError):
            os.kill(int(word), signal.SIGKILL)


def cleanup_leftovers(prefix: str = PREFIX) -> list[str]:
    """Deletes the namespaces (and kills their processes) of earlier runs that died.

    A namespace ``<prefix>-<pid>-...`` belongs to a dead run when no process
    ``pid`` exists. Namespaces of live runs (other sessions) are left alone.

    Returns:
        The names of the namespaces deleted.
    """
    stale = []
    for line in _ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) < 3 or parts[0] != prefix or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid == os.getpid() or _pid_alive(pid):
            continue
        stale.append(name)
    for name in stale:
        _kill_netns_pids(name)
    for name in stale:
        _ip("netns", "del", name, check=False)
    return stale


# --- processes ------------------------------------------------------------------------------


class Proc:
    """A process in a host's namespace; stdout lines are kept with their arrival times.

    Stdout is read by a thread that stamps each line with ``time.monotonic()``
    of the test process when it arrives (and copies it to ``<name>.out``);
    stderr goes to ``<name>.err``. A restart appends to both.
    """

    def __init__(self, host: Host, name: str, argv: Sequence[str], env: dict[str, str]) -> None:
        self.host = host
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.out = host.lab.workdir / f"{name}.out"
        self.err = host.lab.workdir / f"{name}.err"
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0  # how many times it was started
        self._lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._cond = threading.Condition(self._lock)

    # --- lifecycle ---

    def start(self) -> Proc:
        """Starts the command (again) inside the host's namespace; returns self."""
        if self.alive():
            raise LabError(f"{self.name} is already running")
        self.host.lab._check_open()
        with open(self.err, "ab") as fe:
            popen = subprocess.Popen(
                ["ip", "netns", "exec", self.host.netns, *self.argv],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=fe,
                start_new_session=True,
                preexec_fn=die_with_parent,
                env=self.env,
            )
        self.popen = popen
        self.starts += 1
        self._reader = threading.Thread(
            target=self._read, args=(popen,), name=f"netlab-{self.name}", daemon=True
        )
        self._reader.start()
        return self

    def _read(self, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stdout is not None
        with open(self.out, "ab") as fo:
            for raw in popen.stdout:
                now = time.monotonic()
                fo.write(raw)
                fo.flush()
                if not raw.endswith(b"\n"):
                    continue  # cut off by the process's death: not a line
                with self._cond:
                    self._lines.append((now, raw.decode(errors="replace").rstrip("\n")))
                    self._cond.notify_all()

    def _signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def pause(self) -> None:
        """SIGSTOP to the process group: the kernel keeps its sockets, the program stops."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT to the process group."""
        self._signal(signal.SIGCONT)

    def terminate(self) -> None:
        """SIGTERM to the process group (a graceful stop; does not wait)."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the process group (a crash), then reap it and its output."""
        self._signal(signal.SIGKILL)
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=_CMD_TIMEOUT)
            for stream in (self.popen.stdin,):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def restart(self) -> Proc:
        """SIGKILL (if running), then the same command line again; returns self."""
        self.kill()
        return self.start()

    def wait(self, timeout: float) -> int:
        """Waits for the process to exit; returns its exit code.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout`` seconds.
        """
        assert self.popen is not None
        rc = self.popen.wait(timeout=timeout)
        if self._reader is not None:
            self._reader.join(timeout=5)
        return rc

    # --- introspection ---

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def timed_lines(self) -> list[tuple[float, str]]:
        """Every complete stdout line so far (across restarts) with its arrival time."""
        with self._lock:
            return list(self._lines)

    def lines(self) -> list[str]:
        """Every complete stdout line so far (across restarts)."""
        return [line for _, line in self.timed_lines()]

    def json_lines(self) -> list[dict[str, Any]]:
        """Stdout lines that are JSON objects, parsed."""
        return [json.loads(line) for line in self.lines() if line.startswith("{")]

    def stderr(self) -> str:
        return self.err.read_text(errors="replace") if self.err.exists() else ""

    def send_line(self, line: str) -> None:
        """Writes one line to the process's stdin."""
        assert self.popen is not None and self.popen.stdin is not None
        self.popen.stdin.write(line.encode() + b"\n")
        self.popen.stdin.flush()

    def wait_lines(self, count: int, timeout: float) -> list[str]:
        """Waits until at least ``count`` stdout lines have arrived; returns them.

        Raises:
            AssertionError: fewer after ``timeout`` seconds, or the process exited.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._lines) < count:
                left = deadline - time.monotonic()
                if left <= 0 or (self.popen is not None and self.popen.poll() is not None):
                    if len(self._lines) >= count:
                        break
                    raise AssertionError(
                        f"{self.name}: {len(self._lines)} of {count} output lines after "
                        f"{timeout}s (rc={self.returncode()}); stderr tail:\n"
                        + self.stderr()[-2000:]
                    )
                self._cond.wait(min(left, 0.2))
            return [line for _, line in self._lines]


class Proxy(Proc):
    """A ``tests.support.netproxy`` process (see :meth:`Host.proxy`)."""

    @property
    def address(self) -> str:
        """``host:port`` it listens on (its first output line)."""
        return self.lines()[0]

    def freeze(self, timeout: float = _CMD_TIMEOUT) -> None:
        """Stops forwarding both ways, sockets kept open (SIGUSR1); returns once it did."""
        self._mode(signal.SIGUSR1, "frozen", timeout)

    def heal(self, timeout: float = _CMD_TIMEOUT) -> None:
        """Forwards again (SIGUSR2); returns once it does."""
        self._mode(signal.SIGUSR2, "healed", timeout)

    def _mode(self, sig: int, word: str, timeout: float) -> None:
        n = len(self.lines())
        self._signal(sig)
        lines = self.wait_lines(n + 1, timeout)
        assert lines[n] == word, lines


# --- hosts ----------------------------------------------------------------------------------


class Host:
    """One network namespace with one address on the lab's bridge.

    Link faults are DROP rules on the receiver's INPUT chain: ``"out"`` drops
    what this host sends to a peer (a rule in the peer's namespace), ``"in"``
    what it receives from one (a rule in this host's namespace), ``"both"`` both.
    """

    def __init__(self, lab: Lab, name: str, index: int, *, mgmt: bool) -> None:
        self.lab = lab
        self.name = name
        self.index = index
        self.ip = f"{lab.subnet}.{index}"
        self.netns = f"{lab.base}-{name}"
        self.mgmt = mgmt  # management host (the probe): never cut by isolate/partition
        self.blocked_in: set[str] = set()  # peer addresses whose packets are dropped here

    def __repr__(self) -> str:
        return f"Host({self.name}, {self.ip})"

    def addr(self, port: int) -> str:
        """``ip:port`` of this host."""
        return f"{self.ip}:{port}"

    # --- processes ---

    def run(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Proc:
        """Starts ``argv`` in this namespace (see :class:`Proc`); ``name`` names its logs."""
        if name in self.lab.procs:
            raise LabError(f"a process named {name!r} exists already")
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        proc = Proc(self, name, argv, full_env)
        self.lab.procs[name] = proc
        return proc.start()

    def proxy(
        self, name: str, port: int, target: str, delay: float = 0.0, jitter: float = 0.0
    ) -> Proxy:
        """Starts a TCP proxy (``python -m tests.support.netproxy``) in this namespace,
        listening on ``<ip>:port`` and forwarding to ``target``; waits until it listens.

        Point a client at :attr:`Proxy.address` instead of ``target`` to give that
        link a delay and jitter (there is no netem here), or to freeze it: a
        half-open link, where both sides keep an open socket and hear nothing.
        """
        argv = [sys.executable, "-m", "tests.support.netproxy", "--listen", self.addr(port)]
        argv += ["--target", target, "--delay", str(delay), "--jitter", str(jitter)]
        proc = Proxy(self, name, argv, {**os.environ, "PYTHONUNBUFFERED": "1"})
        if name in self.lab.procs:
            raise LabError(f"a process named {name!r} exists already")
        self.lab.procs[name] = proc
        proc.start()
        proc.wait_lines(1, _CMD_TIMEOUT)
        return proc

    def sh(self, *argv: str, timeout: float = _CMD_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """Runs a short command in this namespace to completion (captured output)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.netns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    # --- links ---

    def cut(self, other: Host | Iterable[Host], direction: Direction = "both") -> None:
        """Drops traffic between this host and ``other`` (one host or several).

        Args:
            other: the peer(s).
            direction: ``"both"``; ``"out"`` drops only what this host sends
                to the peer; ``"in"`` only what the peer sends to this host.
        """
        if direction not in ("both", "in", "out"):
            raise ValueError(f"direction must be both, in or out, not {direction!r}")
        peers = [other] if isinstance(other, Host) else list(other)
        for peer in peers:
            if peer is self:
                raise ValueError("a host cannot be cut from itself")
        if direction in ("both", "out"):
            for peer in peers:
                peer.blocked_in.add(self.ip)
                peer._apply()
        if direction in ("both", "in"):
            self.blocked_in.update(peer.ip for peer in peers)
            self._apply()

    def heal(self, other: Host | Iterable[Host]) -> None:
        """Removes every rule between this host and ``other``, in both namespaces."""
        peers = [other] if isinstance(other, Host) else list(other)
        for peer in peers:
            self.blocked_in.discard(peer.ip)
            if self.ip in peer.blocked_in:
                peer.blocked_in.discard(self.ip)
                peer._apply()
        self._apply()

    def isolate(self) -> None:
        """Cuts this host from every other host of the lab (both ways), except management
        hosts. Hosts added to the lab later are not cut."""
        self.cut([h for h in self.lab.hosts.values() if h is not self and not h.mgmt])

    def heal_all(self) -> None:
        """Removes every rule involving this host, here and in every other namespace."""
        self.heal([h for h in self.lab.hosts.values() if h is not self])

    def _rules(self) -> str:
        lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
        lines += [f"-A INPUT -s {ip}/32 -j DROP" for ip in sorted(self.blocked_in)]
        lines.append("COMMIT")
        return "\n".join(lines) + "\n"

    def _apply(self) -> None:
        """Loads this host's whole rule set at once (iptables-restore replaces the table)."""
        self.lab._check_open()
        r = subprocess.run(
            ["ip", "netns", "exec", self.netns, "iptables-restore"],
            input=self._rules(),
            capture_output=True,
            text=True,
            timeout=_CMD_TIMEOUT,
        )
        if r.returncode != 0:
            raise LabError(f"iptables-restore in {self.netns}: {r.stderr.strip()}")

    def rules(self) -> str:
        """The filter table as the kernel has it (``iptables -S``), for failure messages."""
        return self.sh("iptables", "-S").stdout


# --- the lab --------------------------------------------------------------------------------


class Lab:
    """A bridge and a namespace per host; every process and device removed on close.

    Args:
        workdir: folder for the processes' output files (``<name>.out``/``.err``).
        prefix: first part of every namespace name (and of :func:`cleanup_leftovers`).

    Raises:
        LabError: the hub namespace or the bridge could not be created.
    """

    def __init__(self, workdir: Path, prefix: str = PREFIX) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        n = next(_counter)
        self.base = f"{prefix}-{os.getpid()}-{n}"
        # The subnet only has to be unique within the lab (its namespaces are
        # reachable from nowhere else); it still differs between labs so that
        # addresses in logs tell labs apart.
        self.subnet = f"{_SUBNET_BASE}.{(os.getpid() + n) % 250 + 1}"
        self.hub = f"{self.base}-hub"
        self.hosts: dict[str, Host] = {}
        self.procs: dict[str, Proc] = {}
        self._namespaces: list[str] = []
        self._next_index = 1  # host addresses are never reused, also after remove_host
        self._closed = False
        atexit.register(self.close)
        try:
            self._add_netns(self.hub)
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise LabError("the lab is closed")

    def _add_netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def host(self, name: str, *, mgmt: bool = False) -> Host:
        """The host ``name``, created (namespace, veth, address) on first use.

        Args:
            name: letters, digits, ``_`` (part of the namespace name).
            mgmt: a management host (the probe): :meth:`Host.isolate` and
                :meth:`partition` leave its links alone.
        """
        self._check_open()
        if name in self.hosts:
            return self.hosts[name]
        if not name or not all(c.isalnum() or c == "_" for c in name):
            raise ValueError(f"host name {name!r}: letters, digits and _ only")
        index = self._next_index
        if index > 250:
            raise LabError("a lab holds at most 250 hosts")
        self._next_index += 1
        host = Host(self, name, index, mgmt=mgmt)
        self._add_netns(host.netns)
        veth = f"v{index}"
        # Created in the hub and its peer moved straight into the host's
        # namespace: no device ever exists in the root namespace.
        _ip("-n", self.hub, "link", "add", veth, "type", "veth", "peer", "name", "eth0",
            "netns", host.netns)  # fmt: skip
        _ip("-n", self.hub, "link", "set", veth, "master", "br0", "up")
        _ip("-n", host.netns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        self.hosts[name] = host
        return host

    def remove_host(self, name: str) -> None:
        """The machine is gone: SIGKILLs every process of host ``name`` and deletes its
        namespace (its veth goes with it, so its address answers nothing, not even
        ARP). Its processes stay in :attr:`procs` (their logs, for failures); its
        address is never given to another host.
        """
        self._check_open()
        host = self.hosts.pop(name)
        for p in self.procs.values():
            if p.host is host:
                p.kill()
        _kill_netns_pids(host.netns)
        _ip("netns", "del", host.netns)
        self._namespaces.remove(host.netns)
        for h in self.hosts.values():
            if host.ip in h.blocked_in:
                h.blocked_in.discard(host.ip)
                h._apply()

    def partition(self, *groups: Iterable[Host]) -> None:
        """Cuts every host of each group from every host of the other groups (both ways).

        Hosts in no group keep their links.
        """
        sets = [list(g) for g in groups]
        for i, group in enumerate(sets):
            others = [h.ip for j, g in enumerate(sets) if j != i for h in g if not h.mgmt]
            for h in group:
                if not h.mgmt and others:
                    h.blocked_in.update(others)
                    h._apply()

    def heal_all(self) -> None:
        """Removes every link rule in every namespace."""
        for h in self.hosts.values():
            if h.blocked_in:
                h.blocked_in.clear()
                h._apply()

    # --- processes (also on Proc) ---

    def pause(self, proc: Proc) -> None:
        proc.pause()

    def resume(self, proc: Proc) -> None:
        proc.resume()

    def kill(self, proc: Proc) -> None:
        proc.kill()

    def restart(self, proc: Proc) -> Proc:
        return proc.restart()

    def dump(self, tail: int = 4000) -> str:
        """Every process's exit code and stderr tail, and every host's rules, for failures."""
        parts = []
        for name, p in sorted(self.procs.items()):
            parts.append(f"--- {name} on {p.host.ip} (rc={p.returncode()}, starts={p.starts})")
            parts.append(p.stderr()[-tail:])
        return "\n".join(parts)

    def close(self) -> None:
        """Kills every process and deletes every namespace (with its veth, and the bridge).

        Idempotent; never raises.
        """
        if self._closed:
            return
        # _closed is set only once everything is done: a close interrupted
        # (a second Ctrl-C) runs again from the atexit hook still registered.
        for p in self.procs.values():
            with contextlib.suppress(Exception):
                p.resume()  # a stopped process dies of SIGKILL too, but reap it promptly
                p._signal(signal.SIGKILL)
        for p in self.procs.values():
            with contextlib.suppress(Exception):
                p.kill()
        for name in self._namespaces:
            with contextlib.suppress(Exception):
                _kill_netns_pids(name)
        for name in reversed(self._namespaces):
            with contextlib.suppress(Exception):
                _ip("netns", "del", name, check=False)
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
