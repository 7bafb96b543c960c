"""Cache state fidelity: every transformers cache/layer class round-trips or is declared.

A cache round-tripped through capture's flatten/unflatten must give the model the same result as
the original: the eager model is the judge, fed the original cache and the round-tripped one.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

from capture.pytree import nodes
from capture.pytree.recorded_structure import RecordedLeaf, RecordedStructure
from fixtures.generate_traffic import tiny_causal
from fixtures.models import prompts

transformers = pytest.importorskip("transformers")
cache_utils = pytest.importorskip("transformers.cache_utils")


def _cache_classes() -> list[str]:
    bases = tuple(
        getattr(cache_utils, n)
        for n in ("Cache", "CacheLayerMixin", "LinearAttentionCacheLayerMixin")
        if hasattr(cache_utils, n)
    )
    names = {
        obj.__name__
        for obj in vars(cache_utils).values()
        if inspect.isclass(obj) and issubclass(obj, bases) and obj not in bases
    }
    return sorted(names)


def test_every_cache_class_is_supported_or_declared_unsupported() -> None:
    known = set(nodes.SUPPORTED_LAYERS) | set(nodes.SUPPORTED_CACHES) | set(nodes.UNSUPPORTED)
    undeclared = [name for name in _cache_classes() if name not in known]
    # a class transformers ships must never be flattened silently without its state.
    assert undeclared == []


def test_supported_and_unsupported_do_not_overlap() -> None:
    supported = set(nodes.SUPPORTED_LAYERS) | set(nodes.SUPPORTED_CACHES)
    assert supported & set(nodes.UNSUPPORTED) == set()


def _decode_state(model: Any, steps: int, cache: Any = None, batch: int = 2, length: int = 10):
    """Prefill + `steps` greedy decode steps; returns the next call's (kwargs) with its cache."""
    inputs = prompts(batch, length)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        for _ in range(steps):
            ids = out.logits[:, -1:].argmax(-1)
            mask = torch.cat([mask, torch.ones_like(ids)], dim=-1)
            out = model(input_ids=ids, attention_mask=mask, past_key_values=out.past_key_values)
    ids = out.logits[:, -1:].argmax(-1)
    mask = torch.cat([mask, torch.ones_like(ids)], dim=-1)
    return {"input_ids": ids, "attention_mask": mask, "past_key_values": out.past_key_values}


def _round_trip(value: Any) -> Any:
    with nodes.register_flattening_functions():
        leaves, spec = pytree.tree_flatten(value)
        spec = pytree.treespec_loads(pytree.treespec_dumps(spec))
        return pytree.tree_unflatten(
            [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec
        )


def _logits(model: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return model(**kwargs).logits


@pytest.mark.parametrize("steps", [0, 2, 6])
def test_sliding_window_cache_round_trips_exactly(steps: int) -> None:
    # steps 0: the window is still filling; 2 and 6: prompts (10) already past the window (6).
    model = tiny_causal("mistral", sliding_window=6)
    call = _decode_state(model, steps)
    expected = _logits(model, copy.deepcopy(call))
    got = _logits(model, _round_trip(copy.deepcopy(call)))
    # the round trip keeps cumulative_length (without it the logits are off by ~0.2).
    assert torch.equal(expected, got)


def test_dynamic_cache_round_trips_exactly() -> None:
    model = tiny_causal("llama")
    call = _decode_state(model, 3)
    assert torch.equal(_logits(model, copy.deepcopy(call)), _logits(model, _round_trip(call)))


def test_full_window_state_is_part_of_the_structure() -> None:
    model = tiny_causal("mistral", sliding_window=6)
    filling = _decode_state(model, 0, length=4)["past_key_values"]
    full = _decode_state(model, 0, length=10)["past_key_values"]
    with nodes.register_flattening_functions():
        _, filling_spec = pytree.tree_flatten(filling)
        _, full_spec = pytree.tree_flatten(full)
    assert filling_spec.context[0][2] == "filling"
    assert full_spec.context[0][2] == "full"


def test_seen_tokens_leaf_carries_cumulative_length() -> None:
    model = tiny_causal("mistral", sliding_window=6)
    cache = _decode_state(model, 3, length=10)["past_key_values"]
    with nodes.register_flattening_functions():
        leaves = pytree.tree_leaves(cache)
    # Two layers of keys and values, then one shape-only leaf of 13 seen tokens (10 + 3).
    assert [tuple(t.shape)[-2:] for t in leaves[:4]] == [(5, 16)] * 4
    assert tuple(leaves[-1].shape) == (13,)


def test_static_sliding_window_layers_are_reported_unsupported() -> None:
    leaf = RecordedLeaf(0, "kwargs['past_key_values'].key_cache[0]", None, None, "tensor", "Tensor")
    model = tiny_causal("mistral", sliding_window=6)
    cache = cache_utils.StaticCache(config=model.config, max_cache_len=16)
    call = _decode_state(model, 1, cache=cache, length=4)
    with nodes.register_flattening_functions():
        spec = pytree.treespec_dumps(pytree.tree_flatten(((), call))[1])
    reason = nodes.unsupported_reason(RecordedStructure("s", "m", (leaf,), treespec=spec))
    # a fill level we do not record must make the group "not covered", with the reason.
    assert reason is not None and "StaticSlidingWindowLayer" in reason


@pytest.mark.parametrize("steps", [0, 3])
def test_static_cache_round_trips_exactly(steps: int) -> None:
    model = tiny_causal("llama")
    cache = cache_utils.StaticCache(config=model.config, max_cache_len=20)
    call = _decode_state(model, steps, cache=cache, length=6)
    expected = _logits(model, copy.deepcopy(call))
    # the fill level (cumulative_length) travels with the cache: same logits.
    assert torch.equal(expected, _logits(model, _round_trip(copy.deepcopy(call))))


class MtpCache:
    """Stands for transformers' MtpCache (declared unsupported): recorded as an opaque leaf."""


class _TakesACache(torch.nn.Module):
    def forward(self, x: torch.Tensor, past_key_values: Any = None) -> torch.Tensor:
        return x * 2


def test_a_cache_we_cannot_flatten_is_reported_not_covered(tmp_path: Any) -> None:
    import capture
    import replay

    model = _TakesACache()
    with capture.Recorder(model, tmp_path):
        for batch in (2, 3, 4):
            model(torch.ones(batch, 3), past_key_values=MtpCache())
    result = replay.export(model, tmp_path)
    rows = result.coverage.to_pylist()
    # the group is reported not covered with the reason, and export does not fail.
    assert not result.complete and len(rows) == 3
    assert all(
        not r["covered"]
        and r["error"].startswith("cache state not reproducible: ")
        and "MtpCache: its draft-model state is not flattened" in r["error"]
        for r in rows
    )
