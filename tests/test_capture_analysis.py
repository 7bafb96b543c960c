"""capture.analysis.groups on real stores: call groups, dynamic dims, symbols, relations, summary.

The stores are recorded once per module with the real Recorder (fixtures/stores.py): the seed
scenarios (add, add_broadcast, linear, masked, llm, multimodal) and tiny-Llama generate() traffic
(batch 1 prompts without a mask, left-padded batch 2-3 prompts with one). The relation search is
also checked on synthetic signature matrices (parametrized cases and hypothesis properties).
"""

from __future__ import annotations

import json
import keyword
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import capture
from capture.analysis.groups import (
    DIMS_SCHEMA,
    DimInfo,
    Group,
    Relation,
    analyze,
    dims_table,
)
from capture.analysis.summary import summary
from capture.analysis.symbols import Axis, Symbols, find_symbols
from capture.errors import UnknownModel
from capture.store_api import Store
from fixtures.names import LLAMA_CACHE

T = TypeVar("T")


def _dynamic(group: Group) -> list[tuple[str, int, int, int, int, str | None, str | None]]:
    """(path, axis, min, max, distinct, symbol, expr) of the group's dynamic dims."""
    return [
        (d.path, d.axis, d.min, d.max, d.distinct, d.symbol, d.expr)
        for d in group.dims
        if d.dynamic
    ]


def _only(items: Sequence[T]) -> T:
    assert len(items) == 1, items
    return items[0]


def _by_name(groups: list[Group]) -> dict[str, Group]:
    return {g.name: g for g in groups}


# -- seed scenarios --------------------------------------------------------------------------
def test_add_both_dims_dynamic_and_shared_by_x_and_y(seeds: Store) -> None:
    group = _only(analyze(seeds, "add"))
    assert (group.name, group.calls, group.signatures) == ("g0", 3, 3)
    assert group.dims == [
        DimInfo(0, "args[0]", "x", 0, True, 2, 4, 3, 3, "batch", None),
        DimInfo(0, "args[0]", "x", 1, True, 6, 8, 3, 3, "x_1", None),
        DimInfo(1, "args[1]", "y", 0, True, 2, 4, 3, 3, "batch", None),
        DimInfo(1, "args[1]", "y", 1, True, 6, 8, 3, 3, "x_1", None),
    ]


def test_add_reports_no_relation_from_three_lockstep_calls(seeds: Store) -> None:
    # The calls (2, 6), (3, 7), (4, 8) satisfy seq = batch + 4: too few points to believe it.
    assert _only(analyze(seeds, "add")).relations == []


def test_add_broadcast_y_axis_0_is_static_1(seeds: Store) -> None:
    group = _only(analyze(seeds, "add_broadcast"))
    assert [(d.path, d.axis, d.dynamic, d.min, d.max, d.symbol) for d in group.dims] == [
        ("args[0]", 0, True, 2, 4, "x_0"),
        ("args[0]", 1, True, 6, 8, "x_1"),
        ("args[1]", 0, False, 1, 1, None),
        ("args[1]", 1, True, 6, 8, "x_1"),
    ]


def test_linear_x_and_labels_share_the_batch_symbol(seeds: Store) -> None:
    group = _only(analyze(seeds, "linear"))
    assert _dynamic(group) == [
        ("kwargs['x']", 0, 2, 7, 3, "batch", None),
        ("kwargs['labels']", 0, 2, 7, 3, "batch", None),
    ]
    assert [(d.path, d.axis, d.dynamic, d.min) for d in group.dims if not d.dynamic] == [
        ("kwargs['x']", 1, False, 8)
    ]


def test_masked_groups_with_and_without_mask(seeds: Store) -> None:
    groups = analyze(seeds, "masked")
    assert [(g.name, g.calls, g.signatures) for g in groups] == [("g0", 2, 2), ("g1", 1, 1)]
    assert _dynamic(groups[0]) == [
        ("kwargs['x']", 0, 3, 4, 2, "batch", None),
        ("kwargs['mask']", 0, 3, 4, 2, "batch", None),
    ]
    assert _dynamic(groups[1]) == []


def test_masked_batch_of_a_single_call_group_is_dynamic_when_forced(seeds: Store) -> None:
    groups = analyze(seeds, "masked", set_batch_dimension_for=["x"])
    assert _dynamic(groups[1]) == [("kwargs['x']", 0, 2, 2, 1, "batch", None)]


def test_masked_summary_reports_mask_missing_in_one_of_three_calls(seeds: Store) -> None:
    model = _only(summary(seeds, "masked").to_json()["models"])
    assert model["optional_inputs"] == [
        {
            "argument": "mask",
            "calls": 3,
            "present": 2,
            "missing": 1,
            "none": 0,
            "absent_in": ["g1"],
        }
    ]


def test_llm_mask_and_cache_length_share_a_symbol_without_relation(seeds: Store) -> None:
    # Two calls: (ids 10, mask 10, cache 10) and (ids 1, mask 11, cache 11). mask == cache in
    # both (one symbol); no relation: 2 signatures cannot refute one.
    group = _only(analyze(seeds, "llm"))
    assert group.name == "decode"
    cache = [f"kwargs['past_key_values'].{k}_cache[{i}]" for k in ("key", "value") for i in (0, 1)]
    assert _dynamic(group) == [
        ("kwargs['input_ids']", 1, 1, 10, 2, "input_ids_1", None),
        ("kwargs['attention_mask']", 1, 10, 11, 2, "attention_mask_1", None),
    ] + [(path, 2, 10, 11, 2, "attention_mask_1", None) for path in cache]
    assert group.relations == []


def test_llm_forced_batch_dims_share_one_symbol(seeds: Store) -> None:
    group = _only(analyze(seeds, "llm", set_batch_dimension_for=True))
    batch = [(d.path, d.min, d.max) for d in group.dims if d.symbol == "batch"]
    assert batch == [
        ("kwargs['input_ids']", 1, 1),
        ("kwargs['attention_mask']", 1, 1),
        ("kwargs['past_key_values'].key_cache[0]", 1, 1),
        ("kwargs['past_key_values'].key_cache[1]", 1, 1),
        ("kwargs['past_key_values'].value_cache[0]", 1, 1),
        ("kwargs['past_key_values'].value_cache[1]", 1, 1),
    ]
    assert all(d.dynamic and d.axis == 0 for d in group.dims if d.symbol == "batch")


def test_multimodal_groups_prefill_with_image_and_decode_with_cache(seeds: Store) -> None:
    groups = analyze(seeds, "multimodal")
    assert [(g.name, g.calls, g.signatures) for g in groups] == [
        ("decode", 2, 2),
        ("prefill", 1, 1),
    ]
    decode = groups[0]
    assert [(p, a, lo, hi, s) for p, a, lo, hi, _, s, _ in _dynamic(decode)] == [
        ("kwargs['attention_mask']", 1, 21, 22, "attention_mask_1"),
        ("kwargs['past_key_values'].key_cache[0]", 2, 20, 21, "past_key_values_2"),
        ("kwargs['past_key_values'].key_cache[1]", 2, 20, 21, "past_key_values_2"),
        ("kwargs['past_key_values'].value_cache[0]", 2, 20, 21, "past_key_values_2"),
        ("kwargs['past_key_values'].value_cache[1]", 2, 20, 21, "past_key_values_2"),
    ]


def test_multimodal_mask_is_cache_plus_one_only_below_the_support_rule(seeds: Store) -> None:
    # mask = cache + 1 holds in both decode calls, but 2 signatures give it 1 chance to fail
    # (one is used to fit the +1): below min_support=3 it is not reported, at 1 it is.
    decode = _by_name(analyze(seeds, "multimodal"))["decode"]
    assert decode.relations == []
    lenient = _by_name(analyze(seeds, "multimodal", min_support=1))["decode"]
    assert lenient.relations == [Relation("attention_mask_1", ("past_key_values_2",), 1)]


def test_multimodal_summary_reports_pixel_values_and_cache_missing(seeds: Store) -> None:
    model = _only(summary(seeds, "multimodal").to_json()["models"])
    assert [
        (o["argument"], o["present"], o["missing"], o["absent_in"])
        for o in model["optional_inputs"]
    ] == [
        ("pixel_values", 1, 2, ["decode"]),
        ("past_key_values", 2, 1, ["prefill"]),
    ]


def test_unknown_model_raises(seeds: Store) -> None:
    with pytest.raises(UnknownModel, match="'nope'"):
        analyze(seeds, "nope")


def test_analyze_all_models_sorted_by_model_then_calls(seeds: Store) -> None:
    assert [(g.model_name, g.name) for g in analyze(seeds)] == [
        ("add", "g0"),
        ("add_broadcast", "g0"),
        ("linear", "g0"),
        ("llm", "decode"),
        ("masked", "g0"),
        ("masked", "g1"),
        ("multimodal", "decode"),
        ("multimodal", "prefill"),
    ]


def test_dims_table_columns_and_rows(seeds: Store) -> None:
    table = seeds.dims("add_broadcast")
    assert table.schema == DIMS_SCHEMA
    rows = table.to_pylist()
    assert [{k: r[k] for k in ("group", "path", "axis", "dynamic", "symbol")} for r in rows] == [
        {"group": "g0", "path": "args[0]", "axis": 0, "dynamic": True, "symbol": "x_0"},
        {"group": "g0", "path": "args[0]", "axis": 1, "dynamic": True, "symbol": "x_1"},
        {"group": "g0", "path": "args[1]", "axis": 0, "dynamic": False, "symbol": None},
        {"group": "g0", "path": "args[1]", "axis": 1, "dynamic": True, "symbol": "x_1"},
    ]


def test_dims_table_passes_options_to_analyze(seeds: Store) -> None:
    table = dims_table(seeds, "masked", set_batch_dimension_for=["x"])
    rows = [r for r in table.to_pylist() if r["group"] == "g1"]
    assert [(r["path"], r["axis"], r["dynamic"], r["symbol"]) for r in rows] == [
        ("kwargs['x']", 0, True, "batch"),
        ("kwargs['x']", 1, False, None),
    ]


def test_summary_totals_and_date_range(seeds: Store) -> None:
    data = summary(seeds).to_json()
    assert (data["calls"], data["errors"], data["signatures"]) == (17, 0, 17)
    assert [m["model"] for m in data["models"]] == [
        "add",
        "add_broadcast",
        "linear",
        "llm",
        "masked",
        "multimodal",
    ]
    first, last = datetime.fromisoformat(data["first_ts"]), datetime.fromisoformat(data["last_ts"])
    assert first <= last
    assert first.utcoffset() == timedelta(0)
    assert json.loads(json.dumps(data)) == data
    assert data["skipped_files"] == []


# -- tiny Llama generate() -------------------------------------------------------------------
PAST = f"{LLAMA_CACHE}_2"
"""The cache length's symbol: named after the argument the installed transformers passes."""
CACHE = [f"kwargs['{LLAMA_CACHE}'].{k}_cache[{i}]" for k in ("key", "value") for i in (0, 1)]


def test_llama_groups_prefill_decode_with_and_without_mask(llama: Store) -> None:
    assert [(g.name, g.calls, g.signatures) for g in analyze(llama)] == [
        ("decode", 9, 9),
        ("decode_no_attention_mask", 6, 6),
        ("prefill", 3, 3),
        ("prefill_no_attention_mask", 2, 2),
    ]


def test_llama_decode_shares_batch_across_inputs_and_cache(llama: Store) -> None:
    decode = _by_name(analyze(llama))["decode"]
    batch = [(d.path, d.axis) for d in decode.dims if d.symbol == "batch"]
    # leaves in the forward signature's keyword order (generate passes another)
    assert batch == [
        ("kwargs['input_ids']", 0),
        ("kwargs['attention_mask']", 0),
        ("kwargs['position_ids']", 0),
        *[(p, 0) for p in CACHE],
    ]
    assert {(d.min, d.max, d.distinct) for d in decode.dims if d.symbol == "batch"} == {(2, 3, 2)}


def test_llama_decode_mask_length_is_past_length_plus_input_length(llama: Store) -> None:
    # In decode steps the input length is always 1 (a static dim), so the relation
    # mask = past + input reads attention_mask_1 = <cache>_2 + 1.
    decode = _by_name(analyze(llama))["decode"]
    assert _dynamic(decode)[2] == (
        "kwargs['attention_mask']",
        1,
        5,
        10,
        6,
        "attention_mask_1",
        f"{PAST} + 1",
    )
    assert [(d.path, d.min, d.max, d.distinct) for d in decode.dims if d.symbol == PAST] == [
        (p, 4, 9, 6) for p in CACHE
    ]
    assert [
        (d.path, d.axis, d.dynamic, d.min) for d in decode.dims if d.path == "kwargs['input_ids']"
    ] == [
        ("kwargs['input_ids']", 0, True, 2),
        ("kwargs['input_ids']", 1, False, 1),
    ]
    assert decode.relations == [Relation("attention_mask_1", (PAST,), 1)]
    assert str(decode.relations[0]) == f"attention_mask_1 = {PAST} + 1"


def test_llama_decode_without_mask_has_static_batch_and_dynamic_past(llama: Store) -> None:
    group = _by_name(analyze(llama))["decode_no_attention_mask"]
    assert _dynamic(group) == [(p, 2, 5, 11, 6, PAST, None) for p in CACHE]
    assert group.relations == []


def test_llama_prefill_ids_positions_and_mask_share_the_length(llama: Store) -> None:
    prefill = _by_name(analyze(llama))["prefill"]
    assert _dynamic(prefill) == [
        ("kwargs['input_ids']", 0, 2, 3, 2, "batch", None),
        ("kwargs['input_ids']", 1, 4, 7, 3, "input_ids_1", None),
        ("kwargs['attention_mask']", 0, 2, 3, 2, "batch", None),
        ("kwargs['attention_mask']", 1, 4, 7, 3, "input_ids_1", None),
        ("kwargs['position_ids']", 0, 2, 3, 2, "batch", None),
        ("kwargs['position_ids']", 1, 4, 7, 3, "input_ids_1", None),
    ]


def test_llama_summary_reports_missing_mask_for_batch_1_calls(llama: Store) -> None:
    model = _only(summary(llama).to_json()["models"])
    assert model["optional_inputs"] == [
        {
            "argument": "attention_mask",
            "calls": 20,
            "present": 12,
            "missing": 8,
            "none": 0,
            "absent_in": ["decode_no_attention_mask", "prefill_no_attention_mask"],
        },
        {
            "argument": LLAMA_CACHE,
            "calls": 20,
            "present": 15,
            "missing": 0,
            "none": 5,
            "absent_in": ["prefill", "prefill_no_attention_mask"],
        },
    ]
    assert model["always_absent"] == ["inputs_embeds", "labels"]
    assert model["drift"] == []


def test_llama_summary_groups_and_relations(llama: Store) -> None:
    model = _only(summary(llama).to_json()["models"])
    assert [(g["name"], g["calls"], g["share"]) for g in model["groups"]] == [
        ("decode", 9, 0.45),
        ("decode_no_attention_mask", 6, 0.3),
        ("prefill", 3, 0.15),
        ("prefill_no_attention_mask", 2, 0.1),
    ]
    assert model["relations"] == [
        {
            "group": "decode",
            "symbol": "attention_mask_1",
            "expr": f"{PAST} + 1",
            "relation": f"attention_mask_1 = {PAST} + 1",
        }
    ]
    assert [s["symbol"] for s in model["groups"][0]["symbols"]] == [
        "batch",
        "attention_mask_1",
        PAST,
    ]


# -- drift -----------------------------------------------------------------------------------
class _Add(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


def test_summary_reports_dtype_and_rank_drift(tmp_path: Path) -> None:
    model = _Add()
    with torch.no_grad(), capture.Recorder(model, tmp_path, name="add"):
        for _ in range(3):
            model(torch.ones(2, 3), torch.ones(2, 3))
        model(torch.ones(2, 3, dtype=torch.float16), torch.ones(2, 3, dtype=torch.float16))
        model(torch.ones(2, 3, 4), torch.ones(3, 4))
    with capture.open_store(tmp_path) as store:
        drift = _only(summary(store).to_json()["models"])["drift"]
    assert [(d["path"], d["changes"]) for d in drift] == [
        ("args[0]", ["dtype", "rank"]),
        ("args[1]", ["dtype"]),
    ]
    assert drift[0]["variants"] == [
        {"kind": "tensor", "dtype": "float32", "rank": 2, "calls": 3, "groups": ["g0"]},
        {"kind": "tensor", "dtype": "float16", "rank": 2, "calls": 1, "groups": ["g1"]},
        {"kind": "tensor", "dtype": "float32", "rank": 3, "calls": 1, "groups": ["g2"]},
    ]


class _Picky(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 3:
            raise ValueError("no batch of 3")
        return x


def test_summary_counts_calls_whose_forward_raised(tmp_path: Path) -> None:
    model = _Picky()
    with torch.no_grad(), capture.Recorder(model, tmp_path, name="picky"):
        for batch in (2, 3, 4):
            try:
                model(torch.ones(batch, 5))
            except ValueError:
                pass
    with capture.open_store(tmp_path) as store:
        data = summary(store).to_json()
    model_entry = _only(data["models"])
    assert (data["calls"], data["errors"]) == (3, 1)
    assert [(g["name"], g["calls"], g["errors"]) for g in model_entry["groups"]] == [("g0", 3, 1)]


# -- the relation search on synthetic signatures ---------------------------------------------
def _axes(*names: str) -> list[Axis]:
    return [Axis(name, 1, f"kwargs['{name}']") for name in names]


def _solve(columns: dict[str, list[int]], **options: Any) -> Symbols:
    matrix = np.array(list(columns.values()), dtype=np.int64).T
    return find_symbols(matrix, _axes(*columns), **options)


@pytest.mark.parametrize(
    ("columns", "relations"),
    [
        pytest.param({"a": [2, 3, 4], "b": [6, 7, 8]}, [], id="3-lockstep-points-no-offset"),
        pytest.param(
            {"a": [2, 3, 4, 5], "b": [6, 7, 8, 9]}, ["b_1 = a_1 + 4"], id="4-points-offset"
        ),
        pytest.param({"a": [2, 3, 4, 5], "b": [3, 4, 5, 5]}, [], id="offset-fails-on-one-point"),
        pytest.param(
            {"p": [1, 5, 2], "s": [1, 1, 3], "m": [2, 6, 5]}, ["m_1 = p_1 + s_1"], id="sum-3-points"
        ),
        pytest.param(
            {"p": [1, 2, 3], "s": [2, 4, 6], "m": [3, 6, 9]}, [], id="sum-collinear-points"
        ),
        pytest.param(
            {"p": [1, 5, 2], "s": [1, 1, 3], "m": [3, 7, 6]}, [], id="sum-offset-3-points"
        ),
        pytest.param(
            {"p": [1, 5, 2, 4], "s": [1, 1, 3, 2], "m": [3, 7, 6, 7]},
            ["m_1 = p_1 + s_1 + 1"],
            id="sum-offset-4-points",
        ),
        pytest.param(
            {"p": [1, 5, 2, 4], "s": [1, 1, 3, 2], "m": [2, 6, 5, 6], "n": [4, 8, 7, 8]},
            ["m_1 = p_1 + s_1", "n_1 = p_1 + s_1 + 2"],
            id="offset-of-a-sum-over-free-symbols",
        ),
        pytest.param(
            {"p": [1, 5, 2, 4], "s": [1, 1, 3, 2], "q": [2, 6, 3, 5], "m": [3, 7, 6, 7]},
            ["q_1 = p_1 + 1", "m_1 = p_1 + s_1 + 1"],
            id="sum-of-an-offset-class",
        ),
    ],
)
def test_find_symbols_relations(columns: dict[str, list[int]], relations: list[str]) -> None:
    assert [str(r) for r in _solve(columns).relations] == relations


def test_find_symbols_equal_columns_share_a_symbol_from_two_signatures() -> None:
    found = _solve({"a": [3, 5], "b": [3, 5], "c": [1, 1]})
    assert (found.symbol, found.expr, found.dynamic) == (
        ["a_1", "a_1", None],
        [None, None, None],
        [True, True, False],
    )


def test_find_symbols_forced_constant_columns_share_batch_and_stay_out_of_relations() -> None:
    matrix = np.array([[1, 1, 4, 5], [1, 1, 5, 6], [1, 1, 6, 7], [1, 1, 7, 8]], dtype=np.int64)
    axes = [Axis("x", 0), Axis("y", 0), Axis("past", 2), Axis("mask", 1)]
    found = find_symbols(matrix, axes, forced=[True, True, False, False])
    assert found.symbol == ["batch", "batch", "past_2", "mask_1"]
    assert [str(r) for r in found.relations] == ["mask_1 = past_2 + 1"]


def test_find_symbols_mask_is_past_plus_input_when_the_input_length_varies() -> None:
    # Chunked prefill / speculative decoding: the input length is dynamic too, so the relation
    # is a sum of two symbols; position_ids shares the input length.
    rows = [
        (b, s, p, s, p + s) for b, s, p in [(2, 1, 7), (2, 3, 8), (3, 2, 4), (1, 4, 9), (2, 1, 5)]
    ]
    axes = [
        Axis("input_ids", 0),
        Axis("input_ids", 1),
        Axis("past_key_values", 2),
        Axis("position_ids", 1),
        Axis("attention_mask", 1),
    ]
    found = find_symbols(np.array(rows, dtype=np.int64), axes)
    assert found.symbol == [
        "input_ids_0",
        "input_ids_1",
        "past_key_values_2",
        "input_ids_1",
        "attention_mask_1",
    ]
    assert [str(r) for r in found.relations] == [
        "attention_mask_1 = input_ids_1 + past_key_values_2"
    ]


def test_find_symbols_rejects_a_matrix_that_does_not_match_its_axes() -> None:
    with pytest.raises(ValueError, match="does not match"):
        find_symbols(np.zeros((2, 3), dtype=np.int64), _axes("a", "b"))


def _holds(found: Symbols, matrix: np.ndarray[Any, Any]) -> None:
    """Every reported relation and shared symbol is true on every row of `matrix`."""
    by_symbol: dict[str, np.ndarray[Any, Any]] = {}
    for j, symbol in enumerate(found.symbol):
        if symbol is None:
            continue
        column = matrix[:, j]
        assert np.array_equal(by_symbol.setdefault(symbol, column), column)
    for rel in found.relations:
        total = sum((by_symbol[t] for t in rel.terms), np.zeros(len(matrix), np.int64))
        assert np.array_equal(by_symbol[rel.symbol], total + rel.offset), str(rel)
        assert not any(t in {r.symbol for r in found.relations} for t in rel.terms)


sizes = st.lists(st.integers(1, 64), min_size=6, max_size=12)


@settings(max_examples=60, deadline=None)
@given(a=sizes, b=sizes, k1=st.integers(-3, 3), k2=st.integers(1, 5))
def test_find_symbols_finds_planted_relations(a: list[int], b: list[int], k1: int, k2: int) -> None:
    n = min(len(a), len(b))
    va, vb = np.array(a[:n]), np.array(b[:n])
    assume(len(np.unique(np.stack([va, vb], 1), axis=0)) >= 5)
    # Planted: c = a + b + k1, d = a + k2, e = b. Keep a and b unrelated (the planted ones only).
    assume(len(set((vb - va).tolist())) > 1 and len(set(va.tolist())) >= 5)
    deltas = np.stack([va - va[0], vb - vb[0]], 1)
    assume(np.linalg.matrix_rank(deltas) == 2)
    matrix = np.stack([va, vb, va + vb + k1 + 1, va + k2, vb], 1).astype(np.int64)
    found = find_symbols(matrix, _axes("a", "b", "c", "d", "e"))
    _holds(found, matrix)
    free = {s for s, e in zip(found.symbol, found.expr, strict=True) if s and e is None}
    assert free == {"a_1", "b_1"}
    assert found.symbol[4] == found.symbol[1]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda cols: st.lists(
            st.lists(st.integers(0, 6), min_size=cols, max_size=cols), min_size=1, max_size=10
        )
    )
)
def test_find_symbols_reports_only_what_holds_on_every_signature(rows: list[list[int]]) -> None:
    matrix = np.array(rows, dtype=np.int64)
    found = find_symbols(matrix, _axes(*(f"x{i}" for i in range(matrix.shape[1]))))
    _holds(found, matrix)


@given(st.text(min_size=0, max_size=12), st.integers(0, 4))
def test_symbols_are_python_identifiers(argument: str, axis: int) -> None:
    found = find_symbols(np.array([[1], [2]], dtype=np.int64), [Axis(argument, axis, "args[0]")])
    symbol = found.symbol[0]
    assert symbol is not None and symbol.isidentifier() and not keyword.iskeyword(symbol)
