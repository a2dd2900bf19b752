"""Operating a real replica group: /metrics, JSON logs, `membership admin status`, health.

One group of three replicas under mutual TLS (certificates made in the
test's folder), each with ``--metrics-listen`` and ``--log-format json``,
and two nodes. The test scrapes every replica during the run, SIGKILLs a
node, reads the replicas' log lines, then SIGKILLs replicas and asks
``membership admin status --json`` and the health service.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import ProcCluster, free_ports, wait_until
from tests.integration.harness import secure_env as _env

pytestmark = pytest.mark.integration

# Every name the issue asks for (histograms by their family name).
METRICS = (
    "membership_epoch",
    "membership_in_quorum",
    "membership_raft_term",
    "membership_raft_commit_index",
    "membership_raft_applied_index",
    "membership_raft_role",
    "membership_nodes",
    "membership_suspected_nodes",
    "membership_heartbeats_received",  # counters: the parser drops _total from the family
    "membership_acks_sent",
    "membership_observations_proposed",
    "membership_deaths",
    "membership_subscribers",
    "membership_heartbeat_streams",
    "membership_heartbeat_interarrival_seconds",
    "membership_fsync_duration_seconds",
    "membership_event_loop_lag_seconds",
    "membership_commit_to_subscriber_seconds",
)


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "membership", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(),
        stdin=subprocess.DEVNULL,
    )


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _families(address: str) -> tuple[set[str], Samples]:
    """The metric families at ``http://ADDRESS/metrics`` and every sample:
    (sample name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        text = r.read().decode()
    samples: Samples = {}
    families = set()
    for fam in text_string_to_metric_families(text):
        families.add(fam.name)
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return families, samples


def _scrape(address: str) -> Samples:
    return _families(address)[1]


def _value(samples: Samples, name: str, rid: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"arbiter": rid, **labels}.items())))]


@pytest.fixture
def ops(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[ProcCluster, dict]]:
    """Three replicas (TLS, metrics, JSON logs) and two nodes; metrics addresses by id."""
    c = ProcCluster(tmp_path)
    c.tls = True
    c.env = _env()
    ports = free_ports(6)
    c.arbiters = {f"a{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports[:3])}
    metrics = {rid: f"127.0.0.1:{p}" for rid, p in zip(c.arbiters, ports[3:], strict=True)}
    try:
        for rid in c.arbiters:
            c.start_arbiter(rid, "--metrics-listen", metrics[rid], "--log-format", "json")
        c.start_node("n1")
        c.start_node("n2")
        yield c, metrics
    finally:
        c.close()
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(c.dump())


def _json_lines(c: ProcCluster, rid: str) -> list[dict[str, Any]]:
    """A replica's stderr, every line parsed as JSON (fails on a line that is not)."""
    return [json.loads(line) for line in c.procs[rid].stderr().splitlines() if line.strip()]


def _status(c: ProcCluster, *flags: str) -> tuple[int, list[dict[str, Any]]]:
    r = _cli("admin", "status", "--json", "--timeout", "2", "--arbiters", c.arbiter_list(), *flags)
    return r.returncode, [json.loads(line) for line in r.stdout.splitlines()]


def test_ops_metrics_logs_status_and_health(ops: tuple[ProcCluster, dict[str, str]]) -> None:
    c, metrics = ops
    ids = list(c.arbiters)

    def alive(n: int) -> bool:
        try:
            return all(
                _value(_scrape(metrics[r]), "membership_nodes", r, state="ALIVE") == n for r in ids
            )
        except OSError:
            return False

    wait_until(lambda: alive(2), 30, "n1 and n2 ALIVE on every replica")
    first: dict[str, Samples] = {}
    for rid in ids:
        families, samples = _families(metrics[rid])
        first[rid] = samples
        missing = [m for m in METRICS if m not in families]
        assert not missing, f"{rid} lacks {missing}"
        assert _value(samples, "membership_in_quorum", rid) == 1.0
        assert _value(samples, "membership_heartbeat_streams", rid) == 2.0
        assert _value(samples, "membership_observations_proposed_total", rid) >= 2
        roles = [
            r
            for r in ("follower", "leader")
            if _value(samples, "membership_raft_role", rid, role=r)
        ]
        assert len(roles) == 1, roles
        assert _value(samples, "membership_heartbeat_interarrival_seconds_count", rid) > 0
    leaders = [r for r in ids if _value(first[r], "membership_raft_role", r, role="leader") == 1]
    assert len(leaders) == 1, leaders

    # Counters move: heartbeats and acks go on; a SIGKILLed node is counted dead.
    c.procs["n2"].signal(signal.SIGKILL)
    wait_until(
        lambda: all(_value(_scrape(metrics[r]), "membership_deaths_total", r) == 1.0 for r in ids),
        30,
        "n2's death counted by every replica",
    )
    for rid in ids:
        now = _scrape(metrics[rid])
        for counter in ("membership_heartbeats_received_total", "membership_acks_sent_total"):
            assert _value(now, counter, rid) > _value(first[rid], counter, rid), (rid, counter)
        assert _value(now, "membership_nodes", rid, state="DEAD") == 1.0
        assert _value(now, "membership_epoch", rid) > _value(first[rid], "membership_epoch", rid)

    # JSON logs: every line an object; the DEAD decision carries its evidence; an election.
    for rid in ids:
        lines = _json_lines(c, rid)
        assert all({"ts", "level", "logger", "msg"} <= line.keys() for line in lines)
        dead = [
            line
            for line in lines
            if line.get("event") == "membership_change"
            and line["node"] == "n2"
            and line["state"] == "DEAD"
        ]
        assert len(dead) == 1, dead
        evidence = dead[0]["evidence"]
        assert len(evidence) >= 2 and {e["arbiter"] for e in evidence} <= set(ids)
        assert all(e["silence_seconds"] > 0 for e in evidence), evidence
        assert any(
            line.get("event") == "raft_role" and line["leader"] == leaders[0] and line["term"] >= 1
            for line in lines
        )

    # admin status --json under TLS: a node's certificate is refused by every
    # replica, an observer's is allowed. All refused is not "none answered": the last
    # line says which certificate is needed, and the exit is 2 as for a node whose
    # heartbeats are refused (issue 25, item 3).
    code, lines = _status(c, *c.certs.files("n1").flags())
    assert code == 2 and all("PERMISSION_DENIED" in line["error"] for line in lines), lines
    r = _cli("admin", "status", "--timeout", "2", "--arbiters", c.arbiter_list(),
             *c.certs.files("n1").flags())  # fmt: skip
    last = r.stderr.splitlines()[-1]
    assert r.returncode == 2 and "all 3 arbiter(s) refused this certificate" in last, r.stderr
    assert "an admin or an observer certificate" in last and "answered" not in last, last
    # and so is every admin command refused its certificate: exit 2, the refusal named
    r = _cli("admin", "remove", "n2", "--arbiters", c.arbiter_list(),
             *c.certs.files("dash", "observer").flags())  # fmt: skip
    assert r.returncode == 2 and "PERMISSION_DENIED" in r.stderr, r.stderr
    code, lines = _status(c, *c.certs.files("dash", "observer").flags())
    assert code == 0 and all("error" not in line for line in lines), lines
    # Listing the arbiters is a read too (issue 25, item 5; etcd's member list): the
    # observer may, the node may not; neither may change them.
    listed = _cli("admin", "arbiters", "list", "--arbiters", c.arbiter_list(),
                  *c.certs.files("dash", "observer").flags())  # fmt: skip
    assert listed.returncode == 0 and all(r in listed.stdout for r in ids), listed
    listed = _cli("admin", "arbiters", "list", "--arbiters", c.arbiter_list(),
                  *c.certs.files("n1").flags())  # fmt: skip
    assert listed.returncode == 2 and "PERMISSION_DENIED" in listed.stderr, listed
    added = _cli("admin", "arbiters", "add", "a9=127.0.0.1:1", "--arbiters", c.arbiter_list(),
                 *c.certs.files("dash", "observer").flags())  # fmt: skip
    assert added.returncode == 2 and "PERMISSION_DENIED" in added.stderr, added

    # One replica killed: its line has an error, the others agree on leader and term.
    victim = next(r for r in ids if r != leaders[0])
    c.procs[victim].signal(signal.SIGKILL)
    admin = c.certs.files("admin", "admin").flags()

    def answered() -> list[dict[str, Any]] | None:
        code, lines = _status(c, *admin)
        ok = [line for line in lines if "error" not in line]
        agree = len({(line["leader"], line["term"]) for line in ok}) == 1
        return lines if code == 0 and len(ok) == 2 and agree and ok[0]["leader"] else None

    lines = wait_until(answered, 20, "two replicas agreeing on leader and term")
    assert [line["address"] for line in lines] == c.addresses
    down = [line for line in lines if "error" in line]
    assert len(down) == 1 and down[0]["arbiter"] == c.arbiters[victim], down
    leader = next(line for line in lines if line.get("role") == "leader")
    assert set(leader["followers"]) == set(ids) - {leader["arbiter"]}
    live = next(r for r in ids if r not in (leader["arbiter"], victim))
    for progress in leader["followers"].values():  # lag is counted from the leader's last index
        assert progress["match_index"] + progress["lag"] == leader["last_index"], leader
    assert leader["followers"][live]["match_index"] > 0

    def silent() -> dict[str, Any] | None:  # a fresh user's trial: the stopped one showed lag 0
        _, now = _status(c, *admin)
        lead = next((line for line in now if line.get("role") == "leader"), None)
        followers = lead.get("followers", {}) if lead else {}
        gone = followers.get(victim, {}).get("last_heard_seconds", 0.0)
        return followers if gone > 1.0 else None

    followers = wait_until(silent, 20, "the leader's status showing the killed follower silent")
    assert followers[live]["last_heard_seconds"] < followers[victim]["last_heard_seconds"]
    for line in lines:
        if "error" in line:
            continue
        assert line["configuration"] == {"voters": c.arbiters, "learners": {}}
        assert line["in_quorum"] is True and line["version"]
        assert line["applied_index"] <= line["commit_index"]

    # Health (issue 11 item 3): the last replica standing is out of quorum,
    # so its Membership and Admin services are NOT_SERVING, the server SERVING.
    last = live
    c.procs[leader["arbiter"]].signal(signal.SIGKILL)
    files = c.certs.files("admin", "admin")
    creds = grpc.ssl_channel_credentials(
        files.ca.read_bytes(), files.key.read_bytes(), files.cert.read_bytes()
    )

    def health(service: str) -> int:
        with grpc.secure_channel(c.arbiters[last], creds) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=3).status)

    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    wait_until(
        lambda: health("membership.v1.Membership") == not_serving, 15, "NOT_SERVING out of quorum"
    )
    assert health("membership.v1.Admin") == not_serving
    assert health("") == health_pb2.HealthCheckResponse.SERVING
    code, lines = _status(c, *admin)
    mine = next(line for line in lines if line.get("arbiter") == last)
    assert code == 0 and mine["in_quorum"] is False


async def test_ops_metrics_registry_per_replica_in_one_process(replicas: list[Any]) -> None:
    """Three replicas in this process serve metrics side by side, each its own."""
    import asyncio

    from arbiter.server.ops.metrics import MetricsServer

    ports = free_ports(len(replicas))
    servers = [MetricsServer(s, f"127.0.0.1:{p}") for s, p in zip(replicas, ports, strict=True)]
    for m in servers:
        m.start()
    try:
        for s, p in zip(replicas, ports, strict=True):
            families, samples = await asyncio.to_thread(_families, f"127.0.0.1:{p}")
            assert set(METRICS) <= families
            arbiters = {dict(labels)["arbiter"] for _, labels in samples}
            assert arbiters == {s.replica_id}
            term = _value(samples, "membership_raft_term", s.replica_id)
            assert term == s.driver.raft.status().term
    finally:
        for m in servers:
            await m.stop()
    # Stopped: the ports are free again (as a server rebinds them: TIME_WAIT allowed).
    for p in ports:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", p))


def test_ops_metrics_address_in_use_exits_one_before_the_data_dir(tmp_path: Path) -> None:
    ports = free_ports(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports[1]))
        taken.listen()
        data = tmp_path / "a1.data"
        r = subprocess.run(
            [
                *(sys.executable, "-m", "membership", "arbiter", "--insecure", "--id", "a1"),
                *("--listen", f"127.0.0.1:{ports[0]}", "--peers", f"a1=127.0.0.1:{ports[0]}"),
                *("--data-dir", str(data), "--metrics-listen", f"127.0.0.1:{ports[1]}"),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    assert r.returncode == 1, r.stderr
    assert f"cannot listen on 127.0.0.1:{ports[1]}: address in use" in r.stderr
    assert not data.exists()
