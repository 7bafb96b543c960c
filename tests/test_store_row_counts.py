"""``SELECT count(*) FROM calls`` is answered from the checked footers, with DuckDB's answer.

Each store below is counted twice in fresh readers: by the statement the reader answers from
the footers it checked (no calls file read again), and by one DuckDB must scan (``WHERE
true``). They agree on plain stores, on stores with files left out (foreign, refused claims,
compacted leftovers) and on a store with a segment not committed yet; every other statement
(filters, groups, parameters, a user's own ``calls``) is read from the files.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import duckdb
import pytest
from click.testing import CliRunner

import capture
from capture.cli.main import cli
from capture.store import reader as reader_module
from capture.store.reader import StoreReader
from capture.store.row_counts import counts_calls
from tests import hostile_stores
from tests.flushed_writers import record_flushed, stage_uncommitted_segment

COUNT = "SELECT count(*) AS n FROM calls"
SCANNED = "SELECT count(*) AS n FROM calls WHERE true"


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPTURE_CACHE_DIR", "off")


def _counts(store: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """(count from the footers, count DuckDB scanned), each in a fresh reader; the warnings
    about files left out are the same for both."""

    def no_scan(self: StoreReader, with_calls: bool) -> None:
        raise AssertionError("the count bound the views over the calls files")

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with monkeypatch.context() as patched:
            patched.setattr(StoreReader, "_reconnect", no_scan)
            with StoreReader(store) as reader:
                fast = reader.query(COUNT).column("n").to_pylist()[0]
        with StoreReader(store) as reader:
            scanned = reader.query(SCANNED).column("n").to_pylist()[0]
    lines = [str(w.message) for w in said]
    assert lines[: len(lines) // 2] == lines[len(lines) // 2 :]
    return fast, scanned


def test_a_flushed_store_counts_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record_flushed(tmp_path / "s", [1, 2, 3, 1, 2])
    assert _counts(tmp_path / "s", monkeypatch) == (5, 5)


@pytest.mark.parametrize("plant", [hostile_stores.foreign_parquet, hostile_stores.planted_claim])
def test_files_left_out_are_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plant: object
) -> None:
    store = tmp_path / "s"
    record_flushed(store, [1, 2, 3])
    plant(store)  # type: ignore[operator]
    assert _counts(store, monkeypatch) == (3, 3)


def test_a_compaction_leftover_is_counted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "s"
    record_flushed(store, [1, 2, 3, 4])
    first = hostile_stores.files(store, "calls")[0]
    kept = tmp_path / "kept.parquet"
    shutil.copy(first, kept)
    assert CliRunner().invoke(cli, ["--store", str(store), "compact"]).exit_code == 0
    shutil.copy(kept, first)  # a compaction that died before deleting its sources
    assert _counts(store, monkeypatch) == (4, 4)


def test_calls_of_an_uncommitted_segment_are_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "s"
    stage_uncommitted_segment(store)
    assert _counts(store, monkeypatch) == (2, 2)


def test_the_cli_prints_what_duckdb_prints(tmp_path: Path) -> None:
    store = str(tmp_path / "s")
    record_flushed(store, [1, 2])
    for sql in (COUNT, "select COUNT(*), count(*) AS m from Calls c", SCANNED):
        result = CliRunner().invoke(cli, ["--store", store, "query", sql, "-f", "csv"])
        assert result.exit_code == 0, result.output
        with duckdb.connect() as con:
            con.execute("CREATE TABLE calls AS SELECT 1 AS x UNION ALL SELECT 2")
            expected = con.sql(sql).fetchall()
            names = con.sql(sql).columns
        lines = result.stdout.splitlines()
        assert lines[0].split(",") == names
        assert lines[1] == ",".join(str(v) for v in expected[0])


def test_streamed_counts_and_a_users_own_calls(tmp_path: Path) -> None:
    store = tmp_path / "s"
    record_flushed(store, [1, 2, 3])
    with capture.open_store(store) as opened:
        with opened.stream(COUNT) as batches:
            assert [b.to_pylist() for b in batches] == [[{"n": 3}]]
    with StoreReader(store, unsafe_sql=True) as reader:
        reader.query("CREATE TEMP TABLE calls AS SELECT 1 AS x")
        assert counts_calls(reader.con, COUNT) is False


@pytest.mark.parametrize(
    ("sql", "counted"),
    [
        (COUNT, True),
        ("select count(*) from calls;", True),
        ("SELECT COUNT(*) n, count(*) FROM CALLS AS c", True),
        ("FROM calls SELECT count(*)", True),
        (SCANNED, False),
        ("SELECT count(*) FROM calls WHERE false", False),
        ("SELECT count(*) FROM calls LIMIT 0", False),
        ("SELECT count(1) FROM calls", False),
        ("SELECT count(DISTINCT call_id) FROM calls", False),
        ("SELECT count(*) FILTER (WHERE error IS NULL) FROM calls", False),
        ("SELECT count(*) FROM calls GROUP BY model", False),
        ("SELECT count(*) FROM calls HAVING count(*) > 1", False),
        ("SELECT count(*) FROM calls QUALIFY true", False),
        ("SELECT count(*) FROM calls USING SAMPLE 10", False),
        ("SELECT count(*) FROM calls ORDER BY 1", False),
        ("SELECT DISTINCT count(*) FROM calls", False),
        ("SELECT count(*) + 1 FROM calls", False),
        ("SELECT count(*) OVER () FROM calls", False),
        ("SELECT count(*) FROM main.calls", False),
        ("SELECT count(*) FROM calls, stats", False),
        ("SELECT count(*) FROM (FROM calls)", False),
        ("SELECT count(*) FROM calls t(a, b)", False),
        ("WITH calls AS (SELECT 1) SELECT count(*) FROM calls", False),
        ("SELECT count(*) FROM calls; SELECT 1", False),
        ("SELECT count(*) FROM calls WHERE $1", False),
        ("SELECT count(*) FROM leaves", False),
        ("not sql at all", False),
    ],
)
def test_which_statements_count_from_the_footers(sql: str, counted: bool) -> None:
    assert counts_calls(duckdb.connect(), sql) is counted


def test_a_count_after_the_calls_views_are_bound_still_uses_the_footers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "s"
    record_flushed(store, [1, 2, 3])
    used: list[int] = []
    real = reader_module.counted

    def spy(con: duckdb.DuckDBPyConnection, rows: int, sql: str) -> Any:
        used.append(rows)
        return real(con, rows, sql)

    monkeypatch.setattr(reader_module, "counted", spy)
    with StoreReader(store) as reader:
        assert reader.query(SCANNED).to_pylist() == [{"n": 3}]  # binds the calls views
        assert reader.query(COUNT).to_pylist() == [{"n": 3}]
        assert used == [3]
        reader.query("CREATE OR REPLACE VIEW calls AS SELECT 1 AS x")  # the user's own
        assert reader.query(COUNT).to_pylist() == [{"n": 1}]
        reader.query("CREATE TEMP VIEW calls AS SELECT 1 AS x UNION ALL SELECT 2")
        assert reader.query(COUNT).to_pylist() == [{"n": 2}]
        assert used == [3]
