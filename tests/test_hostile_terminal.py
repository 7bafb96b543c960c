"""Nothing from a store reaches a terminal unescaped (capture/untrusted.py, cli/output.py): model
names, argument names and file names carrying a window-title sequence, an OSC 52 clipboard
write, a screen clear, a right-to-left override, carriage returns and backspaces are printed
escaped by every command, on stdout and stderr; json and csv piped stay the exact data."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from capture import schema
from capture.cli import output
from capture.cli.check import EXIT_NOT_SERVED
from capture.cli.main import cli
from capture.errors import UnknownModel
from capture.record.recorder import Recorder
from capture.untrusted import printable, printable_lines, terminal_data

TITLE = "\x1b]0;pwned\x07"
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4K\x07"
CLEAR = "\x1b[2J\x1b[H"
RLO = "\u202egnp.exe"
OVERWRITE = "\rok\b\b"
C1 = "\x9b31m\x7f"
EVIL = TITLE + CLIPBOARD + CLEAR + RLO + OVERWRITE + C1

RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
"""A control or bidirectional character as a terminal would read it (newline allowed)."""

MODEL_FILE = """
import torch


class Add(torch.nn.Module):
    def forward(self, x, y):
        return x + y


def build():
    return Add()
"""


class Add(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class Keywords(torch.nn.Module):
    def forward(self, x: torch.Tensor, **extra: torch.Tensor) -> torch.Tensor:
        return x + sum(extra.values())


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A store whose model and argument names carry `EVIL`, one store file named with it, and
    an artifact of `Add` (exported from a clean store) to check the store's traffic against."""
    root = tmp_path_factory.mktemp("terminal")
    clean, store = root / "clean", root / "store"
    for where, name in ((clean, "add"), (store, "add" + EVIL)):
        rec = Recorder(Add(), where, name=name, flush_seconds=3600)
        with rec, torch.no_grad():
            for n in range(1, 4):
                rec.model(torch.ones(n, 3), torch.ones(n, 3))
                rec.flush()
    rec = Recorder(Keywords(), store, name="kw" + EVIL, flush_seconds=3600)
    with rec, torch.no_grad():
        for n in range(1, 4):
            rec.model(torch.ones(n, 2), **{"arg" + EVIL: torch.ones(n, 2)})
            rec.flush()
    some = sorted((store / schema.CALLS).rglob("*.parquet"))[0]
    shutil.copy(some, some.parent / f"copy{EVIL}.parquet")  # skipped, with a warning
    model_file = root / "addmodel.py"
    model_file.write_text(MODEL_FILE)
    artifact = root / "add.pt2"
    result = CliRunner().invoke(
        cli, ["--store", str(clean), "export", f"{model_file}:build", "--out", str(artifact)]
    )
    assert result.exit_code == 0, result.output
    return {"store": store, "artifact": artifact}


def _commands(base: dict[str, Path]) -> dict[str, list[str]]:
    return {
        "summary": ["summary"],
        "summary of one model": ["summary", "--model", "kw" + EVIL],
        "dims": ["dims"],
        "dims --python": ["dims", "--model", "kw" + EVIL, "--python"],
        "query": ["query", "SELECT model, path, argument FROM structures"],
        "query --no-headers": ["query", "--no-headers", "SELECT DISTINCT model FROM calls"],
        "profiles": ["profiles"],
        "profiles trtexec": ["profiles", "--model", "kw" + EVIL, "-f", "trtexec"],
        "buckets": ["buckets", "--model", "kw" + EVIL, "--budget", "2"],
        "buckets of several models": ["buckets", "--budget", "2"],
        "check": ["check", str(base["artifact"]), "--model", "add" + EVIL],
        "compact --dry-run": ["compact", "--dry-run"],
        "compact": ["compact"],
        "unknown model": ["summary", "--model", "kw" + EVIL + "nope"],
    }


FAILING = ("unknown model", "buckets of several models")


@pytest.mark.parametrize("command", sorted(_commands({"artifact": Path("a")})))
def test_no_command_prints_a_raw_control_character(
    base: dict[str, Path], tmp_path: Path, command: str
) -> None:
    store = tmp_path / "store"
    shutil.copytree(base["store"], store)
    args = _commands(base)[command]
    result = CliRunner().invoke(cli, ["--store", str(store), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert RAW.findall(result.stdout) == []
    assert RAW.findall(result.stderr) == []
    if command in FAILING:  # one error line, naming the models escaped
        assert result.exit_code == 1
        assert result.stderr.startswith("Error: ") and printable("kw" + EVIL) in result.stderr
        return
    assert result.exit_code in (0, EXIT_NOT_SERVED if command == "check" else 0)
    if not command.startswith("compact"):  # compact names no model
        shown = result.stdout + result.stderr
        assert printable("add" + EVIL) in shown or printable("kw" + EVIL) in shown


def test_a_skipped_file_is_named_escaped_in_its_warning(base: dict[str, Path]) -> None:
    sql = "SELECT count(*) AS n FROM calls"
    result = CliRunner().invoke(cli, ["--store", str(base["store"]), "query", sql])
    assert result.exit_code == 0, result.output
    warned = [line for line in result.stderr.splitlines() if "skipping" in line]
    assert len(warned) == 1 and printable(f"copy{EVIL}.parquet") in warned[0]


def test_an_error_naming_a_stored_name_is_escaped_in_the_library_too() -> None:
    error = UnknownModel(f"no recordings of model {EVIL!r} in the store")
    assert RAW.findall(str(error)) == [] and printable_lines(EVIL) in str(error)


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv"])
def test_data_formats_piped_are_the_exact_data(base: dict[str, Path], fmt: str) -> None:
    sql = "SELECT DISTINCT model FROM calls ORDER BY model"
    result = CliRunner().invoke(cli, ["--store", str(base["store"]), "query", "-f", fmt, sql])
    assert result.exit_code == 0, result.output
    if fmt == "csv":
        assert result.stdout.startswith("model\n") and f"add{EVIL}" in result.stdout
        return
    lines = result.stdout.splitlines()
    rows = json.loads(result.stdout) if fmt == "json" else [json.loads(x) for x in lines]
    assert rows == [{"model": "add" + EVIL}, {"model": "kw" + EVIL}]


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv"])
def test_data_formats_on_a_terminal_are_escaped_and_json_reads_the_same(
    base: dict[str, Path], fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "stdout_is_terminal", lambda: True)
    sql = "SELECT DISTINCT model FROM calls ORDER BY model"
    result = CliRunner().invoke(cli, ["--store", str(base["store"]), "query", "-f", fmt, sql])
    assert result.exit_code == 0, result.output
    assert RAW.findall(result.stdout) == []
    if fmt == "json":
        assert json.loads(result.stdout) == [{"model": "add" + EVIL}, {"model": "kw" + EVIL}]
    if fmt == "csv":
        assert terminal_data(f"add{EVIL}") in result.stdout


def test_a_summary_document_on_a_terminal_reads_back_the_same(
    base: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    piped = CliRunner().invoke(cli, ["--store", str(base["store"]), "summary", "-f", "json"])
    monkeypatch.setattr(output, "stdout_is_terminal", lambda: True)
    shown = CliRunner().invoke(cli, ["--store", str(base["store"]), "summary", "-f", "json"])
    assert piped.exit_code == shown.exit_code == 0
    assert RAW.findall(shown.stdout) == [] and RAW.findall(piped.stdout) != []
    assert json.loads(shown.stdout) == json.loads(piped.stdout)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (TITLE, "\\x1b]0;pwned\\x07"),
        (CLIPBOARD, "\\x1b]52;c;cm0gLXJmIH4K\\x07"),
        (CLEAR, "\\x1b[2J\\x1b[H"),
        (RLO, "\\u202egnp.exe"),
        (OVERWRITE, "\\rok\\x08\\x08"),
        (C1, "\\x9b31m\\x7f"),
        ("\u2066isolate\u2069 a\tb\nc", "\\u2066isolate\\u2069 a\\tb\\nc"),
        ("plain naïve 名前", "plain naïve 名前"),
    ],
)
def test_printable_shows_each_sequence_escaped(text: str, shown: str) -> None:
    assert printable(text) == shown
