"""The ONNX runner's output builder (capture/pytree/unflatten.py) builds what torch's
``tree_unflatten`` builds, takes the direct road for a transformers output and a cache of
key/value layers only where the first call proves it gives the same object (and, for a cache,
where its constructors leave nothing a call could share), and keeps torch's unflatten everywhere
else."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.utils._pytree as pytree
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils.generic import ModelOutput

from capture.pytree.nodes import make_dynamic_cache
from capture.pytree.unflatten import _same, builder
from replay.runtime.allowed import register_types


def _decode_output() -> Any:
    # as the runner's load does: the cache class registered by capture, for the outputs' types
    register_types({"transformers.cache_utils.DynamicCache"})
    cache = make_dynamic_cache([(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))] * 2)
    return CausalLMOutputWithPast(logits=torch.randn(1, 1, 8), **{_CACHE: cache})


# the output's cache field, as the installed transformers spells it (``cache`` from 5.24)
_CACHE = next(
    f.name
    for f in dataclasses.fields(CausalLMOutputWithPast)
    if f.name in ("cache", "past_key_values")
)


def test_a_decode_step_s_output_is_built_as_torch_builds_it_without_the_constructor(
    monkeypatch: Any,
) -> None:
    leaves, spec = pytree.tree_flatten(_decode_output())
    build, first = builder(spec, leaves)
    assert _same(first, pytree.tree_unflatten(leaves, spec))
    # later calls: no dataclass constructor, the same object as torch's unflatten gives
    called = []
    monkeypatch.setattr(CausalLMOutputWithPast, "__post_init__", lambda self: called.append(1))
    fresh = [torch.randn_like(t) for t in leaves]
    got = build(fresh)
    assert not called
    monkeypatch.undo()
    expected = pytree.tree_unflatten(fresh, spec)
    assert _same(got, expected)
    assert type(got) is CausalLMOutputWithPast and got.loss is None and "loss" not in got
    assert list(got) == ["logits", _CACHE] and got.logits is fresh[0]
    assert got[_CACHE].layers[1].keys is fresh[2]
    assert got.to_tuple()[0] is fresh[0]


@dataclasses.dataclass
class _Stamped(ModelOutput):
    """An output class whose construction leaves more than its fields behind."""

    logits: torch.Tensor | None = None
    extra: torch.Tensor | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.__dict__["stamp"] = "made by the constructor"


def test_an_output_class_the_direct_build_would_get_wrong_keeps_its_constructor() -> None:
    leaves, spec = pytree.tree_flatten(_Stamped(logits=torch.randn(2)))
    build, _ = builder(spec, leaves)
    got = build([torch.randn(2)])
    assert got.stamp == "made by the constructor"  # the proof failed: torch's unflatten


@dataclasses.dataclass
class _Pairs(ModelOutput):
    """An output whose first field, alone and not a tensor, is read as key/value pairs."""

    first: Any = None
    second: torch.Tensor | None = None


def test_an_output_without_a_tensor_field_is_left_to_its_constructor() -> None:
    out = _Pairs(first=[("second", torch.ones(1))])
    leaves, spec = pytree.tree_flatten(out)
    build, first = builder(spec, leaves)
    assert _same(first, pytree.tree_unflatten(leaves, spec))
    values = [torch.zeros(1) for _ in leaves]
    assert _same(build(values), pytree.tree_unflatten(values, spec))


def test_plain_containers_and_constants_are_built_as_torch_builds_them() -> None:
    tree = {"a": (torch.ones(1), None, 3), "b": [torch.zeros(2), {"c": torch.ones(3)}]}
    leaves, spec = pytree.tree_flatten(tree)
    build, _ = builder(spec, leaves)
    fresh = [torch.randn(1) if isinstance(v, torch.Tensor) else v for v in leaves]
    assert _same(build(fresh), pytree.tree_unflatten(fresh, spec))


def test_same_tells_a_different_arrangement_apart() -> None:
    a, b = torch.ones(1), torch.ones(1)
    assert _same({"x": a}, {"x": a})
    assert not _same({"x": a}, {"x": b})  # equal values, other objects
    assert not _same({"x": a, "y": None}, {"y": None, "x": a})  # order
    assert not _same((a,), [a])  # type


def _cache_leaves() -> tuple[list[Any], Any]:
    leaves, spec = pytree.tree_flatten(_decode_output())
    return leaves, spec


def test_a_decode_step_s_cache_is_built_without_the_layers_constructors(monkeypatch: Any) -> None:
    import transformers.cache_utils as cu

    leaves, spec = _cache_leaves()
    build, _ = builder(spec, leaves)
    called = []
    monkeypatch.setattr(cu.DynamicLayer, "__init__", lambda self, **k: called.append("layer"))
    monkeypatch.setattr(cu.Cache, "__init__", lambda self, **k: called.append("cache"))
    fresh = [torch.randn_like(t) for t in leaves]
    got = build(fresh)
    assert not called  # built from the constructors' attributes, read once
    monkeypatch.undo()
    assert _same(got, pytree.tree_unflatten(fresh, spec))
    cache = got[_CACHE]
    assert [layer.keys for layer in cache.layers] == [fresh[1], fresh[2]]
    assert [layer.values for layer in cache.layers] == [fresh[3], fresh[4]]
    assert cache.layers[0] is not build(fresh)[_CACHE].layers[0]  # new objects every call
    # a working cache: a decode step grows it as it grows one the model made
    cache.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), 0)
    assert cache.get_seq_length() == 4 and cache.layers[1].keys.shape[-2] == 3


def test_a_layer_whose_constructor_leaves_mutable_state_keeps_its_constructor(
    monkeypatch: Any,
) -> None:
    import transformers.cache_utils as cu

    from capture.pytree.direct import layered_cache

    real: Any = cu.DynamicLayer.__init__

    def with_a_list(self: Any, **kwargs: Any) -> None:
        real(self, **kwargs)
        self.history = []  # shared between calls, were it copied

    monkeypatch.setattr(cu.DynamicLayer, "__init__", with_a_list)
    leaves, spec = _cache_leaves()
    cache_spec = spec.child(1)
    assert layered_cache(cache_spec.type, cache_spec.context, 4) is None
    build, _ = builder(spec, leaves)
    first, second = build(leaves), build(leaves)
    assert _same(first, pytree.tree_unflatten(leaves, spec))
    assert first[_CACHE].layers[0].history is not second[_CACHE].layers[0].history


def test_a_sliding_window_cache_is_left_to_its_registered_unflatten() -> None:
    import transformers.cache_utils as cu

    from capture.pytree.direct import layered_cache

    register_types({"transformers.cache_utils.DynamicCache"})
    cache = object.__new__(cu.DynamicCache)  # as the registered unflatten makes one
    cu.Cache.__init__(cache, layers=[cu.DynamicSlidingWindowLayer(sliding_window=4)])
    cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), 0)
    leaves, spec = pytree.tree_flatten(cache)
    assert layered_cache(spec.type, spec.context, len(leaves)) is None
    build, _ = builder(spec, leaves)
    fresh = [torch.randn_like(t) for t in leaves]
    got, expected = build(fresh).layers[0], pytree.tree_unflatten(fresh, spec).layers[0]
    # its constructor makes a tensor of its own: each build has a new one, as torch's has
    assert got._sliding_window_tensor is not expected._sliding_window_tensor
    assert type(got) is type(expected) and list(vars(got)) == list(vars(expected))
    assert got.keys is fresh[0] and got.values is fresh[1]
    assert got.cumulative_length == expected.cumulative_length
