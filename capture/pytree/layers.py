"""Cache layers: the state each layer class holds, its flattened children, context and rebuild.

A transformers `Cache` is a list of layers; what a layer holds is the cache registry's
``parts`` for its class (`capture.pytree.cachespec`):

- ``kv``: keys and values (``[batch, heads, seq, dim]``; None before the first update);
- ``window``: a sliding window's fill level: one shape-only ``seen_tokens`` leaf per cache (a
  dim) and the window's full/filling state in the context;
- ``static``: a preallocated layer: ``max_cache_len`` in the context (a static dim: another
  size is another structure) and its fill level, the 0-d int64 ``cumulative_length`` tensor
  itself, one leaf per layer (each layer advances its own in place). A value leaf, not a dim:
  the recorder reads it like any integer input, where it lives, and an exported program takes
  it as an input (nothing specializes on it);
- ``linear``: linear-attention and state-space states (Mamba, Bamba, Jamba, Falcon-H1,
  Qwen3-Next): per state index its conv and recurrent state tensors (None until written); the
  kernel sizes, whether a previous state exists (prefill or decode) and ``record_past`` in the
  context.

A layer of a class outside the registry, or one the registry refuses, is one opaque leaf (the
layer object itself): the call is recorded, the leaf names the class, and
`cachespec.blocking_reason` reports its group. Children come in this order: every ``kv`` layer's
keys, then their values, then ``seen_tokens``, the fill levels, the linear states (per layer,
per state: conv then recurrent), the opaque layers. A cache of plain ``DynamicLayer`` flattens to
its keys and values only, as the seeds do.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from capture.pytree import cachespec

__all__ = [
    "FILL",
    "Kind",
    "Layout",
    "children",
    "context_of",
    "kind_of",
    "layout_of",
    "child_keys",
    "rebuild_layers",
    "fill_kv",
    "kv_only_layers",
    "reset",
]

FILL = "fill"
"""Last item of a static part in a layer context: the fill level leaf was recorded."""

_FULL = "full"
_FILLING = "filling"
_STATE = "_capture_state"
_DYNAMIC_CONTEXT = ("DynamicLayer",)


@dataclass(frozen=True)
class Kind:
    """What one layer class holds (from the registry), computed once per class."""

    name: str
    parts: frozenset[str]
    opaque: bool


@dataclass(frozen=True)
class Layout:
    """What the classes of a cache's layers imply, computed once per tuple of layer types."""

    kinds: tuple[Kind, ...]
    kv: tuple[int, ...]
    """Layers with keys and values."""
    window: int | None
    """The first sliding-window layer."""
    static: tuple[int, ...]
    """Layers with a fill level tensor."""
    linear: tuple[int, ...]
    """Layers with linear-attention states."""
    opaque: tuple[int, ...]
    """Layers recorded as opaque leaves."""
    plain: tuple[Any, ...] | None
    """The context when every layer is a plain DynamicLayer (it has no state to read)."""
    dense: bool
    """Once every layer is initialized, every child is a tensor (no linear or opaque layer)."""


_KINDS: dict[type, Kind] = {}
_LAYOUTS: dict[tuple[type, ...], Layout] = {}
_CONTEXTS: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_CACHE_LIMIT = 1024


def reset() -> None:
    """Forgets what was computed from the registry (`capture.pytree.nodes.acquire` calls it)."""
    _KINDS.clear()
    _LAYOUTS.clear()
    _CONTEXTS.clear()
    _CLASSES.clear()


def _spec(name: str, module: str | None) -> cachespec.CacheSpec | None:
    """The registry's supported layer spec of this class, or None (opaque)."""
    spec = cachespec.cache_spec(name)
    if spec is None or not spec.layer or spec.reason is not None:
        return None
    if module is not None and spec.module != module:
        return None  # a class of the same name elsewhere: not the one registered
    return spec


def kind_of(tp: type) -> Kind:
    """The `Kind` of a layer class: its registry parts, or opaque."""
    kind = _KINDS.get(tp)
    if kind is None:
        spec = _spec(tp.__name__, tp.__module__)
        parts = frozenset(spec.parts) if spec is not None else frozenset()
        kind = Kind(tp.__name__, parts, spec is None)
        if len(_KINDS) < _CACHE_LIMIT:
            _KINDS[tp] = kind
    return kind


def layout_of(types: tuple[type, ...]) -> Layout:
    """The `Layout` of a cache whose layers have these types (cached)."""
    layout = _LAYOUTS.get(types)
    if layout is None:
        kinds = tuple(map(kind_of, types))

        def having(part: str) -> tuple[int, ...]:
            return tuple(i for i, k in enumerate(kinds) if part in k.parts)

        windows = having("window")
        opaque = tuple(i for i, k in enumerate(kinds) if k.opaque)
        plain_names = {tp.__name__ for tp in types} <= {"DynamicLayer"}
        plain = (_DYNAMIC_CONTEXT,) * len(types) if plain_names and not opaque else None
        layout = Layout(
            kinds,
            having("kv"),
            windows[0] if windows else None,
            having("static"),
            having("linear"),
            opaque,
            plain,
            not having("linear") and not opaque,
        )
        if len(_LAYOUTS) < _CACHE_LIMIT:
            _LAYOUTS[types] = layout
    return layout


def _window_state(layer: Any) -> str:
    """Full or filling: whether the window's fill level exceeds its cached keys."""
    keys = getattr(layer, "keys", None)
    seen = getattr(layer, "cumulative_length", 0)
    cached = keys.shape[-2] if isinstance(keys, torch.Tensor) and keys.ndim == 4 else 0
    if type(seen) is int and type(cached) is int:
        return _FULL if seen != cached else _FILLING
    # Symbolic while torch.export traces: comparing would add a guard. The state is the one
    # the layer was rebuilt with (the length itself travels as `SEEN_TOKENS`).
    return str(getattr(layer, _STATE, _FILLING))


def _linear_context(layer: Any) -> tuple[Any, ...]:
    """``(states, kernel sizes, has previous state, record_past)`` of a linear layer."""
    n = int(layer.number_of_states)
    kernels = layer.conv_kernel_size
    previous = layer.has_previous_state
    return (
        n,
        tuple(None if kernels[s] is None else int(kernels[s]) for s in range(n)),
        tuple(bool(previous[s]) for s in range(n)),
        bool(layer.record_past),
    )


def layer_context(layer: Any, kind: Kind) -> tuple[Any, ...]:
    """A layer's structural state: its class, then its parts' constants (module docstring)."""
    if kind.opaque or not kind.parts - {"kv"}:
        return _DYNAMIC_CONTEXT if kind.name == "DynamicLayer" else (kind.name,)
    ctx: list[Any] = [kind.name]
    if "window" in kind.parts:
        ctx += [int(layer.sliding_window), _window_state(layer)]
    if "static" in kind.parts:
        ctx += [int(layer.max_cache_len), FILL]
    if "linear" in kind.parts:
        ctx.append(_linear_context(layer))
    return tuple(ctx)


def context_of(layers: Sequence[Any], types: tuple[type, ...], layout: Layout) -> tuple[Any, ...]:
    """The per-layer contexts, from a cache keyed by the layer types and the first layers' state.

    Every sliding layer of a cache has seen the same tokens, every static one has the same
    size, every linear one is in the same step; so the first one of each stands for all. A
    context is only cached when the layers agree (else it is computed per call).
    """
    at = layout.window
    head = layer_context(layers[at], layout.kinds[at]) if at is not None else None
    size = layers[layout.static[0]].max_cache_len if layout.static else None
    linear = _linear_context(layers[layout.linear[0]]) if layout.linear else None
    key = (types, head, size, linear)
    context = _CONTEXTS.get(key)
    if context is None:
        kinds = layout.kinds
        context = tuple(layer_context(layer, k) for layer, k in zip(layers, kinds, strict=True))
        windows = {ctx[1:3] for ctx, k in zip(context, kinds, strict=True) if "window" in k.parts}
        sizes = {layers[i].max_cache_len for i in layout.static}
        states = {_linear_context(layers[i]) for i in layout.linear}
        agree = len(windows) <= 1 and len(sizes) <= 1 and len(states) <= 1
        if agree and len(_CONTEXTS) < _CACHE_LIMIT:
            _CONTEXTS[key] = context
    return context


def children(layers: Sequence[Any], layout: Layout, seen: Any) -> list[Any]:
    """The children of a cache with these layers, in the module docstring's order.

    Args:
        layers: The cache's layers.
        layout: Their `layout_of`.
        seen: The ``seen_tokens`` leaf (when the layout has a window), or None.
    """
    kv = layout.kv
    out = [layers[i].keys for i in kv]
    out += [layers[i].values for i in kv]
    if layout.window is not None:
        out.append(seen)
    out += [layers[i].cumulative_length for i in layout.static]
    for i in layout.linear:
        layer = layers[i]
        for s in range(int(layer.number_of_states)):
            out.append(layer.conv_states[s])
            out.append(layer.recurrent_states[s])
    out += [layers[i] for i in layout.opaque]
    return out


def child_keys(layers: Sequence[Any], layout: Layout) -> list[tuple[str, int | None, int | None]]:
    """``(attribute, layer index, state index)`` of each child, aligned with `children`.

    The state index is None for a linear layer holding one state (its paths read
    ``.conv_states[3]``; with several, ``.conv_states[3][1]``).
    """
    keys: list[tuple[str, int | None, int | None]] = [("key_cache", i, None) for i in layout.kv]
    keys += [("value_cache", i, None) for i in layout.kv]
    if layout.window is not None:
        keys.append(("seen_tokens", None, None))
    keys += [("cumulative_length", i, None) for i in layout.static]
    for i in layout.linear:
        n = int(layers[i].number_of_states)
        for s in range(n):
            state = None if n == 1 else s
            keys += [("conv_states", i, state), ("recurrent_states", i, state)]
    keys += [("layers", i, None) for i in layout.opaque]
    return keys


# -- rebuilding layers from a recorded context and its children ------------------------------


@dataclass(frozen=True)
class _Recorded:
    """One layer context as recorded, read against the registry."""

    name: str
    parts: frozenset[str]
    opaque: bool
    window: int | None = None
    state: str | None = None
    size: int | None = None
    fill: bool = False
    linear: tuple[Any, ...] | None = None

    def count(self) -> int:
        """Children of this layer besides keys, values and seen_tokens."""
        if self.opaque:
            return 1
        states = 2 * int(self.linear[0]) if self.linear is not None else 0
        return int(self.fill) + states


def _read(context: Sequence[Any]) -> _Recorded:
    """Reads one layer context (older forms included: see `cachespec.unsupported_reason`)."""
    name = str(context[0])
    spec = _spec(name, None)
    if spec is None:
        return _Recorded(name, frozenset(), True)
    parts = frozenset(spec.parts)
    rest = list(context[1:])
    window = state = size = linear = None
    fill = False
    if "window" in parts and rest:
        window = int(rest.pop(0))
        state = str(rest.pop(0)) if rest and isinstance(rest[0], str) else None
    if "static" in parts and rest:
        size = int(rest.pop(0))
        fill = bool(rest and rest[0] == FILL)
        if fill:
            rest.pop(0)
    if "linear" in parts:
        if not rest or not isinstance(rest[0], tuple) or len(rest[0]) != 4:
            raise ValueError(f"the recorded {name} context has no linear-attention state")
        linear = rest.pop(0)
    return _Recorded(name, parts, False, window, state, size, fill, linear)


_CLASSES: dict[str, Any] = {}
"""A layer class name -> the registered class `_layer_class` found: a runner builds the layers
of every output cache on every call."""


def _layer_class(cu: Any, name: str) -> Any:
    """The registered layer class `name` (from its registered module; never another name)."""
    found = _CLASSES.get(name)
    if found is not None:
        return found
    spec = _spec(name, None)
    if spec is None:  # pragma: no cover - `_read` marked it opaque
        raise ValueError(f"{name} is not a supported cache layer")
    module = cu if spec.module == cu.__name__ else importlib.import_module(spec.module)
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise ValueError(f"{spec.module} has no cache layer class {name}")
    if len(_CLASSES) < _CACHE_LIMIT:
        _CLASSES[name] = cls
    return cls


def _new_layer(cu: Any, rec: _Recorded) -> Any:
    cls = _layer_class(cu, rec.name)
    options: dict[str, Any] = {}
    if rec.window is not None:
        options["sliding_window"] = rec.window
    if rec.size is not None:
        options["max_cache_len"] = rec.size
    if rec.linear is not None:
        options["number_of_states"] = int(rec.linear[0])
    return cls(**options)


def fill_kv(layer: Any, key: Any, value: Any) -> None:
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


def _fill_linear(layer: Any, linear: tuple[Any, ...], states: Sequence[Any]) -> None:
    n, kernels, previous, record_past = linear
    layer.record_past = bool(record_past)
    for s in range(int(n)):
        conv, recurrent = states[2 * s], states[2 * s + 1]
        layer.conv_states[s] = conv
        layer.recurrent_states[s] = recurrent
        layer.is_conv_states_initialized[s] = isinstance(conv, torch.Tensor)
        layer.is_recurrent_states_initialized[s] = isinstance(recurrent, torch.Tensor)
        layer.has_previous_state[s] = bool(previous[s])
        layer.conv_kernel_size[s] = kernels[s]
        first = conv if isinstance(conv, torch.Tensor) else recurrent
        if isinstance(first, torch.Tensor) and layer.device is None:
            layer.dtype, layer.device = first.dtype, first.device


_PARSED: dict[Any, tuple[list[_Recorded], list[int], bool, int]] = {}
"""A cache context (a tuple, as a treespec holds it) -> what `_parsed` read from it: a runner
unflattens one context on every call."""


def _parsed(context: Sequence[Any]) -> tuple[list[_Recorded], list[int], bool, int]:
    """The layer records of a context, which of them hold keys and values, whether one has a
    sliding window's state, and how many children they take."""
    try:
        found = _PARSED.get(context)
    except TypeError:  # a list (an older treespec): read each time
        found = None
    if found is not None:
        return found
    records = [_read(ctx) for ctx in context]
    kv = [i for i, r in enumerate(records) if "kv" in r.parts]
    windows = any(r.state is not None for r in records)
    expected = 2 * len(kv) + windows + sum(r.count() for r in records)
    found = (records, kv, windows, expected)
    if isinstance(context, tuple) and len(_PARSED) < 256:
        _PARSED[context] = found
    return found


def kv_only_layers(context: Sequence[Any]) -> list[Any] | None:
    """New empty layers for a recorded context whose layers hold keys and values only (no
    sliding window, fill level, linear-attention state or opaque layer): what `rebuild_layers`
    makes before it fills them; None for any other context."""
    import transformers.cache_utils as cu

    records, kv, windows, _ = _parsed(context)
    if windows or len(kv) != len(records):
        return None
    if any(
        r.opaque or r.fill or r.linear is not None or r.window is not None or r.size is not None
        for r in records
    ):
        return None
    return [_new_layer(cu, rec) for rec in records]


def rebuild_layers(context: Sequence[Any], children: Sequence[Any]) -> tuple[list[Any], Any]:
    """The layers a recorded context and its children stand for, and the ``seen_tokens`` leaf.

    Args:
        context: The per-layer contexts (as `context_of` made them, or an older form).
        children: The children (as `children` made them).

    Returns:
        ``(layers, seen)``: new layer objects holding the children (an opaque child is used as
        it is), and the ``seen_tokens`` leaf or None.

    Raises:
        ValueError: The children do not match the context (a store of another version).
    """
    import transformers.cache_utils as cu

    records, kv, windows, expected = _parsed(context)
    if len(children) != expected:
        raise ValueError(
            f"a recorded cache has {len(children)} children where its layers' contexts "
            f"need {expected} (recorded by another version of capture?)"
        )
    n = len(kv)
    at = 2 * n
    seen = children[at] if windows else None
    at += bool(windows)
    layers: list[Any] = [None] * len(records)
    for i, rec in enumerate(records):
        if not rec.opaque:
            layers[i] = _new_layer(cu, rec)
    for j, i in enumerate(kv):
        fill_kv(layers[i], children[j], children[n + j])
    for i, rec in enumerate(records):
        if rec.fill:
            # The layer's own fill level tensor: it advances it in place, as in production.
            layers[i].cumulative_length = children[at]
            at += 1
    for i, rec in enumerate(records):
        if rec.linear is not None:
            width = 2 * int(rec.linear[0])
            _fill_linear(layers[i], rec.linear, children[at : at + width])
            at += width
    for i, rec in enumerate(records):
        if rec.opaque:
            layers[i] = children[at]
            at += 1
    if isinstance(seen, torch.Tensor):
        for layer, rec in zip(layers, records, strict=True):
            if rec.state is not None:
                # A SymInt under torch.export: never int() it (that would specialize).
                layer.cumulative_length = seen.shape[0]
                setattr(layer, _STATE, rec.state)
    return layers, seen
