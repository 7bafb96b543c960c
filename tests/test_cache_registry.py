"""The cache registry: one table drives flattening, string_type and analysis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree

import capture
from capture.analysis.groups import analyze
from capture.pytree import cachespec, nodes
from capture.store_api import open_store

cache_utils = pytest.importorskip("transformers.cache_utils")


class ShadowCache(cache_utils.DynamicCache):  # type: ignore[misc]
    """A user's cache class: a DynamicCache subclass transformers does not know."""


class Memory:
    """A user's state object with one tensor attribute."""

    def __init__(self, state: torch.Tensor) -> None:
        self.state = state


class WithMemory(torch.nn.Module):
    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        return x * 2 if memory is None else x + memory.sum()


@pytest.fixture
def registered() -> Iterator[list[str]]:
    """Names registered by a test, removed afterwards (the registry is process-wide)."""
    names: list[str] = []
    yield names
    for name in names:
        cachespec.unregister_cache(name)


def test_register_cache_rejects_a_duplicate_naming_the_class(registered: list[str]) -> None:
    with pytest.raises(
        capture.CaptureError, match="cache class DynamicCache is already registered"
    ):
        capture.register_cache("DynamicCache")


def test_register_cache_rejects_an_unknown_flattening(registered: list[str]) -> None:
    with pytest.raises(capture.CaptureError, match="flatten='tree' is not one of"):
        capture.register_cache("TreeCache", flatten="tree")


def test_a_registered_class_is_printed_by_string_type(registered: list[str]) -> None:
    capture.register_cache(Memory, fields=("state",))
    registered.append("Memory")
    text = capture.string_type(Memory(torch.zeros(2, 3)), with_shape=True)
    assert text == "Memory(state=T1s2x3)"


def test_a_registered_layered_cache_is_flattened_like_dynamic_cache(
    registered: list[str],
) -> None:
    capture.register_cache(ShadowCache, flatten="layers", fields=cachespec.KEY_VALUE)
    registered.append("ShadowCache")
    cache = ShadowCache()
    cache.layers = nodes.make_dynamic_cache(
        [(torch.zeros(1, 2, 3, 4), torch.ones(1, 2, 3, 4))]
    ).layers
    with capture.register_flattening_functions():
        leaves, spec = pytree.tree_flatten(cache)
        rebuilt = pytree.tree_unflatten(leaves, spec)
    assert (len(leaves), type(rebuilt).__name__) == (2, "ShadowCache")


def test_the_registry_supplies_the_historical_tables() -> None:
    # SUPPORTED_* and UNSUPPORTED are views of the one table, not separate lists.
    # static, linear-attention and hybrid layers are supported.
    assert (nodes.SUPPORTED_CACHES, nodes.SUPPORTED_LAYERS, len(nodes.UNSUPPORTED)) == (
        ("DynamicCache", "StaticCache", "EncoderDecoderCache"),
        (
            "DynamicLayer",
            "DynamicSlidingWindowLayer",
            "StaticLayer",
            "LinearAttentionLayer",
            "LinearAttentionAndFullAttentionLayer",
            "LinearAttentionAndSlidingWindowAttentionLayer",
            "LinearAttentionAndStaticFullAttentionLayer",
            "DummyLayer",
        ),
        13,
    )


def _record(root: Path) -> None:
    model = WithMemory()
    with capture.Recorder(model, root, name="m", flush_seconds=3600), torch.no_grad():
        model(torch.zeros(2, 3))
        model(torch.zeros(2, 3), memory=torch.zeros(2, 4))
        model(torch.zeros(3, 3), memory=torch.zeros(3, 5))


def test_a_registered_argument_name_makes_decode_and_prefill_groups(
    tmp_path: Path, registered: list[str]
) -> None:
    _record(tmp_path)
    with open_store(tmp_path) as store:
        before = sorted(g.name for g in analyze(store, "m"))
        capture.register_cache("MemoryState", module=__name__, arguments=("memory",))
        registered.append("MemoryState")
        after = sorted(g.name for g in analyze(store, "m"))
    # the analysis asks the registry which arguments carry a cache.
    assert (before, after) == (["g0", "g1"], ["decode", "prefill"])


def test_error_classes_are_exported_from_capture() -> None:
    from capture import errors

    assert all(getattr(capture, name) is getattr(errors, name) for name in errors.__all__)
    assert set(errors.__all__) <= set(capture.__all__)


def _refused_objects() -> dict[str, object]:
    """An instance of each class of transformers.cache_utils the registry refuses, when one
    can be built without a model (the quantized cache and the abstract quantized layers need
    a backend: left out)."""
    made: dict[str, object] = {}
    builders = {
        "StaticSlidingWindowLayer": lambda c: c(max_cache_len=8, sliding_window=4),
        "LinearAttentionAndStaticSlidingWindowAttentionLayer": lambda c: c(
            max_cache_len=8, sliding_window=4
        ),
        "DynamicIndexedLayer": lambda c: c(),
        "Fp8QuantizedLayer": lambda c: c(),
        "StaticIndexedLayer": lambda c: c(max_cache_len=8),
        "MtpCache": lambda c: c(),
        "DFlashCache": lambda c: c(),
    }
    for name, build in builders.items():
        cls = getattr(cache_utils, name, None)
        if cls is not None:
            made[name] = build(cls)
    return made


class TakesACache(torch.nn.Module):
    def forward(self, x: torch.Tensor, past_key_values: object = None) -> torch.Tensor:
        return x * 2


@pytest.mark.parametrize("name", sorted(_refused_objects()))
def test_a_refused_class_is_recorded_and_reported(name: str, tmp_path: Path) -> None:
    obj = _refused_objects()[name]
    if name.endswith("Layer"):
        cache = cache_utils.DynamicCache()
        cache.layers = [obj]
        obj = cache
    model = TakesACache()
    with capture.Recorder(model, tmp_path, name="m") as rec:
        model(torch.ones(2, 3), past_key_values=obj)
    (group,) = open_store(tmp_path).summary().models[0].groups
    # "refused" means recorded and reported with the reason, never unrecorded.
    assert rec.stats()["recorded"] == 1
    assert group.blocked is not None
    assert name in group.blocked and cachespec.UNSUPPORTED[name] in group.blocked
