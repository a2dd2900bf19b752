"""``membership top`` against a real cluster: in a real terminal (tmux) and piped.

Three replicas run in this process; nodes are SDK clients in this process too:
n1 is healthy, n2 says it is unhealthy (DEGRADED), n3 is killed (its heartbeats
stop without a leave) and declared DEAD. ``membership top`` runs as a child
process: once inside tmux (``tmux new-session -d``, read with ``capture-pane
-p``), once with its stdout a pipe.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import uuid
from collections.abc import AsyncIterator

import pytest

from arbiter.server.app import ArbiterServer
from membership import ClientConfig, MembershipClient, MemberState
from tests.integration.harness import wait_async

pytestmark = pytest.mark.integration


@pytest.fixture
async def cluster(replicas: list[ArbiterServer]) -> AsyncIterator[list[str]]:
    """The replicas' addresses, with n1 ALIVE, n2 ALIVE and unhealthy, n3 DEAD."""
    addrs = [f"127.0.0.1:{s.port}" for s in replicas]
    cfg = ClientConfig(collect_status=False)
    nodes = {
        n: MembershipClient(addrs, node_id=n, labels={"job": "j1"}, config=cfg)
        for n in ("n1", "n2", "n3")
    }
    try:
        for node in nodes.values():
            await node.start()
        for node in nodes.values():
            await node.wait_alive(timeout=15)
        nodes["n1"].report(phase="train", step=120)
        nodes["n2"].report(phase="train", step=118, healthy=False, reason="ECC errors on GPU 3")
        await nodes["n3"].close()  # killed: no leave, DEAD after D
        leader = next(s for s in replicas if s.driver.is_leader)

        def dead() -> bool:
            m = leader.driver.state.member("n3")
            return m is not None and m.state is MemberState.DEAD

        await wait_async(dead, 15, "n3 DEAD")
        await wait_async(lambda: "n2" in replicas[0].api.degraded.marks(), 10, "n2 DEGRADED on a1")
        yield addrs
    finally:
        for node in nodes.values():
            await node.close()


def _top(*argv: str) -> list[str]:
    return [sys.executable, "-m", "membership", "top", *argv]


# pytest exports COLUMNS=80 and LINES=24, which rich (like most terminal programs)
# prefers to the terminal's own size: the child gets an environment without them.
ENV = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}


async def test_top_once_piped_prints_plain_text_with_no_escape_codes(
    cluster: list[str],
) -> None:
    proc = await asyncio.create_subprocess_exec(
        *_top("--once", "--arbiters", ",".join(cluster)),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**ENV, "MEMBERSHIP_INSECURE": "1"},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    assert "\x1b" not in text  # no escape code of any kind
    lines = text.splitlines()
    # The replicas with their role, term and quorum.
    roles = {
        ln.split()[0]: ln.split()[2] for ln in lines if ln.split()[:1] in (["a1"], ["a2"], ["a3"])
    }
    assert sorted(roles) == ["a1", "a2", "a3"] and sorted(roles.values()).count("leader") == 1
    # The nodes, the unhealthy one DEGRADED with its reason, the dead one DEAD.
    states = {"ALIVE", "DEAD", "LEFT"}
    rows = {ln.split()[0]: ln for ln in lines if ln.split()[1:2] and ln.split()[1] in states}
    assert rows["n1"].split()[1] == "ALIVE" and "unhealthy" not in rows["n1"]
    assert rows["n2"].split()[1] == "ALIVE" and "DEGRADED unhealthy" in rows["n2"]
    assert rows["n3"].split()[1] == "DEAD"
    assert " missed " in rows["n1"] and "train" in rows["n1"] and " 120 " in rows["n1"]
    assert "n2 DEGRADED unhealthy: ECC errors on GPU 3" in text
    # The recent changes: n3's death with the evidence of the replicas that suspected it.
    death = next(ln for ln in lines if "n3 (incarnation" in ln and "DEAD" in ln)
    assert "suspected by" in death and "silent" in death


async def _tmux(socket: str, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        "tmux",
        "-L",
        socket,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=ENV,  # the tmux server's, and so the pane's
    )
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err.decode()
    return out.decode()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt package tmux)")
async def test_top_in_a_real_terminal_draws_the_frame_and_quits_on_q(
    cluster: list[str], tmp_path: object
) -> None:
    socket = f"membership-top-{uuid.uuid4().hex[:8]}"  # a tmux server of this test's own
    command = " ".join(_top("--interval", "0.3", "--arbiters", ",".join(cluster)))
    try:
        await _tmux(
            socket,
            "new-session",
            "-d",
            "-x",
            "160",
            "-y",
            "45",
            "-e",
            "MEMBERSHIP_INSECURE=1",
            f"{command}; echo TOP-EXIT=$?; sleep 60",
        )

        screen = ""

        async def drawn() -> bool:
            nonlocal screen
            screen = await _tmux(socket, "capture-pane", "-p")
            return "DEGRADED unhealthy" in screen and "n3" in screen and "leader" in screen

        for _ in range(300):
            if await drawn():
                break
            await asyncio.sleep(0.1)
        assert await drawn(), screen
        lines = screen.splitlines()
        assert lines[0].startswith("membership top") and "in quorum" in lines[0]
        assert any("─" in ln for ln in lines)  # a terminal gets the tables' rules
        rows = {
            ln.split()[0]: ln.split() for ln in lines if ln.split()[1:2] in (["ALIVE"], ["DEAD"])
        }
        assert rows.get("n2", [""])[1:2] == ["ALIVE"], screen
        assert rows.get("n3", [""])[1:2] == ["DEAD"], screen
        await _tmux(socket, "send-keys", "q")
        for _ in range(200):
            screen = await _tmux(socket, "capture-pane", "-p")
            if "TOP-EXIT=" in screen:
                break
            await asyncio.sleep(0.1)
        assert "TOP-EXIT=0" in screen, screen
    finally:
        kill = await asyncio.create_subprocess_exec(
            "tmux", "-L", socket, "kill-server", stderr=asyncio.subprocess.DEVNULL
        )
        await kill.wait()
