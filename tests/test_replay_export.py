"""replay.export: real torch.export from real stores, checked against eager on every signature.

The seed scenarios and a tiny LlamaForCausalLM recorded during generate() (batch 1 and 2-3,
several prompt lengths) are exported from the store alone; the coverage table must show every
recorded signature reproduced. The full Llama runs are marked slow; the decode step is not.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import capture
import replay
from capture.errors import ReplayError
from capture.store_api import Store
from fixtures.models import run_generate, tiny_llama
from fixtures.names import cache_argument
from fixtures.seeds import AddModel, Scenario, scenarios
from fixtures.stores import record_llama, record_seed_scenarios
from replay.pipeline.exporting import COVERAGE_SCHEMA, output_path

SEEDS = [s.name for s in scenarios()]


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, dict[str, Scenario]]]:
    root = tmp_path_factory.mktemp("seeds")
    recorded = record_seed_scenarios(root)
    with capture.open_store(root) as store:
        yield store, recorded


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, Any]]:
    root = tmp_path_factory.mktemp("llama")
    model, _ = record_llama(root)
    with capture.open_store(root) as store:
        yield store, model


def _record(tmp_path: Path, model: torch.nn.Module, calls: list[tuple[Any, ...]]) -> Store:
    with capture.Recorder(model, tmp_path, name="m"), torch.no_grad():
        for args in calls:
            model(*args)
    return capture.open_store(tmp_path)


def _recorded(result: replay.ExportResult) -> list[dict[str, Any]]:
    return [r for r in result.coverage.to_pylist() if r["kind"] == "recorded"]


def _all_covered(result: replay.ExportResult) -> None:
    rows = result.coverage.to_pylist()
    assert [r["error"] for r in rows if not r["covered"]] == []
    # Within float32 rounding, not bit-equal: rebuilt masks are padded like
    # production's, and the padded attention path rounds differently in the exported graph.
    assert all(r["max_abs_diff"] <= 1e-5 for r in rows), rows
    assert result.complete


@pytest.mark.parametrize("name", SEEDS)
def test_seed_scenario_exports_and_reproduces_every_call(
    seeds: tuple[Store, dict[str, Scenario]], name: str
) -> None:
    store, recorded = seeds
    scenario = recorded[name]
    result = replay.export(
        scenario.model,
        store,
        name,
        set_batch_dimension_for=scenario.set_batch_dimension_for,
        value_if_missing=scenario.value_if_missing,
    )
    _all_covered(result)
    assert sorted(result.programs) == sorted(g.name for g in result.inputs.groups)
    assert sum(r["calls"] for r in _recorded(result)) == len(scenario.calls)


@pytest.mark.parametrize("name", SEEDS)
def test_seed_scenario_with_named_dims_and_keyword_only(
    seeds: tuple[Store, dict[str, Scenario]], name: str
) -> None:
    store, recorded = seeds
    scenario = recorded[name]
    result = replay.export(
        scenario.model,
        store,
        name,
        set_batch_dimension_for=scenario.set_batch_dimension_for,
        named_dims=True,
        keyword_only=True,
    )
    _all_covered(result)
    assert all(g.args == () for g in result.inputs.groups)
    assert not any("rejected" in n for n in result.notes)


def test_coverage_table(seeds: tuple[Store, dict[str, Scenario]]) -> None:
    store, recorded = seeds
    result = replay.export(recorded["masked"].model, store, "masked")
    assert result.coverage.schema == COVERAGE_SCHEMA
    assert result.coverage.to_pylist() == [
        dict(
            group="g0",
            kind="recorded",
            signature="x=3x10 mask=3x10",
            calls=1,
            covered=True,
            max_abs_diff=0.0,
            error=None,
            target="torch",
            sizes=[3, 10, 3, 10],
        ),
        dict(
            group="g0",
            kind="recorded",
            signature="x=4x10 mask=4x10",
            calls=1,
            covered=True,
            max_abs_diff=0.0,
            error=None,
            target="torch",
            sizes=[4, 10, 4, 10],
        ),
        dict(
            group="g1",
            kind="recorded",
            signature="x=2x10",
            calls=1,
            covered=True,
            max_abs_diff=0.0,
            error=None,
            target="torch",
            sizes=[2, 10],
        ),
    ]


def test_batch_one_and_sequence_one_run_on_a_program_exported_at_two(
    seeds: tuple[Store, dict[str, Scenario]],
) -> None:
    store, recorded = seeds
    result = replay.export(recorded["llm"].model, store, "llm", set_batch_dimension_for=True)
    program = result.programs["decode"]
    assert str(result.inputs.groups[0].example.representative.sizes[:4]) == "[2, 10, 2, 11]"
    rows = result.coverage.to_pylist()
    assert [r["signature"] for r in rows if r["kind"] == "recorded"] == [
        "input_ids=1x1 attention_mask=1x11 past_key_values=[1x4x11x32]*4",
        "input_ids=1x10 attention_mask=1x10 past_key_values=[1x4x10x32]*4",
    ]
    assert len(program.range_constraints) > 0
    _all_covered(result)


def test_the_seeds_own_example_is_refused_where_ours_is_not(
    seeds: tuple[Store, dict[str, Scenario]],
) -> None:
    store, recorded = seeds
    scenario = recorded["llm"]
    inputs = replay.export_inputs(store, "llm", set_batch_dimension_for=True)
    _, seed_kwargs = scenario.calls[0]  # batch 1, as the seed's infer_arguments() returns
    with capture.register_flattening_functions(), pytest.raises(Exception, match="0/1 special"):
        torch.export.export(
            scenario.model, (), kwargs=seed_kwargs, dynamic_shapes=inputs.dynamic_shapes
        )
    with capture.register_flattening_functions():
        torch.export.export(
            scenario.model, (), kwargs=inputs.kwargs, dynamic_shapes=inputs.dynamic_shapes
        )


def test_llama_decode_exports_from_the_store(llama: tuple[Store, Any]) -> None:
    store, model = llama
    result = replay.export(model, store, groups=["decode"])
    assert list(result.programs) == ["decode"]
    assert len(_recorded(result)) == 9
    _all_covered(result)
    assert "decode: passed through **kwargs: return_dict; exported from group.module(model)" in (
        " ".join(result.notes)
    )


@pytest.mark.slow
def test_llama_every_group_exports_and_reproduces_every_call(llama: tuple[Store, Any]) -> None:
    store, model = llama
    result = replay.export(model, store)
    # generate()'s mask-less batch-1 groups are served by the masked groups' programs, the
    # mask filled (merge=True, the default), where the check proves it on their own calls.
    assert sorted(result.programs) == ["decode", "prefill"]
    assert sorted(set(result.coverage.column("group").to_pylist())) == [
        "decode",
        "decode_no_attention_mask",
        "prefill",
        "prefill_no_attention_mask",
    ]
    assert len(_recorded(result)) == 20
    _all_covered(result)
    unmerged = replay.export(model, store, merge=False)
    assert sorted(unmerged.programs) == [
        "decode",
        "decode_no_attention_mask",
        "prefill",
        "prefill_no_attention_mask",
    ]
    _all_covered(unmerged)


@pytest.mark.slow
def test_llama_with_a_forced_batch_dim(llama: tuple[Store, Any]) -> None:
    store, model = llama
    result = replay.export(model, store, set_batch_dimension_for=True)
    _all_covered(result)
    # The batch-1 groups are exported at batch 2 and still run every batch-1 call.
    group = result.inputs.group("decode_no_attention_mask")
    assert group.example.representative.synthesized
    assert group.dynamic_shapes["input_ids"] == {0: torch.export.Dim.DYNAMIC}


@pytest.mark.slow
def test_llama_named_dims_fall_back_when_torch_cannot_prove_a_guard(
    llama: tuple[Store, Any],
) -> None:
    # torch 2.13 cannot prove the Min(...) stride guard repeat_kv's reshape adds for the cache
    # length (grouped-query attention), so named Dims on it are rejected; a bounded
    # Dim.DYNAMIC(min=, max=) hint is not (never an unbounded fallback).
    store, model = llama
    result = replay.export(model, store, named_dims=True, groups=["decode", "prefill"])
    _all_covered(result)
    notes = [n for n in result.notes if "named dims rejected by torch.export" in n]
    older = tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13)
    # torch 2.11/2.12 cannot prove the prefill's guards on named Dims either: bounded hints too
    assert [n.split(":")[0] for n in notes] == (["decode", "prefill"] if older else ["decode"])
    assert "satisfy the generated guard min(" in notes[0]
    assert f"bounded Dim.DYNAMIC hints for {cache_argument()}_2 in [4, 9]" in notes[0]
    assert result.not_honoured == {}
    if older:
        return
    prefill = result.inputs.group("prefill").dynamic_shapes
    assert (
        str(prefill["input_ids"]) == "{0: Dim('batch', max=3), 1: Dim('input_ids_1', min=4, max=7)}"
    )


@pytest.mark.slow
def test_llama_named_and_derived_dims_export_without_grouped_query_attention(
    tmp_path: Path,
) -> None:
    model = tiny_llama(0, num_key_value_heads=4)
    with capture.Recorder(model, tmp_path):
        run_generate(model, [(2, 4), (3, 6)], max_new_tokens=4)
    result = replay.export(model, tmp_path, named_dims=True, groups=["decode"])
    _all_covered(result)
    shapes = result.inputs.group("decode").dynamic_shapes
    assert str(shapes["attention_mask"][1]) == f"{cache_argument()}_2 + 1"
    assert not any("rejected" in n for n in result.notes)


def test_a_program_that_writes_its_callers_input_is_not_claimed(tmp_path: Path) -> None:
    class Inplace(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x.add_(1)
            return x * 2

    store = _record(tmp_path, Inplace(), [(torch.ones(2, 3),), (torch.ones(4, 3),)])
    with store:
        result = replay.export(Inplace(), store)
    # A served call must leave the caller's tensors as they were: the loader refuses the
    # program, so the export claims none of its calls and says why.
    rows = _recorded(result)
    assert rows and not any(r["covered"] for r in rows)
    assert all("writes x, an input of the caller" in r["error"] for r in rows)
    assert not result.complete


def test_a_signature_the_program_rejects_is_not_covered(tmp_path: Path) -> None:
    class Branchy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.shape[0] > 3 else x + 1

    store = _record(tmp_path, Branchy(), [(torch.ones(n, 3),) for n in (2, 3, 5)])
    with store:
        # One regime at most: the group is not split at the branch (tests/test_replay_regimes.py);
        # no static fallback (tests/test_replay_budget.py).
        result = replay.export(Branchy(), store, probes=0, max_regimes=1, max_static=0)
    rows = result.coverage.to_pylist()
    assert [(r["signature"], r["covered"]) for r in rows] == [
        ("x=2x3", True),
        ("x=3x3", True),
        ("x=5x3", False),
    ]
    assert rows[2]["error"].startswith("program failed: AssertionError: Guard failed")
    assert not result.complete


def test_a_group_torch_export_rejects_is_reported(seeds: tuple[Store, dict[str, Scenario]]) -> None:
    store, recorded = seeds
    scenario = recorded["masked"]
    # fill_missing gives g1 (x only) the seeds' empty mask: x * mask cannot broadcast.
    result = replay.export(
        scenario.model,
        store,
        "masked",
        value_if_missing=scenario.value_if_missing,
        fill_missing=True,
    )
    assert list(result.programs) == ["g0"]
    assert list(result.errors) == ["g1"]
    row = result.coverage.to_pylist()[-1]
    assert (row["group"], row["covered"]) == ("g1", False)
    assert row["error"].startswith("torch.export failed: ")
    assert not result.complete


def test_fill_missing_reproduces_calls_that_ignore_the_empty_input(
    seeds: tuple[Store, dict[str, Scenario]],
) -> None:
    store, recorded = seeds
    scenario = recorded["multimodal"]
    result = replay.export(
        scenario.model,
        store,
        "multimodal",
        set_batch_dimension_for=True,
        value_if_missing=scenario.value_if_missing,
        fill_missing=True,
    )
    _all_covered(result)
    assert "pixel_values" in result.inputs.group("decode").kwargs


def test_a_renamed_positional_parameter_is_refused(
    seeds: tuple[Store, dict[str, Scenario]],
) -> None:
    class Renamed(AddModel):
        def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return x + z

    store, _ = seeds
    with pytest.raises(ReplayError) as info:
        replay.export(Renamed(), store, "add")
    assert str(info.value) == (
        "model.forward no longer matches the recordings: args[1] was recorded as parameter 'y', "
        "forward now names it 'z' (group g0 of model add)"
    )


def test_a_removed_keyword_parameter_is_refused(seeds: tuple[Store, dict[str, Scenario]]) -> None:
    class NoLabels(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    store, _ = seeds
    with pytest.raises(ReplayError, match="parameter 'labels' is gone"):
        replay.export(NoLabels(), store, "linear")


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("onnxscript") is not None, reason="onnx is installed"
)
def test_onnx_needs_the_extra(seeds: tuple[Store, dict[str, Scenario]], tmp_path: Path) -> None:
    store, recorded = seeds
    with pytest.raises(ReplayError, match=r"run `pip install capture\[onnx\]`"):
        replay.export(recorded["add"].model, store, "add", onnx=tmp_path / "add.onnx")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")  # torch.onnx's own deepcopy
def test_onnx_files_are_written_per_group(
    seeds: tuple[Store, dict[str, Scenario]], tmp_path: Path
) -> None:
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    store, recorded = seeds
    target = tmp_path / "masked.onnx"
    result = replay.export(recorded["masked"].model, store, "masked", onnx=target)
    assert result.onnx == {
        "g0": str(tmp_path / "masked.g0.onnx"),
        "g1": str(tmp_path / "masked.g1.onnx"),
    }
    graph = onnx.load(result.onnx["g0"]).graph
    assert [i.name for i in graph.input] == ["x", "mask"]
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param != ""


def test_output_path_names_one_file_per_group() -> None:
    assert output_path("out/model.pt2", "decode", True) == "out/model.decode.pt2"
    assert output_path("out/model.pt2", "decode", False) == "out/model.pt2"
