"""Recorder behaviour with real models, real Parquet files and real DuckDB."""

from __future__ import annotations

import inspect
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
import torch

from capture import Recorder, open_store, schema
from capture.errors import CaptureError
from capture.record.writer import StoreWriter
from fixtures.models import run_generate, tiny_llama
from fixtures.names import cache_argument

WORKLOAD = [(1, 5), (2, 7), (1, 9), (3, 4)]


class Add(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return x if y is None else x + y


class Boom(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("bad input shape")


def _count_forward_calls(model: torch.nn.Module) -> list[int]:
    counter = [0]

    def hook(module: torch.nn.Module, args: object, kwargs: object) -> None:
        counter[0] += 1

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return counter


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("llama")
    model = tiny_llama(seed=0)
    reference = run_generate(model, WORKLOAD)
    counter = _count_forward_calls(model)
    with Recorder(model, root) as rec:
        recorded = run_generate(model, WORKLOAD)
    return {
        "root": root,
        "reference": reference,
        "recorded": recorded,
        "forward_calls": counter[0],
        "stats": rec.stats(),
        "model": model,
    }


def test_generate_outputs_are_bit_identical(llama_run: dict[str, object]) -> None:
    reference, recorded = llama_run["reference"], llama_run["recorded"]
    assert isinstance(reference, list) and isinstance(recorded, list)
    assert len(reference) == len(recorded) == len(WORKLOAD)
    for a, b in zip(reference, recorded, strict=True):
        assert torch.equal(a, b)


def test_generate_every_forward_call_recorded_once(llama_run: dict[str, object]) -> None:
    store = open_store(llama_run["root"])  # type: ignore[arg-type]
    n = store.query("SELECT count(*) AS n, count(DISTINCT call_id) AS ids FROM calls").to_pylist()
    forward_calls = llama_run["forward_calls"]
    assert forward_calls == len(WORKLOAD) * 4  # 1 prefill + 3 decode steps per generate()
    assert n == [{"n": forward_calls, "ids": forward_calls}]
    assert llama_run["stats"] == {  # type: ignore[comparison-overlap]
        "recorded": forward_calls,
        "dropped": 0,
        "errors": 0,
        "written": forward_calls,
        "sampled_out": 0,
        "structures": 5,  # 4 input structures + 1 output structure
        # structures, rollup, calls; then the closing rollup again, without its segment's
        # names (compaction leaves named calls files alone)
        "files": 4,
        "bad_records": 0,
        "oversized": 0,
        "unreadable": 0,
        "store_resets": 0,
        "tmp_removed": 0,
    }


def test_generate_prefill_and_decode_structures(llama_run: dict[str, object]) -> None:
    store = open_store(llama_run["root"])  # type: ignore[arg-type]
    rows = store.query(
        """
        SELECT s.kind, count(DISTINCT c.call_id) AS calls
        FROM calls c JOIN structures s ON s.structure_id = c.in_structure
        WHERE s.path = $path
        GROUP BY 1 ORDER BY 1
        """,
        {"path": f"kwargs['{cache_argument()}'].key_cache[0]"},
    ).to_pylist()
    # prefill: an uninitialized cache (None leaves); decode: tensors.
    assert rows == [
        {"kind": "none", "calls": len(WORKLOAD)},
        {"kind": "tensor", "calls": 3 * len(WORKLOAD)},
    ]


def test_generate_past_key_values_readable_by_path(llama_run: dict[str, object]) -> None:
    store = open_store(llama_run["root"])  # type: ignore[arg-type]
    rows = store.query(
        """
        SELECT list_sort(list(DISTINCT shape[3])) AS past, list_sort(list(DISTINCT shape[1])) AS b
        FROM leaves
        WHERE side = 'input' AND path = $path AND kind = 'tensor'
        """,
        {"path": f"kwargs['{cache_argument()}'].value_cache[1]"},
    ).to_pylist()
    # decode steps see past lengths prompt, prompt+1, prompt+2 for each prompt of WORKLOAD
    assert rows == [{"past": [4, 5, 6, 7, 8, 9, 10, 11], "b": [1, 2, 3]}]


def test_generate_attention_mask_missing_only_when_all_ones(llama_run: dict[str, object]) -> None:
    store = open_store(llama_run["root"])  # type: ignore[arg-type]
    rows = store.query(
        """
        SELECT kind, list_sort(list(DISTINCT c.dims[1])) AS batch
        FROM leaves l JOIN calls c USING (call_id)
        WHERE l.path = 'kwargs[''attention_mask'']' GROUP BY 1 ORDER BY 1
        """
    ).to_pylist()
    # generate() drops an all-ones mask (batch 1 prompts); padded batches keep it.
    assert rows == [{"kind": "missing", "batch": [1]}, {"kind": "tensor", "batch": [2, 3]}]


def test_signature_stays_visible_and_method_restored(tmp_path: Path) -> None:
    model = Add()
    before = inspect.signature(model.forward)
    with Recorder(model, tmp_path):
        assert inspect.signature(model.forward) == before
        assert "forward" in model.__dict__
    assert "forward" not in model.__dict__


def test_method_restored_when_body_raises(tmp_path: Path) -> None:
    model = Add()
    with pytest.raises(RuntimeError, match="body failed"), Recorder(model, tmp_path):
        model(torch.ones(2))
        raise RuntimeError("body failed")
    assert "forward" not in model.__dict__
    assert open_store(tmp_path).query("SELECT count(*) AS n FROM calls").to_pylist() == [{"n": 1}]


def test_forward_exception_recorded_then_reraised_untouched(tmp_path: Path) -> None:
    model = Boom()
    with Recorder(model, tmp_path):
        with pytest.raises(ValueError, match="bad input shape") as info:
            model(torch.ones(3))
    assert info.value.args == ("bad input shape",)
    rows = open_store(tmp_path).query("SELECT error, out_structure FROM calls").to_pylist()
    assert rows == [{"error": "ValueError: bad input shape", "out_structure": None}]


def test_eight_threads_every_call_recorded_exactly_once(tmp_path: Path) -> None:
    model = Add()
    per_thread = 200
    barrier = threading.Barrier(8)
    failures: list[BaseException] = []

    def work(i: int) -> None:
        try:
            barrier.wait()
            x = torch.ones(i + 1, 3)
            for _ in range(per_thread):
                if not torch.equal(model(x, x), x + x):
                    raise AssertionError("wrong result")
        except BaseException as e:  # collected and re-raised in the main thread
            failures.append(e)

    with Recorder(model, tmp_path, flush_rows=97) as rec:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not failures
    assert rec.stats()["recorded"] == rec.stats()["written"] == 8 * per_thread
    rows = (
        open_store(tmp_path)
        .query(
            "SELECT dims[1] AS batch, count(*) AS n, count(DISTINCT call_id) AS ids "
            "FROM calls GROUP BY 1 ORDER BY 1"
        )
        .to_pylist()
    )
    assert rows == [{"batch": i + 1, "n": per_thread, "ids": per_thread} for i in range(8)]


def test_sampling_and_max_calls(tmp_path: Path) -> None:
    model = Add()
    with Recorder(model, tmp_path / "none", sample=0.0) as rec:
        for _ in range(10):
            model(torch.ones(2))
    assert rec.stats()["recorded"] == 0 and rec.stats()["sampled_out"] == 10
    with Recorder(model, tmp_path / "three", max_calls=3) as rec:
        for _ in range(10):
            model(torch.ones(2))
    assert rec.stats()["recorded"] == 3


def test_queue_full_drops_and_counts(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path, "m", (), queue_size=2)  # thread not started: nothing drains
    rec = (1, 0, "s", None, (2,), None, None, 10, None)
    assert [writer.submit(rec) for _ in range(4)] == [True, True, False, False]
    assert writer.dropped == 2 and writer.recorded == 2


def test_unknown_input_recorded_as_opaque(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    class Thing:
        pass

    class UsesThing(torch.nn.Module):
        def forward(self, x: torch.Tensor, thing: object) -> torch.Tensor:
            return x * 2

    model = UsesThing()
    with caplog.at_level(logging.WARNING, logger="capture"), Recorder(model, tmp_path) as rec:
        for _ in range(3):
            assert torch.equal(model(torch.ones(2), Thing()), torch.full((2,), 2.0))
    warnings = [r for r in caplog.records if "opaque" in r.getMessage()]
    assert len(warnings) == 1 and "args[1]" in warnings[0].getMessage()
    assert rec.stats()["recorded"] == 3
    rows = (
        open_store(tmp_path)
        .query("SELECT DISTINCT path, kind, type FROM leaves WHERE side = 'input' ORDER BY path")
        .to_pylist()
    )
    assert rows == [
        {"path": "args[0]", "kind": "tensor", "type": "Tensor"},
        {"path": "args[1]", "kind": "opaque", "type": f"{__name__}.{Thing.__qualname__}"},
    ]


class Broken:
    """An object whose registered flatten function raises."""


class UsesBroken(torch.nn.Module):
    def forward(self, x: torch.Tensor, b: Broken) -> torch.Tensor:
        return x + 1


@pytest.fixture
def broken_registered() -> Iterator[None]:
    import torch.utils._pytree as pytree

    def bad_flatten(obj: object) -> tuple[list[object], None]:
        raise RuntimeError("cannot flatten")

    pytree.register_pytree_node(Broken, bad_flatten, lambda children, ctx: Broken())
    try:
        yield
    finally:
        pytree._deregister_pytree_node(Broken)


def test_flattener_failure_never_reaches_the_model(tmp_path: Path, broken_registered: None) -> None:
    model = UsesBroken()
    with Recorder(model, tmp_path) as rec:
        for _ in range(3):
            assert torch.equal(model(torch.zeros(2), Broken()), torch.ones(2))
    stats = rec.stats()
    # a call capture cannot flatten is recorded all the same (never "record nothing").
    assert (stats["errors"], stats["recorded"], stats["unreadable"]) == (0, 3, 3)


def test_flattener_failure_is_recorded_as_a_leaf_naming_the_class(
    tmp_path: Path, broken_registered: None
) -> None:
    model = UsesBroken()
    with Recorder(model, tmp_path, name="m"):
        model(torch.zeros(2), Broken())
    rows = (
        open_store(tmp_path)
        .query("SELECT path, kind, type FROM structures WHERE path = 'args[1]'")
        .to_pylist()
    )
    # the part capture cannot read is an opaque leaf naming its class.
    assert [(r["kind"], r["type"]) for r in rows] == [("opaque", f"{__name__}.Broken")]


def test_unwritable_store_keeps_the_model_running(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    model = Add()
    with (
        caplog.at_level(logging.WARNING, logger="capture"),
        Recorder(model, blocker / "store", flush_rows=2) as rec,
    ):
        for i in range(5):
            assert torch.equal(model(torch.full((2,), float(i))), torch.full((2,), float(i)))
    stats = rec.stats()
    assert stats["errors"] >= 1 and stats["written"] == 0 and stats["dropped"] == 5
    assert len([r for r in caplog.records if r.name.startswith("capture")]) == 1
    assert blocker.read_text() == "not a directory"


def test_invalid_options_are_clear_errors() -> None:
    with pytest.raises(CaptureError, match="has no method 'predict'"):
        Recorder(Add(), "x", method="predict")
    with pytest.raises(CaptureError, match=r"sample=2 must be within \[0, 1\]"):
        Recorder(Add(), "x", sample=2)


def test_files_are_complete_zstd_parquet_with_metadata(tmp_path: Path) -> None:
    model = Add()
    with Recorder(model, tmp_path, name="adder"):
        model(torch.ones(2, 3), torch.ones(2, 3))
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    rel = [str(p.relative_to(tmp_path)).split("/")[:-1] for p in files]
    day = rel[0][2]
    assert rel == [
        ["calls", "model=adder", day],
        ["stats", "model=adder"],
        ["structures", "model=adder"],
    ]
    for path in files:
        assert not path.name.startswith(".") and path.suffix == ".parquet"
        meta = pq.read_metadata(path)
        assert meta.metadata[b"capture.schema_version"] == str(schema.SCHEMA_VERSION).encode()
        assert meta.row_group(0).column(0).compression == "ZSTD"
    con = duckdb.connect()
    total = con.execute(
        f"SELECT count(*) FROM read_parquet('{tmp_path}/**/*.parquet', union_by_name=true)"
    ).fetchall()
    assert total == [(5,)]  # 1 call + 1 stats row + 3 structure rows (args x, y; output)


def test_pyarrow_filesystem_uri(tmp_path: Path) -> None:
    model = Add()
    with Recorder(model, f"file://{tmp_path}/uri-store") as rec:
        model(torch.ones(2))
    assert rec.stats()["written"] == 1
    assert open_store(f"file://{tmp_path}/uri-store").query(
        "SELECT count(*) AS n FROM calls"
    ).to_pylist() == [{"n": 1}]


def test_explicit_none_and_missing_are_distinct(tmp_path: Path) -> None:
    model = Add()
    with Recorder(model, tmp_path):
        model(torch.ones(2))
        model(torch.ones(2), None)
    rows = (
        open_store(tmp_path)
        .query(
            "SELECT DISTINCT path, kind FROM leaves "
            "WHERE path LIKE '%y%' OR path = 'args[1]' ORDER BY 2"
        )
        .to_pylist()
    )
    assert rows == [{"path": "kwargs['y']", "kind": "missing"}, {"path": "args[1]", "kind": "none"}]


def test_integer_value_ranges(tmp_path: Path) -> None:
    model = Add()
    with Recorder(model, tmp_path):
        model(torch.tensor([[3, 9], [4, 5]]))
        model(torch.tensor([[-1, 2], [4, 5]]))
    rows = (
        open_store(tmp_path)
        .query(
            "SELECT int_min, int_max FROM leaves "
            "WHERE side = 'input' AND kind = 'tensor' ORDER BY int_min"
        )
        .to_pylist()
    )
    assert rows == [{"int_min": -1, "int_max": 5}, {"int_min": 3, "int_max": 9}]


def test_flush_makes_calls_visible_while_recording(tmp_path: Path) -> None:
    model = Add()
    rec = Recorder(model, tmp_path, flush_seconds=3600).start()
    try:
        model(torch.ones(2))
        rec.flush()
        assert open_store(tmp_path).query("SELECT count(*) AS n FROM calls").to_pylist() == [
            {"n": 1}
        ]
    finally:
        rec.stop()
    assert os.listdir(tmp_path)


def test_same_containers_with_other_dtypes_ranks_and_grads_get_their_own_structure(
    tmp_path: Path,
) -> None:
    # One container key (a single positional tensor), many dtype/rank/requires_grad variants,
    # more than the recorder keeps C++ guards for: each call must still get the structure of
    # what it was called with, on the guarded path and on the Python-key path alike.
    variants = [
        torch.ones(2, 3),
        torch.ones(2, 3, dtype=torch.float16),
        torch.ones(2, 3, 4),
        torch.ones(5, 3, dtype=torch.int64),
        torch.ones(2, 3, requires_grad=True),
        torch.ones(2, 3, dtype=torch.float64),
        torch.ones(4, dtype=torch.bfloat16),
        torch.ones(7, 3),
    ]
    model = Add()
    sent = []
    with Recorder(model, tmp_path) as rec:
        for _ in range(3):
            for x in variants:
                model(x)
                sent.append((str(x.dtype).removeprefix("torch."), list(x.shape)))
    assert rec.stats()["recorded"] == len(sent)
    rows = (
        open_store(tmp_path)
        .query(
            "SELECT dtype, shape FROM leaves WHERE side = 'input' AND kind = 'tensor' "
            "ORDER BY call_id"
        )
        .to_pylist()
    )
    assert [(r["dtype"], r["shape"]) for r in rows] == sent
