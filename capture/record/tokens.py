"""Special token counts, the recorder's side: the token ids that matter beyond their range.

A vision-language model counts its placeholder tokens: Qwen2-VL's forward requires exactly as
many ``image_token_id`` tokens in ``input_ids`` as the image features it receives. A value range
does not say how many there were, so a rebuilt ``input_ids`` held none and eager itself refused
it. The recorder therefore counts, in every token-id input whose value range it records, each
id the model's config names as special (`special_token_ids`): a few integers per call, appended
to the call's ``int_min``/``int_max`` lists after the value ranges (min = max = the count), so
the store's rollups and signatures carry them unchanged. The structure says where: the token
leaf's ``value`` column holds ``{"counts": {"<id>": <item index>}}`` (docs/schema.md).
`replay.inputs.tokens` places the counted ids back into a rebuilt ``input_ids``.

Counting costs one Python pass over a decode step's few ids, or one comparison kernel for a
prefill; models without special ids in their config count nothing.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "COUNTS",
    "MAX_SPECIAL_IDS",
    "count_ids",
    "is_token_argument",
    "special_token_ids",
    "token_counts",
]

COUNTS = "counts"
"""Key of the token leaf's ``value`` JSON: id -> index of its count in ``int_min``/``int_max``."""

MAX_SPECIAL_IDS = 8
"""Most special ids counted per token input (a config naming more is cut, in name order)."""

_GENERIC = ("bos_", "eos_", "pad_", "decoder_start_", "sep_", "cls_", "unk_", "mask_")
_SUFFIXES = ("_token_id", "_token_index")
_SUB_CONFIGS = ("text_config", "vision_config", "audio_config")
_SMALL = 16


def _config_ids(config: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, value in sorted(vars(config).items()):
        if not name.endswith(_SUFFIXES) or name.startswith(_GENERIC):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[name] = value
    return out


def special_token_ids(model: Any) -> tuple[int, ...]:
    """The placeholder ids a model's config names (image, video, audio, vision start/end, ...).

    Every int instance attribute of ``model.config`` (and its text, vision and audio
    sub-configs; properties are not evaluated) named
    ``*_token_id`` or ``*_token_index``, except the generic ones (bos, eos, pad, decoder start,
    sep, cls, unk, mask): those the model counts or locates. At most `MAX_SPECIAL_IDS`.

    Args:
        model: The recorded object (a transformers model has a ``config``; others have none).

    Returns:
        The distinct ids, in attribute-name order; empty without a config.

    Example:
        >>> from types import SimpleNamespace
        >>> model = SimpleNamespace(config=SimpleNamespace(image_token_id=151655, bos_token_id=1))
        >>> special_token_ids(model)
        (151655,)
    """
    config = getattr(model, "config", None)
    if config is None:
        return ()
    found = _config_ids(config)
    for sub in _SUB_CONFIGS:
        nested = getattr(config, sub, None)
        if nested is not None and nested is not config:
            found.update({f"{sub}.{k}": v for k, v in _config_ids(nested).items()})
    ids: list[int] = []
    for value in found.values():
        if value not in ids:
            ids.append(value)
    return tuple(ids[:MAX_SPECIAL_IDS])


def is_token_argument(name: str | None) -> bool:
    """Tells whether an argument carries token ids (``input_ids``, ``decoder_input_ids``).

    Example:
        >>> is_token_argument("decoder_input_ids"), is_token_argument("position_ids")
        (True, False)
    """
    return bool(name) and str(name).endswith("input_ids")


def count_ids(t: torch.Tensor, ids: Sequence[int]) -> list[int]:
    """How many times each of `ids` occurs in `t` (a CPU integer tensor).

    Args:
        t: The token ids.
        ids: The ids to count.

    Returns:
        One count per id.
    """
    flat = t.reshape(-1)
    if flat.numel() > _SMALL:
        # A prefill: keep the ids within the band the special ids span (placeholder ids sit
        # together, so that is usually a few), then count those in Python; twice as fast as
        # comparing every id with every special id (bench/bench_families.py).
        flat = flat[(flat >= min(ids)) & (flat <= max(ids))]
    values = flat.tolist()
    return [values.count(i) for i in ids]


def token_counts(
    leaves: list[Any], tensor_of: dict[int, int], n_ranges: int, ids: Sequence[int]
) -> tuple[list[Any], tuple[tuple[int, tuple[int, ...], torch.Tensor], ...]]:
    """Marks the token leaves whose special ids are counted, and where their counts go.

    Args:
        leaves: A structure's leaves (`capture.pytree.recorded_structure.RecordedLeaf`),
            argument names filled.
        tensor_of: Leaf index -> position of that tensor in the call's tensor list.
        n_ranges: Value range items a call has before the counts.
        ids: `special_token_ids` of the model.

    Returns:
        ``(leaves, counts)``: the leaves with ``value`` set on each counted token leaf, and
        per counted leaf ``(tensor position, ids, torch.tensor(ids))``, in item order.
    """
    if not ids:
        return leaves, ()
    out = list(leaves)
    counts: list[tuple[int, tuple[int, ...], torch.Tensor]] = []
    item = n_ranges
    for index, leaf in enumerate(leaves):
        if (
            leaf.range_index is None
            or not leaf.rank
            or not is_token_argument(leaf.argument)
            or index not in tensor_of
        ):
            continue
        where = {str(i): item + k for k, i in enumerate(ids)}
        out[index] = dataclasses.replace(leaf, value=json.dumps({COUNTS: where}))
        counts.append((tensor_of[index], tuple(ids), torch.tensor(ids, dtype=torch.int64)))
        item += len(ids)
    return out, tuple(counts)
