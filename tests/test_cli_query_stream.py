"""`capture query` streams its result: bounded memory in every format, and a
reader that stops reading (``| head``) ends the command quietly.

Each case runs the real command in a fresh process, whose peak RSS is what is measured.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import capture
from capture.cli.main import EXIT_BROKEN_PIPE
from capture.cli.output import FORMATS

# A command run in-process, then its peak RSS (MiB) on stderr: the measure of one process.
_MEASURED = """
import resource, sys
from capture.cli.main import cli
try:
    cli.main(sys.argv[1:], standalone_mode=False)
finally:
    sys.stderr.write(f"RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}\\n")
"""

# Rows of 500 characters: 100,000 of them are 50 MB as one Arrow table, more as Python rows.
_WIDE_ROWS = "SELECT range AS i, repeat('x', 500) AS s FROM range({n})"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("stream") / "store"
    model = torch.nn.Linear(2, 2)
    with capture.Recorder(model, root, name="linear"):
        model(torch.randn(1, 2))
    return str(root)


def _peak_rss(store: str, n: int, fmt: str) -> int:
    args = ["--store", store, "query", _WIDE_ROWS.format(n=n), "-f", fmt]
    done = subprocess.run(
        [sys.executable, "-c", _MEASURED, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("RSS ")]
    return int(line.split()[1])


def _check_bounded(store: str, fmt: str) -> None:
    # 100M rows built in memory whole take 24 GB (and get killed). Memory, not time, is
    # checked. DuckDB's buffers reach their size by 100,000 such rows (about 50 MiB
    # over the 1,000-row peak); 300,000 more rows (150 MB of text) then add less than 40 MiB.
    small = _peak_rss(store, 100_000, fmt)
    large = _peak_rss(store, 400_000, fmt)
    assert large - small < 40, (small, large)


def test_query_table_memory_does_not_grow_with_the_result(store: str) -> None:
    _check_bounded(store, "table")  # sized columns, yet never the whole result read first


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "table"])
def test_query_memory_does_not_grow_with_the_result(store: str, fmt: str) -> None:
    _check_bounded(store, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_query_piped_to_head_ends_quietly(store: str, fmt: str) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "capture.cli", "--store", store, "query"]
        + ["SELECT * FROM range(100000000)", "-f", fmt],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    process.stdout.close()  # what head does once it has its lines
    assert process.wait(timeout=120) == EXIT_BROKEN_PIPE
    assert first != b""
    assert process.stderr.read() == b""  # no traceback, no message
    process.stderr.close()


def test_a_failure_while_streaming_is_one_error_line(store: str, tmp_path: Path) -> None:
    # DuckDB fails on row 500,000: one line, exit 1, whether batches were printed before (its
    # threads scan parts of the range in parallel, and may reach that row first).
    sql = "SELECT range, CASE WHEN range = 500000 THEN error('boom') END AS e FROM range(1000000)"
    done = subprocess.run(
        [sys.executable, "-m", "capture.cli", "--store", store, "query", sql, "-f", "csv"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr == "Error: query failed: Invalid Input Error: boom\n"
    assert done.stdout == "" or done.stdout.startswith("range,e\n0,\n")
