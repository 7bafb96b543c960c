"""Flattening: key paths, kinds, treespec JSON round trips, and walk() == torch pytree order."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import given, settings
from hypothesis import strategies as st

from capture import schema
from capture.pytree.nodes import (
    make_dynamic_cache,
    make_encoder_decoder_cache,
    register_flattening_functions,
    registered_classes,
)
from capture.record.flatten import describe, tensor_key, walk
from capture.signature import Signature


def _cache(layers: int, seq: int) -> Any:
    return make_dynamic_cache(
        [(torch.randn(1, 2, seq, 4), torch.randn(1, 2, seq, 4)) for _ in range(layers)]
    )


def _describe(args: tuple[Any, ...], kwargs: dict[str, Any], fn: Any = None) -> Any:
    tensors: list[torch.Tensor] = []
    key: list[Any] = []
    walk((args, kwargs), tensors, key)
    signature = Signature.of(fn) if fn is not None else Signature()
    return describe((args, kwargs), tensors, signature=signature), tensors


def test_paths_kinds_and_missing() -> None:
    def forward(x, mask=None, past_key_values=None, *, flag=True, n=3):  # type: ignore[no-untyped-def]
        return x

    with register_flattening_functions():
        st_, _ = _describe((torch.ones(2, 3),), {"past_key_values": _cache(2, 5), "n": 4}, forward)
    rows = [
        (leaf.path, leaf.argument, leaf.kind, leaf.rank, leaf.dim_offset) for leaf in st_.leaves
    ]
    assert rows == [
        ("args[0]", "x", "tensor", 2, 0),
        ("kwargs['past_key_values'].key_cache[0]", "past_key_values", "tensor", 4, 2),
        ("kwargs['past_key_values'].key_cache[1]", "past_key_values", "tensor", 4, 6),
        ("kwargs['past_key_values'].value_cache[0]", "past_key_values", "tensor", 4, 10),
        ("kwargs['past_key_values'].value_cache[1]", "past_key_values", "tensor", 4, 14),
        ("kwargs['n']", "n", "int", None, None),
        ("kwargs['mask']", "mask", "missing", None, None),
        ("kwargs['flag']", "flag", "missing", None, None),
    ]
    assert st_.leaves[5].value == "4"
    assert not st_.slow


def test_treespec_round_trip_rebuilds_a_dynamic_cache() -> None:
    with register_flattening_functions():
        kwargs = {"input_ids": torch.ones(1, 3, dtype=torch.int64), "past_key_values": _cache(3, 7)}
        st_, tensors = _describe((), kwargs)
        spec = pytree.treespec_loads(st_.treespec)
        assert json.loads(st_.treespec)[0] == 1  # torch's treespec protocol version
        args, rebuilt = pytree.tree_unflatten(tensors, spec)
    assert args == ()
    cache = rebuilt["past_key_values"]
    assert type(cache).__name__ == "DynamicCache" and len(cache.layers) == 3
    assert cache.layers[2].values is tensors[-1]
    assert cache.get_seq_length() == 7


def test_encoder_decoder_cache_paths() -> None:
    with register_flattening_functions():
        cache = make_encoder_decoder_cache(_cache(1, 4), _cache(1, 6))
        st_, tensors = _describe((), {"past_key_values": cache})
        rebuilt = pytree.tree_unflatten(tensors, pytree.treespec_loads(st_.treespec))[1]
    assert [leaf.path for leaf in st_.leaves] == [
        "kwargs['past_key_values'].self_attention_cache.key_cache[0]",
        "kwargs['past_key_values'].self_attention_cache.value_cache[0]",
        "kwargs['past_key_values'].cross_attention_cache.key_cache[0]",
        "kwargs['past_key_values'].cross_attention_cache.value_cache[0]",
    ]
    assert rebuilt["past_key_values"].cross_attention_cache.get_seq_length() == 6


def test_registration_is_refcounted_and_undone() -> None:
    from transformers.cache_utils import DynamicCache

    assert DynamicCache not in pytree.SUPPORTED_NODES
    with register_flattening_functions():
        with register_flattening_functions():
            assert DynamicCache in pytree.SUPPORTED_NODES
        assert DynamicCache in pytree.SUPPORTED_NODES
    assert DynamicCache not in pytree.SUPPORTED_NODES
    assert registered_classes() == []


def test_key_changes_with_dtype_rank_and_scalars_but_not_sizes() -> None:
    def key_of(*args: Any, **kwargs: Any) -> Any:
        tensors: list[torch.Tensor] = []
        key: list[Any] = []
        walk((args, kwargs), tensors, key)
        return tensor_key(key, tensors)[0]

    base = key_of(torch.ones(2, 3), n=1)
    assert key_of(torch.ones(5, 7), n=1) == base
    assert key_of(torch.ones(2, 3, dtype=torch.float16), n=1) != base
    assert key_of(torch.ones(2, 3, 1), n=1) != base
    assert key_of(torch.ones(2, 3), n=2) != base
    assert key_of(torch.ones(2, 3), n=True) != base  # True == 1 but is another constant


_leaf = st.one_of(
    st.builds(lambda r, s: torch.zeros(tuple([s] * r)), st.integers(0, 3), st.integers(0, 3)),
    st.builds(lambda s: torch.zeros(s, dtype=torch.int64), st.integers(1, 4)),
    st.none(),
    st.integers(-3, 3),
    st.booleans(),
    st.text(max_size=3),
)
_tree = st.recursive(
    _leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.text("abc", min_size=1, max_size=2), children, max_size=3),
    ),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(
    args=st.lists(_tree, max_size=3).map(tuple),
    kwargs=st.dictionaries(st.sampled_from("xyz"), _tree, max_size=3),
)
def test_walk_matches_pytree_and_round_trips(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    st_, tensors = _describe(args, kwargs)
    assert not st_.slow  # walk() found torch's tensor leaves, in torch's order
    leaves, spec = pytree.tree_flatten((args, kwargs))
    assert len(st_.leaves) == len(leaves)
    # encode -> JSON -> decode -> rebuild preserves the spec, shapes and dtypes
    spec2 = pytree.treespec_loads(st_.treespec)
    assert spec2 == spec
    rebuilt = [
        torch.empty(t.shape, dtype=t.dtype) if isinstance(t, torch.Tensor) else t for t in leaves
    ]
    again = pytree.tree_leaves(pytree.tree_unflatten(rebuilt, spec2))
    for a, b in zip(again, leaves, strict=True):
        if isinstance(b, torch.Tensor):
            assert a.shape == b.shape and a.dtype == b.dtype
        else:
            assert a == b


def test_schema_is_pinned() -> None:
    """Golden test: renaming a column or changing a type requires bumping SCHEMA_VERSION."""
    assert (schema.SCHEMA_VERSION, schema.STRUCTURE_ID_VERSION) == (3, 1)
    golden = {
        "structures": [
            ("structure_id", "string"),
            ("model", "string"),
            ("leaf", "int32"),
            ("path", "string"),
            ("argument", "string"),
            ("position", "int32"),
            ("kind", "string"),
            ("type", "string"),
            ("dtype", "string"),
            ("rank", "int32"),
            ("device", "string"),
            ("value", "string"),
            ("dim_offset", "int32"),
            ("range_index", "int32"),
            ("treespec", "string"),
            ("signature", "string"),
            ("n_args", "int32"),
            ("schema_version", "int32"),
        ],
        "calls": [
            ("call_id", "int64"),
            ("ts", "timestamp[us, tz=UTC]"),
            ("model", "string"),
            ("host", "string"),
            ("pid", "int32"),
            ("in_structure", "string"),
            ("out_structure", "string"),
            ("dims", "list<item: int64>"),
            ("out_dims", "list<item: int64>"),
            ("int_min", "list<item: int64>"),
            ("int_max", "list<item: int64>"),
            ("duration_ns", "int64"),
            ("error", "string"),
            ("state", "string"),
        ],
        "stats": [
            ("model", "string"),
            ("in_structure", "string"),
            ("out_structure", "string"),
            ("dims", "list<item: int64>"),
            ("out_dims", "list<item: int64>"),
            ("state", "string"),
            ("calls", "int64"),
            ("errors", "int64"),
            ("int_min", "list<item: int64>"),
            ("int_max", "list<item: int64>"),
            ("first_ts", "timestamp[us, tz=UTC]"),
            ("last_ts", "timestamp[us, tz=UTC]"),
            ("duration_ns_sum", "int64"),
            ("duration_ns_min", "int64"),
            ("duration_ns_max", "int64"),
        ],
    }
    actual = {name: [(f.name, str(f.type)) for f in s] for name, s in schema.SCHEMAS.items()}
    assert actual == golden
    assert all(isinstance(s, pa.Schema) for s in schema.SCHEMAS.values())


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool]
)
def test_dtype_names(dtype: torch.dtype) -> None:
    st_, _ = _describe((torch.zeros(2, dtype=dtype),), {})
    assert st_.leaves[0].dtype == str(dtype).removeprefix("torch.")
