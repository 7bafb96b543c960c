"""Cache layers flattened by what they hold: linear-attention, state-space, hybrid,
static and dummy layers round-trip every piece of state that changes a forward's result.

The eager model is the judge where a tiny model exists (Mamba, Bamba): it is fed the original
cache and the round-tripped one. The other layer classes are built, updated as transformers
updates them, round-tripped, and compared attribute by attribute.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

import capture
from capture.pytree import cachespec, nodes
from capture.store_api import open_store
from fixtures.families import tiny_bamba, tiny_mamba
from fixtures.names import cache_argument

cu = pytest.importorskip("transformers.cache_utils")


def _round_trip(value: Any) -> Any:
    with nodes.register_flattening_functions():
        leaves, spec = pytree.tree_flatten(value)
        spec = pytree.treespec_loads(pytree.treespec_dumps(spec))
        return pytree.tree_unflatten(
            [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec
        )


def _paths(value: Any) -> list[str]:
    with nodes.register_flattening_functions():
        return [pytree.keystr(kp) for kp, _ in pytree.tree_flatten_with_path(value)[0]]


def _decode_call(model: Any, argument: str, steps: int) -> dict[str, Any]:
    """Prefill (batch 2, 7 tokens) and `steps` decode steps; the next decode call's kwargs."""
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        cache = getattr(out, argument)
        for _ in range(steps):
            ids = out.logits[:, -1:].argmax(-1)
            out = model(input_ids=ids, use_cache=True, **{argument: cache})
    return {"input_ids": out.logits[:, -1:].argmax(-1), argument: cache, "use_cache": True}


def _logits(model: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return model(**kwargs).logits


@pytest.mark.parametrize("build", [tiny_mamba, tiny_bamba])
def test_state_space_cache_round_trips_exactly(build: Any) -> None:
    model = build()
    call = _decode_call(model, cache_argument(type(model).__name__), steps=2)
    expected = _logits(model, copy.deepcopy(call))
    # conv and recurrent states (and Bamba's keys) travel with the cache.
    assert torch.equal(expected, _logits(model, _round_trip(copy.deepcopy(call))))


def test_hybrid_cache_paths_name_each_state() -> None:
    argument = cache_argument("BambaForCausalLM")
    call = _decode_call(tiny_bamba(), argument, steps=1)
    assert _paths(call[argument]) == [
        ".key_cache[1]",
        ".value_cache[1]",
        ".conv_states[0]",
        ".recurrent_states[0]",
    ]


def test_string_type_shows_the_state_space_states() -> None:
    argument = cache_argument("BambaForCausalLM")
    cache = _decode_call(tiny_bamba(), argument, steps=1)[argument]
    assert capture.string_type(cache, with_shape=True) == (
        "DynamicCache(key_cache=#2[None,T1s2x2x8x16], value_cache=#2[None,T1s2x2x8x16], "
        "conv_states=#1[T1s2x144x4], recurrent_states=#1[T1s2x8x16x8])"
    )


def test_prefill_and_decode_states_are_distinct_structures() -> None:
    model = tiny_mamba()
    ids = torch.randint(3, 128, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = getattr(model(input_ids=ids, use_cache=True), cache_argument("MambaForCausalLM"))
    with nodes.register_flattening_functions():
        decode = pytree.tree_flatten(cache)[1]
        cache.layers[0].has_previous_state[0] = False
        cache.layers[1].has_previous_state[0] = False
        first = pytree.tree_flatten(cache)[1]
    # has_previous_state picks Mamba's prefill or decode path: it is part of the structure.
    assert decode != first


def _filled(layer: Any) -> Any:
    """A layer holding state, updated the way transformers updates it."""
    g = torch.Generator().manual_seed(1)
    if isinstance(layer, cu.CacheLayerMixin):  # keys and values (hybrids included)
        layer.update(torch.randn(2, 2, 3, 4, generator=g), torch.randn(2, 2, 3, 4, generator=g))
    if isinstance(layer, cu.LinearAttentionLayer):
        layer.update_conv_state(torch.randn(2, 8, 3, generator=g), conv_kernel_size=4)
        layer.update_recurrent_state(torch.randn(2, 4, 8, generator=g))
    return layer


_LAYERS = {
    "DynamicLayer": lambda: cu.DynamicLayer(),
    "DynamicSlidingWindowLayer": lambda: cu.DynamicSlidingWindowLayer(sliding_window=2),
    "StaticLayer": lambda: cu.StaticLayer(max_cache_len=6),
    "LinearAttentionLayer": lambda: cu.LinearAttentionLayer(),
    "LinearAttentionAndFullAttentionLayer": lambda: cu.LinearAttentionAndFullAttentionLayer(),
    "LinearAttentionAndSlidingWindowAttentionLayer": lambda: (
        cu.LinearAttentionAndSlidingWindowAttentionLayer(sliding_window=2)
    ),
    "LinearAttentionAndStaticFullAttentionLayer": lambda: (
        cu.LinearAttentionAndStaticFullAttentionLayer(max_cache_len=6)
    ),
    "DummyLayer": lambda: cu.DummyLayer(),
}
_STATE = (
    "keys",
    "values",
    "cumulative_length",
    "is_initialized",
    "sliding_window",
    "max_cache_len",
    "conv_states",
    "recurrent_states",
    "has_previous_state",
    "is_conv_states_initialized",
    "is_recurrent_states_initialized",
    "conv_kernel_size",
    "record_past",
)


def _state(layer: Any) -> dict[str, Any]:
    out = {}
    for name in _STATE:
        value = getattr(layer, name, "<absent>")
        if isinstance(value, dict):
            value = {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in value.items()}
        elif isinstance(value, torch.Tensor):
            value = value.tolist()
        out[name] = value
    return out


def test_every_supported_layer_class_is_exercised() -> None:
    # The round trip below covers each layer class the registry supports.
    assert set(_LAYERS) == set(cachespec.SUPPORTED_LAYERS)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(_LAYERS))
def test_every_supported_layer_round_trips_its_state(name: str) -> None:
    layer = _filled(_LAYERS[name]())
    cache = cu.DynamicCache()
    cache.layers = [layer]
    rebuilt = _round_trip(cache).layers[0]
    # every piece of state that changes a forward's result survives the round trip.
    assert (type(rebuilt).__name__, _state(rebuilt)) == (name, _state(layer))


class MysteryLayer(cu.DynamicLayer):  # type: ignore[misc]
    """A layer class the registry does not know (a model's own)."""


def test_an_unknown_layer_is_one_opaque_leaf_naming_its_class() -> None:
    cache = cu.DynamicCache()
    cache.layers = [_filled(cu.DynamicLayer()), _filled(MysteryLayer())]
    with nodes.register_flattening_functions():
        flat = pytree.tree_flatten_with_path(cache)[0]
    found = [(pytree.keystr(kp), type(v).__name__) for kp, v in flat]
    # the part capture cannot read is an opaque leaf naming its class.
    assert found == [
        (".key_cache[0]", "Tensor"),
        (".value_cache[0]", "Tensor"),
        (".layers[1]", "MysteryLayer"),
    ]


class _TakesCache(torch.nn.Module):
    def forward(self, x: torch.Tensor, past_key_values: Any = None) -> torch.Tensor:
        return x * 2


def test_a_cache_with_an_unknown_layer_is_recorded_and_reported(tmp_path: Path) -> None:
    model = _TakesCache()
    with capture.Recorder(model, tmp_path, name="m") as rec:
        for batch in (2, 3):
            cache = cu.DynamicCache()
            cache.layers = [_filled(MysteryLayer())]
            model(torch.ones(batch, 3), past_key_values=cache)
    groups = open_store(tmp_path).summary().models[0].groups
    # every call recorded, and the summary names the class that blocks export.
    assert rec.stats()["recorded"] == 2
    assert [g.calls for g in groups] == [2]
    blocked = str(groups[0].blocked)
    assert "past_key_values'].layers[0] is a test_cache_layers.MysteryLayer" in blocked


def test_static_cache_fill_level_is_recorded_once_per_cache(tmp_path: Path) -> None:
    from fixtures.generate_traffic import record_traffic, tiny_causal
    from fixtures.names import LLAMA_CACHE

    model = tiny_causal("llama")
    record_traffic(model, tmp_path, [(2, 6, True)], max_new_tokens=3, cache_implementation="static")
    with open_store(tmp_path) as store:
        rows = store.query(
            """
            SELECT c.int_min[s.range_index + 1] AS lo, c.int_max[s.range_index + 1] AS hi,
                   s.path
            FROM calls c JOIN structures s ON s.structure_id = c.in_structure
            WHERE s.path LIKE '%cumulative_length%' AND s.range_index IS NOT NULL
            ORDER BY c.ts
            """
        ).to_pylist()
    # the fill level of each call, read where it lives; layer 0's only (all alike).
    assert [(r["lo"], r["hi"]) for r in rows] == [(0, 0), (6, 6), (7, 7)]
    assert {r["path"] for r in rows} == {f"kwargs['{LLAMA_CACHE}'].cumulative_length[0]"}


def test_rebuilt_static_layers_share_the_recorded_fill_level(tmp_path: Path) -> None:
    from capture.analysis.groups import analyze
    from fixtures.generate_traffic import record_traffic, tiny_causal
    from fixtures.names import LLAMA_CACHE
    from replay.inputs import rebuild as rb
    from replay.inputs import select

    model = tiny_causal("llama")
    record_traffic(model, tmp_path, [(2, 6, True)], max_new_tokens=3, cache_implementation="static")
    with open_store(tmp_path) as store:
        decode = [g for g in analyze(store, "LlamaForCausalLM") if g.name == "decode"][0]
        ranges = select.value_ranges(store, decode)
    sizes, found = min(ranges.items())
    cache = rb.rebuild(decode.structure, sizes, found)[1][LLAMA_CACHE]
    # Only layer 0's level is recorded; every layer is rebuilt with it (replay.inputs.patterns).
    assert [int(layer.cumulative_length) for layer in cache.layers] == [6, 6]


@pytest.mark.gpu
def test_static_cache_fill_level_on_cuda_is_recorded(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from fixtures.generate_traffic import record_traffic, tiny_causal

    model = tiny_causal("llama").cuda()
    # value_ranges="cpu" (the default): the fill level is still read, by the writer thread.
    record_traffic(model, tmp_path, [(2, 6, True)], max_new_tokens=3, cache_implementation="static")
    with open_store(tmp_path) as store:
        rows = store.query(
            """
            SELECT c.int_max[s.range_index + 1] AS level
            FROM calls c JOIN structures s ON s.structure_id = c.in_structure
            WHERE s.path LIKE '%cumulative_length[0]' ORDER BY c.ts
            """
        ).to_pylist()
    assert [r["level"] for r in rows] == [0, 6, 7]
