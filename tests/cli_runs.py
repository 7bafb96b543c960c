"""Running the ``capture`` command in a child process, and reading the one error line it prints.

A command that cannot open its store prints one ``Error:`` line on stderr, nothing on stdout,
and exits 1 (no traceback); the tests of remote stores check exactly that, and how long it took.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["ROOT", "Run", "run_cli", "error_line"]

ROOT = Path(__file__).resolve().parents[1]

Run = tuple[subprocess.CompletedProcess[str], float]
"""A finished command and its wall time in seconds (start-up included)."""


def run_cli(store: str, *args: str, env: dict[str, str], timeout: float) -> Run:
    """``python -m cli --store STORE ARGS`` (``summary`` without ARGS) from the source tree,
    with `env` over this process's environment."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "--store", store, *(args or ("summary",))],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        timeout=timeout,
    )
    return proc, time.monotonic() - t0


def error_line(proc: subprocess.CompletedProcess[str], *, alone: bool = False) -> str:
    """The one ``Error:`` line of a command that exited 1 with no traceback and no stdout.

    `alone`: stderr holds that line and nothing else (no warning, no progress line).
    """
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1, proc.stderr
    if alone:
        assert lines == errors, proc.stderr
    return errors[0]
