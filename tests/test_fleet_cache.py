"""The reader's cache of checked store files (issue 14): faster opens, never another answer."""

from __future__ import annotations

import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest

import capture
from capture import footer_cache, schema
from fixtures.models import run_generate, tiny_llama

SQL = {
    "calls": "SELECT * EXCLUDE (date) FROM calls ORDER BY call_id",
    "signatures": "SELECT * FROM signatures ORDER BY ALL",
    "structures": "SELECT * FROM structures ORDER BY ALL",
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-Llama traffic written 2 calls per file: many small files of each table."""
    root = tmp_path_factory.mktemp("cached") / "store"
    model = tiny_llama(0)
    with capture.Recorder(model, root, flush_rows=2, flush_seconds=3600):
        run_generate(model, [(1, 5), (2, 7)], max_new_tokens=5, seed=0)
    return root


@pytest.fixture
def store(recorded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    copy = tmp_path / "store"
    shutil.copytree(recorded, copy)
    monkeypatch.setenv("CAPTURE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(footer_cache, "MIN_FILES", 1)  # cache this small store too
    return copy


def _answer(root: Path) -> dict[str, Any]:
    with capture.open_store(root) as opened:
        out = {k: opened.query(sql).to_pylist() for k, sql in SQL.items()}
        out["summary"] = opened.summary()
    return out


def _uncached(root: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    with monkeypatch.context() as m:
        m.setenv("CAPTURE_CACHE_DIR", "off")
        return _answer(root)


def _rewrite(path: Path, change: Any) -> None:
    """Writes `path` again, changed, keeping its footer metadata (a store file's)."""
    table = pq.read_table(path)
    time.sleep(0.01)  # another modification time even on coarse clocks
    pq.write_table(change(table).replace_schema_metadata(table.schema.metadata), path)


def test_cached_opens_give_the_uncached_answer(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _uncached(store, monkeypatch)
    first = _answer(store)  # fills the cache
    assert list((tmp_path / "cache").glob("*-stats-rows.arrow"))
    assert _answer(store) == first == expected  # issue 14: the cache never changes an answer


def test_a_stats_file_written_again_after_caching_is_read_again(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _answer(store)
    path = sorted((store / schema.STATS).rglob("*.parquet"))[0]
    _rewrite(path, lambda t: t.set_column(5, "calls", pc.multiply(t.column("calls"), 10)))
    # issue 14: a stale cache entry (another stamp) is ignored, the file's new rows count
    assert _answer(store) == _uncached(store, monkeypatch)


def test_a_calls_file_replaced_by_a_foreign_one_after_caching_is_skipped(store: Path) -> None:
    _answer(store)
    path = sorted((store / schema.CALLS).rglob("*.parquet"))[0]
    time.sleep(0.01)
    pq.write_table(pa.table({"call_id": [1, 2]}), path)
    with pytest.warns(RuntimeWarning, match="not a capture file"):  # issue 14: checked again
        with capture.open_store(store) as opened:
            assert str(path) in [s.path for s in opened.skipped]


def test_a_damaged_cache_is_ignored(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _answer(store)
    for path in (tmp_path / "cache").iterdir():
        path.write_bytes(b"not parquet")
    assert _answer(store) == expected  # issue 14


def test_a_cache_of_rows_without_its_index_pair_is_ignored(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _answer(store)
    rows = next((tmp_path / "cache").glob("*-stats-rows.arrow"))
    with pa.memory_map(str(rows)) as source:
        table = pa.ipc.open_file(source).read_all()
    # rows written by another reader (another token) beside this index: neither is used
    other = table.slice(0, 1).replace_schema_metadata({b"capture.cache_token": b"x"})
    with pa.OSFile(str(rows), "wb") as sink, pa.ipc.new_file(sink, other.schema) as out:
        out.write_table(other)
    assert _answer(store) == expected  # issue 14


def test_summary_does_not_bind_the_calls_files(store: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with capture.open_store(store) as opened:
            opened.summary()
            for path in (store / schema.CALLS).rglob("*.parquet"):
                os.remove(path)
            # issue 14: summary reads stats and structures only; no view over 100,000 calls
            # files is bound for it, so the calls files are not touched
            assert opened.summary()["models"]


def test_a_calls_file_with_a_column_of_a_later_version_is_read(store: Path) -> None:
    count = "SELECT count(*) AS n FROM calls"
    with capture.open_store(store) as opened:
        before = opened.query(count).to_pylist()
    path = sorted((store / schema.CALLS).rglob("*.parquet"))[-1]
    _rewrite(path, lambda t: t.append_column("later", pa.array([7] * t.num_rows)))
    with capture.open_store(store) as opened:
        # issue 14: columns merged by name only when a file needs it, and then they are
        assert opened.query(count).to_pylist() == before
        assert opened.query("SELECT count(later) AS n FROM calls").to_pylist()[0]["n"] > 0
