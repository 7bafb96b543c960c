"""A store of version 1 (tests/data/store_before_issue9) still opens, exports, and is read as v1.

The fixture was recorded by the code of commit 9c7ab6a (before this change): a tiny Llama and a
tiny Mistral (sliding window 4, shorter than the prompts), greedy generate() of 3 tokens.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

import capture
import replay
from capture import schema
from fixtures.generate_traffic import tiny_causal

pytest.importorskip("transformers")

OLD_STORE = Path(__file__).parent / "data" / "store_before_issue9"


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(OLD_STORE, root)
    return root


def test_old_store_opens(old_store: Path) -> None:
    with capture.open_store(old_store) as store:
        models = store.query("SELECT DISTINCT model FROM calls ORDER BY model").to_pylist()
    assert [m["model"] for m in models] == ["llama", "mistral"]


def test_old_llama_store_exports_and_covers_decode(old_store: Path) -> None:
    result = replay.export(tiny_causal("llama"), old_store, model_name="llama")
    # Recorded signatures only: with two distinct decode signatures the analysis cannot tell
    # mask = past + 1 from chance, so probes vary them apart and the program's guard refuses them.
    decode = [
        r
        for r in result.coverage.to_pylist()
        if r["group"].startswith("decode") and r["kind"] == "recorded"
    ]
    assert decode and all(r["covered"] for r in decode)


def test_old_sliding_window_store_is_reported_not_covered(old_store: Path) -> None:
    model = tiny_causal("mistral", sliding_window=4)
    result = replay.export(model, old_store, model_name="mistral")
    decode = [r for r in result.coverage.to_pylist() if r["group"].startswith("decode")]
    # a window recorded without its fill level cannot be rebuilt exactly: never covered.
    assert decode and not any(r["covered"] for r in decode)
    assert all("recorded without its fill level" in r["error"] for r in decode)


def test_a_stateless_cache_layer_is_read_by_the_version_it_was_recorded_under(
    old_store: Path,
) -> None:
    from capture.analysis.groups import analyze
    from capture.pytree.cachespec import blocking_reason

    with capture.open_store(old_store) as store:
        versions = store.query("SELECT DISTINCT schema_version FROM structures").to_pylist()
        decode = [g for g in analyze(store, "mistral") if g.name.startswith("decode")]
    assert versions == [{"schema_version": None}]  # files of version 1 have no such column
    structure = decode[0].structure
    assert structure.schema_version == 1
    assert "recorded without its fill level (a store of version 1" in str(
        blocking_reason(structure)
    )
    # The same rows claiming a version that always records the fill level: a corrupt store.
    claimed = dataclasses.replace(structure, schema_version=schema.SCHEMA_VERSION)
    assert "the store's structures file is corrupt" in str(blocking_reason(claimed))


def test_a_new_recording_says_its_version_on_every_structure_row(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    with capture.Recorder(model, tmp_path / "store"):
        model(torch.rand(2, 3))
    with capture.open_store(tmp_path / "store") as store:
        rows = store.query("SELECT DISTINCT schema_version FROM structures").to_pylist()
    assert rows == [{"schema_version": schema.SCHEMA_VERSION}]
