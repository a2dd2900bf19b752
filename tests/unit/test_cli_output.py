"""membership.output: the shapes the CLI prints, and events it has no shape for yet."""

from __future__ import annotations

import json
from dataclasses import dataclass

from membership.output import event_lines
from membership.view import MemberState, QuorumChanged


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
