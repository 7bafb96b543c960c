"""replay.inputs.shapes: per-axis specs, the dynamic_shapes structure, call forms.

Structures and dims come from real recordings (the seed scenarios and a tiny Llama's generate()
traffic) analysed by capture.analysis.groups.
"""

from __future__ import annotations

import pytest
from torch.export import Dim

from capture.analysis.groups import Group, analyze
from capture.errors import ReplayError
from capture.signature import POSITIONAL_OR_KEYWORD, VAR_KEYWORD, VAR_POSITIONAL, Param, Signature
from capture.store_api import Store
from fixtures.names import cache_argument
from replay.inputs import shapes
from replay.inputs.shapes import AxisSpec, SymbolRange
from replay.runtime import callform
from replay.runtime.callform import CallForm


def _group(store: Store, model: str, name: str) -> Group:
    return next(g for g in analyze(store, model) if g.name == name)


def _tree(
    group: Group, by_leaf: dict[int, dict[int, object]]
) -> tuple[list[object], dict[str, object]]:
    structure = group.structure
    return shapes.spec_tree(structure.treespec, shapes.leaf_specs(structure.leaves, by_leaf))


def test_dynamic_axes_are_unnamed_by_default(seeds: Store) -> None:
    specs = shapes.axis_specs(_group(seeds, "add_broadcast", "g0"))
    assert specs.by_leaf == {0: {0: AxisSpec(), 1: AxisSpec()}, 1: {1: AxisSpec()}}
    assert specs.symbols == {}


def test_named_dims_share_one_symbol_with_the_observed_range(seeds: Store) -> None:
    specs = shapes.axis_specs(_group(seeds, "add_broadcast", "g0"), named_dims=True)
    assert specs.by_leaf == {
        0: {0: AxisSpec("x_0"), 1: AxisSpec("x_1")},
        1: {1: AxisSpec("x_1")},
    }
    assert specs.symbols == {"x_0": SymbolRange("x_0", 2, 4), "x_1": SymbolRange("x_1", 6, 8)}


def test_a_relation_becomes_a_derived_dim(llama: Store) -> None:
    specs = shapes.axis_specs(_group(llama, "LlamaForCausalLM", "decode"), named_dims=True)
    mask = next(
        leaf
        for leaf in _group(llama, "LlamaForCausalLM", "decode").structure.leaves
        if leaf.argument == "attention_mask"
    )
    past = f"{cache_argument()}_2"
    assert specs.by_leaf[mask.leaf][1] == AxisSpec("attention_mask_1", past, 1, 1)
    assert "attention_mask_1" not in specs.symbols


def test_a_forced_constant_batch_dim_has_no_max(seeds: Store) -> None:
    group = next(g for g in analyze(seeds, "llm", set_batch_dimension_for=True))
    specs = shapes.axis_specs(group, named_dims=True, example={"batch": 2})
    assert specs.symbols["batch"] == SymbolRange("batch", 1, None)


def test_the_range_is_widened_to_the_example(seeds: Store) -> None:
    group = next(g for g in analyze(seeds, "llm", set_batch_dimension_for=True))
    specs = shapes.axis_specs(group, named_dims=True, example={"input_ids_1": 12})
    assert specs.symbols["input_ids_1"] == SymbolRange("input_ids_1", 1, 12)


def test_materialize_reuses_one_dim_object_per_symbol(llama: Store) -> None:
    group = _group(llama, "LlamaForCausalLM", "decode")
    dims = shapes.materialize(shapes.axis_specs(group, named_dims=True))
    batches = [axes[0] for axes in dims.values()]
    assert all(b is batches[0] for b in batches)
    assert str(batches[0]) == "Dim('batch', max=3)"
    mask = next(leaf.leaf for leaf in group.structure.leaves if leaf.argument == "attention_mask")
    assert str(dims[mask][1]) == f"{cache_argument()}_2 + 1"


def test_materialize_gives_dim_dynamic_for_unnamed_axes(seeds: Store) -> None:
    dims = shapes.materialize(shapes.axis_specs(_group(seeds, "linear", "g0")))
    assert dims == {0: {0: Dim.DYNAMIC}, 1: {0: Dim.DYNAMIC}}


def test_spec_tree_of_positional_arguments(seeds: Store) -> None:
    group = _group(seeds, "add_broadcast", "g0")
    assert _tree(group, {0: {0: "b", 1: "s"}, 1: {1: "s"}}) == ([{0: "b", 1: "s"}, {1: "s"}], {})


def test_spec_tree_flattens_a_dynamic_cache_to_one_list(seeds: Store) -> None:
    group = _group(seeds, "llm", "decode")
    args, kwargs = _tree(group, {i: {0: f"t{i}"} for i in range(6)})
    assert args == []
    assert kwargs == {
        "input_ids": {0: "t0"},
        "attention_mask": {0: "t1"},
        "past_key_values": [{0: "t2"}, {0: "t3"}, {0: "t4"}, {0: "t5"}],
    }


def test_spec_tree_keeps_none_leaves_and_constants(llama: Store) -> None:
    group = _group(llama, "LlamaForCausalLM", "prefill")
    args, kwargs = _tree(group, {})
    assert kwargs == {
        "input_ids": None,
        cache_argument(): [None, None, None, None],
        "position_ids": None,
        "attention_mask": None,
        "logits_to_keep": None,
        "use_cache": None,
        "return_dict": None,
    }


def test_spec_tree_needs_a_treespec() -> None:
    with pytest.raises(ReplayError, match="no treespec"):
        shapes.spec_tree(None, [])


PARAMS = Signature(
    (Param("x", POSITIONAL_OR_KEYWORD, False), Param("y", POSITIONAL_OR_KEYWORD, True))
)
VAR_KW = Signature((*PARAMS, Param("kwargs", VAR_KEYWORD, False)))


@pytest.mark.parametrize(
    ("n_args", "keywords", "params", "keyword_only", "expected"),
    [
        (2, [], PARAMS, False, CallForm(("x", "y"), ())),
        (1, ["y"], PARAMS, False, CallForm(("x",), ("y",))),
        (1, ["y"], PARAMS, True, CallForm((), ("x", "y"))),
        (0, ["x", "flag"], VAR_KW, False, CallForm((), ("x", "flag"), ("flag",))),
    ],
)
def test_call_form(
    n_args: int, keywords: list[str], params: Signature, keyword_only: bool, expected: CallForm
) -> None:
    assert callform.call_form(n_args, keywords, params, keyword_only=keyword_only) == expected


@pytest.mark.parametrize(
    ("form", "args", "kwargs", "expected"),
    [
        (CallForm(("x", "y"), ()), ["a", "b"], {}, ("a", "b")),
        (CallForm(("x",), ("y",)), ["a"], {"y": "b"}, {"x": "a", "y": "b"}),
        (CallForm((), ("x", "y")), [], {"x": "a", "y": "b"}, {"x": "a", "y": "b"}),
    ],
)
def test_shapes_of_is_a_tuple_for_positional_calls_else_a_dict(
    form: CallForm, args: list[str], kwargs: dict[str, str], expected: object
) -> None:
    assert callform.shapes_of(form, args, kwargs) == expected


def test_arrange_moves_positional_arguments_to_keywords() -> None:
    form = callform.call_form(1, ["y"], PARAMS, keyword_only=True)
    assert callform.arrange(form, ["a"], {"y": "b"}) == ((), {"x": "a", "y": "b"})


def test_keyword_only_refuses_star_args() -> None:
    params = Signature(
        (Param("x", POSITIONAL_OR_KEYWORD, False), Param("rest", VAR_POSITIONAL, False))
    )
    with pytest.raises(ReplayError, match="cannot move to keyword arguments"):
        callform.call_form(3, [], params, keyword_only=True)


def test_describe_sizes_counts_equal_shapes(seeds: Store) -> None:
    group = _group(seeds, "llm", "decode")
    sizes = [1, 1, 1, 11] + [1, 4, 11, 32] * 4
    text = shapes.describe_sizes(group.structure.leaves, sizes)
    assert text == "input_ids=1x1 attention_mask=1x11 past_key_values=[1x4x11x32]*4"
