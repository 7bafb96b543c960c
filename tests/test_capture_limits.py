"""The recorder's limits hold whatever a call receives, and each loss is counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from capture import Recorder, open_store
from capture.record.writer import TMP_MAX_AGE

ROOT = Path(__file__).resolve().parents[1]


class Echo(torch.nn.Module):
    def forward(self, x: object, n: object = None) -> object:
        return x


def _calls(store: Path) -> int:
    with open_store(store) as s:
        return int(s.query("SELECT count(*) AS n FROM calls").to_pylist()[0]["n"])


def test_huge_list_argument_is_summarised_under_a_memory_cap(tmp_path: Path) -> None:
    store = tmp_path / "store"
    code = f"""
        import json, tracemalloc, torch
        from capture import Recorder
        class Echo(torch.nn.Module):
            def forward(self, x, items):
                return x
        m = Echo()
        rec = Recorder(m, {str(store)!r}).start()
        items = list(range(100_000))
        m(torch.ones(2, 3), items)  # first call: structures cache, describe()
        lists = [list(range(i, 100_000 + i)) for i in range(3)]  # a new list each call
        x = torch.ones(2, 3)
        tracemalloc.start()
        for items in lists:
            m(x, items)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        rec.stop()
        print(json.dumps({{"peak": peak, **rec.stats()}}))
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    # 100,000 ints as separate leaves take a server to 23.9 GB. The list is one opaque leaf: the
    # recording's own allocations stay small (the argument itself is ~3.6 MB) and bounded.
    assert stats["peak"] < 500_000, stats
    assert stats["oversized"] == 4 and stats["written"] == 4 and stats["dropped"] == 0
    assert proc.stderr.count("counted in stats()['oversized']") == 1  # warned once
    with open_store(store) as s:
        rows = s.query(
            "SELECT argument, kind, type FROM structures WHERE argument = 'items'"
        ).to_pylist()
    assert rows == [{"argument": "items", "kind": "opaque", "type": "builtins.list"}]


def test_structures_table_stores_the_treespec_once(tmp_path: Path) -> None:
    store = tmp_path / "store"
    m = Echo()
    with Recorder(m, store):
        m([torch.ones(1)] * 500)
    files = list((store / "structures").rglob("*.parquet"))
    table = pq.read_table(files[0]).to_pylist()
    inputs = [r for r in table if r["path"].startswith("args")]
    # The treespec is stored once, not on each of the 500 rows (which is quadratic size).
    assert [r["leaf"] for r in inputs if r["treespec"] is not None] == [0]
    with open_store(store) as s:
        assert s.query("SELECT count(*) AS n FROM calls").to_pylist() == [{"n": 1}]


def test_a_fresh_nan_each_call_is_one_structure(tmp_path: Path) -> None:
    m = Echo()
    with Recorder(m, tmp_path / "store", max_structures=5) as rec:
        for _ in range(50):
            m(torch.ones(2), float("nan"))
    stats = rec.stats()
    # NaN != NaN must not make each call a new structure (max_structures would drop calls).
    assert stats["dropped"] == 0 and stats["written"] == 50 and stats["structures"] == 2


def test_a_long_model_name_keeps_its_calls(tmp_path: Path) -> None:
    name = "model-" + "x" * 300
    m = Echo()
    with Recorder(m, tmp_path / "store", name=name) as rec:
        m(torch.ones(2))
    assert rec.stats()["written"] == 1  # a too-long file name (ENAMETOOLONG) drops no call
    with open_store(tmp_path / "store") as s:
        assert s.query("SELECT model FROM calls").to_pylist() == [{"model": name}]
    folders = [p.name for p in (tmp_path / "store" / "calls").iterdir()]
    assert len(folders) == 1 and len(folders[0]) <= 220


def test_two_recorders_stopped_first_in_first_out_leave_no_wrapper(tmp_path: Path) -> None:
    m = Echo()
    first = Recorder(m, tmp_path / "a").start()
    second = Recorder(m, tmp_path / "b").start()
    m(torch.ones(2))
    first.stop()
    m(torch.ones(2))  # still recorded by the second one
    second.stop()
    assert "forward" not in m.__dict__  # no recorder's wrapper stays behind
    m(torch.ones(2))
    assert (first.stats()["written"], second.stats()["written"]) == (1, 2)


def test_stats_add_up_over_restarts(tmp_path: Path) -> None:
    m = Echo()
    rec = Recorder(m, tmp_path / "store")
    for n in (3, 2):
        rec.start()
        for _ in range(n):
            m(torch.ones(2))
        rec.stop()
    stats = rec.stats()
    assert stats["recorded"] == 5 and stats["written"] == 5  # not reset on restart
    assert _calls(tmp_path / "store") == 5


def test_old_tmp_files_of_killed_writers_are_removed(tmp_path: Path) -> None:
    folder = tmp_path / "store" / "calls" / "model=Echo" / "date=2026-01-01"
    folder.mkdir(parents=True)
    old, fresh = folder / ".dead-000001.parquet.tmp", folder / ".live-000001.parquet.tmp"
    old.write_bytes(b"partial")
    fresh.write_bytes(b"partial")
    stale = time.time() - TMP_MAX_AGE - 60
    os.utime(old, (stale, stale))
    m = Echo()
    with Recorder(m, tmp_path / "store") as rec:
        m(torch.ones(2))
    # An old .tmp of a killed writer is removed; a recent one may be a live writer's.
    assert not old.exists() and fresh.exists()
    assert rec.stats()["tmp_removed"] == 1


def test_stop_waits_for_a_call_still_in_the_model(tmp_path: Path) -> None:
    entered = threading.Event()

    class Slow(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            entered.set()
            time.sleep(0.5)
            return x

    m = Slow()
    rec = Recorder(m, tmp_path / "store").start()
    worker = threading.Thread(target=m, args=(torch.ones(2),))
    worker.start()
    entered.wait(10)
    rec.stop()
    worker.join()
    # A call still in the model when stop() runs is written, not only counted recorded.
    assert rec.stats()["written"] == 1 and _calls(tmp_path / "store") == 1


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: torch.arange(40, dtype=torch.int64).to(torch.uint64), id="uint64"),
        pytest.param(lambda: torch.arange(40, dtype=torch.int32).to(torch.uint32), id="uint32"),
        pytest.param(lambda: torch.tensor([[0, 3], [5, 0]]).to_sparse(), id="sparse-int"),
        pytest.param(
            lambda: torch.nested.as_nested_tensor([torch.ones(2, 3), torch.ones(4, 3)]),
            id="strided-nested",
            marks=pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors"),
        ),
        pytest.param(
            lambda: torch.nested.nested_tensor(
                [torch.ones(2, 3), torch.ones(4, 3)], layout=torch.jagged
            ),
            id="jagged-nested",
        ),
    ],
)
def test_unusual_tensors_are_recorded(tmp_path: Path, make: object) -> None:
    x = make()  # type: ignore[operator]
    m = Echo()
    with Recorder(m, tmp_path / "store") as rec:
        m(x)
        m(x)
    stats = rec.stats()
    # These inputs are recorded, not counted as errors.
    assert (stats["errors"], stats["dropped"], stats["written"]) == (0, 0, 2), stats
    with open_store(tmp_path / "store") as s:
        dims = s.query("SELECT dims FROM calls").to_pylist()
    expected = list(x.shape) if not x.is_nested else [2, -1, 3]  # ragged: -1
    assert dims == [{"dims": expected}] * 2
