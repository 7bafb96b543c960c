"""A small store file's rows are the same whether a column is decoded or built from the footer
that pins it to one value: a writer's stats, files without statistics, row groups that
disagree, all-null and non-UTF-8 columns, and values the checks refuse."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from capture import schema
from capture.store import footer_schema, layout, small_rows
from tests import hostile_stores
from tests.flushed_writers import record_flushed


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stopped writer's store: three calls of three batch sizes (three signature rows)."""
    store = tmp_path_factory.mktemp("small") / "s"
    record_flushed(store, [1, 2, 3])
    return store


def _pinned(path: Path, table: str) -> set[str]:
    """The columns of `path` its footer pins (names)."""
    meta = pq.read_metadata(path)
    known = footer_schema.checked_facts(meta, table)
    return {field.name for _, field, _ in small_rows._pins(meta, known.pinnable).values()}


def _rows(path: Path, table: str) -> pa.Table:
    verdict, rows = layout.read_with_rows(pafs.LocalFileSystem(), str(path), table)
    assert isinstance(verdict, layout.FileInfo), verdict
    assert rows is not None
    return rows


def _same_as_decoded(path: Path, table: str) -> None:
    decoded = pq.read_table(path)
    rows = _rows(path, table)
    assert rows.schema.equals(decoded.schema, check_metadata=True)
    assert rows.equals(decoded)


def _copy(
    source: Path, target: Path, change: Callable[[pa.Table], pa.Table] = lambda t: t, **write: Any
) -> Path:
    """`source` copied to `target`, rewritten with `change` applied and the `pq.write_table`
    options `write` (`hostile_stores.rewrite`: footer metadata kept)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    hostile_stores.rewrite(target, change, **write)
    return target


def test_a_writers_stats_file_has_its_constant_columns_built(recorded: Path) -> None:
    (stats,) = hostile_stores.files(recorded, schema.STATS)
    assert _pinned(stats, schema.STATS) >= {"model", "out_structure", "state", "calls", "errors"}
    assert "in_structure" in _pinned(stats, schema.STATS)  # one input structure: pinned too
    _same_as_decoded(stats, schema.STATS)
    for structures in hostile_stores.files(recorded, schema.STRUCTURES):
        _same_as_decoded(structures, schema.STRUCTURES)


def test_a_file_without_statistics_is_decoded(recorded: Path, tmp_path: Path) -> None:
    (stats,) = hostile_stores.files(recorded, schema.STATS)
    bare = _copy(stats, tmp_path / "stats" / "model=add" / "bare.parquet", write_statistics=False)
    assert _pinned(bare, schema.STATS) == set()
    _same_as_decoded(bare, schema.STATS)


def test_row_groups_that_disagree_pin_nothing(recorded: Path, tmp_path: Path) -> None:
    """``calls`` is 1 in the first group and 7 in the second: each group pins its own value,
    the file none; ``errors`` is 0 in both."""
    (stats,) = hostile_stores.files(recorded, schema.STATS)

    def change(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index("calls")
        return t.set_column(i, t.schema.field(i), pa.array([1, 1, 7], pa.int64()))

    split = _copy(
        stats, tmp_path / "stats" / "model=add" / "split.parquet", change, row_group_size=2
    )
    assert pq.read_metadata(split).num_row_groups == 2
    pinned = _pinned(split, schema.STATS)
    assert "calls" not in pinned and "errors" in pinned
    rows = _rows(split, schema.STATS)
    assert rows.column("calls").to_pylist() == [1, 1, 7]
    _same_as_decoded(split, schema.STATS)


def test_a_column_with_some_nulls_is_decoded(recorded: Path, tmp_path: Path) -> None:
    (stats,) = hostile_stores.files(recorded, schema.STATS)

    def change(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index("state")
        return t.set_column(i, t.schema.field(i), pa.array([None, "lora-a", None], pa.string()))

    some = _copy(stats, tmp_path / "stats" / "model=add" / "some.parquet", change)
    assert "state" not in _pinned(some, schema.STATS)
    assert _rows(some, schema.STATS).column("state").to_pylist() == [None, "lora-a", None]
    _same_as_decoded(some, schema.STATS)


def test_a_string_bound_that_is_not_utf8_leaves_the_column_to_the_decoder() -> None:
    field = pa.field("model", pa.string())
    assert small_rows._array(field, b"\xff\xfe", 3) is None
    built = small_rows._array(field, b"add", 3)
    assert built is not None and built.to_pylist() == ["add"] * 3
    assert (
        small_rows._array(pa.field("calls", pa.int64(), nullable=False), small_rows._NULL, 3)
        is None
    )


def test_nulls_built_for_a_nullable_column_are_not_reused_for_one_that_allows_none() -> None:
    nullable = small_rows._array(pa.field("calls", pa.int64()), small_rows._NULL, 4)
    assert nullable is not None and nullable.null_count == 4
    required = pa.field("calls", pa.int64(), nullable=False)
    assert small_rows._array(required, small_rows._NULL, 4) is None


def test_a_long_pinned_column_is_built_and_not_kept() -> None:
    rows = small_rows._SHORT + 1
    built = small_rows._array(pa.field("errors", pa.int64()), 0, rows)
    assert built is not None and len(built) == rows and built.to_pylist() == [0] * rows
    assert all(key[2] <= small_rows._SHORT for key in small_rows._BUILT)


def test_a_pinned_value_the_checks_refuse_still_skips_the_file(
    recorded: Path, tmp_path: Path
) -> None:
    """Negative ``calls`` in every row: pinned, built, and refused as the decoded rows are."""
    (stats,) = hostile_stores.files(recorded, schema.STATS)

    def change(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index("calls")
        return t.set_column(i, t.schema.field(i), pa.array([-1] * t.num_rows, pa.int64()))

    bad = _copy(stats, tmp_path / "stats" / "model=add" / "bad.parquet", change)
    assert "calls" in _pinned(bad, schema.STATS)
    verdict, rows = layout.read_with_rows(pafs.LocalFileSystem(), str(bad), schema.STATS)
    assert isinstance(verdict, layout.Skip) and verdict.corrupt and rows is None
