"""Integer inputs rebuilt in the patterns production sent them.

`replay.inputs.rebuild` fills integer tensors uniformly in their recorded range; a model then takes
paths production never took (no padding) or impossible ones (positions unrelated to the mask).
`apply` rewrites the rebuilt leaves of one call, in place, before they are unflattened:

- **padded masks**: a 2-D integer mask whose recorded minimum is 0 gets padded rows. Row 0 is
  left-padded (as a tokenizer pads a batch for generate(), the newest token is never padded);
  row 1, when the call carries no cache (a prefill or an encoder call, where the mask covers
  only the call's own tokens), is right-padded. A third of the row is padding, never all of it;
  the other rows are all ones. The store keeps no per-row facts, so this is the pattern of a
  left-padded batch (and a right-padded one without cache), not the exact rows of the call.
- **positions** agree with the mask and the cache: ``position_ids`` are generate()'s
  ``cumsum(mask) - 1`` (padding at 1) over the last ``q`` columns when a self-attention mask of
  length ``past + q`` is present, else ``past .. past + q - 1``; ``cache_position`` is
  ``past .. past + q - 1``. ``past`` is a static cache's recorded fill level, else the
  cache's ``seen_tokens`` length (a sliding window), else its keys' length, else the mask
  length minus ``q``, else 0.
- **fill levels**: every layer of a static cache holds the recorded fill level of its first
  layer (only that one's value is recorded; all layers advance alike).
- token ids stay uniform within their recorded range; the special ids the model counts are
  placed as recorded (`replay.inputs.tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from capture.pytree import nodes

if TYPE_CHECKING:
    from capture.pytree.recorded_structure import RecordedLeaf

__all__ = ["apply", "past_length"]

_KEY_CACHE = ".key_cache["
_SEEN = f".{nodes.SEEN_TOKENS}"
_FILL = f".{nodes.FILL_LEVEL}["


def _pad_rows(mask: torch.Tensor, right: bool) -> None:
    """Left-pads row 0 (and right-pads row 1 when `right`) of a 2-D mask, in place."""
    n = mask.shape[-1]
    if n < 2:
        return
    pad = max(1, n // 3)
    mask[0, :pad] = 0
    if right and mask.shape[0] > 1:
        mask[1, n - pad :] = 0


def past_length(rows: Sequence[RecordedLeaf], values: Sequence[Any]) -> int | None:
    """Tokens the rebuilt cache has seen, or None when the call carries no cache tensor."""
    keys = None
    for row, value in zip(rows, values, strict=True):
        if not isinstance(value, torch.Tensor):
            continue
        path = row.path
        if _FILL in path and value.dim() == 0:
            return int(value)
        if path.endswith(_SEEN):
            return int(value.shape[0])
        if keys is None and _KEY_CACHE in path and value.dim() == 4:
            keys = int(value.shape[-2])
    return keys


def _argument(row: RecordedLeaf) -> str:
    return row.argument or ""


def apply(
    rows: Sequence[RecordedLeaf],
    values: list[Any],
    lows: Sequence[int | None],
) -> None:
    """Rewrites masks, positions and cache positions of one rebuilt call in place.

    Args:
        rows: The structure's leaves present in the call, in leaf order.
        values: The rebuilt leaf values, aligned with `rows` (tensors are modified in place).
        lows: The recorded minimum of each integer leaf, by ``range_index``.
    """
    _same_fill_levels(rows, values)
    past = past_length(rows, values)
    mask: torch.Tensor | None = None
    for row, value in zip(rows, values, strict=True):
        if not _is_int_matrix(value) or "mask" not in _argument(row).lower():
            continue
        index = row.range_index
        low = lows[index] if index is not None and index < len(lows) else None
        if low == 0:
            _pad_rows(value, right=past is None)
        if mask is None and _argument(row) == "attention_mask":
            mask = value
    for row, value in zip(rows, values, strict=True):
        if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point:
            continue
        name = _argument(row)
        if name == "position_ids" and value.dim() == 2:
            value.copy_(_positions(value, mask, past))
        elif name == "cache_position" and value.dim() == 1:
            q = value.shape[0]
            start = past if past is not None else _mask_past(mask, q)
            value.copy_(torch.arange(start, start + q, dtype=value.dtype))


def _same_fill_levels(rows: Sequence[RecordedLeaf], values: list[Any]) -> None:
    """Gives every static layer of a cache the fill level recorded for its first one."""
    levels: dict[str, torch.Tensor] = {}
    for row, value in zip(rows, values, strict=True):
        at = row.path.find(_FILL)
        if at < 0 or not isinstance(value, torch.Tensor):
            continue
        cache = row.path[:at]
        if row.range_index is not None:
            levels[cache] = value
        elif cache in levels:
            value.copy_(levels[cache])


def _is_int_matrix(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.dim() == 2
        and not value.dtype.is_floating_point
        and value.dtype != torch.bool
    )


def _mask_past(mask: torch.Tensor | None, q: int) -> int:
    return max(int(mask.shape[-1]) - q, 0) if mask is not None else 0


def _positions(value: torch.Tensor, mask: torch.Tensor | None, past: int | None) -> torch.Tensor:
    """generate()'s position ids for a call of ``q = value.shape[1]`` new tokens."""
    q = value.shape[1]
    start = past if past is not None else _mask_past(mask, q)
    if mask is not None and mask.shape[-1] == start + q and mask.shape[0] == value.shape[0]:
        positions = mask.long().cumsum(-1) - 1
        positions = positions.masked_fill(mask == 0, 1)[:, -q:]
    else:
        positions = torch.arange(start, start + q).expand(value.shape[0], q)
    return positions.to(value.dtype)
