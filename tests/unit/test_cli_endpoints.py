"""MEMBERSHIP_ARBITERS (membership/cli/endpoints.py): the flag wins, the variable fills in,
and an error caused by the variable names it."""

from __future__ import annotations

import grpc
import pytest

from membership.cli import main

ENV = "a1:7000,a2:7000,a3:7000"


@pytest.fixture(autouse=True)
def no_channels(monkeypatch: pytest.MonkeyPatch) -> None:
    """--check-config must not connect."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"--check-config opened a channel to {args[:1]}")

    monkeypatch.setattr(grpc.aio, "insecure_channel", refuse)


@pytest.mark.parametrize(
    "argv",
    [
        ["node", "--id", "n1", "--check-config"],
        ["watch", "--check-config"],
        ["view", "--check-config"],
    ],
)
def test_cli_endpoints_come_from_membership_arbiters_when_the_flag_is_absent(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MEMBERSHIP_ARBITERS", ENV)
    assert main(argv) == 0
    assert f"arbiters = {ENV}" in capsys.readouterr().out


def test_cli_endpoints_flag_wins_over_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MEMBERSHIP_ARBITERS", "not an address")  # never read
    assert main(["view", "--arbiters", "127.0.0.1:7000", "--check-config"]) == 0
    assert "arbiters = 127.0.0.1:7000" in capsys.readouterr().out


def test_cli_endpoints_missing_or_malformed_is_a_usage_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MEMBERSHIP_ARBITERS", raising=False)
    with pytest.raises(SystemExit) as e:
        main(["view", "--check-config"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--arbiters (or set MEMBERSHIP_ARBITERS)" in err
    monkeypatch.setenv("MEMBERSHIP_ARBITERS", "a1:notaport")
    for argv in (["view"], ["admin", "status"], ["admin", "arbiters", "list"], ["top", "--once"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2, argv
        assert "MEMBERSHIP_ARBITERS='a1:notaport'" in err and "argument --arbiters" not in err, err
