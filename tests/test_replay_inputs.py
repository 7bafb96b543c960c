"""replay.export_inputs: export arguments and dynamic_shapes per call group, from a real store.

The seed scenarios are recorded once per module with the real Recorder; the expected
dynamic_shapes are the seeds' (Dim.DYNAMIC where a dim varied, a tuple for positional calls, a
dict for keyword calls, a flat list for a DynamicCache), with examples torch.export accepts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.export import Dim

import replay
from capture.errors import ReplayError, UnknownModel
from capture.seeds.strings import string_type
from capture.store_api import Store
from fixtures.stores import record_seed_scenarios

D = Dim.DYNAMIC


def _inputs(store: Store, model: str, **options: object) -> replay.ExportInputs:
    return replay.export_inputs(store, model, **options)  # type: ignore[arg-type]


def test_positional_calls_give_a_tuple(seeds: Store) -> None:
    inputs = _inputs(seeds, "add_broadcast")
    assert inputs.dynamic_shapes == ({0: D, 1: D}, {1: D})
    assert string_type((inputs.args, inputs.kwargs), with_shape=True) == "((T1s2x6,T1s1x6),{})"


def test_keyword_calls_give_a_dict(seeds: Store) -> None:
    inputs = _inputs(seeds, "linear")
    assert inputs.dynamic_shapes == {"x": {0: D}, "labels": {0: D}}
    assert string_type(inputs.kwargs, with_shape=True) == "dict(x:T1s2x8,labels:T7s2)"


def test_a_dynamic_cache_gives_a_flat_list(seeds: Store) -> None:
    inputs = _inputs(seeds, "llm", set_batch_dimension_for=True)
    assert inputs.dynamic_shapes == {
        "input_ids": {0: D, 1: D},
        "attention_mask": {0: D, 1: D},
        "past_key_values": [{0: D, 2: D}] * 4,
    }


def test_every_dynamic_dim_of_the_example_is_at_least_two(seeds: Store) -> None:
    inputs = _inputs(seeds, "llm", set_batch_dimension_for=True)
    assert string_type(inputs.kwargs, with_shape=True) == (
        "dict(input_ids:T7s2x10,attention_mask:T7s2x11,past_key_values:DynamicCache("
        "key_cache=#2[T1s2x4x11x32,T1s2x4x11x32], value_cache=#2[T1s2x4x11x32,T1s2x4x11x32]))"
    )
    assert (
        inputs.groups[0]
        .notes[0]
        .startswith(
            "example synthesized (no recorded signature has every dynamic dim >= 2): "
            "batch: 1 -> 2, input_ids_1: 1 -> 10"
        )
    )


def test_one_group_per_input_structure_largest_first(seeds: Store) -> None:
    inputs = _inputs(seeds, "multimodal", set_batch_dimension_for=True)
    assert [(g.name, g.calls) for g in inputs.groups] == [("decode", 2), ("prefill", 1)]
    assert inputs.kwargs is inputs.groups[0].kwargs
    prefill = inputs.group("prefill")
    assert prefill.dynamic_shapes == {
        "input_ids": {0: D},
        "pixel_values": {0: D},
        "attention_mask": {0: D},
    }
    assert "not passed (missing in the recorded calls): past_key_values" in prefill.notes


def test_named_dims_reuse_one_dim_per_symbol(seeds: Store) -> None:
    shapes = _inputs(seeds, "add", named_dims=True).dynamic_shapes
    assert shapes[0][0] is shapes[1][0]
    assert str(shapes) == (
        "({0: Dim('batch', max=4), 1: Dim('x_1', min=6, max=8)}, "
        "{0: Dim('batch', max=4), 1: Dim('x_1', min=6, max=8)})"
    )


def test_keyword_only_moves_positional_arguments(seeds: Store) -> None:
    inputs = _inputs(seeds, "add_broadcast", keyword_only=True)
    assert inputs.args == ()
    assert list(inputs.kwargs) == ["x", "y"]
    assert inputs.dynamic_shapes == {"x": {0: D, 1: D}, "y": {1: D}}


def test_value_if_missing_is_only_used_with_fill_missing(seeds: Store) -> None:
    mask = torch.ones(0, 10)
    plain = _inputs(seeds, "masked", value_if_missing={"mask": mask}).group("g1")
    assert list(plain.kwargs) == ["x"]
    assert plain.notes[1].startswith("value_if_missing for mask not used")
    filled = _inputs(seeds, "masked", value_if_missing={"mask": mask}, fill_missing=True)
    g1 = filled.group("g1")
    assert string_type(g1.kwargs, with_shape=True) == "dict(x:T1s2x10,mask:T1s0x10)"
    assert g1.dynamic_shapes == {"x": None, "mask": None}


def test_value_if_missing_must_name_an_argument(seeds: Store) -> None:
    with pytest.raises(ReplayError, match="value_if_missing names maks, which no recorded call"):
        _inputs(seeds, "masked", value_if_missing={"maks": torch.ones(0, 10)})


def test_fill_missing_uses_the_recorded_dtype_and_shape(seeds: Store) -> None:
    decode = _inputs(seeds, "multimodal", fill_missing=True).group("decode")
    assert string_type(decode.kwargs["pixel_values"], with_shape=True) == "T1s0x3x224x224"
    assert decode.notes[1] == (
        "missing optionals given as static empty tensors (fill_missing): pixel_values=0x3x224x224"
    )


def test_a_store_path_is_accepted(tmp_path: Path) -> None:
    record_seed_scenarios(tmp_path, names=["add"])
    assert replay.export_inputs(str(tmp_path)).model_name == "add"


def test_several_models_need_a_name(seeds: Store) -> None:
    with pytest.raises(ReplayError, match=r"holds several models \(add, add_broadcast, "):
        replay.export_inputs(seeds)


def test_unknown_model(seeds: Store) -> None:
    with pytest.raises(UnknownModel, match="no model 'nope'"):
        replay.export_inputs(seeds, "nope")


def test_unknown_group(seeds: Store) -> None:
    with pytest.raises(ReplayError, match=r"no group 'nope' for model masked \(groups: g0, g1\)"):
        replay.export_inputs(seeds, "masked", groups=["nope"])


def test_groups_filter(seeds: Store) -> None:
    assert [g.name for g in _inputs(seeds, "masked", groups=["g1"]).groups] == ["g1"]


def test_a_group_reads_the_structure_the_analysis_built(seeds: Store) -> None:
    group = _inputs(seeds, "llm").groups[0]
    assert group.analysis is not None
    # the typed structure is read once, by the analysis; replay reuses that object.
    assert group.structure is group.analysis.structure
