"""Helper processes check shares of a local store's files: the same verdicts and rows as the
reader's own check, on sound and damaged files, and the same when a helper fails."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

import capture
from capture import schema
from capture.store import checked, footer_procs
from capture.store.checked import CheckedTable, check_table
from tests import hostile_stores
from tests.flushed_writers import record_flushed


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four writers' files, with a foreign file, a truncated calls file, a stats file whose
    values are impossible (its rows decode: the reader must find them) and one of the wrong
    schema."""
    store = tmp_path_factory.mktemp("procs") / "s"
    for batches in ([1, 2], [3], [1, 4], [2, 5]):
        record_flushed(store, batches)
    hostile_stores.truncated_calls_file(store)
    hostile_stores.foreign_parquet(store)
    hostile_stores.negative_calls(store)
    stats = hostile_stores.files(store, schema.STATS)
    hostile_stores.rewrite(
        stats[1],
        lambda t: t.set_column(
            t.schema.get_field_index("calls"), "calls", pa.array(["x"] * t.num_rows)
        ),
    )
    return store


def _seen(found: CheckedTable) -> dict[str, Any]:
    rows = None
    if found.rows is not None:
        rows = sorted(map(repr, found.rows.to_pylist()))
    return {
        "kept": found.kept,
        "skipped": sorted((s.path, s.reason, s.corrupt) for s in found.skipped),
        "refused": found.refused,
        "rows": rows,
        "file_rows": found.file_rows,
        "folders": found.folders,
        "exact": found.exact,
    }


def _checked(store: Path, table: str, monkeypatch: pytest.MonkeyPatch, env: str) -> dict[str, Any]:
    monkeypatch.setenv(footer_procs.ENV, env)
    return _seen(check_table(pafs.LocalFileSystem(), str(store), table, None))


@pytest.fixture
def helpers_ran(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every helper's outcome (True: its verdicts were used), with shares of any size."""
    monkeypatch.setattr(footer_procs, "MIN_SHARE", 1)
    monkeypatch.setattr(footer_procs, "_HEAD_START", 0)
    monkeypatch.setattr(footer_procs, "_cores", lambda: 3)  # whatever machine runs the tests
    outcomes: list[bool] = []
    results = footer_procs.Helper.results

    def spied(self: footer_procs.Helper) -> Any:
        found = results(self)
        outcomes.append(found is not None)
        return found

    monkeypatch.setattr(footer_procs.Helper, "results", spied)
    return outcomes


@pytest.mark.parametrize("table", schema.TABLES)
def test_helpers_find_what_the_reader_finds(
    damaged: Path, table: str, monkeypatch: pytest.MonkeyPatch, helpers_ran: list[bool]
) -> None:
    alone = _checked(damaged, table, monkeypatch, "1")
    assert helpers_ran == []
    shared = _checked(damaged, table, monkeypatch, "3")
    assert helpers_ran and all(helpers_ran)
    assert shared == alone
    reasons = " ".join(reason for _, reason, _ in alone["skipped"])
    if table == schema.STATS:  # the impossible values were found in the helper's rows
        assert any(corrupt for *_, corrupt in alone["skipped"]) and "calls" in reasons
    if table == schema.CALLS:
        assert "not a capture file" in reasons and "magic bytes" in reasons


@pytest.mark.parametrize(
    "command",
    [
        "import sys; sys.exit(3)",
        "import sys; sys.stdout.write('x' * 40)",
        # a well-formed answer about other files than those it was given
        "import sys, json, capture.store.footer_procs as f;"
        "sys.stdin = __import__('io').TextIOWrapper(__import__('io').BytesIO("
        "json.dumps({'paths': ['/elsewhere.parquet'], 'columns': None, 'budget': 0})"
        ".encode()));"
        "f._main(sys.argv[1])",
    ],
    ids=["fails", "garbage", "other files"],
)
def test_a_failed_helper_leaves_its_share_to_the_reader(
    damaged: Path,
    command: str,
    monkeypatch: pytest.MonkeyPatch,
    helpers_ran: list[bool],
    caplog: pytest.LogCaptureFixture,
) -> None:
    alone = _checked(damaged, schema.STATS, monkeypatch, "1")
    monkeypatch.setattr(footer_procs, "_command", lambda t: [sys.executable, "-c", command, t])
    with caplog.at_level(logging.DEBUG, logger="capture.store"):
        shared = _checked(damaged, schema.STATS, monkeypatch, "3")
    assert helpers_ran and not any(helpers_ran)
    assert shared == alone
    assert "helper's check" in caplog.text


def test_only_many_local_files_use_helpers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    local = pafs.LocalFileSystem()
    many = 100 * footer_procs.MIN_SHARE
    monkeypatch.setattr(footer_procs, "_CPU_MAX", "/nonexistent/cpu.max")
    monkeypatch.delenv(footer_procs.ENV, raising=False)
    monkeypatch.setattr(footer_procs.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert footer_procs.processes(local, many) == 3
    assert footer_procs.processes(local, 2 * footer_procs.MIN_SHARE - 1) == 1
    assert footer_procs.processes(pafs._MockFileSystem(), many) == 1  # not a local disk
    monkeypatch.setenv(footer_procs.ENV, "1")
    assert footer_procs.processes(local, many) == 1
    monkeypatch.setenv(footer_procs.ENV, "two")
    with caplog.at_level(logging.WARNING, logger="capture.store"):
        assert footer_procs.processes(local, many) == 3
    assert "$CAPTURE_CHECK_PROCESSES='two' is not a number" in caplog.text


@pytest.mark.parametrize(
    "quota, cores", [("max 100000", 3), ("200000 100000", 2), ("50000 100000", 1)]
)
def test_a_cgroup_cpu_quota_bounds_the_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quota: str, cores: int
) -> None:
    (tmp_path / "cpu.max").write_text(quota + "\n")
    monkeypatch.setattr(footer_procs, "_CPU_MAX", str(tmp_path / "cpu.max"))
    monkeypatch.setattr(footer_procs.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.delenv(footer_procs.ENV, raising=False)
    assert footer_procs.processes(pafs.LocalFileSystem(), 100 * footer_procs.MIN_SHARE) == cores


def test_helpers_are_stopped_when_the_reader_fails(
    damaged: Path, monkeypatch: pytest.MonkeyPatch, helpers_ran: list[bool]
) -> None:
    started: list[footer_procs.Helper] = []
    init = footer_procs.Helper.__init__

    def spied(self: footer_procs.Helper, table: str, paths: Any, *more: Any) -> None:
        init(self, table, paths, *more)
        started.append(self)

    def fails(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the reader's own share failed")

    monkeypatch.setattr(footer_procs.Helper, "__init__", spied)
    monkeypatch.setattr(
        footer_procs, "_command", lambda t: [sys.executable, "-c", "import time; time.sleep(60)"]
    )
    monkeypatch.setattr(checked, "_read_here", fails)
    monkeypatch.setenv(footer_procs.ENV, "3")
    with pytest.raises(RuntimeError, match="own share failed"):
        check_table(pafs.LocalFileSystem(), str(damaged), schema.STATS, None)
    assert started and all(
        h.process is not None and h.process.returncode is not None for h in started
    )
    assert helpers_ran == []  # never waited for: stopped


def test_a_reader_answers_the_same_with_helpers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, helpers_ran: list[bool]
) -> None:
    store = tmp_path / "s"
    for batches in ([1, 2], [3], [1, 4]):
        record_flushed(store, batches)
    monkeypatch.setenv("CAPTURE_CACHE_DIR", "off")

    def answers(env: str) -> Any:
        monkeypatch.setenv(footer_procs.ENV, env)
        with capture.open_store(store) as opened:
            return (
                opened.summary().to_json(),
                opened.dims().to_pylist(),
                opened.query("SELECT count(*) AS n FROM calls").to_pylist(),
                opened.query("SELECT * EXCLUDE (date) FROM calls ORDER BY call_id").to_pylist(),
            )

    alone = answers("1")
    assert helpers_ran == []
    assert answers("3") == alone
    assert len(helpers_ran) == 6 and all(helpers_ran)  # 2 each: stats, structures, calls
    assert alone[2] == [{"n": 5}]
