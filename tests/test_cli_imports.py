"""Startup cost: `capture --help` and the store commands never import torch (STYLE: startup cost).

Each case runs the command in a fresh interpreter through ``cli(..., standalone_mode=False)``
and then reports which heavy modules ended up in ``sys.modules``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import capture

SCRIPT = """
import sys
from capture.cli.main import cli
cli(sys.argv[1:], standalone_mode=False)
watched = ("torch", "transformers", "duckdb", "pyarrow")
watched += tuple(f"capture.cli.{m}" for m in ("query", "export", "demo"))
sys.stderr.write("imported: " + " ".join(m for m in watched if m in sys.modules) + "\\n")
"""


class Toy(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


@pytest.fixture
def store(tmp_path: Path) -> str:
    model = Toy()
    with capture.Recorder(model, tmp_path / "store", name="toy"):
        model(torch.ones(2, 3))
        model(torch.ones(4, 3))
    return str(tmp_path / "store")


def _imported(*args: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith("imported:"), result.stderr
    return last.removeprefix("imported:").split()


def test_group_help_imports_no_command_and_no_heavy_module() -> None:
    assert _imported("--help") == []


def test_command_help_imports_only_its_module() -> None:
    assert _imported("query", "--help") == ["capture.cli.query"]


@pytest.mark.parametrize(
    "args",
    [
        ["query", "SELECT count(*) AS n FROM calls"],
        ["summary"],
        ["dims"],
        ["dims", "--python"],
        ["compact"],
        ["report", "--out", "{tmp}/r.html"],
        ["buckets", "--budget", "2"],
    ],
    ids=["query", "summary", "dims", "dims-python", "compact", "report", "buckets"],
)
def test_store_commands_do_not_import_torch(store: str, args: list[str], tmp_path: Path) -> None:
    # The report draws what capture export would do (replay.inputs.source), still without torch.
    imported = _imported("--store", store, *(a.format(tmp=tmp_path) for a in args))
    assert "torch" not in imported
    assert "transformers" not in imported
