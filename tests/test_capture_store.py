"""capture.store.reader: the DuckDB views over real Parquet trees written by the real Recorder."""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import capture
from capture import schema
from capture.errors import EmptyStore, QueryError, StoreNotFound, UnknownModel
from capture.record.segment import pack_sizes, sizes_array
from capture.store.files import write_parquet
from capture.store_api import Store

ROOT = Path(__file__).resolve().parents[1]


class Toy(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return x * 2 if y is None else x + y


def _record_toy(root: Path, name: str = "toy") -> None:
    """Two segments: x of 2x3, then x and y of 4x3 (first segment); x of 5x3 (second)."""
    model = Toy()
    with torch.no_grad(), capture.Recorder(model, root, name=name) as rec:
        model(torch.ones(2, 3))
        model(torch.ones(4, 3), y=torch.ones(4, 3))
        rec.flush()
        model(torch.ones(5, 3))


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    root = tmp_path_factory.mktemp("toy")
    _record_toy(root)
    with capture.open_store(root) as store:
        yield store


def _files(root: Path, table: str) -> list[Path]:
    return sorted((root / table).rglob("*.parquet"))


# -- opening ---------------------------------------------------------------------------------
def test_missing_directory_raises_store_not_found(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFound, match=re.escape(f"no store at {tmp_path / 'nope'}")):
        capture.open_store(tmp_path / "nope")


def test_empty_directory_raises_empty_store(tmp_path: Path) -> None:
    with pytest.raises(EmptyStore, match="holds no recorded call yet"):
        capture.open_store(tmp_path)


def test_truncated_file_is_skipped_with_a_warning_naming_it(tmp_path: Path) -> None:
    _record_toy(tmp_path)
    bad = _files(tmp_path, schema.CALLS)[-1]  # the second segment: the 5x3 call
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with capture.open_store(tmp_path) as store:
        # the calls files are checked when SQL first reads them
        with pytest.warns(RuntimeWarning, match=re.escape(str(bad))):
            rows = store.query("SELECT dims FROM calls ORDER BY call_id").to_pylist()
        assert [s.path for s in store.skipped] == [str(bad)]
        assert rows == [{"dims": [2, 3]}, {"dims": [4, 3, 4, 3]}]
        assert store.query("SELECT sum(calls) AS n FROM signatures").to_pylist() == [{"n": 3}]


def test_file_of_a_future_schema_version_is_skipped_with_an_upgrade_hint(tmp_path: Path) -> None:
    _record_toy(tmp_path)
    stats = pq.read_table(_files(tmp_path, schema.STATS)[0])
    folder = str(tmp_path / schema.STATS / "model=toy")
    path = write_parquet(pafs.LocalFileSystem(), folder, "future.parquet", stats, schema.STATS)
    table = pq.read_table(path)
    meta = dict(table.schema.metadata)
    meta[schema.METADATA_SCHEMA_VERSION] = str(schema.SCHEMA_VERSION + 1).encode()
    pq.write_table(table.replace_schema_metadata(meta), path)
    # one planted file must not make the store unreadable; the warning says to upgrade
    newer = f"{path} (written with store schema v{schema.SCHEMA_VERSION + 1}"
    with pytest.warns(RuntimeWarning, match=re.escape(newer)):
        with capture.open_store(tmp_path) as store:
            assert store.query("SELECT count(*) AS n FROM calls").to_pylist() == [{"n": 3}]


# -- several processes -----------------------------------------------------------------------
_WRITER = textwrap.dedent(
    """
    import sys
    import torch
    import capture

    class Add(torch.nn.Module):
        def forward(self, x, y):
            return x + y

    model = Add()
    with torch.no_grad(), capture.Recorder(model, sys.argv[1], name="add"):
        for batch in sys.argv[2].split(","):
            model(torch.ones(int(batch), 3), torch.ones(int(batch), 3))
    """
)


def test_store_written_by_several_processes_reads_as_one(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), batches], env=env)
        for batches in ("2,3,3", "3,4")
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    with capture.open_store(tmp_path) as store:
        assert store.models() == ["add"]
        calls = store.query("SELECT count(*) AS calls, count(DISTINCT pid) AS pids FROM calls")
        assert calls.to_pylist() == [{"calls": 5, "pids": 2}]
        raw = store.query("SELECT count(*) AS n FROM _structures_raw WHERE model = 'add'")
        # Each process wrote the input structure (2 leaves) and the output one (1 leaf).
        assert raw.to_pylist() == [{"n": 6}]
        leaves = store.query("SELECT path FROM structures ORDER BY path").to_pylist()
        assert leaves == [{"path": "args[0]"}, {"path": "args[1]"}, {"path": "output"}]
        sigs = store.query("SELECT dims, calls FROM signatures ORDER BY dims").to_pylist()
        assert sigs == [
            {"dims": [2, 3, 2, 3], "calls": 1},
            {"dims": [3, 3, 3, 3], "calls": 3},
            {"dims": [4, 3, 4, 3], "calls": 1},
        ]


# -- views -----------------------------------------------------------------------------------
def test_leaves_view_gives_the_shapes_of_known_calls(toy: Store) -> None:
    rows = toy.query(
        "SELECT side, leaf, path, argument, kind, dtype, shape FROM leaves "
        "ORDER BY call_id, side, leaf"
    ).to_pylist()
    x, y, out = "args[0]", "kwargs['y']", "output"
    assert [(r["side"], r["path"], r["argument"], r["kind"], r["shape"]) for r in rows] == [
        ("input", x, "x", "tensor", [2, 3]),
        ("input", y, "y", "missing", None),
        ("output", out, None, "tensor", [2, 3]),
        ("input", x, "x", "tensor", [4, 3]),
        ("input", y, "y", "tensor", [4, 3]),
        ("output", out, None, "tensor", [4, 3]),
        ("input", x, "x", "tensor", [5, 3]),
        ("input", y, "y", "missing", None),
        ("output", out, None, "tensor", [5, 3]),
    ]
    assert {r["dtype"] for r in rows if r["kind"] == "tensor"} == {"float32"}


def test_dims_view_gives_one_row_per_tensor_axis(toy: Store) -> None:
    rows = toy.query(
        "SELECT path, axis, size FROM dims WHERE side = 'input' ORDER BY call_id, leaf, axis"
    ).to_pylist()
    assert [(r["path"], r["axis"], r["size"]) for r in rows] == [
        ("args[0]", 0, 2),
        ("args[0]", 1, 3),
        ("args[0]", 0, 4),
        ("args[0]", 1, 3),
        ("kwargs['y']", 0, 4),
        ("kwargs['y']", 1, 3),
        ("args[0]", 0, 5),
        ("args[0]", 1, 3),
    ]


def test_signatures_merge_the_stats_of_every_segment(toy: Store) -> None:
    assert toy.query("SELECT count(*) AS n FROM stats").to_pylist() == [{"n": 3}]
    rows = toy.signatures("toy").to_pylist()
    assert sorted((r["dims"], r["calls"], r["errors"]) for r in rows) == [
        ([2, 3], 1, 0),
        ([4, 3, 4, 3], 1, 0),
        ([5, 3], 1, 0),
    ]


def test_calls_view_has_the_utc_date_of_each_call(toy: Store) -> None:
    rows = toy.query("SELECT date, ts FROM calls").to_pylist()
    assert all(r["date"] == r["ts"].astimezone(dt.timezone.utc).date() for r in rows)


def test_unknown_model_raises(toy: Store) -> None:
    for call in (toy.signatures, toy.dims, toy.summary, toy.check_model):
        with pytest.raises(UnknownModel, match="no model 'nope' .*models: toy"):
            call("nope")


def test_invalid_sql_raises_query_error(toy: Store) -> None:
    with pytest.raises(QueryError, match="query failed"):
        toy.query("SELECT nope FROM calls")


def test_model_name_that_is_not_a_folder_name_is_kept(tmp_path: Path) -> None:
    # The `model=` folder holds a sanitized name; the views must show the recorded one.
    _record_toy(tmp_path, name="org/toy v1")
    with capture.open_store(tmp_path) as store:
        assert store.models() == ["org/toy v1"]
        for view in ("calls", "structures", "signatures"):
            rows = store.query(f"SELECT DISTINCT model FROM {view}").to_pylist()
            assert rows == [{"model": "org/toy v1"}], view
        assert store.dims("org/toy v1").num_rows == 6  # 2 groups: (x) and (x, y)


@given(
    st.lists(
        st.one_of(st.none(), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=9).map(tuple)),
        max_size=20,
    )
)
@settings(max_examples=200, deadline=None)
def test_packed_dims_become_the_same_arrow_lists_as_python_ints(
    rows: list[tuple[int, ...] | None],
) -> None:
    packed = [None if r is None else pack_sizes(r) for r in rows]
    expected = pa.array([None if r is None else list(r) for r in rows], pa.list_(pa.int64()))
    assert sizes_array(packed).equals(expected)


class Ids(torch.nn.Module):
    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return ids * 2  # pos only passes through the recorder


def test_signatures_merge_integer_ranges_over_segments(tmp_path: Path) -> None:
    model = Ids()
    empty = torch.zeros(0, dtype=torch.int64)
    for ids in ([[3, 9]], [[-1, 4]]):  # two recorders: two writers, two stats files
        with torch.no_grad(), capture.Recorder(model, tmp_path, name="ids", flush_rows=1):
            model(torch.tensor(ids), empty)  # pos empty: its range is unknown (NULL items)
    with capture.open_store(tmp_path) as store:
        segments = store.query("SELECT count(*) AS n FROM stats").to_pylist()
        rows = store.query("SELECT calls, int_min, int_max FROM signatures").to_pylist()
    assert segments == [{"n": 2}]
    # the view merges the ranges (one rule, capture.store.stats_merge), item by item
    assert rows == [{"calls": 2, "int_min": [-1, None], "int_max": [9, None]}]


def test_a_writer_rolls_its_segments_up_into_one_stats_file(tmp_path: Path) -> None:
    model = Ids()
    empty = torch.zeros(0, dtype=torch.int64)
    with torch.no_grad(), capture.Recorder(model, tmp_path, name="ids", flush_rows=1) as rec:
        for ids in ([[3, 9]], [[-1, 4]], [[5, 5]]):
            model(torch.tensor(ids), empty)
            rec.flush()
    calls = sorted((tmp_path / schema.CALLS).rglob("*.parquet"))
    stats = sorted((tmp_path / schema.STATS).rglob("*.parquet"))
    # one stats file per writer, not one per flush (three segments, three calls files)
    assert len(calls) == 3 and len(stats) == 1
    meta = pq.read_metadata(stats[0]).metadata
    assert meta[schema.METADATA_ROLLUP] == b"closed"  # the recorder stopped: compaction may take it
    rows = pq.read_table(stats[0]).to_pylist()
    # the writer's in-memory merge follows the SQL rule (stats_merge.merge_items)
    assert [(r["calls"], r["int_min"], r["int_max"]) for r in rows] == [(3, [-1, None], [9, None])]
