"""membership.cli.output: the shapes the CLI prints, and events it has no shape for yet."""

from __future__ import annotations

import json
from dataclasses import dataclass

from membership.cli.output import event_lines
from membership.shared.view import MemberState, QuorumChanged


@dataclass(frozen=True, slots=True, kw_only=True)
class Disconnected:  # an event type the SDK may add before this module knows it
    arbiter_id: str
    silence: float
    state: MemberState


def test_cli_output_unknown_event_is_rendered_from_its_fields() -> None:
    ev = Disconnected(arbiter_id="a1", silence=12.5, state=MemberState.DEAD)
    [line] = event_lines(ev, as_json=True)
    assert json.loads(line) == {
        "type": "disconnected",
        "arbiter_id": "a1",
        "silence": 12.5,
        "state": "DEAD",
    }
    assert event_lines(ev, as_json=False) == ["disconnected: arbiter_id=a1 silence=12.5 state=DEAD"]


def test_cli_output_quorum_lines() -> None:
    ev = QuorumChanged(in_quorum=False, arbiter_id="a3", leader_id=None)
    [line] = event_lines(ev, as_json=True)
    assert json.loads(line) == {
        "type": "quorum",
        "in_quorum": False,
        "arbiter": "a3",
        "leader": None,
    }
    assert event_lines(ev, as_json=False) == ["arbiter a3 lost its quorum (leader: none)"]


def test_cli_configures_grpc_before_grpc_is_first_imported() -> None:
    # gRPC reads GRPC_ENABLE_FORK_SUPPORT and GRPC_VERBOSITY once, on import:
    # set later, the demo's children could inherit a broken poller from a
    # fork racing gRPC's threads (a demo node died so about one run in six).
    import subprocess
    import sys

    probe = (
        "import os, sys\n"
        "class Spy:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'grpc':\n"
        "            print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'), "
        "os.environ.get('GRPC_VERBOSITY'))\n"
        "            sys.meta_path.remove(self)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Spy())\n"
        "os.environ.pop('GRPC_ENABLE_FORK_SUPPORT', None)\n"
        "os.environ.pop('GRPC_VERBOSITY', None)\n"
        "import membership.cli\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out[:2] == ["false", "ERROR"], out


def test_output_node_lines_while_leaving_leave_out_the_join_that_commits_meanwhile() -> None:
    # A fresh user's trial: SIGINT while joining printed "leaving", then "is ALIVE" and
    # "unfenced" (the join committing during the leave), then "LEFT".
    from membership._node.session import Fenced, StateChanged
    from membership.cli.output import session_event_line

    alive = StateChanged(state=MemberState.ALIVE, incarnation=7)
    unfenced = Fenced(fenced=False, epoch=3)
    left = StateChanged(state=MemberState.LEFT, incarnation=7)
    assert session_event_line("n1", alive) == "n1: incarnation 7 is ALIVE"
    assert session_event_line("n1", unfenced) == "n1: unfenced (fencing epoch 3)"
    assert session_event_line("n1", alive, leaving=True) is None
    assert session_event_line("n1", unfenced, leaving=True) is None
    assert session_event_line("n1", left, leaving=True) == "n1: incarnation 7 is LEFT"
    fenced = Fenced(fenced=True, epoch=4)
    assert session_event_line("n1", fenced, leaving=True) == "n1: fenced (fencing epoch 4)"


def test_output_node_lines_of_a_takeover_say_taken_over_not_dead_first() -> None:
    # A fresh user's trial: a node taken over printed "is DEAD", then "taken over".
    from membership._node.session import Fenced, StateChanged, Superseded
    from membership.cli.output import session_event_line

    events = [
        Fenced(fenced=True, epoch=5),
        StateChanged(state=MemberState.DEAD, incarnation=10),
        Superseded(incarnation=10, by=20),
    ]  # as the session emits them (tests/unit/test_session.py)
    lines = [session_event_line("n1", ev, taken_over=True) for ev in events]
    assert [line for line in lines if line] == [
        "n1: fenced (fencing epoch 5)",
        "n1: incarnation 10 taken over by 20; stopping",
    ]
    # any other death is still said
    dead = StateChanged(state=MemberState.DEAD, incarnation=10)
    assert session_event_line("n1", dead) == "n1: incarnation 10 is DEAD"
