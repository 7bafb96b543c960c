"""capture.compact / `capture compact`: small files merged, no call lost or counted twice."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

import capture
from capture import open_store, schema
from capture.cli.main import cli
from capture.errors import CaptureError
from capture.store import claims, compaction, file_merge, layout
from fixtures.models import run_generate, tiny_llama

WORKLOAD = [(1, 5), (2, 7), (1, 9)]
CALLS, FILES = 30, 10  # the workload twice, 3 calls per file
WRITERS = 2  # one recorder per run of the workload: one stats file (its rollup) each
CALLS_SQL = "SELECT * EXCLUDE (date) FROM calls ORDER BY call_id"
# What the analysis reads from stats: merged signatures, with their integer ranges.
SIGNATURES_SQL = """
SELECT model, in_structure, out_structure, dims, out_dims, calls, errors,
       duration_ns_sum, duration_ns_min, duration_ns_max, first_ts, last_ts
FROM signatures ORDER BY ALL
"""
RANGES_SQL = """
SELECT in_structure, dims, i, min(int_min[i]) AS lo, max(int_max[i]) AS hi
FROM (SELECT *, unnest(generate_series(1, len(int_min))) AS i FROM stats)
GROUP BY ALL ORDER BY ALL
"""


def _files(root: Path, table: str) -> list[Path]:
    return sorted(p for p in (root / table).rglob("*.parquet") if not p.name.startswith("."))


def _snapshot(root: Path) -> dict[str, Any]:
    with open_store(root) as store:
        return {
            "calls": store.query(CALLS_SQL).to_pylist(),
            "signatures": store.query(SIGNATURES_SQL).to_pylist(),
            "ranges": store.query(RANGES_SQL).to_pylist(),
            "structures": store.query("SELECT * FROM structures ORDER BY ALL").to_pylist(),
            "dims": store.dims().to_pylist(),
            "summary": store.summary(),
        }


@pytest.fixture(scope="module")
def small_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-Llama generate() traffic written 3 calls per file (a server flushing often).

    The workload runs twice, each time under its own recorder (two processes of a fleet), so
    every signature is seen in two stats files.
    """
    root = tmp_path_factory.mktemp("small-files") / "store"
    model = tiny_llama(0)
    written = 0
    for _ in range(WRITERS):
        with capture.Recorder(model, root, flush_rows=3, flush_seconds=3600) as rec:
            run_generate(model, WORKLOAD, max_new_tokens=5, seed=0)
        written += rec.stats()["written"]
    assert written == CALLS
    return root


@pytest.fixture
def store(small_files: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "store"
    shutil.copytree(small_files, copy)
    return copy


def test_compaction_keeps_every_call_signature_range_and_analysis(store: Path) -> None:
    before = _snapshot(store)
    assert len(_files(store, "calls")) == FILES and len(_files(store, "stats")) == WRITERS
    result = capture.compact(store)
    assert len(_files(store, "calls")) == 1
    assert len(_files(store, "stats")) == 1
    assert len(_files(store, "structures")) == 1
    assert _snapshot(store) == before
    calls = result.tables["calls"]
    assert (calls.files_before, calls.files_after) == (FILES, 1)
    assert (calls.rows_before, calls.rows_after) == (CALLS, CALLS)
    stats = result.tables["stats"]
    assert (stats.files_after, stats.rows_before, stats.rows_after) == (1, CALLS, CALLS // 2)
    assert not [p for p in store.rglob("*") if p.name.endswith(".tmp")]
    assert not (store / compaction.LOCK_NAME).exists()


def test_merged_file_names_what_it_replaces(store: Path) -> None:
    sources = {p.name for p in _files(store, "calls")}
    capture.compact(store)
    (merged,) = _files(store, "calls")
    meta = pq.read_metadata(merged).metadata
    assert set(json.loads(meta[compaction.METADATA_REPLACES])) == sources
    assert meta[schema.METADATA_SCHEMA_VERSION] == str(schema.SCHEMA_VERSION).encode()


def test_died_before_deleting_readers_count_once_and_next_run_cleans_up(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _snapshot(store)
    originals = {table: len(_files(store, table)) for table in schema.TABLES}
    with monkeypatch.context() as m:  # the process "dies" after each rename, before deleting
        m.setattr(compaction, "_delete", lambda fs, paths: None)
        capture.compact(store)
    assert len(_files(store, "calls")) == FILES + 1  # sources and the merged file, all present
    assert _snapshot(store) == before  # the sources are skipped: no call counted twice
    result = capture.compact(store)
    assert result.deleted_leftovers == sum(n for n in originals.values() if n > 1)
    assert {table: len(_files(store, table)) for table in schema.TABLES} == dict.fromkeys(
        schema.TABLES, 1
    )
    assert _snapshot(store) == before


def test_calls_merged_batch_by_batch_into_row_groups_across_batches(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _snapshot(store)
    monkeypatch.setattr(file_merge, "BATCH_FILES", 2)  # 3 calls per file: 6 calls a batch
    monkeypatch.setattr(file_merge, "_ROW_GROUP", 4)  # row groups cut across batches
    capture.compact(store)
    (merged,) = _files(store, "calls")
    meta = pq.read_metadata(merged)
    groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert groups == [4] * 7 + [2]  # streamed in bounded memory, in order
    assert _snapshot(store) == before


def test_leftovers_are_compared_in_chunks_and_each_file_judged_alone(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:  # "dies" before deleting: 10 files listed by the merged one
        m.setattr(compaction, "_delete", lambda fs, paths: None)
        capture.compact(store)
    (merged,) = [p for p in _files(store, "calls") if p.name.startswith("compact-")]
    sources = [p for p in _files(store, "calls") if p != merged]
    forged = sources[4]  # same row count, one call the merged file does not hold
    rows = pq.read_table(forged)
    ids = rows.column("call_id").to_pylist()
    rows = rows.set_column(
        rows.schema.get_field_index("call_id"), "call_id", pa.array([ids[0] + 10**9, *ids[1:]])
    )
    pq.write_table(rows, forged)
    fs = pafs.LocalFileSystem()
    infos = [layout.read_footer(fs, str(p), "calls") for p in _files(store, "calls")]
    refused: list[layout.Skip] = []
    monkeypatch.setattr(claims, "_CHUNK", 3)  # the merged file's rows read once, 4 chunks
    hidden = claims.verified_replaced(fs, infos, refused)  # type: ignore[arg-type]
    assert hidden == {str(p) for p in sources if p != forged}  # bulk check
    assert [(s.path, s.reason) for s in refused] == [
        (
            str(merged),
            f"claims to replace {forged.name} but does not hold its rows "
            "(1 of the file's calls are not in it); both files are read",
        )
    ]


def test_target_rows_bounds_merged_files_and_leaves_big_ones(store: Path) -> None:
    before = _snapshot(store)
    result = capture.compact(store, target_rows=10)  # 3+3+3 per merged file; a lone 3 stays
    rows = sorted(pq.read_metadata(p).num_rows for p in _files(store, "calls"))
    assert rows == [3, 9, 9, 9]
    assert result.tables["calls"].files_after == 4
    capture.compact(store, target_rows=9)  # big enough already, or alone
    assert sorted(pq.read_metadata(p).num_rows for p in _files(store, "calls")) == [3, 9, 9, 9]
    assert _snapshot(store) == before


def test_dry_run_changes_nothing(store: Path) -> None:
    listing = sorted(str(p) for p in store.rglob("*"))
    result = capture.compact(store, dry_run=True)
    assert result.dry_run and result.tables["calls"].files_after == 1
    assert sorted(str(p) for p in store.rglob("*")) == listing


def test_recording_on_while_compacting_loses_nothing(tmp_path: Path) -> None:
    class Add(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    model, root = Add(), tmp_path / "store"
    rec = capture.Recorder(model, root, flush_rows=10, flush_seconds=3600).start()
    try:
        for i in range(95):
            model(torch.ones(1 + i % 4, 2))
        rec.flush()
        capture.compact(root)
        for i in range(55):
            model(torch.ones(1 + i % 4, 2))
    finally:
        rec.stop()
    with open_store(root) as s:
        assert s.query("SELECT count(*) AS n, count(DISTINCT call_id) AS d FROM calls").to_pylist()[
            0
        ] == {"n": 150, "d": 150}
        assert s.query("SELECT sum(calls) AS n FROM signatures").to_pylist() == [{"n": 150}]


def test_a_merge_that_does_not_check_out_touches_nothing(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _snapshot(store)
    stats_files = _files(store, "stats")
    real = file_merge.merge_stats
    monkeypatch.setattr(file_merge, "merge_stats", lambda t: real(t).slice(1))  # loses a row
    with pytest.raises(CaptureError, match="did not check out.*untouched"):
        capture.compact(store)
    assert _files(store, "stats") == stats_files  # no merged file left, no source deleted
    assert not [p for p in store.rglob("*") if p.name.endswith(".tmp")]
    assert not (store / compaction.LOCK_NAME).exists()
    monkeypatch.undo()
    assert _snapshot(store) == before  # (calls, merged before stats, are complete)


def test_unreadable_file_is_left_alone_and_reported(store: Path) -> None:
    bad = store / "calls" / "model=LlamaForCausalLM"
    (broken,) = list(bad.glob("date=*"))[:1]
    (broken / "truncated.parquet").write_bytes(b"PAR1 not really")
    result = capture.compact(store)
    assert result.unreadable == [str(broken / "truncated.parquet")]
    assert (broken / "truncated.parquet").exists()
    assert result.tables["calls"].files_after == 1


def test_lock_held_is_a_clear_error_and_cli_exit_1(store: Path) -> None:
    (store / compaction.LOCK_NAME).write_text("{}")
    with pytest.raises(CaptureError, match="another compaction holds"):
        capture.compact(store)
    result = CliRunner().invoke(cli, ["--store", str(store), "compact"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: another compaction holds")
    assert "Traceback" not in result.output
    assert len(_files(store, "calls")) == FILES


def test_cli_compact_prints_what_it_did(store: Path) -> None:
    files = {table: len(_files(store, table)) for table in schema.TABLES}
    rows = {table: _rows(store, table) for table in schema.TABLES}
    result = CliRunner().invoke(cli, ["--store", str(store), "compact", "--target-rows", "100"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"compacted {store} (target 100 calls per file)",
        f"  structures  {files['structures']} files -> 1, {rows['structures']} rows -> "
        f"{_rows(store, 'structures')}",
        f"  calls       {FILES} files -> 1, {CALLS} rows -> {CALLS}",
        f"  stats       {WRITERS} files -> 1, {rows['stats']} rows -> {_rows(store, 'stats')}",
    ]


def _rows(store: Path, table: str) -> int:
    return sum(pq.read_metadata(p).num_rows for p in _files(store, table))


def test_cli_missing_store_and_bad_target(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(cli, ["--store", str(tmp_path / "nope"), "compact"])
    assert missing.exit_code == 1
    assert missing.output.startswith("Error: no store at")
    bad = runner.invoke(cli, ["--store", str(tmp_path), "compact", "--target-rows", "0"])
    assert bad.exit_code == 2


def test_merge_stats_widens_ranges_item_by_item_and_keeps_nulls() -> None:
    def row(
        calls: int, lo: list[int | None] | None, hi: list[int | None] | None, t: int
    ) -> dict[str, Any]:
        ts = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=t)
        return {
            "model": "m", "in_structure": "s", "out_structure": None, "dims": [2, 3],
            "out_dims": None, "calls": calls, "errors": t % 2, "int_min": lo, "int_max": hi,
            "first_ts": ts, "last_ts": ts, "duration_ns_sum": 10 * calls,
            "duration_ns_min": 5 + t, "duration_ns_max": 50 + t,
        }  # fmt: skip

    rows = [row(2, [3, None], [9, None], 1), row(1, [1, None], [4, None], 2), row(4, None, None, 3)]
    other = {**row(1, [0, 0], [1, 1], 4), "dims": [5, 3]}
    merged = file_merge.merge_stats(
        pa.Table.from_pylist([*rows, other], schema=schema.STATS_SCHEMA)
    ).to_pylist()
    assert len(merged) == 2
    first = merged[0]
    assert (first["calls"], first["errors"], first["duration_ns_sum"]) == (7, 2, 70)
    assert (first["int_min"], first["int_max"]) == ([1, None], [9, None])
    assert (first["duration_ns_min"], first["duration_ns_max"]) == (6, 53)
    assert first["first_ts"] < first["last_ts"]
    assert merged[1]["dims"] == [5, 3] and merged[1]["int_min"] == [0, 0]
