"""Pytree registrations for transformers caches, and `register_flattening_functions()`.

transformers 5.x registers none of its cache classes with torch's pytree, so `tree_flatten`
sees a `DynamicCache` as one opaque leaf. We register the classes the installed version has:

- `DynamicCache` flattens to ``[key_0, ..., key_{L-1}, value_0, ..., value_{L-1}]`` (one flat
  list, so its `dynamic_shapes` is a flat list of ``2 * L`` per-tensor dicts), with readable key
  paths ``.key_cache[i]`` / ``.value_cache[i]``;
- then the state that changes a forward's result: for sliding windows one
  shape-only ``.seen_tokens`` leaf, as long as their ``cumulative_length`` (a dim: no structure
  per step, dynamic in torch.export); a window's full/filling state is in its layer's context;
- `StaticCache` the same way (its context keeps ``max_cache_len`` per layer);
- `EncoderDecoderCache` to ``[self_attention_cache, cross_attention_cache]``.

Which classes are registered, and how, is the cache registry's (`capture.pytree.cachespec`, where
`capture.register_cache` adds one); classes we cannot round-trip exactly have a reason there and
replay reports their groups not covered. A cache of plain `DynamicLayer` flattens exactly as before.

Contexts are tuples of plain values: they hash (the recorder's structure cache keys on them) and
dump to JSON. Unflattening creates no tensor of its own, which `torch.onnx.export` needs.

The registry is process-wide, so registration is reference counted (`acquire`/`release`); a
class someone else registered first is left alone.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import operator
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from capture import compat, untrusted
from capture.pytree import cachespec, outputs
from capture.pytree import layers as layer_state
from capture.pytree.cachespec import unsupported_reason

__all__ = [
    "CacheKey",
    "acquire",
    "release",
    "register_flattening_functions",
    "make_dynamic_cache",
    "make_encoder_decoder_cache",
    "registered_classes",
    "transformers_loaded",
    "registrable",
    "flatten_layers",
    "walk_layers",
    "unsupported_reason",
    "SEEN_TOKENS",
    "FILL_LEVEL",
]

logger = logging.getLogger(__name__)

# Why module state: it mirrors torch's process-wide pytree registry, which we must not
# register into twice nor deregister while another user (a second Recorder) still needs it.
_LOCK = threading.RLock()
_REFCOUNT = 0
_OWNED: list[type] = []
_SCANNED: tuple[cachespec.CacheSpec, ...] = ()
LAYERED_CACHES: set[type] = set()
"""Layer-based cache classes we registered (read by `capture.record.flatten.walk`'s fast path)."""


@dataclass(frozen=True)
class CacheKey(pytree.GetAttrKey):
    """A pytree key entry that prints as ``.key_cache[3]`` (attribute plus index).

    It subclasses `GetAttrKey` because torch.export only accepts the standard key kinds when it
    names the sources of its inputs; ``name`` stays unique per child (``key_cache_3``). A
    linear layer holding several states adds the state index (``.conv_states[3][1]``).
    """

    attr: str = ""
    index: int | None = None
    state: int | None = None

    def __str__(self) -> str:
        text = f".{self.attr}" if self.index is None else f".{self.attr}[{self.index}]"
        return text if self.state is None else f"{text}[{self.state}]"

    def get(self, parent: Any) -> Any:
        """Returns the child this key designates (pytree's KeyEntry protocol)."""
        if self.attr == SEEN_TOKENS:
            return flatten_layers(parent)[0][_seen_position(parent)]
        if self.index is None:
            return getattr(parent, self.attr)
        layer = parent.layers[self.index]
        if self.attr == "layers":
            return layer
        if self.attr in ("key_cache", "value_cache"):
            return layer.keys if self.attr == "key_cache" else layer.values
        if self.attr in ("conv_states", "recurrent_states"):
            return getattr(layer, self.attr)[self.state or 0]
        return getattr(layer, self.attr)


def _key(attr: str, index: int | None = None, state: int | None = None) -> CacheKey:
    name = attr if index is None else f"{attr}_{index}"
    return CacheKey(name if state is None else f"{name}_{state}", attr, index, state)


def transformers_loaded() -> bool:
    """Tells whether transformers is already imported (we never import it just to check)."""
    return "transformers" in sys.modules


def registrable(tp: type) -> bool:
    """Tells whether registering the registry's classes would make `tp` a pytree node.

    True for a cache class the registry flattens (`CacheSpec.flatten`), from its module, once
    transformers is loaded; `capture.record.flatten.walk` then registers lazily.
    """
    spec = cachespec.cache_spec(tp.__name__)
    return (
        spec is not None
        and spec.flatten is not None
        and spec.module == tp.__module__
        and transformers_loaded()
    )


SEEN_TOKENS = "seen_tokens"
"""Key of the shape-only leaf that carries a full sliding-window layer's ``cumulative_length``."""

FILL_LEVEL = "cumulative_length"
"""Key of a static layer's fill level leaf (``.cumulative_length[3]``, a 0-d int64 tensor)."""


_MARKER: list[torch.Tensor] = []


def _marker(length: int) -> torch.Tensor:
    """A shape-only tensor of `length` elements: a contiguous view of a shared zero buffer.

    A view, so the hot path allocates nothing per call; contiguous, because torch.export
    gives an expanded (stride 0) input a static size.
    """
    if not _MARKER or _MARKER[0].shape[0] < length:
        size = max(1024, 2 * length)
        _MARKER[:] = [torch.zeros(size)]
    return _MARKER[0][:length]


def _seen_leaf(cache: Any, seen: Any) -> torch.Tensor:
    """The `SEEN_TOKENS` leaf of `seen` tokens.

    A cache we rebuilt keeps the leaf it was given (`_ANCHOR`): torch.export must find that very
    input tensor when it flattens the example (a view gets a static size). While torch.export
    traces the outputs, `seen` is symbolic and the leaf is a graph op (no constant tensor).
    """
    anchor: torch.Tensor | None = getattr(cache, _ANCHOR, None)
    if anchor is None:
        return _marker(seen)
    if type(seen) is int and anchor.shape[0] == seen:
        return anchor
    return anchor.new_zeros(seen)


_ANCHOR = "_capture_seen_tokens"
_is_initialized = operator.attrgetter("is_initialized")
_keys = operator.attrgetter("keys")
_values = operator.attrgetter("values")
_TENSOR_ONLY = {torch.Tensor}


def _seen(cache: Any, layers: Sequence[Any], layout: layer_state.Layout) -> Any:
    """The `SEEN_TOKENS` leaf when the layout has a sliding window (else unused: None).

    Every sliding-window layer of a cache has seen the same tokens, so one shape-only leaf
    carries their ``cumulative_length`` (a dim, not a value: it varies per call without making a
    new structure, and torch.export takes it as a dynamic dim).
    """
    if layout.window is None:
        return None
    first = layers[layout.window]
    return _seen_leaf(cache, first.cumulative_length) if first.is_initialized else None


def _seen_position(cache: Any) -> int:
    return 2 * len(layer_state.layout_of(tuple(map(type, cache.layers))).kv)


def flatten_layers(cache: Any) -> tuple[list[Any], tuple[Any, ...]]:
    """``(children, context)`` of a layered cache: keys, values, then the state leaves.

    The registered flatten function (`capture.pytree.layers` says what each layer holds).
    """
    layers = cache.layers
    types = tuple(map(type, layers))
    layout = layer_state.layout_of(types)
    if layout.plain is not None:
        return [layer.keys for layer in layers] + [layer.values for layer in layers], layout.plain
    context = layer_state.context_of(layers, types, layout)
    return layer_state.children(layers, layout, _seen(cache, layers, layout)), context


def walk_layers(cache: Any) -> tuple[list[Any], tuple[Any, ...], bool]:
    """`flatten_layers` plus whether every child is a tensor: the recorder's fast path.

    `capture.record.flatten.walk` takes the children as tensors in one step when the last item
    is True (no per-child walk), so both agree on the structure at the cost of one flatten.
    """
    layers = cache.layers
    types = tuple(map(type, layers))
    layout = layer_state.layout_of(types)
    if layout.plain is not None:  # C-level passes: the recorder and the runners walk every call
        children = [*map(_keys, layers), *map(_values, layers)]
        return children, layout.plain, all(map(_is_initialized, layers))
    context = layer_state.context_of(layers, types, layout)
    children = layer_state.children(layers, layout, _seen(cache, layers, layout))
    if layout.dense:
        return children, context, all(map(_is_initialized, layers))
    # Linear layers have no is_initialized: their states are tensors once written (a decode
    # step), None before; an opaque layer is never a tensor. One C-level pass over the types.
    return children, context, set(map(type, children)) <= _TENSOR_ONLY


_flatten_layers = flatten_layers


def _flatten_layers_with_keys(cache: Any) -> tuple[list[tuple[Any, Any]], tuple[Any, ...]]:
    children, context = flatten_layers(cache)
    layers = cache.layers
    layout = layer_state.layout_of(tuple(map(type, layers)))
    keys = layer_state.child_keys(layers, layout)
    return [(_key(*k), c) for k, c in zip(keys, children, strict=True)], context


def _fill_layer(layer: Any, key: Any, value: Any) -> Any:
    layer_state.fill_kv(layer, key, value)
    return layer


def _unflatten_layers(cache_cls: type) -> Callable[[Any, Any], Any]:
    def unflatten(children: Any, context: Any) -> Any:
        import transformers.cache_utils as cu

        layers, seen = layer_state.rebuild_layers(context, list(children))
        cache: Any = object.__new__(cache_cls)
        cu.Cache.__init__(cache, layers=layers)
        if isinstance(seen, torch.Tensor):
            setattr(cache, _ANCHOR, seen)
        return cache

    return unflatten


def _flatten_encoder_decoder(cache: Any) -> tuple[list[Any], None]:
    return [cache.self_attention_cache, cache.cross_attention_cache], None


def _flatten_encoder_decoder_with_keys(cache: Any) -> tuple[list[tuple[Any, Any]], None]:
    return [
        (_key("self_attention_cache"), cache.self_attention_cache),
        (_key("cross_attention_cache"), cache.cross_attention_cache),
    ], None


def _unflatten_encoder_decoder(children: Any, context: Any) -> Any:
    import transformers.cache_utils as cu

    self_attention, cross_attention = list(children)
    return cu.EncoderDecoderCache(self_attention, cross_attention)


def _dump_context(context: Any) -> str:
    return json.dumps(context)


def _frozen(value: Any) -> Any:
    """JSON lists back to the tuples the context was made of (nested: a linear layer's)."""
    return tuple(map(_frozen, value)) if isinstance(value, list) else value


def _load_context(text: str) -> Any:
    loaded = untrusted.loads(text)
    if loaded is None:
        return None
    return tuple(tuple(map(_frozen, item)) for item in loaded)


def _kwargs(cls: type, spec: cachespec.CacheSpec) -> dict[str, Any]:
    """`register_pytree_node`'s arguments for a class the registry says to flatten."""
    common = dict(
        serialized_type_name=f"{cls.__module__}.{cls.__name__}",
        to_dumpable_context=_dump_context,
        from_dumpable_context=_load_context,
    )
    if spec.flatten == "layers":
        return dict(
            flatten_fn=_flatten_layers,
            unflatten_fn=_unflatten_layers(cls),
            flatten_with_keys_fn=_flatten_layers_with_keys,
            **common,
        )
    return dict(
        flatten_fn=_flatten_encoder_decoder,
        unflatten_fn=_unflatten_encoder_decoder,
        flatten_with_keys_fn=_flatten_encoder_decoder_with_keys,
        **common,
    )


def _flattened_specs() -> tuple[cachespec.CacheSpec, ...]:
    return tuple(s for s in cachespec.cache_specs() if s.flatten is not None and not s.layer)


def _registrations() -> list[tuple[type, dict[str, Any]]]:
    """What the registry says to register, for the classes installed (none without transformers)."""
    regs: list[tuple[type, dict[str, Any]]] = []
    for spec in _flattened_specs():
        try:
            module = importlib.import_module(spec.module)
        except ImportError:
            continue
        cls = getattr(module, spec.name, None)
        if isinstance(cls, type):
            regs.append((cls, _kwargs(cls, spec)))
    return regs


def acquire() -> None:
    """Registers the cache classes (first caller) or bumps the reference count."""
    global _REFCOUNT, _SCANNED
    outputs.add_keys_to_registered()  # diffusers' output classes get key paths (no import)
    with _LOCK:
        _REFCOUNT += 1
        wanted = tuple(cachespec.cache_specs())
        if _REFCOUNT > 1 and _OWNED and wanted == _SCANNED:
            return
        if wanted != _SCANNED:  # the registry changed: what layers hold is read again
            layer_state.reset()
        _SCANNED = wanted
        for cls, kwargs in _registrations():
            if cls in compat.pytree_nodes() or cls in _OWNED:
                continue
            pytree.register_pytree_node(cls, **kwargs)
            _OWNED.append(cls)
            if kwargs["flatten_fn"] is _flatten_layers:
                LAYERED_CACHES.add(cls)
            logger.debug("registered %s with torch pytree", cls.__name__)


def release() -> None:
    """Drops one reference; the last one deregisters exactly what `acquire` registered."""
    global _REFCOUNT
    with _LOCK:
        if _REFCOUNT == 0:
            return
        _REFCOUNT -= 1
        if _REFCOUNT:
            return
        while _OWNED:
            if not compat.deregister_pytree_node(_OWNED[-1]):
                break  # this torch cannot deregister (warned once): they stay registered, ours
            LAYERED_CACHES.discard(_OWNED.pop())


def registered_classes() -> list[type]:
    """The classes this module registered and still owns (for tests and diagnostics)."""
    with _LOCK:
        return list(_OWNED)


@contextlib.contextmanager
def register_flattening_functions(patch_transformers: bool = True) -> Iterator[None]:
    """Registers the transformers cache classes with torch pytree for the duration of a block.

    Args:
        patch_transformers: Register the transformers caches (the only thing there is to
            register today; False makes the block a no-op, as in the seeds).

    Example:
        >>> with register_flattening_functions(patch_transformers=True):
        ...     pass
    """
    if not patch_transformers:
        yield
        return
    acquire()
    try:
        yield
    finally:
        release()


def make_dynamic_cache(key_value_pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """Builds a transformers `DynamicCache` holding the given ``(key, value)`` per layer.

    Args:
        key_value_pairs: One ``(key, value)`` pair per layer, each ``[batch, heads, seq, dim]``.

    Returns:
        A `transformers.cache_utils.DynamicCache`.

    Example:
        >>> import torch
        >>> cache = make_dynamic_cache([(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))])
        >>> len(cache.layers)
        1
    """
    import transformers.cache_utils as cu

    cache = cu.DynamicCache()
    layer_cls: Any = cu.DynamicLayer
    cache.layers = [_fill_layer(layer_cls(), k, v) for k, v in key_value_pairs]
    return cache


def __getattr__(name: str) -> Any:
    # SUPPORTED_CACHES, SUPPORTED_LAYERS, UNSUPPORTED: the registry's live views.
    if name in ("SUPPORTED_CACHES", "SUPPORTED_LAYERS", "UNSUPPORTED"):
        return getattr(cachespec, name)
    raise AttributeError(f"module 'capture.pytree.nodes' has no attribute {name!r}")


def make_encoder_decoder_cache(self_attention: Any, cross_attention: Any) -> Any:
    """Builds a transformers `EncoderDecoderCache` from two `DynamicCache` objects."""
    import transformers.cache_utils as cu

    return cu.EncoderDecoderCache(self_attention, cross_attention)
