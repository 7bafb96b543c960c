"""The calls view over files of older store versions, and links on the first query's path.

Files of one older version (all without the column a later version added) are read as they are,
the missing column null on every row; files of several versions are merged by column name. In
both cases the view's rows are exactly what DuckDB reads from the files themselves. A symbolic
link in the store (to a file or a folder outside it) is never read.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import capture
from capture import schema
from capture.store.checked import check_table
from capture.store.files import write_parquet
from tests.flushed_writers import record_flushed

_COLUMNS = "call_id, ts, model, in_structure, dims, duration_ns"


def _calls_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "calls").rglob("*.parquet") if not p.name.startswith("."))


def _as_version_2(path: Path) -> None:
    """Rewrites a calls file as a version-2 writer wrote it: no ``state`` column."""
    table = pq.read_table(path)
    older = table.drop_columns([schema.STATE]).replace_schema_metadata(None)
    os.remove(path)
    meta = {schema.METADATA_SCHEMA_VERSION: b"2"}
    write_parquet(pafs.LocalFileSystem(), str(path.parent), path.name, older, "calls", meta)


def _duckdb_rows(paths: list[Path], union: bool) -> list[tuple[object, ...]]:
    files = [str(p) for p in paths]
    return duckdb.execute(
        f"SELECT {_COLUMNS} FROM read_parquet(?, union_by_name = {union}) ORDER BY call_id",
        [files],
    ).fetchall()


def _store_rows(root: Path) -> tuple[list[tuple[object, ...]], list[object]]:
    with capture.open_store(root) as store:
        table = store.query(f"SELECT {_COLUMNS}, state FROM calls ORDER BY call_id")
    rows = list(zip(*(table.column(c).to_pylist() for c in _COLUMNS.split(", ")), strict=True))
    return rows, table.column("state").to_pylist()


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAPTURE_CACHE_DIR", "off")
    root = tmp_path / "store"
    record_flushed(root, [1, 2, 3, 1, 2])
    return root


def test_files_of_one_older_version_read_as_they_are(store: Path) -> None:
    files = _calls_files(store)
    for path in files:
        _as_version_2(path)
    found = check_table(pafs.LocalFileSystem(), str(store), schema.CALLS, None)
    assert (found.exact, found.uniform) == (False, True)
    rows, states = _store_rows(store)
    assert len(rows) == 5
    assert rows == _duckdb_rows(files, union=False)
    assert states == [None] * 5


def test_files_of_two_versions_are_merged_by_name(store: Path) -> None:
    files = _calls_files(store)
    for path in files[:2]:
        _as_version_2(path)
    found = check_table(pafs.LocalFileSystem(), str(store), schema.CALLS, None)
    assert (found.exact, found.uniform) == (False, False)
    rows, states = _store_rows(store)
    assert len(rows) == 5
    assert rows == _duckdb_rows(files, union=True)
    by_file = duckdb.execute(
        "SELECT call_id, state FROM read_parquet(?, union_by_name = true) ORDER BY call_id",
        [[str(p) for p in files]],
    ).fetchall()
    assert states == [state for _, state in by_file]
    assert states.count(None) >= 2


def test_links_out_of_the_store_are_not_read_by_the_first_query(
    store: Path, tmp_path: Path
) -> None:
    files = _calls_files(store)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.parquet").write_bytes(files[0].read_bytes())
    os.symlink(outside / "x.parquet", files[0].parent / "link.parquet")
    os.symlink(outside, files[0].parent.parent / "date=2000-01-01")
    with pytest.warns(RuntimeWarning, match="symbolic link") as warned:
        with capture.open_store(store) as opened:
            count = opened.query("SELECT count(*) AS n FROM calls").column("n")[0].as_py()
            assert all(str(outside) not in f for f in opened.files[schema.CALLS])
    assert count == 5
    said = " ".join(str(w.message) for w in warned)
    assert "link.parquet" in said and "date=2000-01-01" in said
