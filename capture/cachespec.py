"""Which transformers cache and layer classes capture round-trips exactly, and which not (issue 9).

One table read by the flattening (`capture.nodes`), by replay's coverage (a group holding an
unsupported class is reported not covered, with the reason) and by the enumeration test that
fails when transformers ships a class that is in neither list.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

_STATEFUL = ("DynamicSlidingWindowLayer",)

__all__ = ["SUPPORTED_CACHES", "SUPPORTED_LAYERS", "UNSUPPORTED", "unsupported_reason"]

# Layer classes whose forward-relevant state the flattening carries exactly (issue 9). The
# enumeration test (tests/test_fidelity_caches.py) fails when transformers ships a cache or layer
# class that is in neither table.
SUPPORTED_LAYERS = ("DynamicLayer", "DynamicSlidingWindowLayer")
SUPPORTED_CACHES = ("DynamicCache", "StaticCache", "EncoderDecoderCache")
"""Registered cache classes; their layers are judged by `SUPPORTED_LAYERS` / `UNSUPPORTED`."""
_QUANTIZED = "its quantized states are not tensors torch.export can take"
_LINEAR = "its convolution and recurrent states are not flattened"
_INDEXED = "its indexer keys and positions are not flattened"
_DRAFT = "its draft-model state is not flattened (no pytree registration)"
UNSUPPORTED: dict[str, str] = {
    "StaticLayer": (
        "its fill level (cumulative_length, a device tensor) is not recorded: reading it costs "
        "a device sync per call, and a leaf for it would change the seed-compatible flattening"
    ),
    "StaticSlidingWindowLayer": (
        "its Python-int fill level (cumulative_length_int) selects the update path and cannot "
        "be an input of an exported program"
    ),
    "DynamicIndexedLayer": _INDEXED,
    "StaticIndexedLayer": _INDEXED,
    "BaseQuantizedLayer": _QUANTIZED,
    "QuantizedLayer": _QUANTIZED,
    "QuantoQuantizedLayer": _QUANTIZED,
    "HQQQuantizedLayer": _QUANTIZED,
    "Fp8QuantizedLayer": _QUANTIZED,
    "LinearAttentionCacheLayerMixin": _LINEAR,
    "LinearAttentionLayer": _LINEAR,
    "LinearAttentionAndFullAttentionLayer": _LINEAR,
    "LinearAttentionAndSlidingWindowAttentionLayer": _LINEAR,
    "LinearAttentionAndStaticFullAttentionLayer": _LINEAR,
    "LinearAttentionAndStaticSlidingWindowAttentionLayer": _LINEAR,
    "QuantizedCache": "quantized layers are not flattened (no pytree registration)",
    "MtpCache": _DRAFT,
    "DFlashCache": _DRAFT,
}
"""Cache and layer classes we cannot round-trip exactly -> why (reported as not covered)."""


def unsupported_reason(leaves: Sequence[dict[str, Any]]) -> str | None:
    """Why a recorded structure holds cache state we cannot rebuild exactly, or None.

    Reads the structure rows (``structures`` view): an opaque leaf of an `UNSUPPORTED` class, or
    a layer of one in a cache's treespec context.

    Args:
        leaves: The structure's rows, each with ``kind``, ``type``, ``path`` and ``treespec``.

    Returns:
        ``"<path>: <Class> <reason>"`` for the first such class, or None.

    Example:
        >>> unsupported_reason([{"kind": "tensor", "type": "Tensor", "path": "x",
        ...                      "treespec": None}]) is None
        True
    """
    for row in leaves:
        name = str(row.get("type") or "").rsplit(".", 1)[-1]
        if row.get("kind") == "opaque" and name in UNSUPPORTED:
            return f"{row.get('path')}: {name}: {UNSUPPORTED[name]}"
    treespec = leaves[0].get("treespec") if leaves else None
    if not treespec:
        return None
    try:
        loaded = json.loads(str(treespec))
    except ValueError:
        return None
    stack = [loaded[1] if isinstance(loaded, list) and len(loaded) == 2 else loaded]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        stack.extend(node.get("children_spec") or [])
        kind = str(node.get("type") or "")
        if not kind.startswith("transformers."):
            continue
        try:
            context = json.loads(node.get("context") or "null")
        except ValueError:
            continue
        for layer in context if isinstance(context, list) else []:
            if isinstance(layer, list) and layer and layer[0] in _STATEFUL and len(layer) < 3:
                # Recorded before capture kept the window's fill level (schema v1 stores).
                return (
                    f"a {kind.rsplit('.', 1)[-1]} layer: {layer[0]} was recorded without its "
                    "fill level (a store written before capture 'issue 9'); record again"
                )
            if isinstance(layer, list) and layer and layer[0] in UNSUPPORTED:
                cache = kind.rsplit(".", 1)[-1]
                return f"a {cache} layer: {layer[0]}: {UNSUPPORTED[layer[0]]}"
    return None
