"""The cache registry: one table of the cache and layer classes capture knows.

Each `CacheSpec` says, for one class (by name, as ``type(obj).__name__`` spells it), how
`capture.pytree.nodes` registers it with torch's pytree (``flatten``), what `capture.string_type`
prints of it (``fields``), whether capture can round-trip it exactly (``reason`` is None) and under
which argument names models receive it (``arguments``, for the analysis's prefill/decode naming).
The flattening, `string_type`, replay's coverage and the analysis read this table only;
`register_cache` adds a class and refuses a name already in the table, as torch's pytree registry
does. ``SUPPORTED_CACHES``, ``SUPPORTED_LAYERS`` and ``UNSUPPORTED`` (name -> reason) are views of
the table, computed when read. The module imports neither torch nor transformers.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from capture import schema, untrusted
from capture.errors import CaptureError

if TYPE_CHECKING:
    from capture.pytree.recorded_structure import RecordedStructure

__all__ = [
    "CacheSpec",
    "KEY_VALUE",
    "register_cache",
    "unregister_cache",
    "cache_spec",
    "cache_specs",
    "is_cache_argument",
    "is_cache_counter",
    "unsupported_reason",
    "blocking_reason",
    "LAYER_PARTS",
]

KEY_VALUE = ("key_cache", "value_cache")
"""``fields`` of a layered cache: printed as its layers' keys and values."""

_FLATTENINGS = ("layers", "encoder_decoder")


@dataclass(frozen=True)
class CacheSpec:
    """One cache or layer class in the registry.

    Attributes:
        name: The class name (``type(obj).__name__``), unique in the registry.
        module: Where the class lives; `capture.pytree.nodes` looks it up there to register it.
        layer: A layer class (an element of a cache's ``layers``), not a cache.
        flatten: How `capture.pytree.nodes` registers the class with torch's pytree: ``"layers"``
            (keys, values, then the state leaves of a transformers `Cache`),
            ``"encoder_decoder"`` (two caches), or None (not registered).
        fields: What `string_type` prints: `KEY_VALUE`, or attribute names printed as
            ``Name(a=..., b=...)``; empty for a class `string_type` does not know.
        reason: Why capture cannot round-trip the class exactly (its groups are reported
            not covered), or None.
        arguments: Argument names models pass the cache under (analysis names a group holding
            tensors there ``decode``).
        parts: For a layer: the state it holds, flattened in this order by
            `capture.pytree.layers` (`LAYER_PARTS`): ``"kv"`` (keys and values),
            ``"window"`` (a sliding window's fill level), ``"static"`` (a preallocated layer's
            size and fill level), ``"linear"`` (linear-attention / state-space conv and
            recurrent states). A layer with a reason, or outside the registry, is recorded as
            one opaque leaf naming its class.
    """

    name: str
    module: str = "transformers.cache_utils"
    layer: bool = False
    flatten: str | None = None
    fields: tuple[str, ...] = ()
    reason: str | None = None
    arguments: tuple[str, ...] = ()
    parts: tuple[str, ...] = ()


LAYER_PARTS = ("kv", "window", "static", "linear")
"""The state a layer can hold (`CacheSpec.parts`), in flattening order."""

_QUANTIZED = "its quantized states are not tensors torch.export can take"
_INDEXED = "its indexer keys and positions are not flattened"
_DRAFT = "its draft-model state is not flattened (no pytree registration)"
_STATIC_WINDOW = (
    "its Python-int fill level (cumulative_length_int) picks one of three update paths "
    "(filling, becoming full, full) and slices the keys by it: not an input an exported "
    "program can take"
)
_LAYER_FIELDS = ("keys", "values")
_ARGUMENTS = ("past_key_value", "past_key_values", "cache_params")


def _unsupported_layers(reason: str, *names: str) -> tuple[CacheSpec, ...]:
    return tuple(CacheSpec(name, layer=True, reason=reason) for name in names)


_BUILTIN = (
    # Caches capture round-trips exactly (the enumeration test in tests/test_fidelity_caches.py
    # fails when transformers ships a class that is in neither this table's supported nor its
    # unsupported entries).
    CacheSpec("DynamicCache", flatten="layers", fields=KEY_VALUE, arguments=_ARGUMENTS),
    CacheSpec("StaticCache", flatten="layers", fields=KEY_VALUE),
    CacheSpec(
        "EncoderDecoderCache",
        flatten="encoder_decoder",
        fields=("self_attention_cache", "cross_attention_cache"),
    ),
    # Names older transformers releases use: printed by string_type, not flattened.
    CacheSpec("SlidingWindowCache", fields=KEY_VALUE),
    CacheSpec("HybridCache", fields=KEY_VALUE),
    CacheSpec("MambaCache", fields=("conv_states", "ssm_states")),
    CacheSpec("DynamicLayer", layer=True, fields=_LAYER_FIELDS, parts=("kv",)),
    CacheSpec(
        "DynamicSlidingWindowLayer", layer=True, fields=_LAYER_FIELDS, parts=("kv", "window")
    ),
    # Its fill level is the 0-d `cumulative_length` tensor itself: a value leaf,
    # read where it lives (no device sync); max_cache_len is in the context (a static dim).
    CacheSpec("StaticLayer", layer=True, fields=_LAYER_FIELDS, parts=("kv", "static")),
    # Linear-attention and state-space layers (Mamba, Bamba, Jamba, Falcon-H1, Qwen3-Next, ...).
    CacheSpec("LinearAttentionLayer", layer=True, parts=("linear",)),
    CacheSpec(
        "LinearAttentionAndFullAttentionLayer",
        layer=True,
        fields=_LAYER_FIELDS,
        parts=("kv", "linear"),
    ),
    CacheSpec(
        "LinearAttentionAndSlidingWindowAttentionLayer",
        layer=True,
        fields=_LAYER_FIELDS,
        parts=("kv", "window", "linear"),
    ),
    CacheSpec(
        "LinearAttentionAndStaticFullAttentionLayer",
        layer=True,
        fields=_LAYER_FIELDS,
        parts=("kv", "static", "linear"),
    ),
    # Holds nothing (a layer sharing another's keys and values, or without attention).
    CacheSpec("DummyLayer", layer=True),
    CacheSpec(
        "StaticSlidingWindowLayer",
        layer=True,
        reason=_STATIC_WINDOW,
    ),
    CacheSpec(
        "LinearAttentionAndStaticSlidingWindowAttentionLayer",
        layer=True,
        reason=_STATIC_WINDOW,
    ),
    CacheSpec(
        "LinearAttentionCacheLayerMixin",
        layer=True,
        reason="an abstract base class: transformers never puts one in a cache",
    ),
    *_unsupported_layers(_INDEXED, "DynamicIndexedLayer", "StaticIndexedLayer"),
    *_unsupported_layers(
        _QUANTIZED,
        "BaseQuantizedLayer",
        "QuantizedLayer",
        "QuantoQuantizedLayer",
        "HQQQuantizedLayer",
        "Fp8QuantizedLayer",
    ),
    CacheSpec(
        "QuantizedCache", reason="quantized layers are not flattened (no pytree registration)"
    ),
    CacheSpec("MtpCache", reason=_DRAFT),
    CacheSpec("DFlashCache", reason=_DRAFT),
)

# Why module state: like torch's pytree registry, the table is process-wide; readers take a
# plain dict lookup (string_type, unflattening), writers the lock.
_LOCK = threading.Lock()
_SPECS: dict[str, CacheSpec] = {spec.name: spec for spec in _BUILTIN}
# Argument names ending in "cache"/"caches" are cache arguments whatever the class.
_ARGUMENT_SUFFIX = re.compile(r"^.*caches?$", re.IGNORECASE)
_STATEFUL = ("DynamicSlidingWindowLayer",)


def register_cache(
    cls_or_name: type | str,
    *,
    module: str | None = None,
    layer: bool = False,
    flatten: str | None = None,
    fields: Sequence[str] = (),
    reason: str | None = None,
    arguments: Iterable[str] = (),
    parts: Sequence[str] = (),
) -> CacheSpec:
    """Adds a cache (or layer) class to the registry.

    The flattening takes a new ``flatten`` entry into account from the next
    `register_flattening_functions` block or `Recorder` start.

    Args:
        cls_or_name: The class, or its name (``type(obj).__name__``).
        module: The module holding the class (default: the class's own module, or
            ``transformers.cache_utils`` for a name).
        layer: The class is a layer of a cache, not a cache.
        flatten: ``"layers"``, ``"encoder_decoder"`` or None; see `CacheSpec`.
        fields: What `string_type` prints (`KEY_VALUE` or attribute names).
        reason: Why capture cannot round-trip the class exactly, or None.
        arguments: Argument names models pass the cache under.
        parts: For a layer, the state it holds (`LAYER_PARTS`; see `CacheSpec`). A layer
            registered without parts holds nothing capture reads.

    Returns:
        The registered `CacheSpec`.

    Raises:
        CaptureError: The name is already registered, ``flatten`` is unknown, or given for
            a layer, or ``parts`` names an unknown part or is given for a cache.

    Example:
        >>> spec = register_cache("MyCache", module="my_models", fields=("state",))
        >>> cache_spec("MyCache").fields
        ('state',)
        >>> register_cache("MyCache")
        Traceback (most recent call last):
        ...
        capture.errors.CaptureError: cache class MyCache is already registered ...
        >>> unregister_cache("MyCache")
    """
    if isinstance(cls_or_name, str):
        name, owner = cls_or_name, module or "transformers.cache_utils"
    else:
        name, owner = cls_or_name.__name__, module or cls_or_name.__module__
    if flatten is not None and layer:
        raise CaptureError(
            f"register_cache({name!r}): a layer is flattened by its cache; pass flatten=None"
        )
    if flatten is not None and flatten not in _FLATTENINGS:
        raise CaptureError(
            f"register_cache({name!r}): flatten={flatten!r} is not one of {_FLATTENINGS}; "
            "register other classes with torch.utils._pytree.register_pytree_node"
        )
    unknown = [p for p in parts if p not in LAYER_PARTS]
    if unknown or (parts and not layer):
        raise CaptureError(
            f"register_cache({name!r}): parts={tuple(parts)!r} must name parts of a layer "
            f"(layer=True), among {LAYER_PARTS}"
        )
    ordered = tuple(p for p in LAYER_PARTS if p in parts)
    spec = CacheSpec(name, owner, layer, flatten, tuple(fields), reason, tuple(arguments), ordered)
    with _LOCK:
        known = _SPECS.get(name)
        if known is not None:
            raise CaptureError(
                f"cache class {name} is already registered (from {known.module}); "
                "call capture.pytree.cachespec.unregister_cache first to replace it"
            )
        _SPECS[name] = spec
    return spec


def unregister_cache(name: str) -> None:
    """Removes a class from the registry (a no-op when it is absent).

    Args:
        name: The class name given to `register_cache`.
    """
    with _LOCK:
        _SPECS.pop(name, None)


def cache_spec(name: str) -> CacheSpec | None:
    """The spec registered under a class name, or None.

    Args:
        name: A class name (``type(obj).__name__``).

    Returns:
        Its `CacheSpec`, or None.

    Example:
        >>> cache_spec("DynamicCache").flatten
        'layers'
    """
    return _SPECS.get(name)


def cache_specs() -> list[CacheSpec]:
    """Every registered spec, built-in ones first, in registration order."""
    return list(_SPECS.values())


def is_cache_argument(name: str) -> bool:
    """Tells whether an argument of this name carries a cache (drives decode/prefill names).

    Args:
        name: A top-level argument name.

    Returns:
        True for a registered cache argument name (``past_key_values``, ``cache_params``,
        ...) or a name ending in ``cache``/``caches``; case does not matter.

    Example:
        >>> is_cache_argument("past_key_values"), is_cache_argument("input_ids")
        (True, False)
    """
    if _ARGUMENT_SUFFIX.match(name) is not None:
        return True
    lowered = name.lower()
    return any(lowered == a.lower() for spec in _SPECS.values() for a in spec.arguments)


_COUNTERS = (".cumulative_length[", ".seen_tokens")


def is_cache_counter(path: str) -> bool:
    """Tells whether a leaf path is a cache's fill level, not its state.

    A static cache holds its fill level tensors before its first update (a prefill), so the
    analysis does not count them as cache state when it names groups ``prefill``/``decode``.

    Args:
        path: A leaf path (``kwargs['past_key_values'].cumulative_length[0]``).

    Returns:
        True for a static layer's ``cumulative_length`` or a window's ``seen_tokens`` leaf.

    Example:
        >>> is_cache_counter("kwargs['past_key_values'].cumulative_length[0]")
        True
    """
    return any(c in path for c in _COUNTERS)


def _supported_caches() -> tuple[str, ...]:
    specs = _SPECS.values()
    return tuple(s.name for s in specs if not s.layer and s.flatten and s.reason is None)


def _supported_layers() -> tuple[str, ...]:
    return tuple(s.name for s in _SPECS.values() if s.layer and s.reason is None)


def _unsupported() -> dict[str, str]:
    return {s.name: s.reason for s in _SPECS.values() if s.reason is not None}


def __getattr__(name: str) -> Any:
    # The historical constants, computed from the live table (one list of classes).
    if name == "SUPPORTED_CACHES":
        return _supported_caches()
    if name == "SUPPORTED_LAYERS":
        return _supported_layers()
    if name == "UNSUPPORTED":
        return _unsupported()
    raise AttributeError(f"module 'capture.pytree.cachespec' has no attribute {name!r}")


def _reason(name: str) -> str | None:
    spec = _SPECS.get(name)
    return None if spec is None else spec.reason


def unsupported_reason(structure: RecordedStructure) -> str | None:
    """Why a recorded structure holds cache state we cannot rebuild exactly, or None.

    Reads the typed structure (`capture.pytree.recorded_structure`): an opaque leaf of an
    unsupported class, or a layer of one in a cache's treespec context (the treespec parsed
    with its protocol checked; one that cannot be parsed names no layer).

    Args:
        structure: The recorded structure (`capture.analysis.groups.Group.structure`).

    Returns:
        ``"<path>: <Class> <reason>"`` for the first such class, or None.

    Example:
        >>> from capture.pytree.recorded_structure import RecordedLeaf, RecordedStructure
        >>> unsupported_reason(RecordedStructure("s", "m", (RecordedLeaf(0, "x", None, None,
        ...     "tensor", "Tensor"),))) is None
        True
    """
    for leaf in structure.leaves:
        name = str(leaf.type or "").rsplit(".", 1)[-1]
        reason = _reason(name)
        if leaf.kind == schema.KIND_OPAQUE and reason is not None:
            return f"{leaf.path}: {name}: {reason}"
    if not structure.treespec:
        return None
    try:
        stack = [structure.tree]
    except CaptureError:  # a treespec we cannot read names no layer; the rebuild says why
        return None
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        kind = node.type or ""
        if not kind.startswith("transformers."):
            continue
        try:
            context = untrusted.loads(node.context or "null")
        except (TypeError, ValueError):
            continue
        for layer in context if isinstance(context, list) else []:
            stateful = isinstance(layer, list) and layer and layer[0] in (*_STATEFUL, "StaticLayer")
            if stateful and len(layer) < 3:
                return _stateless(kind, str(layer[0]), structure.schema_version)
            reason = _reason(layer[0]) if isinstance(layer, list) and layer else None
            if reason is not None:
                cache = kind.rsplit(".", 1)[-1]
                return f"a {cache} layer: {layer[0]}: {reason}"
    return None


def _stateless(kind: str, layer: str, version: int) -> str:
    """Why a cache layer recorded without its state (fill level) cannot be rebuilt, by the store
    version its structure was recorded under: version 1 stores did not record it (for sliding
    windows and static layers both), a later one always does."""
    cache = kind.rsplit(".", 1)[-1]
    if version < 2:
        return (
            f"a {cache} layer: {layer} was recorded without its fill level (a store of version "
            f"{version}, written by an older capture); record again"
        )
    return (
        f"a {cache} layer: {layer} has no fill level, which every store of version {version} "
        "records: the store's structures file is corrupt; record again"
    )


_CONTAINERS = ("builtins.list", "builtins.tuple", "builtins.dict")


def blocking_reason(structure: RecordedStructure) -> str | None:
    """Why a recorded group cannot be rebuilt (so not exported), naming the class; or None.

    Every call is recorded, also one holding something capture cannot read: that
    part is an opaque leaf naming its class. This says, per group, which class blocks export
    and why: a class the cache registry refuses (`unsupported_reason`), or any other opaque
    leaf (no pytree registration, a flattening that failed, a container too large to record).
    `replay.export` reports the group's signatures not covered with this text, and
    ``capture summary`` / ``capture report`` show it per group.

    Args:
        structure: The recorded structure of the group.

    Returns:
        ``"cache state not reproducible: ..."`` or ``"not reproducible: ..."``, or None.

    Example:
        >>> from capture.pytree.recorded_structure import RecordedLeaf, RecordedStructure
        >>> blocking_reason(RecordedStructure("s", "m", (RecordedLeaf(0, "kwargs['state']",
        ...     "state", None, "opaque", "my_models.Memory"),)))
        ... # doctest: +NORMALIZE_WHITESPACE +ELLIPSIS
        "not reproducible: kwargs['state'] is a my_models.Memory, recorded by its class name
        only: ... register it ..."
    """
    reason = unsupported_reason(structure)
    if reason is not None:
        return f"cache state not reproducible: {reason}"
    for leaf in structure.leaves:
        if leaf.kind != schema.KIND_OPAQUE:
            continue
        if leaf.type in _CONTAINERS:
            why = (
                "it held too many items to record leaf by leaf (capture.record.flatten."
                "MAX_ITEMS); pass fewer items, or export it by other means"
            )
        else:
            why = (
                "capture cannot flatten it (no torch pytree registration, or its flattening "
                "failed); register it with capture.register_cache or "
                "torch.utils._pytree.register_pytree_node, then record again"
            )
        return (
            f"not reproducible: {leaf.path} is a {leaf.type}, recorded by its class name "
            f"only: {why}"
        )
    return None
