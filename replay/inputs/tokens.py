"""Special token counts, the replay's side: the ids put back into a rebuilt ``input_ids``.

The recorder counts, per call, each id the model's config names as special in every token
input whose value range it records (`capture.record.tokens`); the counts sit after the value
ranges in ``int_min``/``int_max`` and the token leaf's ``value`` says which item is which id.
A rebuilt ``input_ids`` is drawn uniformly within its range, so it would hold those ids by
chance or not at all (Qwen2-VL's eager forward then refuses an image prefill: "Image features
and image tokens do not match"). `place` first replaces every special id the draw produced by an
ordinary id of the range, then writes each id as many times as recorded, in the config's order,
spread over the rows (the first rows take one more when it does not divide), one block per row
away from the row ends that `replay.inputs.patterns` pads. Where the ids sit inside a row is not
recorded; only how many there are, which is what the models that count them check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from capture import untrusted
from capture.errors import ReplayError
from replay.inputs import select

if TYPE_CHECKING:
    from capture.pytree.recorded_structure import RecordedLeaf, RecordedStructure

__all__ = ["counted_ids", "place", "probe_ranges"]

_COUNTS = "counts"  # capture.record.tokens.COUNTS (that module imports torch at record time)


def counted_ids(leaf: RecordedLeaf) -> dict[int, int]:
    """``{special id: item index}`` of a token leaf whose special ids were counted, else {}.

    Raises:
        ReplayError: The leaf's ``value`` is not the JSON the recorder writes.

    Example:
        >>> from capture.pytree.recorded_structure import RecordedLeaf
        >>> counted_ids(RecordedLeaf(0, "kwargs['input_ids']", "input_ids", None, "tensor",
        ...     "Tensor", value='{"counts": {"151655": 3}}'))
        {151655: 3}
    """
    if leaf.value is None or leaf.kind != "tensor":
        return {}
    try:
        loaded = untrusted.loads(leaf.value)
        items = loaded[_COUNTS]
        return {int(k): int(v) for k, v in items.items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        raise ReplayError(
            f"{leaf.path}: the recorded token counts are not the JSON capture writes"
        ) from None


def _filler(low: int, high: int, specials: set[int]) -> int | None:
    """An id within ``[low, high]`` that is not special, or None."""
    for candidate in (low, high, (low + high) // 2):
        if candidate not in specials:
            return candidate
    for candidate in range(low, min(high, low + len(specials) + 1) + 1):
        if candidate not in specials:
            return candidate
    return None


def _spread(count: int, rows: int) -> list[int]:
    return [count // rows + (1 if r < count % rows else 0) for r in range(rows)]


def place(
    rows: Sequence[RecordedLeaf],
    values: list[Any],
    lows: Sequence[int | None],
    highs: Sequence[int | None],
) -> None:
    """Writes the recorded special ids into the rebuilt token tensors of one call, in place.

    Args:
        rows: The structure's leaves present in the call, in leaf order.
        values: The rebuilt leaf values, aligned with `rows`.
        lows: The signature's minimums (value ranges, then counts).
        highs: Its maximums; a count is the maximum recorded for the signature.

    Raises:
        ReplayError: The counts do not fit the tensor, or the store's JSON is malformed.
    """
    for row, value in zip(rows, values, strict=True):
        ids = counted_ids(row)
        if not ids or not isinstance(value, torch.Tensor) or value.dim() == 0:
            continue
        index = row.range_index
        low = lows[index] if index is not None and index < len(lows) else None
        high = highs[index] if index is not None and index < len(highs) else None
        counts = {i: highs[item] if item < len(highs) else None for i, item in ids.items()}
        if any(c is None for c in counts.values()):
            continue  # recorded without counts (another signature's rows): nothing to place
        _place(row.path, value, counts, low, high)


def _place(
    path: str, value: torch.Tensor, counts: dict[int, Any], low: int | None, high: int | None
) -> None:
    specials = set(counts)
    lines = value.reshape(-1, value.shape[-1])
    if low is not None and high is not None:
        filler = _filler(int(low), int(high), specials)
        for i in specials:
            hit = lines == i
            if bool(hit.any()):
                if filler is None:
                    raise ReplayError(f"{path}: every id of its recorded range is special")
                lines[hit] = filler
    n_rows, width = lines.shape
    total = sum(int(c) for c in counts.values())
    if total > lines.numel():
        raise ReplayError(
            f"{path}: {total} special tokens were recorded in a tensor of {lines.numel()}"
        )
    sequence = [i for i, count in counts.items() for _ in range(int(count))]
    at = 0
    for r, k in enumerate(_spread(total, n_rows)):  # k <= width: total <= n_rows * width
        if not k:
            continue
        # Away from the row ends `replay.inputs.patterns` pads (a third of the row on each side).
        start = min(width // 3, width - k)
        block = torch.tensor(sequence[at : at + k], dtype=lines.dtype)
        lines[r, start : start + k] = block
        at += k


def probe_ranges(
    structure: RecordedStructure,
    ranges: Mapping[tuple[int, ...], select.Ranges],
    sizes: Sequence[int],
) -> select.Ranges | None:
    """`select.nearest_ranges`, with the special token counts a probe's sizes imply.

    A probe (an unseen size vector) takes the value ranges of the closest recorded signature;
    a count that equals one dynamic dim in every recorded signature (Qwen2-VL: its image tokens
    and the rows of the image features it receives) takes that dim's size in the probe, so
    eager is not handed features and tokens that disagree.

    Args:
        structure: The group's recorded structure.
        ranges: Its recorded value ranges per signature (`select.value_ranges`).
        sizes: The size vector to rebuild.

    Returns:
        ``(minimums, maximums)``, or None without recorded ranges.
    """
    found = select.nearest_ranges(ranges, sizes)
    key = tuple(int(s) for s in sizes)
    items = {item for leaf in structure.leaves for item in counted_ids(leaf).values()}
    if found is None or key in ranges or not items:
        return found
    lows, highs = list(found[0]), list(found[1])
    recorded = list(ranges.items())
    for item in sorted(items):
        if item >= len(highs):
            continue
        for j in range(len(key)):
            follows = all(
                item < len(r[1]) and r[1][item] == s[j] and r[0][item] == s[j] for s, r in recorded
            )
            if follows and len({s[j] for s, _ in recorded}) > 1:
                lows[item] = highs[item] = key[j]
                break
    return lows, highs
