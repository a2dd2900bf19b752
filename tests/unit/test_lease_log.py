"""The node logs which arbiters' leases it holds, on change only (membership/eventlog.py LeaseLog).

With the session core's lease bookkeeping (NodeSession.holders) under simulated
time, then through a real NodeAgent: its acks and its fence timer.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from membership._arbiters.identity import ClusterCheck
from membership._config import ClientConfig
from membership._node.agent import NodeAgent
from membership._node.eventlog import LeaseLog
from membership._node.session import NodeSession
from membership.shared import convert
from membership.shared.backoff import Backoff
from membership.shared.view import MemberState
from membership.v1 import membership_pb2 as pb

ADDRESSES = ("h:1", "h:2", "h:3")
NAMES = {"h:1": "a1", "h:2": "a2", "h:3": "a3"}


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "holds leases from" in r.getMessage()]


def _ack(s: NodeSession, arbiter: str, t: float, lease: float = 0.75) -> None:
    seq, _ = s.heartbeat(arbiter, t)
    s.on_ack(
        arbiter,
        seq=seq,
        lease=lease,
        state=MemberState.ALIVE,
        recorded_incarnation=1,
        epoch=3,
        now=t + 0.02,
    )


def test_lease_log_says_each_change_once_and_nothing_at_renewals(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="membership.client")
    s = NodeSession(node_id="n1", incarnation=1, arbiters=ADDRESSES, lease_guard=0.1)
    leases = LeaseLog("n1", voters=s.voters)

    def note(now: float) -> bool:
        return leases.note(s.holders(now), s.voters, s.quorum, NAMES)

    assert not note(0.0)  # nothing held yet: no "0 of 3" line at the start
    # h:3 grants first, then h:1, then h:2 (each once its ALIVE commits there);
    # every one renewed every 0.15 s (interval) for 0.75 s leases until h:2 stops
    # granting at 2.0 s.
    t, logged = 0.0, []
    while t < 4.0:
        for addr, since, until in (("h:3", 0.0, 9), ("h:1", 0.3, 9), ("h:2", 0.6, 2.0)):
            if since <= t < until:
                _ack(s, addr, t)
        if note(t + 0.02):
            logged.append(t)
        t = round(t + 0.15, 6)
    assert _lines(caplog) == [
        "n1 holds leases from 1 of 3 arbiters (a3; a quorum is 2)",
        "n1 holds leases from 2 of 3 arbiters (a1, a3; a quorum is 2)",
        "n1 holds leases from 3 of 3 arbiters (a1, a2, a3; a quorum is 2)",
        "n1 holds leases from 2 of 3 arbiters (a1, a3; a quorum is 2)",
    ]
    # The drop is said at the first look after h:2's last lease ended (sent at
    # 1.95 s: 1.95 + 0.75 - 0.1 = 2.6 s), not at its first missed renewal (2.1 s).
    assert logged[-1] == pytest.approx(2.7)
    # A new configuration changes the voters: said even though the same leases are held.
    s.configure(["h:1", "h:3", "h:4", "h:5"], [], 4, t)
    _ack(s, "h:1", t)
    _ack(s, "h:3", t)
    assert note(t + 0.02)
    assert _lines(caplog)[-1] == "n1 holds leases from 2 of 4 arbiters (a1, a3; a quorum is 3)"
    assert not note(t + 0.03)
    # Leases voided (the node left): the last line says none, by address when unnamed.
    s.leave(t + 0.05)
    assert note(t + 0.05)
    assert _lines(caplog)[-1] == "n1 holds leases from 0 of 4 arbiters (a quorum is 3)"


def _agent() -> NodeAgent:
    config = ClientConfig(collect_status=False)
    return NodeAgent(
        node_id="n1",
        incarnation=1,
        arbiters=list(ADDRESSES),
        labels={},
        config=config,
        channels=None,  # type: ignore[arg-type]  # no link runs
        backoff=Backoff(config.backoff_initial, config.backoff_max),
        check=ClusterCheck(listed=len(ADDRESSES)),
        status=None,
        on_event=None,
        fail=lambda e: None,
        closed=lambda: False,
    )


def _agent_ack(agent: NodeAgent, address: str, lease: float) -> None:
    now = time.monotonic()
    seq, _ = agent.next_request(address, now)
    ack = pb.HeartbeatAck(
        seq=seq,
        lease_seconds=lease,
        state=convert.state_to_pb(MemberState.ALIVE),
        incarnation=1,
        epoch=3,
        arbiter_id=NAMES[address],
    )
    agent.on_ack(address, ack, now)


async def test_node_agent_logs_the_leases_held_on_acks_and_when_one_runs_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="membership.client")
    agent = _agent()
    try:
        for address in ADDRESSES:
            _agent_ack(agent, address, 10.0 if address != "h:2" else 0.3)
        _agent_ack(agent, "h:1", 10.0)  # a renewal: no line
        assert _lines(caplog) == [
            "n1 holds leases from 1 of 3 arbiters (a1; a quorum is 2)",
            "n1 holds leases from 2 of 3 arbiters (a1, a2; a quorum is 2)",
            "n1 holds leases from 3 of 3 arbiters (a1, a2, a3; a quorum is 2)",
        ]
        # h:2's lease runs out in 0.3 s and nothing acks: the fence timer wakes
        # then, although the quorum's deadline is 10 s away.
        timer = asyncio.get_running_loop().create_task(agent._fence_timer())
        try:
            async with asyncio.timeout(3.0):
                while len(_lines(caplog)) < 4:
                    await asyncio.sleep(0.01)
        finally:
            timer.cancel()
        assert _lines(caplog)[3] == "n1 holds leases from 2 of 3 arbiters (a1, a3; a quorum is 2)"
        assert not agent.session.fenced(time.monotonic())
    finally:
        agent.close_status()
