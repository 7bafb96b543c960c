"""The first statement over the calls runs over the columns it names, read with the checks: the
same answer as DuckDB reading the files, for statements that name their columns and for those
that reach others (the whole row, a NATURAL join), which are read from the files instead.

A real store (the seed scenarios: many models and structures), real DuckDB, the reader's own
cache off unless said. The smallest number of files for the path is lowered to 1 (a real store
needs 1,000).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from click.testing import CliRunner

import capture
from capture import schema
from capture.cli.main import cli
from capture.errors import QueryError
from capture.store import checked, first_read, footer_cache, footer_procs
from capture.store.checked import check_table

_NAMED = [
    "SELECT count(*) AS n FROM calls WHERE duration_ns >= 0",
    "SELECT model, date, count(*) AS n FROM calls GROUP BY ALL ORDER BY ALL",
    "SELECT model, in_structure, max(len(dims)) AS d, sum(len(out_dims)) AS o "
    "FROM calls GROUP BY ALL ORDER BY ALL",
    'SELECT "model", min(ts) AS first, count(error) AS failed FROM calls GROUP BY 1 ORDER BY 1',
    "SELECT side, path, axis, min(size) AS lo, max(size) AS hi, count(*) AS n "
    "FROM dims GROUP BY ALL ORDER BY ALL",
    "SELECT model, side, kind, count(*) AS n FROM leaves GROUP BY ALL ORDER BY ALL",
    "SELECT count(*) AS n FROM calls WHERE 1 = 1",
    "SELECT c.model, count(*) AS n FROM calls c JOIN signatures s USING (model) "
    "GROUP BY 1 ORDER BY 1",
]
"""Statements that name every column they read: answered from the rows read with the checks."""

_REACHING = [
    "SELECT count(DISTINCT c) AS n FROM calls c",  # the whole row, as a value
    "SELECT count(*) AS n FROM calls NATURAL JOIN signatures",  # on columns it does not name
    "SELECT max(struct_extract(c, 'pid')) AS p FROM calls c",
]
"""Statements that read columns they do not name: read from the files (an unread column's
value raises first)."""


@pytest.fixture
def first(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements run over the columns read; the reader's cache off, any store eligible."""
    monkeypatch.setenv("CAPTURE_CACHE_DIR", "off")
    monkeypatch.setattr(checked, "COLUMN_FILES", 1)
    ran: list[str] = []
    run = first_read.run

    def spied(*args: Any) -> Any:
        ran.append(args[-1])
        return run(*args)

    monkeypatch.setattr(first_read, "run", spied)
    return ran


def _answer(root: Path, sql: str) -> Any:
    with capture.open_store(root) as store:
        return store.query(sql).to_pylist()


def _from_files(root: Path, sql: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setattr(checked, "COLUMN_FILES", 10**9)
        return _answer(root, sql)


@pytest.mark.parametrize("sql", _NAMED)
def test_a_statement_naming_its_columns_is_answered_from_the_rows_read(
    seeds_root: Path,
    sql: str,
    first: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    expected = _from_files(seeds_root, sql, monkeypatch)
    assert first == []
    with caplog.at_level(logging.DEBUG, logger="capture.store"):
        got = _answer(seeds_root, sql)
    assert first == [sql]
    assert "reads the calls files" not in caplog.text
    assert got == expected and got


@pytest.mark.parametrize("sql", _REACHING)
def test_a_statement_reaching_unnamed_columns_is_read_from_the_files(
    seeds_root: Path,
    sql: str,
    first: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    expected = _from_files(seeds_root, sql, monkeypatch)
    with caplog.at_level(logging.DEBUG, logger="capture.store"):
        got = _answer(seeds_root, sql)
    assert first == [sql]  # tried over the rows read, then over the files
    assert first_read.NOT_READ in caplog.text
    assert got == expected and got


def test_too_few_columns_named_cannot_answer_wrong(
    seeds_root: Path,
    first: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The check can disagree: told that a sum of durations reads only the model, the rows read
    lack the durations, and the statement is read from the files."""
    sql = "SELECT model, sum(duration_ns) AS t FROM calls GROUP BY 1 ORDER BY 1"
    expected = _from_files(seeds_root, sql, monkeypatch)
    monkeypatch.setattr(first_read, "statement_columns", lambda con, s: ["model"])
    with caplog.at_level(logging.DEBUG, logger="capture.store"):
        got = _answer(seeds_root, sql)
    assert first == [sql] and f"{first_read.NOT_READ} (duration_ns)" in caplog.text
    assert got == expected


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM calls ORDER BY call_id LIMIT 3",
        "SELECT c.* FROM calls c ORDER BY call_id LIMIT 3",
        "SELECT max(COLUMNS('dur.*')) FROM calls",
        "SELECT count(*) AS n FROM calls WHERE duration_ns >= ?",
        "SELECT min(call_id) OVER () AS m FROM calls LIMIT 1",
    ],
)
def test_statements_reading_every_column_or_with_parameters_read_the_files(
    seeds_root: Path, sql: str, first: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    params = [0] if "?" in sql else None
    with capture.open_store(seeds_root) as store:
        got = store.query(sql, params).to_pylist()
    with monkeypatch.context() as m:
        m.setattr(checked, "COLUMN_FILES", 10**9)
        with capture.open_store(seeds_root) as store:
            assert got == store.query(sql, params).to_pylist()
    assert first == []


def test_statement_columns_come_from_the_words() -> None:
    import duckdb

    con = duckdb.connect()
    assert first_read.statement_columns(con, "SELECT count(*) FROM calls") == []
    assert (
        first_read.statement_columns(
            con, 'SELECT "Model", date FROM calls WHERE duration_ns > 2 * 3'
        )
        is None
    )  # a product is a star to the tokenizer's reader: every column
    assert first_read.statement_columns(
        con, 'SELECT "Model", date FROM calls WHERE duration_ns > 6'
    ) == ["model", "duration_ns", "date"]
    dims = first_read.statement_columns(con, "SELECT count(*) FROM dims")
    assert dims is not None and {"dims", "out_dims", "in_structure", "call_id"} <= set(dims)
    assert first_read.statement_columns(con, "SELECT 1; SELECT 2") is None
    assert first_read.statement_columns(con, "CREATE TABLE t AS SELECT 1") is None
    assert first_read.statement_columns(con, "SELECT nextval('s') FROM calls") is None
    assert first_read.statement_columns(con, "SELECT call_id FROM calls LIMIT 3") is None
    limited = "SELECT call_id FROM calls ORDER BY duration_ns LIMIT 3"
    assert first_read.statement_columns(con, limited) == ["call_id", "duration_ns"]


def test_a_failed_statement_fails_as_over_the_files(
    seeds_root: Path, first: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sql = "SELECT CAST(model AS INTEGER) AS m FROM calls"
    with pytest.raises(QueryError) as files:
        _from_files(seeds_root, sql, monkeypatch)
    with pytest.raises(QueryError) as rows:
        _answer(seeds_root, sql)
    # DuckDB's threads meet a different first value from one run to the next
    assert first == [sql] and "Could not convert string" in str(rows.value)
    assert str(rows.value).split("'")[0] == str(files.value).split("'")[0]


def test_the_stream_and_the_cli_print_what_the_files_give(
    seeds_root: Path, first: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sql = "SELECT call_id, model, duration_ns FROM calls ORDER BY call_id"
    with capture.open_store(seeds_root) as store:
        streamed = pa.Table.from_batches(list(store.stream(sql, batch_rows=3))).to_pylist()
    assert streamed == _from_files(seeds_root, sql, monkeypatch) and len(first) == 1

    def printed() -> str:
        result = CliRunner().invoke(cli, ["--store", str(seeds_root), "query", sql, "-f", "csv"])
        assert result.exit_code == 0, result.output
        return result.stdout

    with monkeypatch.context() as m:
        m.setattr(checked, "COLUMN_FILES", 10**9)
        from_files = printed()
    assert printed() == from_files and len(first) == 2


def test_rows_past_the_budget_leave_the_statement_to_the_files(
    seeds_root: Path, first: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sql = "SELECT model, count(*) AS n FROM calls GROUP BY 1 ORDER BY 1"
    expected = _from_files(seeds_root, sql, monkeypatch)
    monkeypatch.setattr(checked, "COLUMN_BUDGET", -1)
    assert _answer(seeds_root, sql) == expected
    assert first == []


def test_helpers_read_the_rows_the_reader_reads(
    seeds_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checked, "COLUMN_FILES", 1)
    monkeypatch.setattr(footer_procs, "MIN_SHARE", 1)
    monkeypatch.setattr(footer_procs, "_HEAD_START", 0)
    monkeypatch.setattr(footer_procs, "_cores", lambda: 3)
    columns = ["call_id", "model", "dims"]

    def rows(env: str) -> list[Any]:
        monkeypatch.setenv(footer_procs.ENV, env)
        found = check_table(pafs.LocalFileSystem(), str(seeds_root), schema.CALLS, None, columns)
        assert found.columns is not None
        return sorted(map(repr, found.columns.to_pylist()))

    alone = rows("1")
    assert alone == rows("3") and len(alone) == sum(
        check_table(pafs.LocalFileSystem(), str(seeds_root), schema.CALLS, None).file_rows.values()
    )


def test_a_file_column_of_any_name_stays_a_name(
    tmp_path: Path, first: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A calls file with an extra column (allowed) named like SQL: the view quotes it, and a
    statement reaching it reads the files, with the same answer."""
    from tests import hostile_stores
    from tests.flushed_writers import record_flushed

    store = tmp_path / "s"
    record_flushed(store, [1, 2, 3])
    odd = "x\"'); CREATE TABLE planted AS SELECT 1; --"
    calls = hostile_stores.files(store, schema.CALLS)[0]
    hostile_stores.rewrite(calls, lambda t: t.append_column(odd, pa.array([7] * t.num_rows)))
    for sql in ("SELECT count(*) AS n FROM calls WHERE pid > 0", "SELECT max(c) FROM calls c"):
        expected = _from_files(store, sql, monkeypatch)
        with capture.open_store(store) as opened:
            assert opened.query(sql).to_pylist() == expected
            assert odd in opened.query("DESCRIBE calls").column("column_name").to_pylist()
            assert opened.query("SELECT count(*) AS n FROM duckdb_tables()").to_pylist() == [
                {"n": 0}
            ]
    assert first == ["SELECT count(*) AS n FROM calls WHERE pid > 0", "SELECT max(c) FROM calls c"]


@pytest.mark.parametrize("older", [2, 5], ids=["two versions", "one older version"])
def test_files_of_older_versions_read_as_the_files_do(
    tmp_path: Path, older: int, first: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files without the column a later version added: null there, as DuckDB reads them."""
    from tests.flushed_writers import record_flushed
    from tests.test_store_versions_view import _as_version_2, _calls_files

    store = tmp_path / "s"
    record_flushed(store, [1, 2, 3, 1, 2])
    for path in _calls_files(store)[:older]:
        _as_version_2(path)
    sql = "SELECT call_id, ts, dims, state, date FROM calls ORDER BY call_id"
    expected = _from_files(store, sql, monkeypatch)
    assert _answer(store, sql) == expected and len(expected) == 5
    assert first == [sql]


def test_a_warm_cache_still_reads_the_columns_with_the_checks(
    seeds_root: Path, tmp_path: Path, first: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache holds every calls file's verdict: the statement still runs over the columns
    read (DuckDB would open each file anyway), and the files are checked again as they are."""
    monkeypatch.setenv("CAPTURE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(footer_cache, "MIN_FILES", 1)
    sql = "SELECT model, max(duration_ns) AS d FROM calls GROUP BY 1 ORDER BY 1"
    expected = _from_files(seeds_root, sql, monkeypatch)  # fills the cache
    assert any((tmp_path / "cache").rglob("*")) and first == []
    assert _answer(seeds_root, sql) == expected
    assert first == [sql]
