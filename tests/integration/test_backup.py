"""Backup and restore on real processes (arbiter/server/ops/backup.py,
membership/cli/admin/snapshot.py).

Save a snapshot with ``membership admin snapshot save``, stop every replica
and delete every data dir, start all three again with ``--restore FILE``:
the new group has the same members and epoch under a new identity; a node
that was running stops (its SDK pinned the old identity) and rejoins once
restarted; a member that never comes back is DEAD after the restart grace.
The SaveSnapshot RPC needs an admin certificate under mutual TLS.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from membership.v1 import membership_pb2 as pb
from membership.v1 import membership_pb2_grpc as pb_grpc
from tests.integration.harness import ProcCluster, run_cli, wait_until

pytestmark = pytest.mark.integration

# Restored replicas wait this long before suspecting anyone (observer rule 5):
# long enough for the views to be read before the absent member is DEAD.
GRACE = "10"


def _members(view: dict[str, Any]) -> list[tuple[str, int, str]]:
    return sorted((m["node_id"], m["incarnation"], m["state"]) for m in view["members"])


def _views(cluster: ProcCluster) -> dict[str, dict[str, Any]] | None:
    """Each replica's GetView, asked directly (fast: the restart grace is running),
    in the shape of ``membership view --json``; None if one does not answer."""
    out = {}
    for rid, addr in cluster.arbiters.items():
        try:
            with grpc.insecure_channel(addr) as ch:
                r = pb_grpc.MembershipStub(ch).GetView(pb.GetViewRequest(), timeout=2)
        except grpc.RpcError:
            return None
        members = [
            {
                "node_id": m.node_id,
                "incarnation": m.incarnation,
                "state": pb.MemberState.Name(m.state).removeprefix("MEMBER_STATE_"),
            }
            for m in r.view.members
        ]
        out[rid] = {
            "epoch": r.view.epoch,
            "members": members,
            "in_quorum": r.in_quorum,
            "cluster": r.cluster,
            "instance": r.instance,
        }
    return out


def _state(cluster: ProcCluster, node: str) -> tuple[int, str] | None:
    v = cluster.view()
    for m in (v or {}).get("members", []):
        if m["node_id"] == node:
            return int(m["incarnation"]), str(m["state"])
    return None


def test_backup_save_destroy_every_data_dir_restore_same_view_nodes_rejoin(
    cluster: ProcCluster,
) -> None:
    cluster.start_arbiters(3, "--preset", "local")
    wait_until(cluster.leader, 20, "a leader")
    cluster.start_node("n1", labels={"rack": "r1"})
    cluster.start_node("n2", labels={"rack": "r2"})
    wait_until(lambda: _state(cluster, "n1") and _state(cluster, "n2"), 20, "n1 and n2 in the view")
    wait_until(
        lambda: {_state(cluster, n)[1] for n in ("n1", "n2")} == {"ALIVE"},  # type: ignore[index]
        20,
        "n1 and n2 ALIVE",
    )
    before = cluster.view()
    assert before is not None
    backup = cluster.workdir / "backup.snap"

    r = run_cli("admin", "snapshot", "save", str(backup), "--arbiters", cluster.arbiter_list())
    assert r.returncode == 0, r.stderr
    assert "snapshot saved" in r.stdout
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    r = run_cli("admin", "snapshot", "save", str(backup), "--arbiters", cluster.arbiter_list())
    assert r.returncode == 1 and "exists" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("admin", "snapshot", "status", str(backup), "--json")
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert status["valid"] is True
    assert (status["epoch"], status["members"]) == (before["epoch"], 2)
    assert status["identity"] == before["cluster"]
    saved_epoch = status["epoch"]
    damaged = backup.with_name("damaged.snap")
    raw = backup.read_bytes()
    damaged.write_bytes(raw[:-2] + bytes([raw[-2] ^ 0x20]) + raw[-1:])
    r = run_cli("admin", "snapshot", "status", str(damaged))
    assert r.returncode == 1 and "checksum mismatch" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1

    # n2 is gone for good; then every replica stops and loses its data dir.
    cluster.kill("n2")
    for rid in cluster.arbiters:
        cluster.procs[rid].signal(signal.SIGTERM)
    for rid in cluster.arbiters:
        assert cluster.procs[rid].popen.wait(15) == 0
    r = run_cli(
        "admin", "snapshot", "save", str(backup.with_name("none.snap")),
        *("--arbiters", cluster.arbiter_list(), "--timeout", "1"),
    )  # fmt: skip
    assert r.returncode == 1 and "no leader could save a snapshot" in r.stderr, r.stderr
    for rid in cluster.arbiters:
        shutil.rmtree(cluster.data_dir(rid))
    for rid in cluster.arbiters:
        for f in (cluster.procs[rid].out, cluster.procs[rid].err):
            f.rename(f.with_name(f"{rid}.before{f.suffix}"))
        cluster.start_arbiter(
            rid, "--preset", "local", "--restart-grace", GRACE, "--restore", str(backup)
        )

    views = wait_until(
        lambda: (
            (vs := _views(cluster))
            and all(v["in_quorum"] and v["instance"] for v in vs.values())
            and vs
        ),
        20,
        "the restored group in a quorum",
    )
    assert views is not None
    identities = {v["cluster"] for v in views.values()}
    assert len(identities) == 1 and identities != {before["cluster"]}
    assert {v["instance"] for v in views.values()} != {before["instance"]}
    for v in views.values():
        assert v["epoch"] == saved_epoch
        assert _members(v) == _members(before)

    # The running node refuses the new group (its SDK pinned the old identity) and stops.
    n1 = cluster.procs["n1"]
    wait_until(lambda: not n1.alive(), 20, "n1 to stop on the new cluster identity")
    assert "another cluster" in n1.stderr()
    old_n1 = _state(cluster, "n1")
    assert old_n1 is not None
    cluster.start_node("n1", labels={"rack": "r1"})
    wait_until(
        lambda: (s := _state(cluster, "n1")) and s[1] == "ALIVE" and s[0] > old_n1[0],
        20,
        "n1 ALIVE at a new incarnation in the restored group",
    )
    # n2 never came back: suspected after the restart grace, then DEAD.
    n2 = next(int(m["incarnation"]) for m in before["members"] if m["node_id"] == "n2")
    wait_until(lambda: _state(cluster, "n2") == (n2, "DEAD"), 30, "n2 DEAD after the grace")
    after = cluster.view()
    assert after is not None and after["epoch"] > saved_epoch
    assert after["cluster"] in identities


@pytest.fixture
def tls_cluster(tmp_path: Path) -> Iterator[ProcCluster]:
    """Three replicas with mutual TLS; children get no MEMBERSHIP_ setting."""
    c = ProcCluster(tmp_path)
    c.tls = True
    c.env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBERSHIP_")}
    try:
        c.start_arbiters(3, "--preset", "local")
        yield c
    finally:
        c.close()


def test_backup_save_under_tls_needs_an_admin_certificate(tls_cluster: ProcCluster) -> None:
    c = tls_cluster

    def save(name: str, role: str, target: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *(sys.executable, "-m", "membership", "admin", "snapshot", "save", str(target)),
                *("--arbiters", c.arbiter_list(), "--timeout", "20"),
                *c.certs.files(name, role).flags(),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=c.env,
            stdin=subprocess.DEVNULL,
        )

    denied = save("n1", "node", c.workdir / "n1.snap")
    assert denied.returncode == 2, denied.stderr  # a refused certificate (issue 25, item 3)
    assert "PERMISSION_DENIED" in denied.stderr and "Traceback" not in denied.stderr
    assert not (c.workdir / "n1.snap").exists()
    ok = save("admin", "admin", c.workdir / "admin.snap")
    assert ok.returncode == 0, ok.stderr
    r = run_cli("admin", "snapshot", "status", str(c.workdir / "admin.snap"), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["valid"] is True
