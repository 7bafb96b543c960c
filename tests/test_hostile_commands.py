"""Every command over every hostile store: an answer, or one ``Error:`` line and exit 1; never a
traceback (the stores: tests/hostile_stores.py, the crafted stores of test_hostile.py, a store of
calls with an unknown class (fixtures.unregistered), and files whose values no writer
writes). A file whose values are corrupt is named in the error, and left as it is."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hostile_stores import CORRUPT, PLANTERS

import replay
from capture.cli.check import EXIT_NOT_SERVED
from capture.cli.main import cli
from capture.errors import CaptureError, CorruptStoreFile
from capture.record.recorder import Recorder
from fixtures.unregistered import record_stateful

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


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real store (6 calls of `Add`, one flush each), its model file and its artifact."""
    root = tmp_path_factory.mktemp("matrix")
    store = root / "store"
    rec = Recorder(Add(), store, name="add", flush_seconds=3600)
    with rec, torch.no_grad():
        for n in range(1, 7):
            rec.model(torch.ones(n, 3), torch.ones(n, 3))
            rec.flush()
    unknown = root / "unknown-class"
    record_stateful(unknown, [(2, True), (3, True), (2, False)])
    model_file = root / "addmodel.py"
    model_file.write_text(MODEL_FILE)
    artifact = root / "add.pt2"
    result = CliRunner().invoke(
        cli, ["--store", str(store), "export", f"{model_file}:build", "--out", str(artifact)]
    )
    assert result.exit_code == 0, result.output
    return {"store": store, "unknown": unknown, "model": model_file, "artifact": artifact}


def _commands(base: dict[str, Path], tmp: Path) -> dict[str, list[str]]:
    return {
        "query": ["query", "SELECT count(*) AS n, sum(len(dims)) AS d FROM calls"],
        "query dims": ["query", "SELECT axis, size, count(*) FROM dims GROUP BY ALL"],
        "summary": ["summary"],
        "summary json": ["summary", "-f", "json"],
        "summary --artifact": ["summary", "--artifact", str(base["artifact"])],
        "dims": ["dims"],
        "dims --python": ["dims", "--python"],
        "payloads": ["payloads"],
        "report": ["report", "--out", str(tmp / "report.html")],
        "profiles": ["profiles"],
        "buckets": ["buckets", "--budget", "2"],
        "compact": ["compact"],
    }


RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""A control or bidirectional character as a terminal reads it (newline allowed)."""

SLOW_COMMANDS = ("export", "check")
"""Commands that run torch.export or the exported programs (seconds each)."""


def _slow_commands(base: dict[str, Path]) -> dict[str, list[str]]:
    return {
        "export": ["export", f"{base['model']}:build"],
        "check": ["check", str(base["artifact"])],
    }


def _hostile(base: dict[str, Path], tmp: Path, name: str) -> tuple[Path, Path | None]:
    """A copy of the store with `name` planted (the file it broke), or the unknown-class store."""
    if name == "unknown_class":
        store = tmp / "store"
        shutil.copytree(base["unknown"], store)
        return store, None
    store = tmp / "store"
    shutil.copytree(base["store"], store, symlinks=True)
    return store, PLANTERS[name](store)


def _one_outcome(
    name: str, command: str, code: int, stdout: str, stderr: str, exception: BaseException | None
) -> str | None:
    """Why this run is not an answer nor one error line (None: it is one of them)."""
    if exception is not None and not isinstance(exception, SystemExit):
        return f"{name} / {command}: raised {type(exception).__name__}: {exception}"
    if "Traceback" in stdout + stderr:
        return f"{name} / {command}: printed a traceback"
    # nothing from a store reaches a terminal unescaped (json piped is exact data)
    raw = RAW_CONTROL.findall(stderr if "json" in command else stdout + stderr)
    if raw:
        return f"{name} / {command}: printed raw control characters {sorted(set(raw))!r}"
    if code == 0 or (command == "check" and code == EXIT_NOT_SERVED):
        return None  # an answer (check: some recorded calls are not served)
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    if code != 1 or len(errors) != 1 or stderr.strip().splitlines()[-1] != errors[0]:
        return f"{name} / {command}: exit {code}, stderr {stderr[-500:]!r}"
    return None


def _run_matrix(
    base: dict[str, Path], tmp: Path, name: str, commands: dict[str, list[str]]
) -> list[str]:
    problems = []
    for command, args in commands.items():
        where = tmp / command.replace(" ", "_").replace("-", "")
        where.mkdir()
        store, broken = _hostile(base, where, name)
        # a corrupt file is left as it is by every command, compact included
        before = broken.read_bytes() if broken is not None and name in CORRUPT else None
        result = CliRunner().invoke(cli, ["--store", str(store), *args])
        why = _one_outcome(
            name, command, result.exit_code, result.stdout, result.stderr, result.exception
        )
        if why is not None:
            problems.append(why)
        if name in CORRUPT and result.exit_code == 1:
            said = result.stderr.strip().splitlines()[-1]
            if str(broken) not in said or CORRUPT[name] not in said:
                if "the structures rows of" not in said:  # a structure read past the sizes
                    problems.append(f"{name} / {command}: {said!r} does not name the file")
        if broken is not None and before is not None and broken.read_bytes() != before:
            problems.append(f"{name} / {command}: changed {broken}")
    return problems


STORES = [*PLANTERS, "unknown_class"]


@pytest.mark.parametrize("name", STORES)
def test_every_command_answers_or_fails_in_one_line(
    base: dict[str, Path], tmp_path: Path, name: str
) -> None:
    problems = _run_matrix(base, tmp_path, name, _commands(base, tmp_path))
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("name", STORES)
def test_export_and_check_answer_or_fail_in_one_line(
    base: dict[str, Path], tmp_path: Path, name: str
) -> None:
    problems = _run_matrix(base, tmp_path, name, _slow_commands(base))
    assert not problems, "\n".join(problems)


CORRUPT_COMMANDS: dict[str, list[str]] = {
    "null_in_dims": ["query", "compact"],
    "null_dims_list": ["query", "compact"],
    "negative_dim_offset": [
        "summary",
        "dims",
        "report",
        "profiles",
        "buckets",
        "summary --artifact",
    ],
    "negative_calls": ["summary", "report", "buckets"],
    # JSON nested past the recursion limit is the file's error, not a RecursionError
    "deep_signature": ["query", "summary", "dims", "profiles", "buckets", "summary --artifact"],
    "deep_treespec": ["query", "summary", "dims", "profiles", "buckets"],
    "deep_replaces": ["query", "summary", "dims", "compact", "profiles", "buckets"],
}


@pytest.mark.parametrize("name", sorted(CORRUPT_COMMANDS))
def test_a_corrupt_file_is_one_error_naming_it(
    base: dict[str, Path], tmp_path: Path, name: str
) -> None:
    commands = _commands(base, tmp_path)
    for command in CORRUPT_COMMANDS[name]:
        where = tmp_path / command.replace(" ", "_").replace("-", "")
        where.mkdir()
        store, broken = _hostile(base, where, name)
        result = CliRunner().invoke(cli, ["--store", str(store), *commands[command]])
        assert result.exit_code == 1, (command, result.output)
        said = result.stderr.strip().splitlines()[-1]
        assert said.startswith("Error: ") and str(broken) in said and CORRUPT[name] in said


@pytest.mark.slow
def test_check_of_a_null_size_is_one_error_naming_the_file(
    base: dict[str, Path], tmp_path: Path
) -> None:
    store, broken = _hostile(base, tmp_path, "null_in_dims")
    result = CliRunner().invoke(cli, ["--store", str(store), "check", str(base["artifact"])])
    assert result.exit_code == 1, result.output
    assert str(broken) in result.stderr and "a null in its dims" in result.stderr


@pytest.mark.slow
def test_replay_export_raises_the_projects_error(base: dict[str, Path], tmp_path: Path) -> None:
    store, broken = _hostile(base, tmp_path, "negative_dim_offset")
    with pytest.raises(CaptureError, match="negative value in its dim_offset"):
        replay.export(Add(), store)


@pytest.mark.parametrize("name", ["deep_signature", "deep_treespec", "deep_replaces"])
def test_replay_export_of_deeply_nested_json_is_the_files_error(
    base: dict[str, Path], tmp_path: Path, name: str
) -> None:
    # one CorruptStoreFile naming the file, no RecursionError
    store, broken = _hostile(base, tmp_path, name)
    with pytest.raises(CorruptStoreFile) as raised:
        replay.export(Add(), store)
    assert str(broken) in str(raised.value) and CORRUPT[name] in str(raised.value)
