"""Changing the arbiter group on real processes (README "Replacing an arbiter").

(a) a replica whose machine is gone (SIGKILL, data dir deleted) is replaced:
a4 is added, started with ``--join`` on an empty data dir, promoted once
caught up, and a3 removed; no view change, no node fenced, a node killed
afterwards is DEAD by the new group's quorum, and the node SDK and a
subscriber talk to a4 and no longer to a3. (b) the group grows from 3 to 5 and shrinks back while
nodes heartbeat: no false death, no fencing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any

import pytest

from membership.testing.localcluster import free_ports
from tests.integration.harness import ProcCluster, alive_set, changes, run_cli, wait_until

pytestmark = pytest.mark.integration

NODES = ("n1", "n2")


def _admin(c: ProcCluster, *argv: str, via: str = "a1") -> subprocess.CompletedProcess[str]:
    return run_cli(
        "admin", "arbiters", *argv, "--arbiters", c.arbiters[via], *c.security_flags(["admin"])
    )


def _listed(c: ProcCluster, via: str = "a1") -> dict[str, dict[str, Any]]:
    # Polled: the same command as _admin, run in the harness's long-lived CLI process.
    argv = ("admin", "arbiters", "list", "--json", "--arbiters", c.arbiters[via])
    r = c.query(*argv, *c.security_flags(["admin"]))
    if r.returncode != 0:
        return {}
    return {row["id"]: row for row in map(json.loads, r.stdout.splitlines())}


def _join(c: ProcCluster, rid: str, via: list[str]) -> None:
    """Adds ``rid`` as a learner and starts it with --join on an empty data dir."""
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    r = _admin(c, "add", f"{rid}={address}", via=via[0])
    assert r.returncode == 0, r.stderr
    assert "learner" in r.stdout, r.stdout
    c.arbiters[rid] = address
    c.spawn(
        rid,
        *("arbiter", "--id", rid, "--listen", address),
        *("--join", ",".join(c.arbiters[v] for v in via), "--data-dir", str(c.data_dir(rid))),
        *c.arbiter_args,
    )


def _fenced_after_joining(node_lines: list[str]) -> bool:
    """True when the node logged being fenced after it first held a quorum of leases."""
    held = False
    for line in node_lines:
        if "holds a quorum of leases" in line:
            held = True
        elif held and " fenced (epoch" in line:
            return True
    return False


_LEASES = re.compile(r" holds leases from (\d+) of (\d+) arbiters ")


def _holds_every_lease(node_lines: list[str]) -> bool:
    """True when the node's latest "holds leases from N of M arbiters" line has N == M."""
    found = [m for line in node_lines if (m := _LEASES.search(line))]
    return bool(found) and found[-1][1] == found[-1][2]


def _wait_every_lease(c: ProcCluster) -> None:
    """Waits until every node holds a lease from every voter. ALIVE alone is not enough
    when a replica goes next: a replica grants the node a lease only once it applied
    the node's ALIVE, so a node may hold two of three; and if the replica that goes
    is the one leading, the third's commit waits for an election (1 to 2 s), while
    the node, down to one lease, is fenced."""
    for n in NODES:
        wait_until(
            lambda n=n: _holds_every_lease(c.procs[n].stderr().splitlines()),
            20,
            f"{n} to hold a lease from every replica",
        )


def _epoch(c: ProcCluster, rid: str) -> int:
    return int((c.view(rid) or {}).get("epoch", -1))


def test_reconfig_replace_a_replica_whose_machine_is_gone(cluster: ProcCluster) -> None:
    c = cluster
    c.start_arbiters(3)
    wait_until(c.leader, 20, "a leader")
    for n in NODES:
        c.start_node(n)
    w = c.start_watch("w", first="a1")
    wait_until(lambda: alive_set(w) == set(NODES), 20, "every node ALIVE")
    _wait_every_lease(c)  # a3 goes next: the nodes must keep a quorum without it
    epoch = _epoch(c, "a1")
    a3 = c.arbiters["a3"]

    c.procs["a3"].kill()
    shutil.rmtree(c.data_dir("a3"))
    _join(c, "a4", via=["a1", "a2"])
    wait_until(
        lambda: _listed(c).get("a4", {}).get("role") == "voter", 30, "a4 promoted once caught up"
    )
    r = _admin(c, "remove", "a3")
    assert r.returncode == 0, r.stderr
    rows = wait_until(lambda: _listed(c, via="a4") or None, 20, "a4 to list the group")
    assert {rid: row["role"] for rid, row in rows.items()} == {
        "a1": "voter",
        "a2": "voter",
        "a4": "voter",
    }
    assert "joining cluster default@" in c.procs["a4"].stderr()
    # The node SDK follows the acks' arbiter set: a link to a4, none to a3.
    for n in NODES:
        wait_until(
            lambda n=n: any(
                "follows the arbiter configuration" in line
                and c.arbiters["a4"] in line
                and a3 not in line
                for line in c.procs[n].stderr().splitlines()
            ),
            20,
            f"{n} to follow the configuration without a3",
        )
    # No view change, nobody fenced.
    assert all(_epoch(c, rid) == epoch for rid in ("a1", "a2", "a4"))
    assert [ch for ch in changes(w) if ch["epoch"] > epoch] == []
    for n in NODES:
        assert not _fenced_after_joining(c.procs[n].stderr().splitlines()), c.procs[n].stderr()

    # A node killed now is DEAD, decided by the new group (a quorum of {a1, a2, a4}).
    c.procs["n2"].kill()
    wait_until(lambda: any(ch["state"] == "DEAD" for ch in changes(w, "n2")), 15, "n2 DEAD")
    dead = next(ch for ch in changes(w, "n2") if ch["state"] == "DEAD")
    judges = {e["arbiter"] for e in dead["evidence"]}
    assert len(judges) >= 2 and judges <= {"a1", "a2", "a4"}, dead
    assert {ch["node_id"] for ch in changes(w) if ch["epoch"] > epoch} == {"n2"}
    wait_until(lambda: _epoch(c, "a4") >= dead["epoch"], 10, "a4 to apply the death")
    # The subscriber follows the set too: with a1 and a2 gone, a4 serves it (it
    # was given a1, a2 and a3 only).
    for rid in ("a1", "a2"):
        c.procs[rid].kill()
    wait_until(lambda: any(ev.get("arbiter") == "a4" for ev in w.json_lines()), 20, "a4 to serve w")


def test_reconfig_grow_to_five_and_shrink_back_while_nodes_heartbeat(cluster: ProcCluster) -> None:
    c = cluster
    c.start_arbiters(3)
    wait_until(c.leader, 20, "a leader")
    for n in NODES:
        c.start_node(n)
    w = c.start_watch("w", first="a1")
    wait_until(lambda: alive_set(w) == set(NODES), 20, "every node ALIVE")
    # a4's promotion raises the lease quorum to 3 of 4 voters: a node that holds
    # leases from only two of a1, a2 and a3 then depends on a4's.
    _wait_every_lease(c)
    epoch = _epoch(c, "a1")
    for rid in ("a4", "a5"):
        _join(c, rid, via=["a1", "a2", "a3"])
        wait_until(
            lambda rid=rid: _listed(c).get(rid, {}).get("role") == "voter",
            30,
            f"{rid} promoted",
        )
    assert len(_listed(c)) == 5
    for rid in ("a5", "a4"):
        r = _admin(c, "remove", rid)
        assert r.returncode == 0, r.stderr
        # A removed replica stops by itself, exit 0 (reconfig.py rule 2).
        assert c.procs[rid].popen.wait(20) == 0, c.procs[rid].stderr()
        assert "was removed from the arbiter group" in c.procs[rid].stderr()
    assert sorted(_listed(c)) == ["a1", "a2", "a3"]
    # Started again on its data dir, a removed replica finds it in its log and exits 0.
    again = c.spawn(
        "a5",
        *("arbiter", "--id", "a5", "--listen", c.arbiters["a5"], "--join", c.arbiters["a1"]),
        *("--data-dir", str(c.data_dir("a5"))),
    )
    assert again.popen.wait(20) == 0, again.stderr()
    assert "was removed from the arbiter group" in again.stderr().split("restarting from")[-1]
    # it was given --join, not --peers: no word of a --peers that differs (issue 25, item 7)
    assert "--peers" not in again.stderr(), again.stderr()
    assert [ch for ch in changes(w) if ch["epoch"] > epoch] == []
    assert _epoch(c, "a1") == epoch
    for n in NODES:
        assert c.procs[n].alive()
        assert not _fenced_after_joining(c.procs[n].stderr().splitlines()), c.procs[n].stderr()
