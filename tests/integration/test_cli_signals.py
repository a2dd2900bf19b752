"""SIGINT and SIGTERM stop every ``membership`` command promptly, in every phase; the demo.

Each test waits for the phase it interrupts (a line the command prints), sends the
signal, and bounds the exit with a timeout. Every process is killed at the end,
also when a test fails.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from membership.testing.localcluster import (
    die_with_parent,
    free_ports,
    membership_command,
    node_args,
)
from tests.integration.harness import Proc, ProcCluster, wait_until

pytestmark = pytest.mark.integration

PROMPT = 2.0  # seconds from the signal to the exit (the bound)
WAITING = "waiting for a majority of the arbiters to answer"


def _exits_within(proc: Proc, seconds: float) -> int:
    t0 = time.monotonic()
    try:
        return proc.popen.wait(seconds)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"{proc.name} still running {time.monotonic() - t0:.1f}s after the signal:\n"
            + proc.stderr()[-2000:]
        ) from None


SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}
COMMANDS = ("node", "watch")


@pytest.fixture(scope="module")
def connecting(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[tuple[str, str], Proc]]:
    """A ``node`` and a ``watch`` per signal, all started at once, connecting to a port
    where nothing listens; by (command, signal name).

    A command says it is still connecting only after 5 s (``_wait_reachable`` in
    membership/cli/commands.py); started together, the four wait those 5 s once
    instead of one after the other. Each test signals its own process. They keep
    connecting (retrying, their --connect-timeout far ahead) until signalled, so
    a later test finds its process in the same phase as the first one.
    """
    cluster = ProcCluster(tmp_path_factory.mktemp("connecting"))
    (port,) = free_ports(1)  # nothing listens there
    procs: dict[tuple[str, str], Proc] = {}
    try:
        for command in COMMANDS:
            for name in SIGNALS:
                argv = [command, "--connect-timeout", "300", "--arbiters", f"127.0.0.1:{port}"]
                if command == "node":
                    argv += ["--id", "x"]
                procs[command, name] = cluster.spawn(
                    f"{command}-{name}", *argv, log_level="warning"
                )
        yield procs
    finally:
        cluster.close()


@pytest.mark.parametrize("sig", list(SIGNALS))
@pytest.mark.parametrize("command", COMMANDS)
def test_cli_signal_while_connecting_exits_zero_within_two_seconds(
    connecting: dict[tuple[str, str], Proc], command: str, sig: str
) -> None:
    proc = connecting[command, sig]
    wait_until(lambda: WAITING in proc.stderr(), 20, f"{command} to say it is connecting")
    assert proc.alive(), proc.stderr()
    proc.signal(SIGNALS[sig])
    assert _exits_within(proc, PROMPT) == 0, proc.stderr()
    said = "x: stopped before joining" if command == "node" else "watch: stopped before connecting"
    assert said in proc.stderr() and "Traceback" not in proc.stderr(), proc.stderr()


def test_cli_node_second_sigint_while_leaving_exits_at_once(cluster: ProcCluster) -> None:
    cluster.start_arbiters(1)
    wait_until(cluster.leader, 15, "the arbiter to lead")
    node = cluster.start_node("n1", "--no-status-probes", "--leave-timeout", "30")
    wait_until(lambda: any("is ALIVE" in line for line in node.lines()), 15, "n1 ALIVE")
    cluster.procs["a1"].signal(signal.SIGSTOP)  # the leave can never commit now
    node.signal(signal.SIGINT)
    wait_until(lambda: "n1: leaving" in node.lines(), 10, "n1 to start leaving")
    node.signal(signal.SIGINT)
    assert _exits_within(node, PROMPT) == 130
    assert "Traceback" not in node.stderr(), node.stderr()


def test_cli_node_whose_output_reader_went_away_still_leaves_on_sigterm(
    cluster: ProcCluster, tmp_path: Path
) -> None:
    """``membership node | head -1``: once the reader is gone the node heartbeats on and
    SIGTERM still makes it LEFT (its 'leaving' line once raised BrokenPipeError, the
    leave was skipped and the cluster declared it DEAD)."""
    cluster.start_arbiters(1)
    wait_until(cluster.leader, 15, "the arbiter to lead")
    args = node_args("n1", cluster.addresses, "--no-status-probes")
    with open(tmp_path / "n1.err", "wb") as err:
        node = subprocess.Popen(
            membership_command(*args, *cluster.security_flags(args)),
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
    try:
        assert node.stdout is not None
        ready, _, _ = select.select([node.stdout], [], [], 30)
        assert ready and b"is ALIVE" in node.stdout.readline()
        node.stdout.close()  # the reader goes away, as head's does
        wait_until(lambda: _state(cluster, "n1") == "ALIVE", 15, "n1 ALIVE in the view")
        node.send_signal(signal.SIGTERM)
        assert node.wait(15) == 0
        assert _state(cluster, "n1") == "LEFT"
        assert "Traceback" not in (tmp_path / "n1.err").read_text()
    finally:
        node.kill()
        node.wait()


def _state(cluster: ProcCluster, node_id: str) -> str | None:
    view = cluster.view() or {"members": []}
    return next((m["state"] for m in view["members"] if m["node_id"] == node_id), None)


def test_cli_view_interrupted_exits_130(cluster: ProcCluster) -> None:
    import socket

    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.settimeout(20)
        addr = f"127.0.0.1:{silent.getsockname()[1]}"
        view = cluster.spawn("view", "view", "--timeout", "30", "--arbiters", addr)
        conn, _ = silent.accept()  # view is asking now, and would wait 30 s
        with conn:
            view.signal(signal.SIGINT)
            assert _exits_within(view, PROMPT) == 130
    assert "Traceback" not in view.stderr(), view.stderr()


# --- the demo -------------------------------------------------------------------------------


@pytest.fixture
def demo_env(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path, str]]:
    """An environment for the demo: its own TMPDIR (to see what it leaves there) and a
    mark every child inherits (to find its processes); leftovers are killed afterwards."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    mark = uuid.uuid4().hex
    env = {**os.environ, "TMPDIR": str(tmp), "DEMO_TEST_MARK": mark, "PYTHONUNBUFFERED": "1"}
    env.pop("MEMBERSHIP_INSECURE", None)  # the demo needs no setting: it runs with mutual TLS
    try:
        yield env, tmp, mark
    finally:
        for pid in _marked(mark):
            with _suppress():
                os.kill(pid, signal.SIGKILL)


def _suppress() -> object:
    import contextlib

    return contextlib.suppress(ProcessLookupError)


def _demo(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "membership", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _marked(mark: str) -> list[int]:
    """Live (not zombie) processes whose environment carries ``mark``."""
    found = []
    needle = f"DEMO_TEST_MARK={mark}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


def test_cli_demo_exits_zero_within_60s_leaves_nothing_and_reports_the_total(
    demo_env: tuple[dict[str, str], Path, str],
) -> None:
    env, tmp, mark = demo_env
    t0 = time.monotonic()
    proc = _demo(env)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    took = time.monotonic() - t0
    assert proc.returncode == 0, out + err
    assert took < 60
    assert "declared DEAD by a quorum" in out and "summary" in out
    assert "mutual TLS: a CA and one certificate per process" in out
    total = float(out.rsplit("total ", 1)[1].split("s", 1)[0])
    # The total covers the whole command (start-up and cleanup included), so it is
    # what this test measured from outside, less the interpreter's exit (the
    # total once left out the cleanup: 6.5 s printed for an 11.8 s run). The
    # process's start time has a resolution of a clock tick (10 ms).
    assert took - 3.0 < total <= took + 0.1, (total, took)
    assert _marked(mark) == []
    assert list(tmp.iterdir()) == []


def _up(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:  # until the cluster is up
        if line.startswith("[") and "nodes ALIVE" in line:
            return
    raise AssertionError(f"the demo ended early: {proc.stderr.read() if proc.stderr else ''}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_demo_interrupted_cleans_up_and_exits_128_plus_signal(
    demo_env: tuple[dict[str, str], Path, str], sig: int
) -> None:
    env, tmp, mark = demo_env
    proc = _demo(env)
    try:
        _up(proc)
        assert len(_marked(mark)) >= 8  # the demo, 3 arbiters, at least 4 nodes
        assert len(list(tmp.iterdir())) == 1  # its temporary folder
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, err
    assert "interrupted" in out and "Traceback" not in err, err
    assert _marked(mark) == []
    assert list(tmp.iterdir()) == []


def test_cli_demo_second_sigint_exits_at_once_without_traceback(
    demo_env: tuple[dict[str, str], Path, str],
) -> None:
    env, tmp, mark = demo_env
    proc = _demo(env)
    try:
        _up(proc)
        proc.send_signal(signal.SIGINT)
        assert proc.stdout is not None
        for line in proc.stdout:
            if "stopping the cluster" in line:
                break
        proc.send_signal(signal.SIGINT)
        proc.wait(PROMPT)
        _, err = proc.communicate(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert "Traceback" not in err, err
    wait_until(lambda: _marked(mark) == [], 5, "every child gone")
    assert list(tmp.iterdir()) == []


def _importing_grpc(pid: int) -> bool:
    """True once grpc's extension is mapped into ``pid``: ``membership.cli`` is being
    imported (grpc comes early in it), so ``main`` has not installed its handlers."""
    try:
        return "cygrpc" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("name", sorted(SIGNALS))
def test_cli_a_signal_while_the_command_is_still_importing_exits_as_documented(name: str) -> None:
    # Issue 25, item 6: SIGINT in the first 0.2 s printed an importlib
    # KeyboardInterrupt traceback and the process died of the signal.
    sig = SIGNALS[name]
    proc = subprocess.Popen(
        membership_command("node", "--id", "n1", "--arbiters", "127.0.0.1:1", "--insecure"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent,
    )
    try:
        wait_until(
            lambda: _importing_grpc(proc.pid) or proc.poll() is not None, 30, "importing", 0.002
        )
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=PROMPT + 5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # node stops by a signal: 0 at any moment (EXIT_CODES), and it says it never joined
    assert proc.returncode == 0, (proc.returncode, err)
    assert "n1: stopped before joining" in err and "Traceback" not in err, err  # as later
