"""A store with many more files than a compaction would leave says so, in one line on stderr.

The thresholds are lowered for the test (a real hint needs 1,000 files); the output on stdout is
the same with or without the hint, and once compacted the store no longer gets it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from capture.cli.main import cli
from capture.store import upkeep
from tests.flushed_writers import record_flushed


@pytest.fixture()
def flushed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(upkeep, "_HINT_FILES", 6)
    monkeypatch.setattr(upkeep, "_HINT_RATIO", 5)
    monkeypatch.setenv("CAPTURE_CACHE_DIR", "off")
    root = tmp_path / "store"
    record_flushed(root, [1, 2, 3, 1, 2, 3, 4])  # 7 calls files of one call each
    return str(root)


def _query(store: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        cli, ["--store", store, "query", "SELECT count(*) AS n FROM calls", "-f", "csv"]
    )
    return result.exit_code, result.stdout, result.stderr


def test_many_calls_files_print_the_compact_hint(flushed: str) -> None:
    code, out, err = _query(flushed)
    assert code == 0
    assert out == "n\n7\n"
    assert err == (
        f"warning: capture: the store at {flushed} holds 7 calls files where a compaction "
        "would leave about 1; every first read opens each one: run "
        f"`capture --store {flushed} compact` once\n"
    )


def test_a_compacted_store_gets_no_hint(flushed: str) -> None:
    assert CliRunner().invoke(cli, ["--store", flushed, "compact"]).exit_code == 0
    assert _query(flushed) == (0, "n\n7\n", "")


def test_summary_reads_no_calls_file_and_gives_no_calls_hint(flushed: str) -> None:
    result = CliRunner().invoke(cli, ["--store", flushed, "summary"])
    assert result.exit_code == 0
    assert "7 calls" in result.stdout
    assert result.stderr == ""
