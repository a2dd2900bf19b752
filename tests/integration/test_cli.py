"""The ``membership`` command: errors are one line on stderr, never a traceback; the demo runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from membership.demo import free_ports
from tests.integration.harness import run_cli

pytestmark = pytest.mark.integration


def _one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines, "expected an error message on stderr"
    return lines[-1]


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["node", "--arbiters", "127.0.0.1:1"], "--id"),
        (["node", "--id", "n1", "--arbiters", "nohost"], "not host:port"),
        (["node", "--id", "n1", "--arbiters", "127.0.0.1:99999"], "valid port"),
        (["node", "--id", "bad id", "--arbiters", "127.0.0.1:1"], "node_id"),
        (["node", "--id", "n1", "--arbiters", "127.0.0.1:1", "--label", "novalue"], "key=value"),
        (["watch"], "--arbiters"),
        (["view", "--arbiters", "127.0.0.1:1", "--timeout", "-1"], "finite number > 0"),
        (
            ["arbiter", "--id", "a9", "--listen", "127.0.0.1:1", "--peers", "a1=127.0.0.1:1"],
            "not in --peers",
        ),
        (["arbiter", "--id", "a1", "--listen", "127.0.0.1:1", "--peers", "a1"], "not id=host:port"),
        (
            [
                "arbiter",
                "--id",
                "a1",
                "--listen",
                "127.0.0.1:1",
                "--peers",
                "a1=127.0.0.1:1",
                "--election-timeout",
                "0.1",
            ],
            "election_timeout",
        ),
        (["bogus"], "invalid choice"),
        (
            ["node", "--id", "n1", "--arbiters", "127.0.0.1:1", "--incarnation", "-1"],
            "incarnation must be in",
        ),
        (
            ["node", "--id", "n1", "--arbiters", "127.0.0.1:1", "--leave-timeout", "nan"],
            "finite number",
        ),
        (
            [
                "arbiter",
                "--id",
                "a1",
                "--listen",
                "127.0.0.1:1",
                "--peers",
                "a1=127.0.0.1:1",
                "--heartbeat-interval",
                "inf",
                "--check-config",
            ],
            "finite number",
        ),
        (["demo", "--timeout", "0"], "finite number > 0"),
    ],
)
def test_cli_bad_flags_one_line_error_no_traceback(argv: list[str], expect: str) -> None:
    r = run_cli(*argv)
    assert r.returncode != 0
    assert expect in _one_line_error(r)


@pytest.mark.parametrize("command", ["view", "watch", "node"])
def test_cli_unreachable_arbiters_one_line_error(command: str) -> None:
    (port,) = free_ports(1)
    argv = [command, "--arbiters", f"127.0.0.1:{port}"]
    if command == "node":
        argv += ["--id", "n1", "--connect-timeout", "1"]
    if command == "watch":
        argv += ["--connect-timeout", "1"]
    if command == "view":
        argv += ["--timeout", "1"]
    r = run_cli(*argv)
    assert r.returncode == 1
    assert "no arbiter" in _one_line_error(r)


def test_cli_arbiter_check_config_accepts_valid_flags() -> None:
    r = run_cli(
        "arbiter",
        "--id",
        "a1",
        "--listen",
        "127.0.0.1:7001",
        "--peers",
        "a1=127.0.0.1:7001,a2=127.0.0.1:7002,a3=127.0.0.1:7003",
        "--check-config",
    )
    assert r.returncode == 0, r.stderr
    assert "configuration OK" in r.stdout


def test_cli_arbiter_sigterm_stops_gracefully() -> None:
    (port,) = free_ports(1)
    addr = f"127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "membership",
            "--log-level",
            "info",
            "arbiter",
            "--id",
            "a1",
            "--listen",
            addr,
            "--peers",
            f"a1={addr}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 15
        while run_cli("view", "--arbiters", addr, "--timeout", "1").returncode != 0:
            assert time.monotonic() < deadline, "arbiter did not start"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert "stopped" in err and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_demo_exits_zero_within_60s_and_leaves_no_process() -> None:
    t0 = time.monotonic()
    mark = uuid.uuid4().hex
    proc = _demo(mark)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out + err
    assert time.monotonic() - t0 < 60
    assert "declared DEAD by a quorum" in out
    assert "summary" in out
    assert _marked(mark) == []


def test_cli_demo_interrupted_leaves_no_process() -> None:
    mark = uuid.uuid4().hex
    proc = _demo(mark)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until the cluster is up
            if "all" in line and "ALIVE" in line:
                break
        running = _marked(mark)
        # the demo, 3 arbiters, 5 nodes; it may have killed its first node already
        assert len(running) >= 8, running
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        assert proc.returncode is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _marked(mark) == []


def _demo(mark: str) -> subprocess.Popen[str]:
    """Starts the demo with ``mark`` in its environment (inherited by every child)."""
    return subprocess.Popen(
        [sys.executable, "-m", "membership", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DEMO_TEST_MARK": mark},
    )


def _marked(mark: str) -> list[str]:
    """Command lines of live processes whose environment carries ``mark``."""
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
                    continue  # a zombie is already gone
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def test_cli_arbiter_port_in_use_is_one_line_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        r = run_cli(
            "arbiter",
            "--id",
            "a1",
            "--listen",
            addr,
            "--peers",
            f"a1={addr}",
            "--data-dir",
            str(tmp_path / "a1"),
        )
    assert r.returncode == 1
    assert "cannot listen on" in _one_line_error(r)
