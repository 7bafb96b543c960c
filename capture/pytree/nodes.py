"""Pytree registrations for transformers caches, and `register_flattening_functions()`.

transformers 5.x registers none of its cache classes with torch's pytree, so `tree_flatten`
sees a `DynamicCache` as one opaque leaf. We register the classes the installed version has:

- `DynamicCache` flattens to ``[key_0, ..., key_{L-1}, value_0, ..., value_{L-1}]`` (one flat
  list, so its `dynamic_shapes` is a flat list of ``2 * L`` per-tensor dicts), with readable key
  paths ``.key_cache[i]`` / ``.value_cache[i]``;
- then the state that changes a forward's result (issue 9): for sliding windows one
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
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from capture import compat
from capture.pytree import cachespec
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
    "flatten_layers",
    "unsupported_reason",
    "SEEN_TOKENS",
]

logger = logging.getLogger(__name__)

# Why module state: it mirrors torch's process-wide pytree registry, which we must not
# register into twice nor deregister while another user (a second Recorder) still needs it.
_LOCK = threading.RLock()
_REFCOUNT = 0
_OWNED: list[type] = []
_SCANNED: tuple[str, ...] = ()
LAYERED_CACHES: set[type] = set()
"""Layer-based cache classes we registered (read by `capture.record.flatten.walk`'s fast path)."""


@dataclass(frozen=True)
class CacheKey(pytree.GetAttrKey):
    """A pytree key entry that prints as ``.key_cache[3]`` (attribute plus index).

    It subclasses `GetAttrKey` because torch.export only accepts the standard key kinds when it
    names the sources of its inputs; ``name`` stays unique per child (``key_cache_3``).
    """

    attr: str = ""
    index: int | None = None

    def __str__(self) -> str:
        return f".{self.attr}" if self.index is None else f".{self.attr}[{self.index}]"

    def get(self, parent: Any) -> Any:
        """Returns the child this key designates (pytree's KeyEntry protocol)."""
        if self.attr in ("key_cache", "value_cache") and self.index is not None:
            layer = parent.layers[self.index]
            return layer.keys if self.attr == "key_cache" else layer.values
        if self.attr == SEEN_TOKENS:
            return flatten_layers(parent)[0][-1]
        return getattr(parent, self.attr)


def _key(attr: str, index: int | None = None) -> CacheKey:
    name = attr if index is None else f"{attr}_{index}"
    return CacheKey(name, attr, index)


def transformers_loaded() -> bool:
    """Tells whether transformers is already imported (we never import it just to check)."""
    return "transformers" in sys.modules


SEEN_TOKENS = "seen_tokens"
"""Key of the shape-only leaf that carries a full sliding-window layer's ``cumulative_length``."""

_FULL = "full"
_FILLING = "filling"


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


_WINDOWS: dict[type, bool] = {}


def _is_window(tp: type) -> bool:
    """A DynamicSlidingWindowLayer (or subclass): its fill level changes results."""
    known = _WINDOWS.get(tp)
    if known is None:
        known = any(base.__name__ == "DynamicSlidingWindowLayer" for base in tp.__mro__)
        _WINDOWS[tp] = known
    return known


def _layer_context(layer: Any) -> tuple[Any, ...]:
    """The structural state of a layer: its class, its constants and, for a sliding window,
    whether it is full (``cumulative_length`` then exceeds the cached keys)."""
    name = type(layer).__name__
    if name == "DynamicLayer":
        return _DYNAMIC_CONTEXT
    if _is_window(type(layer)):
        keys = getattr(layer, "keys", None)
        seen = getattr(layer, "cumulative_length", 0)
        cached = keys.shape[-2] if isinstance(keys, torch.Tensor) and keys.ndim == 4 else 0
        if type(seen) is int and type(cached) is int:
            state = _FULL if seen != cached else _FILLING
        else:
            # Symbolic while torch.export traces: comparing would add a guard. The state is
            # the one the layer was rebuilt with (the length itself travels as `SEEN_TOKENS`).
            state = getattr(layer, _STATE, _FILLING)
        return (name, int(layer.sliding_window), state)
    if hasattr(layer, "max_cache_len"):
        return (name, int(layer.max_cache_len))
    return (name,)


_DYNAMIC_CONTEXT = ("DynamicLayer",)


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
_STATE = "_capture_state"


@dataclass(frozen=True)
class _Layout:
    """What the classes of a cache's layers imply, computed once per tuple of layer types."""

    plain: tuple[Any, ...] | None
    """The context when every layer is a plain DynamicLayer (it has no state to read)."""
    sliding: int | None
    """Index of the first sliding-window layer."""


_LAYOUTS: dict[tuple[type, ...], _Layout] = {}
_CONTEXTS: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_CACHE_LIMIT = 1024


def _layout(types: tuple[type, ...]) -> _Layout:
    layout = _LAYOUTS.get(types)
    if layout is None:
        names = [tp.__name__ for tp in types]
        plain = (_DYNAMIC_CONTEXT,) * len(names) if set(names) <= {"DynamicLayer"} else None
        sliding = [i for i, tp in enumerate(types) if _is_window(tp)]
        layout = _Layout(plain, sliding[0] if sliding else None)
        if len(_LAYOUTS) < _CACHE_LIMIT:
            _LAYOUTS[types] = layout
    return layout


def _context(layers: Sequence[Any], types: tuple[type, ...], layout: _Layout) -> tuple[Any, ...]:
    """The per-layer contexts, from a cache keyed by the layer types and the window's state.

    Every sliding layer of a cache has seen the same tokens, so the first one's state stands
    for all; a context is only cached when the layers agree (else it is computed per call).
    """
    first = layers[layout.sliding] if layout.sliding is not None else None
    head = _layer_context(first) if first is not None else None
    key = (types, head, getattr(layers[0], "max_cache_len", None) if layers else None)
    context = _CONTEXTS.get(key)
    if context is None:
        context = tuple(_layer_context(layer) for layer in layers)
        windows = {ctx[1:] for ctx in context if len(ctx) > 2}
        sizes = {ctx for ctx in context if ctx[0] == "StaticLayer"}
        if len(windows) <= 1 and len(sizes) <= 1 and len(_CONTEXTS) < _CACHE_LIMIT:
            _CONTEXTS[key] = context
    return context


def _extras(cache: Any, layers: Sequence[Any], layout: _Layout) -> list[Any]:
    """The state leaves after keys and values: `SEEN_TOKENS` when there is a sliding window.

    Every sliding-window layer of a cache has seen the same tokens, so one shape-only leaf
    carries their ``cumulative_length`` (a dim, not a value: it varies per call without making a
    new structure, and torch.export takes it as a dynamic dim).
    """
    extras: list[Any] = []
    if layout.sliding is not None:
        first = layers[layout.sliding]
        seen = first.cumulative_length if first.is_initialized else None
        extras.append(None if seen is None else _seen_leaf(cache, seen))
    return extras


def flatten_layers(cache: Any) -> tuple[list[Any], tuple[Any, ...]]:
    """``(children, context)`` of a layered cache: keys, values, then the state leaves.

    Also the recorder's fast path (`capture.record.flatten.walk`), so both agree on the structure.
    """
    layers = cache.layers
    types = tuple(map(type, layers))
    layout = _layout(types)
    keys = [layer.keys for layer in layers]
    values = [layer.values for layer in layers]
    if layout.plain is not None:
        return keys + values, layout.plain
    context = _context(layers, types, layout)
    return keys + values + _extras(cache, layers, layout), context


_flatten_layers = flatten_layers


def _flatten_layers_with_keys(cache: Any) -> tuple[list[tuple[Any, Any]], tuple[Any, ...]]:
    children, context = flatten_layers(cache)
    n = len(context)
    keyed = [(_key("key_cache", i), children[i]) for i in range(n)]
    keyed += [(_key("value_cache", i), children[n + i]) for i in range(n)]
    if any(len(ctx) > 2 for ctx in context):
        keyed.append((_key(SEEN_TOKENS), children[-1]))
    return keyed, context


def _fill_layer(layer: Any, key: Any, value: Any) -> Any:
    if isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor):
        layer.keys, layer.values = key, value
        layer.dtype, layer.device = key.dtype, key.device
        layer.is_initialized = True
        if hasattr(layer, "max_cache_len"):
            layer.batch_size, layer.num_heads = key.shape[0], key.shape[1]
            layer.k_head_dim, layer.v_head_dim = key.shape[-1], value.shape[-1]
        if hasattr(layer, "sliding_window") and key.ndim == 4:
            # Exact while the window is filling: every token seen is still cached. A full
            # window gets the `SEEN_TOKENS` length afterwards. A SymInt under torch.export.
            layer.cumulative_length = key.shape[-2]
    return layer


def _make_layer(cu: Any, context: Sequence[Any]) -> Any:
    name = str(context[0])
    layer_cls = getattr(cu, name, None)
    spec = cachespec.cache_spec(name)
    if layer_cls is None or (spec is not None and spec.reason is not None):
        # Rebuilt as the nearest supported layer; `unsupported_reason` reports the group.
        return cu.DynamicLayer()
    if name == "DynamicSlidingWindowLayer":
        return layer_cls(sliding_window=int(context[1]))
    if name == "StaticLayer":
        return layer_cls(max_cache_len=int(context[1]))
    return layer_cls()


def _unflatten_layers(cache_cls: type) -> Callable[[Any, Any], Any]:
    def unflatten(children: Any, context: Any) -> Any:
        import transformers.cache_utils as cu

        children = list(children)
        n = len(context)
        layers = [
            _fill_layer(_make_layer(cu, ctx), children[i], children[n + i])
            for i, ctx in enumerate(context)
        ]
        seen = children[2 * n] if len(children) > 2 * n else None
        if isinstance(seen, torch.Tensor):
            for layer, ctx in zip(layers, context, strict=True):
                if len(ctx) > 2:
                    # A SymInt under torch.export: never int() it (that would specialize).
                    layer.cumulative_length = seen.shape[0]
                    setattr(layer, _STATE, ctx[2])
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


def _load_context(text: str) -> Any:
    loaded = json.loads(text)
    if loaded is None:
        return None
    return tuple(tuple(item) for item in loaded)


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
    with _LOCK:
        _REFCOUNT += 1
        wanted = tuple(spec.name for spec in _flattened_specs())
        if _REFCOUNT > 1 and _OWNED and wanted == _SCANNED:
            return
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
