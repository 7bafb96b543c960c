"""`capture --help`, `--version`, per-command help quality and the lazy command registry."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from capture import __version__
from capture.cli.main import COMMANDS, CaptureGroup, cli


def _command(name: str) -> click.Command:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    return command


def test_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"capture {__version__}\n"
    assert result.stderr == ""


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_group_help_lists_every_command(flag: str) -> None:
    result = CliRunner().invoke(cli, [flag])
    assert result.exit_code == 0
    commands = result.stdout.split("Commands:\n", 1)[1]
    expected = "".join(
        f"  {name:<{max(map(len, COMMANDS))}}  {summary}\n"
        for name, (_, summary) in sorted(COMMANDS.items())
    )
    assert commands == expected
    assert result.stderr == ""


def test_group_help_states_store_default() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert "Default: $CAPTURE_STORE if set, else" in " ".join(result.stdout.split())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_help_has_summary_and_example(name: str) -> None:
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"Usage: capture {name} [OPTIONS]")
    assert lines[2] == f"  {COMMANDS[name][1]}"
    assert "\n  Example:\n    capture " in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_registry_summary_matches_command(name: str) -> None:
    assert _command(name).get_short_help_str(limit=200) == COMMANDS[name][1]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_states_its_default(name: str) -> None:
    context = click.Context(_command(name))
    for param in _command(name).get_params(context):
        if isinstance(param, click.Option) and "--help" not in param.opts:
            assert param.help and "Default" in param.help, f"{name} {param.opts}"


def test_help_short_flag_works_for_commands() -> None:
    result = CliRunner().invoke(cli, ["query", "-h"])
    assert result.exit_code == 0
    assert "Run SQL over the recorded calls" in result.stdout


def test_unknown_command_is_usage_error() -> None:
    result = CliRunner().invoke(cli, ["nope"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "Error: No such command 'nope'." in result.stderr


def _group_with_broken_command() -> CaptureGroup:
    @click.group(
        cls=CaptureGroup,
        lazy_commands={
            "broken": ("cli.no_such_module:broken_command", "Never loads."),
            "query": COMMANDS["query"],
        },
    )
    def group() -> None:
        """Test group."""

    assert isinstance(group, CaptureGroup)
    return group


def test_broken_command_module_is_one_line_exit_1() -> None:
    result = CliRunner().invoke(_group_with_broken_command(), ["broken"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        "Error: the 'broken' command is unavailable: importing cli.no_such_module failed "
        "(ModuleNotFoundError: No module named 'cli.no_such_module'); check the installation\n"
    )


def test_broken_command_module_leaves_help_working() -> None:
    result = CliRunner().invoke(_group_with_broken_command(), ["--help"])
    assert result.exit_code == 0
    assert result.stdout.endswith(
        "Commands:\n  broken  Never loads.\n  query   Run SQL over the recorded calls and print "
        "the result.\n"
    )


def test_broken_command_module_leaves_other_commands_working() -> None:
    result = CliRunner().invoke(_group_with_broken_command(), ["query", "--help"])
    assert result.exit_code == 0
    assert "Example:" in result.stdout


def test_python_dash_m_cli_runs_capture() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "capture.cli", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0
    assert result.stdout == f"capture {__version__}\n"
    assert result.stderr == ""


def test_a_usage_error_is_one_error_line_naming_the_help() -> None:
    result = CliRunner().invoke(cli, ["query"], prog_name="capture")
    assert result.exit_code == 2
    assert result.stdout == ""
    # one line, no usage block, and which help to read
    assert result.stderr == "Error: Missing argument 'SQL'. (see 'capture query --help')\n"
