"""``membership admin arbiters`` on real processes: the list, its --json, and who may use it.

The changes themselves (add, remove, promote) are exercised by the
replacement and grow/shrink tests (tests/chaos/test_reconfig.py); here the
command's surface and its authorization under mutual TLS.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from membership.testing.localcluster import free_ports
from tests.integration.harness import ProcCluster, wait_until
from tests.integration.harness import secure_env as _env

pytestmark = pytest.mark.integration


def _cli(
    c: ProcCluster, *argv: str, cert: tuple[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    flags = [] if cert is None else c.certs.files(*cert).flags()
    return subprocess.run(
        [sys.executable, "-m", "membership", *argv, *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env() if c.tls else dict(os.environ),
        stdin=subprocess.DEVNULL,
    )


def test_admin_arbiters_under_mutual_tls_admin_may_node_certificate_is_denied(
    tls_cluster: ProcCluster,
) -> None:
    c = tls_cluster
    admin = ("admin", "admin")

    def listed() -> list[dict[str, object]] | None:
        r = _cli(
            c, "admin", "arbiters", "list", "--json", "--arbiters", c.arbiter_list(), cert=admin
        )
        rows = [json.loads(line) for line in r.stdout.splitlines()] if r.returncode == 0 else []
        # the leader's answer carries progress (its own at least)
        return rows if any("match" in row for row in rows) else None

    rows = wait_until(listed, 30, "the leader to list the arbiters with their progress")
    assert [(r["id"], r["address"], r["role"]) for r in rows] == [
        (rid, c.arbiters[rid], "voter") for rid in sorted(c.arbiters)
    ]
    assert all(isinstance(r["lag"], int) and r["lag"] >= 0 for r in rows if "lag" in r)
    node = ("n1", "node")
    for argv in (
        ("list",),
        ("add", "a4=127.0.0.1:1"),
        ("remove", "a3"),
        ("promote", "a3"),
    ):
        r = _cli(c, "admin", "arbiters", *argv, "--arbiters", c.arbiter_list(), cert=node)
        # a refused certificate exits 2, as a node's refused heartbeats (issue 25, item 3)
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        may = "may not list the arbiters" if argv == ("list",) else "may not administer"
        assert "PERMISSION_DENIED" in lines[0] and may in lines[0], lines[0]
        # and which certificate would do (a fresh user's trial: only admin status said it)
        needs = "an admin or an observer certificate" if argv == ("list",) else "an admin cert"
        prog = f"membership admin arbiters {argv[0]}"
        assert lines[0].startswith(f"{prog}: error: ") and f"{prog[11:]} needs {needs}" in lines[0]
    # Nothing changed: the same three voters.
    assert [r["id"] for r in listed() or []] == ["a1", "a2", "a3"]


def test_admin_arbiters_usage_errors_exit_two_and_refusals_exit_one(tmp_path: Path) -> None:
    c = ProcCluster(tmp_path)
    try:
        c.start_arbiters(1)
        wait_until(c.leader, 20, "a leader")
        r = _cli(c, "admin", "arbiters", "add", "a4", "--arbiters", c.arbiter_list())
        assert r.returncode == 2 and "is not ID=HOST:PORT" in r.stderr, r.stderr
        r = _cli(c, "admin", "arbiters", "add", "a1=127.0.0.1:1", "--arbiters", c.arbiter_list())
        assert r.returncode == 1 and "ALREADY_EXISTS" in r.stderr, r.stderr
        r = _cli(c, "admin", "arbiters", "remove", "a9", "--arbiters", c.arbiter_list())
        assert r.returncode == 1 and "NOT_FOUND" in r.stderr, r.stderr
        r = _cli(c, "admin", "arbiters", "remove", "a1", "--arbiters", c.arbiter_list())
        assert r.returncode == 1 and "is the last voter" in r.stderr, r.stderr
        # A learner that never started is not promoted by hand (it would vote absent).
        (port,) = free_ports(1)
        r = _cli(
            c, "admin", "arbiters", "add", f"a5=127.0.0.1:{port}", "--arbiters", c.arbiter_list()
        )
        assert r.returncode == 0, r.stderr
        r = _cli(c, "admin", "arbiters", "promote", "a5", "--arbiters", c.arbiter_list())
        assert r.returncode == 1 and "learner a5 is not caught up" in r.stderr, r.stderr
        r = _cli(c, "admin", "arbiters", "list", "--json", "--arbiters", c.arbiter_list())
        roles = {row["id"]: row["role"] for row in map(json.loads, r.stdout.splitlines())}
        assert roles == {"a1": "voter", "a5": "learner"}, r.stdout
        # The leader logged the change (a config_change event) and its new configuration.
        log = c.procs["a1"].stderr()
        assert f"arbiter configuration change add_learner a5=127.0.0.1:{port} by" in log, log
        assert "arbiter configuration at log index" in log and "learners a5" in log, log
        r = _cli(c, "admin", "arbiters", "list", "--arbiters", c.arbiter_list())
        assert r.returncode == 0 and r.stdout.split()[:4] == [
            "a1",
            c.arbiters["a1"],
            "voter",
            "leader",
        ]
    finally:
        c.close()


def test_admin_arbiters_join_under_mutual_tls_refused_until_added_then_restarts_from_its_state(
    tls_cluster: ProcCluster,
) -> None:
    c = tls_cluster

    def role(rid: str) -> object:
        # Polled: _cli's command line and environment, in the harness's long-lived
        # CLI process (no Python start per poll).
        argv = ("admin", "arbiters", "list", "--json", "--arbiters", c.arbiter_list())
        r = c.query(*argv, *c.certs.files("admin", "admin").flags(), secure=True)
        rows = [json.loads(line) for line in r.stdout.splitlines()] if r.returncode == 0 else []
        return next((row["role"] for row in rows if row["id"] == rid and "match" in row), None)

    wait_until(lambda: role("a1") == "voter", 30, "a leader")
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    join = ("arbiter", "--id", "a4", "--listen", address, "--join", c.arbiter_list())
    data = ("--data-dir", str(c.data_dir("a4")))
    # Not added yet: refused, saying which command to run, and no data dir made.
    r = _cli(c, *join, *data, cert=("a4", "arbiter"))
    assert r.returncode == 1, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert f"add it first with 'membership admin arbiters add a4={address}" in line, line
    assert not c.data_dir("a4").exists()
    r = _cli(
        c,
        "admin",
        "arbiters",
        "add",
        f"a4={address}",
        "--arbiters",
        c.arbiter_list(),
        cert=("admin", "admin"),
    )
    assert r.returncode == 0, r.stderr
    c.arbiters["a4"] = address
    a4 = c.spawn("a4", *join, *data)

    wait_until(lambda: role("a4") == "voter", 30, "a4 promoted")
    a4.signal(signal.SIGTERM)
    assert a4.popen.wait(15) == 0
    # --join with a data dir that holds state: a plain restart from it.
    a4 = c.spawn("a4", *join, *data)
    wait_until(
        lambda: (
            "restarting from the stored configuration" in a4.stderr()
            and "in_quorum=True" in a4.stderr().split("restarting from the stored")[-1]
        ),
        30,
        "a4 back in the quorum from its own state",
    )
    assert "joining cluster" not in a4.stderr().split("restarting from the stored")[-1]
