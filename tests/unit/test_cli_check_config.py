"""``membership node|watch|view --check-config``: every flag validated, nothing connected."""

from __future__ import annotations

import grpc
import pytest

from membership.cli import main

ARBITERS = "a1:7000,a2:7000,a3:7000"


@pytest.fixture(autouse=True)
def no_channels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if a command opens a channel: --check-config must not connect."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"--check-config opened a channel to {args[:1]}")

    monkeypatch.setattr(grpc.aio, "insecure_channel", refuse)


@pytest.mark.parametrize(
    ("argv", "first_line", "settings"),
    [
        (
            [
                *("node", "--id", "n1", "--arbiters", ARBITERS),
                *("--label", "rack=r1", "--label", "gpu=a100"),
                *("--no-status-probes", "--incarnation", "5"),
            ],
            "node n1: configuration OK",
            [
                f"arbiters = {ARBITERS}",
                "labels = rack=r1,gpu=a100",
                "incarnation = 5",
                "collect_status = False",
                "auto_rejoin = True",
            ],
        ),
        (
            ["node", "--id", "n1", "--arbiters", ARBITERS, "--no-rejoin"],
            "node n1: configuration OK",
            ["labels = ", "auto_rejoin = False", "leave_timeout = 5.0"],
        ),
        (
            ["watch", "--arbiters", ARBITERS, "--json", "--since-epoch", "7"],
            "watch: configuration OK",
            [f"arbiters = {ARBITERS}", "json = True", "since_epoch = 7"],
        ),
        (
            ["view", "--arbiters", "127.0.0.1:7000", "--timeout", "2"],
            "view: configuration OK",
            ["arbiters = 127.0.0.1:7000", "call_timeout = 2.0"],
        ),
    ],
)
def test_cli_check_config_valid_flags_print_ok_and_exit_zero(
    argv: list[str], first_line: str, settings: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--check-config"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == first_line
    for line in settings:
        assert f"  {line}" in out, (line, out)


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["node", "--id", "bad id", "--arbiters", ARBITERS], "node_id"),
        (["node", "--id", "n1", "--arbiters", "a1:7000,a1:7000"], "listed twice"),
        (["node", "--id", "n1", "--arbiters", ARBITERS, "--label", "/x=1"], "label key"),
        (["node", "--id", "n1", "--arbiters", ARBITERS, "--label", "k=\x01"], "non-printable"),
        (["node", "--id", "n1", "--arbiters", ARBITERS, "--incarnation", "0"], "incarnation"),
        (["watch", "--arbiters", "a1:7000,a1:7000"], "listed twice"),
        (["view", "--arbiters", "a1:7000,a1:7000"], "listed twice"),
    ],
)
def test_cli_check_config_invalid_value_one_line_error_exit_one(
    argv: list[str], expect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--check-config"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"membership {argv[0]}: error: ")
    assert expect in lines[0]


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["node", "--id", "n1", "--arbiters", "a1"], "not host:port"),
        (["node", "--id", "n1", "--arbiters", ARBITERS, "--label", "novalue"], "key=value"),
        (["watch", "--arbiters", "a1:0"], "valid port"),
        (["watch", "--arbiters", ARBITERS, "--since-epoch", "-1"], ">= 0"),
        (["view", "--arbiters", ARBITERS, "--timeout", "inf"], "finite number"),
    ],
)
def test_cli_check_config_malformed_flag_is_a_usage_error(
    argv: list[str], expect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--check-config"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert expect in err.strip().splitlines()[-1]
