"""The control socket (membership/cli/control.py) and its client ``membership node-ctl``: a
path the sidecar cannot use is one error naming --control-socket and the path; node-ctl
takes its flags before or after the action and waits what --timeout says."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from membership._client import MembershipClient
from membership._config import ClientConfig
from membership._node.graces import MAX_REASON, GraceWindow
from membership.cli.control import MAX_PATH, ControlServer, start, stop
from membership.shared.errors import InvalidArgument
from membership.shared.exits import EXIT_FAILURE, CliError


def _client() -> MembershipClient:
    return MembershipClient(["127.0.0.1:1"], node_id="n1", config=ClientConfig(insecure=True))


async def test_control_start_where_no_folder_can_be_made_names_the_flag_and_path(
    tmp_path: Path,
) -> None:
    (tmp_path / "file").write_text("not a folder")
    path = str(tmp_path / "file" / "n1.sock")
    with pytest.raises(CliError) as e:
        await start(_client(), path)
    assert e.value.code == EXIT_FAILURE
    assert str(e.value).startswith(f"--control-socket {path}: cannot serve it there: ")


@pytest.mark.parametrize(
    ("name", "expect"),
    [("s" * MAX_PATH, "unix socket"), ("file", "exists and is not a socket")],
)
async def test_control_start_refuses_a_bad_path_as_a_usage_error(
    tmp_path: Path, name: str, expect: str
) -> None:
    (tmp_path / "file").write_text("kept")
    path = str(tmp_path / name)
    with pytest.raises(InvalidArgument, match=expect):
        await start(_client(), path)
    assert (tmp_path / "file").read_text() == "kept"


async def test_control_start_makes_its_folder_and_stop_removes_the_socket(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run" / "n1.sock"
    server = await start(_client(), str(path))
    assert server is not None and path.is_socket() and path.stat().st_mode & 0o777 == 0o600
    await stop(server)
    assert not path.exists()


def _parse(*argv: str) -> argparse.Namespace:
    from membership.cli import build_parser

    return build_parser().parse_args(["node-ctl", *argv])


@pytest.mark.parametrize(
    ("argv", "socket", "timeout"),
    [
        (["--socket", "/a.sock", "--timeout", "7", "status"], "/a.sock", 7.0),
        (["status", "--socket", "/b.sock", "--timeout", "3"], "/b.sock", 3.0),  # after it
        (["--socket", "/a.sock", "--timeout", "7", "wait", "--timeout", "60"], "/a.sock", 60.0),
        (["--socket", "/a.sock", "grace", "5"], "/a.sock", 30.0),
    ],
)
def test_node_ctl_socket_and_timeout_before_or_after_the_action(
    argv: list[str], socket: str, timeout: float
) -> None:
    args = _parse(*argv)
    assert (args.socket, args.timeout) == (socket, timeout)


def test_node_ctl_reason_over_the_limit_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as e:
        _parse("--socket", "/a.sock", "grace", "5", "--reason", "x" * (MAX_REASON + 1))
    assert e.value.code == 2
    assert f"at most {MAX_REASON} printable characters" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "sent", "waited"),
    [
        (["--timeout", "2", "status"], {"cmd": "status"}, 2.0),  # once answered 7 s later
        (["grace", "5", "--timeout", "2"], {"cmd": "grace", "seconds": 5.0, "timeout": 2.0}, 3.0),
        (
            ["wait", "--after", "4", "--timeout", "2"],
            {"cmd": "wait", "after": 4, "timeout": 2.0},
            3.0,
        ),
    ],
)
async def test_node_ctl_waits_its_timeout_and_gives_the_sidecar_the_same(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], sent: dict[str, Any], waited: float
) -> None:
    """status waits --timeout; grace and wait give the sidecar --timeout and wait
    ANSWER_SLACK more for its answer at the end of it (why it was not committed)."""
    from membership.cli import ctl as cli_ctl

    asked: list[tuple[dict[str, Any], float]] = []

    def request(path: str, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        asked.append((req, timeout))
        return {"ok": True, "seconds": 5.0, "grant": 9, "covered": 4.8, **STATUS}

    monkeypatch.setattr(cli_ctl, "request", request)
    assert await cli_ctl.node_ctl(_parse("--socket", "/a.sock", *argv), None) == 0
    ((req, timeout),) = asked
    assert {k: v for k, v in req.items() if k != "reason"} == sent
    assert timeout == waited == (2.0 if sent["cmd"] == "status" else 2.0 + cli_ctl.ANSWER_SLACK)


STATUS: dict[str, Any] = {
    "node_id": "n1",
    "incarnation": 1,
    "state": "ALIVE",
    "fenced": False,
    "is_member": True,
    "fencing_epoch": 3,
    "epoch": 3,
}


async def test_control_grace_passes_the_requests_timeout_to_the_client() -> None:
    """The sidecar asks with the caller's timeout (default: the client's own)."""
    calls: list[tuple[Any, ...]] = []

    class Client:
        async def grace(self, seconds: float, reason: str, timeout: float | None) -> GraceWindow:
            calls.append((seconds, reason, timeout))
            return GraceWindow(seconds=seconds, grant=5, covered=seconds - 0.2, reason=reason)

    server = ControlServer(Client(), "/unused")  # type: ignore[arg-type]
    for req in ({"cmd": "grace", "seconds": 3, "timeout": 2.5}, {"cmd": "grace", "seconds": 3}):
        answer = await server.answer(json.dumps(req).encode())
        assert answer["ok"] and answer["grant"] == 5, answer
    bad = await server.answer(b'{"cmd": "grace", "seconds": 3, "timeout": -1}')
    assert not bad["ok"] and "timeout" in bad["error"]
    assert calls == [(3, "", 2.5), (3, "", None)]
