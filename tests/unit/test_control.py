"""The control socket's start (membership/control.py rule 1): a path it cannot use is
one error naming --control-socket and the path, before the node contacts anyone."""

from __future__ import annotations

from pathlib import Path

import pytest

from membership.client import MembershipClient
from membership.config import ClientConfig
from membership.control import MAX_PATH, start, stop
from membership.errors import InvalidArgument
from membership.exits import EXIT_FAILURE, CliError


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
