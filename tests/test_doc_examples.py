"""Every example of README.md and docs/*.md that shows output is run, and must print it.

Each page runs in a working directory of its own (its examples write their own stores and
files; pages never share state, so they can be read and run in any order). Convention (an HTML
comment on the line before a fenced block; GitHub does not render it):

- ``<!-- readme-test: python -->`` before a ```` ```python ```` block: the block runs as a script
  (``python -c``) in a working directory where the page's earlier tested python blocks ran
  (in order), and must exit with status 0 without writing to stderr. If the next fenced block
  is marked ``<!-- readme-test: output -->``, the script's stdout must be exactly that block.
- ``<!-- readme-test: console -->`` before a ```` ```console ```` block: a transcript. Each
  ``$ capture ...`` line runs through the real CLI (click's CliRunner, in a copy of the working
  directory left by the python blocks above it); the lines up to the next ``$`` line are what
  the terminal shows (stdout and stderr, in order). The command must exit with status 0 unless
  the next line of the transcript is ``$ echo $?``, whose output is the expected status.
- Every ```` ```python ```` block, tested or not, must at least compile.

Examples must therefore avoid output that changes between runs (timestamps, call ids,
durations, host names).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest
from click.testing import CliRunner

from capture.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(
    r"(?:^<!-- readme-test: (?P<mark>[a-z]+) -->\n)?"
    r"^(?P<indent>[ ]*)```(?P<lang>[a-z]*)\n(?P<body>.*?)^(?P=indent)```[ ]*$",
    re.S | re.M,
)


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str
    line: int
    lang: str
    mark: str | None
    body: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.mark or self.lang}-line{self.line}"


def _blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    name = page.relative_to(ROOT).as_posix()
    return [
        Block(
            page=name,
            line=text.count("\n", 0, m.start("body")),
            lang=m.group("lang"),
            mark=m.group("mark"),
            body=textwrap.dedent(m.group("body")),
        )
        for m in _FENCE.finditer(text)
    ]


BLOCKS = {p.relative_to(ROOT).as_posix(): _blocks(p) for p in PAGES}
PYTHON = {page: [b for b in blocks if b.mark == "python"] for page, blocks in BLOCKS.items()}
ALL_PYTHON = [b for blocks in PYTHON.values() for b in blocks]
CONSOLE = [b for blocks in BLOCKS.values() for b in blocks if b.mark == "console"]


def _expected_output(block: Block) -> str | None:
    """The ``readme-test: output`` block right after `block`, if any."""
    blocks = BLOCKS[block.page]
    index = blocks.index(block)
    if index + 1 < len(blocks) and blocks[index + 1].mark == "output":
        return blocks[index + 1].body
    return None


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CAPTURE_STORE"}
    env["PYTHONHASHSEED"] = "0"
    return env


def _run_python(block: Block, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", block.body],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


class _Workdirs:
    """Runs each page's tested python blocks in order, each once, in copies of one directory.

    `after(page, n)` is the page's working directory once its first n blocks ran;
    `result(page, i)` is what its block i printed. Built lazily, once per session, so the tests
    may run in any order; every page starts from an empty directory of its own.
    """

    def __init__(self, base: Path) -> None:
        self.base = base
        self.dirs: dict[tuple[str, int], Path] = {}
        self.results: dict[tuple[str, int], subprocess.CompletedProcess[str]] = {}

    def after(self, page: str, n: int) -> Path:
        if (page, n) not in self.dirs:
            path = self.base / page.replace("/", "_") / f"after-{n}"
            if n == 0:
                path.mkdir(parents=True)
            else:
                shutil.copytree(self.after(page, n - 1), path)
                self.results[(page, n - 1)] = _run_python(PYTHON[page][n - 1], path)
            self.dirs[(page, n)] = path
        return self.dirs[(page, n)]

    def result(self, block: Block) -> subprocess.CompletedProcess[str]:
        index = PYTHON[block.page].index(block)
        self.after(block.page, index + 1)
        return self.results[(block.page, index)]


@pytest.fixture(scope="session")
def workdirs(tmp_path_factory: pytest.TempPathFactory) -> _Workdirs:
    return _Workdirs(tmp_path_factory.mktemp("docs"))


def _python_before(block: Block) -> int:
    """How many tested python blocks come before `block` on its page."""
    return sum(1 for b in PYTHON[block.page] if b.line < block.line)


def _transcript(body: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in body.splitlines(keepends=True):
        if line.startswith("$ "):
            steps.append((line[2:].rstrip("\n"), []))
        elif steps:
            steps[-1][1].append(line)
        else:
            raise AssertionError(f"a transcript must start with a '$ ' line, got {line!r}")
    return [(command, "".join(output)) for command, output in steps]


@pytest.mark.parametrize(
    "block",
    [b for blocks in BLOCKS.values() for b in blocks if b.lang == "python"],
    ids=lambda b: b.id,
)
def test_python_block_compiles(block: Block) -> None:
    compile(block.body, f"{block.page}:{block.line}", "exec")


_TORCH = tuple(int(p) for p in version("torch").split("+")[0].split(".")[:2])


@pytest.mark.parametrize("block", ALL_PYTHON, ids=lambda b: b.id)
def test_python_block_runs(block: Block, workdirs: _Workdirs) -> None:
    result = workdirs.result(block)
    assert result.returncode == 0, result.stderr
    stderr = result.stderr
    if _TORCH < (2, 13):
        # compile hints say once that this torch marks unbacked sizes without their range
        stderr = "".join(line for line in stderr.splitlines(True) if "mark_unbacked" not in line)
    assert stderr == ""
    expected = _expected_output(block)
    if expected is not None:
        assert result.stdout == expected


@pytest.mark.parametrize("block", CONSOLE, ids=lambda b: b.id)
def test_console_transcript(
    block: Block, workdirs: _Workdirs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = tmp_path / "work"
    shutil.copytree(workdirs.after(block.page, _python_before(block)), cwd)
    monkeypatch.chdir(cwd)
    runner = CliRunner(env={"CAPTURE_STORE": None})
    last_status: int | None = None
    previous = ""
    for command, expected in _transcript(block.body):
        if command == "echo $?":
            assert last_status is not None, "'$ echo $?' must follow a command"
            assert expected == f"{last_status}\n"
            last_status = None
            continue
        if last_status is not None:
            assert last_status == 0, f"{previous!r} exited with {last_status}"
        argv = shlex.split(command)
        assert argv[0] == "capture", f"transcripts run capture only, not {argv[0]!r}"
        result = runner.invoke(cli, argv[1:], prog_name="capture")
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        assert result.output == expected, f"$ {command}"
        last_status = result.exit_code
        previous = command
    if last_status is not None:
        assert last_status == 0, f"{previous!r} exited with {last_status}"


def test_readme_has_tested_examples() -> None:
    assert PYTHON["README.md"] and any(b.page == "README.md" for b in CONSOLE)
