"""The ``membership`` command: one-line errors, exit codes per kind, the arbiter's start-up checks.

Signals and the demo are in test_cli_signals.py.
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import sqlite3
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from membership.testing.localcluster import free_ports
from tests.integration.harness import ProcCluster, run_cli, wait_until

pytestmark = pytest.mark.integration

# A peer list of one replica whose data dir is somewhere harmless.
ONE = ("--id", "a1", "--listen", "127.0.0.1:1", "--peers", "a1=127.0.0.1:1")


def _one_line_error(r: subprocess.CompletedProcess[str], command: str) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    prefix = f"membership {command}".rstrip() + ": error: "
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


USAGE_ERRORS = [
    (["node", "--arbiters", "127.0.0.1:1"], "--id"),
    (["node", "--id", "n1", "--arbiters", "nohost"], "not host:port"),
    (["node", "--id", "n1", "--arbiters", "127.0.0.1:99999"], "valid port"),
    (["node", "--id", "bad id", "--arbiters", "127.0.0.1:1"], "node_id"),
    (["node", "--id", "n1", "--arbiters", "127.0.0.1:1", "--label", "novalue"], "key=value"),
    (["node", "--id", "n1", "--arbiters", "127.0.0.1:1", "--label", "/k=v"], "label key"),
    (["node", "--id", "n1", "--arbiters", "127.0.0.1:1,127.0.0.1:1"], "listed twice"),
    (["watch"], "--arbiters"),
    (["watch", "--arbiters", "127.0.0.1:1", "--since-epoch", "-1"], ">= 0"),
    (["view", "--arbiters", "127.0.0.1:1", "--timeout", "-1"], "finite number > 0"),
    (["arbiter", "--id", "a9", "--listen", "127.0.0.1:1", "--peers", "a1=127.0.0.1:1"], "data"),
    (["arbiter", *ONE[:4], "--peers", "a1", "--data-dir", "/x"], "not id=host:port"),
    (["arbiter", "--id", "a9", *ONE[2:], "--data-dir", "/x"], "not in --peers"),
    (["arbiter", *ONE, "--data-dir", "/x", "--election-timeout", "0.1"], "election_timeout"),
    (["arbiter", *ONE, "--data-dir", "/x", "--heartbeat-interval", "inf"], "finite number"),
    (["arbiter", *ONE[:4], "--peers", "a1=127.0.0.1:2", "--data-dir", "/x"], "ports differ"),
    (["arbiter", *ONE, "--listen", "127.0.0.1:x", "--data-dir", "/x"], "valid port"),
    (["bogus"], "invalid choice"),
    (["node", "--id", "n1", "--arbiters", "127.0.0.1:1", "--incarnation", "-1"], "incarnation"),
    (["node", "--id", "n1", "--arbiters", "127.0.0.1:1", "--leave-timeout", "nan"], "finite"),
    (["demo", "--timeout", "0"], "finite number > 0"),
    (["demo", "--nodes", "3"], ">= 4"),
    (["view", "--log-level", "loud", "--arbiters", "127.0.0.1:1"], "invalid choice"),
    (["node", "--id", "n1", "--arbiters", "127.0.0.1:1", "--control-socket", ""], "empty path"),
    # checked before connecting (nothing listens at 127.0.0.1:1: that would be exit 1)
    (
        ["node", "--id", "n1", "--arbiters", "127.0.0.1:1", "--control-socket", "/" + "s" * 120],
        "unix socket",
    ),
]


@pytest.fixture(scope="module")
def usage_runs() -> dict[tuple[str, ...], subprocess.CompletedProcess[str]]:
    """Every USAGE_ERRORS command line run as its own ``membership`` process, four at
    a time (each is a Python start, ~0.5 s, and they are independent): by argv."""
    argvs = [tuple(argv) for argv, _ in USAGE_ERRORS]
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(argvs, pool.map(lambda a: run_cli(*a), argvs), strict=True))


@pytest.mark.parametrize(("argv", "expect"), USAGE_ERRORS)
def test_cli_usage_errors_exit_two_with_one_line(
    usage_runs: dict[tuple[str, ...], subprocess.CompletedProcess[str]],
    argv: list[str],
    expect: str,
) -> None:
    r = usage_runs[tuple(argv)]
    assert r.returncode == 2, r.stderr
    line = _one_line_error(r, argv[0] if argv[0] != "bogus" else "")
    assert expect in line, line


UNREACHABLE = ("view", "watch", "node")


@pytest.fixture(scope="module")
def unreachable_runs() -> dict[str, tuple[int, subprocess.CompletedProcess[str]]]:
    """Each UNREACHABLE command given an address where nothing listens (a port of its
    own), all run at once, each its own process (a Python start and a 1 s timeout
    apiece): by command, (port, result)."""

    def run(command: str, port: int) -> tuple[int, subprocess.CompletedProcess[str]]:
        argv = [command, "--arbiters", f"127.0.0.1:{port}"]
        if command == "node":
            argv += ["--id", "n1", "--connect-timeout", "1"]
        if command == "watch":
            argv += ["--connect-timeout", "1"]
        if command == "view":
            argv += ["--timeout", "1"]
        return port, run_cli(*argv)

    ports = free_ports(len(UNREACHABLE))
    with ThreadPoolExecutor(max_workers=len(UNREACHABLE)) as pool:
        return dict(zip(UNREACHABLE, pool.map(run, UNREACHABLE, ports), strict=True))


@pytest.mark.parametrize("command", UNREACHABLE)
def test_cli_unreachable_arbiters_exit_one_with_one_line(
    unreachable_runs: dict[str, tuple[int, subprocess.CompletedProcess[str]]], command: str
) -> None:
    port, r = unreachable_runs[command]
    assert r.returncode == 1
    # node and watch say why they wait (a warning) before giving up with the error line.
    last = r.stderr.strip().splitlines()[-1]
    assert ("no arbiter" if command == "view" else "fewer than a majority") in last, last
    assert f"127.0.0.1:{port}" in last, last  # the address and why it failed
    assert r.stderr.strip().splitlines()[-1].startswith(f"membership {command}: error: ")
    assert "Traceback" not in r.stderr


def test_cli_global_flags_after_the_command_and_version() -> None:
    r = run_cli("view", "--log-level", "debug", "--arbiters", "127.0.0.1:1", "--check-config")
    assert r.returncode == 0 and r.stdout.startswith("view: configuration OK"), r.stderr
    r = run_cli("node", "--version")
    assert r.returncode == 0 and re.fullmatch(r"membership \S+\n", r.stdout), r.stdout


def test_cli_arbiter_check_config_accepts_valid_flags() -> None:
    r = run_cli(
        *("arbiter", "--id", "a1", "--listen", "127.0.0.1:7001", "--data-dir", "/nonexistent"),
        *("--peers", "a1=127.0.0.1:7001,a2=127.0.0.1:7002,a3=127.0.0.1:7003", "--check-config"),
    )
    assert r.returncode == 0, r.stderr
    assert "configuration OK" in r.stdout and "  listen = 127.0.0.1:7001" in r.stdout
    assert "  interval_ceiling = 3.5762786865234375 (derived, seconds:" in r.stdout  # lan
    assert not Path("/nonexistent").exists()


def test_cli_arbiter_sigterm_stops_gracefully(cluster: ProcCluster) -> None:
    cluster.start_arbiters(1)
    wait_until(cluster.leader, 15, "the arbiter to lead")
    proc = cluster.procs["a1"]
    proc.signal(signal.SIGTERM)
    assert proc.popen.wait(10) == 0, proc.stderr()
    assert "Traceback" not in proc.stderr()
    assert proc.stderr().count("arbiter a1 stopped") == 1, proc.stderr()  # said once


def _arbiter(addr: str, data_dir: Path, peers: str | None = None) -> list[str]:
    return [
        *("arbiter", "--id", "a1", "--listen", addr, "--peers", peers or f"a1={addr}"),
        *("--data-dir", str(data_dir)),
    ]


def test_cli_arbiter_port_in_use_exit_one_no_data_dir(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        r = run_cli(*_arbiter(addr, tmp_path / "a1"))
    assert r.returncode == 1
    line = _one_line_error(r, "arbiter")  # and no raw gRPC log line before it
    assert f"cannot listen on {addr}: address in use" in line, line
    assert not (tmp_path / "a1").exists()


@pytest.mark.parametrize(
    ("host", "expect"),
    [
        ("no-such-host.invalid", "unknown host 'no-such-host.invalid'"),
        ("192.0.2.1", "192.0.2.1 is not an address of this machine"),  # TEST-NET-1
    ],
)
def test_cli_arbiter_unusable_listen_host_exit_one_no_data_dir(
    tmp_path: Path, host: str, expect: str
) -> None:
    (port,) = free_ports(1)
    r = run_cli(*_arbiter(f"{host}:{port}", tmp_path / "a1"))
    assert r.returncode == 1, r.stderr
    line = _one_line_error(r, "arbiter")
    assert expect in line and "in use" not in line, line
    assert not (tmp_path / "a1").exists()


def test_cli_arbiter_stored_configuration_wins_and_a_moved_address_is_refused(
    cluster: ProcCluster,
) -> None:
    cluster.start_arbiters(1)
    wait_until(cluster.leader, 15, "the arbiter to lead")
    first = cluster.arbiters["a1"]
    cluster.procs["a1"].signal(signal.SIGTERM)
    assert cluster.procs["a1"].popen.wait(10) == 0
    data_dir = cluster.data_dir("a1")
    meta = dict(sqlite3.connect(data_dir / "raft.sqlite3").execute("SELECT * FROM meta"))
    assert meta["arbiters"] == f"a1={first}"  # addresses recorded, not ids alone
    assert meta["identity"].startswith("default@")
    # Same id, same cluster, another address: the stored configuration wins over
    # --peers, and a1 would listen where the group does not look for it.
    (port,) = free_ports(1)
    r = run_cli(*_arbiter(f"127.0.0.1:{port}", data_dir))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "the stored configuration wins over --peers" in r.stderr  # says which is used
    assert "listening on" not in r.stderr  # refused before serving anything
    line = r.stderr.splitlines()[-1]
    assert line.startswith("membership arbiter: error: "), line
    assert f"is not a1's own address in --peers ({first})" in line, line
    assert "the stored configuration at log index 0 wins over --peers" in line, line
    # Its own address, but a --peers that lists another replica too: the stored
    # configuration is used (a one-replica group still leads), with a WARNING.
    (other,) = free_ports(1)
    cluster.spawn("a1", *_arbiter(first, data_dir, f"a1={first},a2=127.0.0.1:{other}"))
    wait_until(cluster.leader, 15, "a1 to lead alone, as its stored configuration says")
    err = cluster.procs["a1"].stderr()
    assert "differs from the stored configuration in force" in err
    # the listening line names the configuration in force, not the stale --peers
    # (issue 25, item 7)
    listening = next(line for line in err.splitlines() if "listening on" in line)
    assert f"arbiters in force: a1={first};" in listening and "a2=" not in listening, listening


def test_cli_node_declared_dead_with_no_rejoin_exits_three(cluster: ProcCluster) -> None:
    cluster.start_arbiters(1)
    wait_until(cluster.leader, 15, "the arbiter to lead")
    node = cluster.start_node("n1", "--no-rejoin", "--no-status-probes")
    wait_until(lambda: any("is ALIVE" in line for line in node.lines()), 15, "n1 ALIVE")
    node.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: _state(cluster, "n1") == "DEAD", 15, "n1 DEAD")
    finally:
        node.signal(signal.SIGCONT)
    assert node.popen.wait(15) == 3, node.stderr()
    assert (
        "n1 was declared DEAD by the cluster and --no-rejoin is set"
        in (node.stderr().splitlines()[-1])
    )
    # Said loudly before that: an ERROR line and the event's own line.
    assert re.search(r"ERROR .*n1 incarnation \d+ was declared DEAD by the cluster", node.stderr())
    assert any("declared DEAD by the cluster without asking; stopping" in x for x in node.lines())


def test_cli_node_made_left_by_another_leave_exits_three(cluster: ProcCluster) -> None:
    import grpc

    from membership.v1 import membership_pb2 as pb
    from membership.v1 import membership_pb2_grpc as pb_grpc

    cluster.start_arbiters(1)
    wait_until(cluster.leader, 15, "the arbiter to lead")
    node = cluster.start_node("n1", "--no-status-probes")
    alive = wait_until(
        lambda: [
            m for line in node.lines() if (m := re.match(r"n1: incarnation (\d+) is ALIVE", line))
        ],
        15,
        "n1 ALIVE",
    )
    incarnation = int(alive[-1][1])

    async def leave_for_it() -> None:
        # Someone else's Leave for n1's incarnation, straight to the arbiter (the
        # SDK sends none for a client that never joined).
        async with grpc.aio.insecure_channel(cluster.addresses[0]) as channel:
            request = pb.LeaveRequest(node_id="n1", incarnation=incarnation)
            await pb_grpc.MembershipStub(channel).Leave(request, timeout=10)

    asyncio.run(leave_for_it())
    assert node.popen.wait(15) == 3, node.stderr()
    assert "n1 was removed from the cluster: it is LEFT without having asked" in node.stderr()


def _state(cluster: ProcCluster, node_id: str) -> str | None:
    view = cluster.view()
    if view is None:
        return None
    return next((m["state"] for m in view["members"] if m["node_id"] == node_id), None)


def test_cli_watch_since_a_future_epoch_exits_one_with_one_line(cluster: ProcCluster) -> None:
    cluster.start_arbiters(1)
    wait_until(cluster.leader, 15, "the arbiter to lead")
    r = run_cli("watch", "--since-epoch", "9999", "--arbiters", cluster.arbiter_list(), timeout=30)
    assert r.returncode == 1, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("membership watch: error: ") and "9999" in line, r.stderr
    assert "Traceback" not in r.stderr


def test_cli_node_given_arbiters_of_two_clusters_exits_two_naming_them(
    cluster: ProcCluster,
) -> None:
    from membership.testing.localcluster import arbiter_args

    p1, p2 = free_ports(2)
    one, other = {"a1": f"127.0.0.1:{p1}"}, {"a1": f"127.0.0.1:{p2}"}
    cluster.spawn("x1", *arbiter_args("a1", one, cluster.workdir / "x1.data"))
    cluster.spawn("y1", *arbiter_args("a1", other, cluster.workdir / "y1.data"))
    for addr in (one["a1"], other["a1"]):
        wait_until(lambda a=addr: run_cli("view", "--arbiters", a).returncode == 0, 15, addr)
    r = run_cli("node", "--id", "n1", "--arbiters", f"{one['a1']},{other['a1']}", timeout=60)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("membership node: error: "), r.stderr
    assert one["a1"] in line and other["a1"] in line, line
