"""Integer value ranges and token counts of a call, read without a device sync.

A CPU tensor is read where it is (`int_range`, `tokens.count_ids`): no sync is involved. A
tensor on an accelerator is different: reading a value back blocks the serving thread until the
device has run everything queued before it. For those (`DeviceRanges`) the recorder only
queues work: the min and max (``aminmax``) and the token counts are computed on the device
into one small int64 vector, copied to pinned host memory with ``non_blocking=True`` on the
tensor's current stream, and an event is recorded behind the copy. The writer thread waits for
that event and reads the values (`resolve`), off the model's path. A static cache's fill level
on CUDA is recorded this way; so are the value ranges of every tracked device tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from capture.record.tokens import count_ids

__all__ = ["DeviceRanges", "int_range", "ranges", "resolve"]

# Integer dtypes torch.aminmax does not implement on CPU: widened to int64 first (exact).
_WIDEN = {getattr(torch, n) for n in ("uint16", "uint32") if hasattr(torch, n)}
_INT64 = torch.int64
_SMALL = 16


def int_range(t: torch.Tensor) -> tuple[int | None, int | None]:
    """(min, max) of a CPU integer tensor; (None, None) when empty."""
    n = t.numel()
    if n == 0:
        return None, None
    if n <= _SMALL:
        # One aminmax is a few microseconds of dispatch; for a decode step's (1, 1) input_ids
        # reading the few values back is cheaper.
        values: Any = t.tolist()
        if t.dim() == 0:
            return int(values), int(values)
        for _ in range(t.dim() - 1):
            values = [v for row in values for v in row]
        return int(min(values)), int(max(values))
    if t.dtype in _WIDEN:
        t = t.to(_INT64)
    lo, hi = torch.aminmax(t)
    return int(lo), int(hi)


def ranges(
    tensors: Sequence[torch.Tensor],
    positions: Sequence[int],
    counts: Sequence[tuple[int, tuple[int, ...], torch.Tensor]],
) -> tuple[list[int | None], list[int | None]]:
    """(minimums, maximums) of the tracked CPU tensors, then their special token counts.

    Args:
        tensors: The call's tensors.
        positions: The tracked ones (`Structure.range_tensors`).
        counts: `Structure.counts`.
    """
    lows: list[int | None] = []
    highs: list[int | None] = []
    for i in positions:
        lo, hi = int_range(tensors[i])
        lows.append(lo)
        highs.append(hi)
    for i, ids, _table in counts:
        found: list[int | None] = list(count_ids(tensors[i], ids))
        lows += found
        highs += found
    return lows, highs


# The special ids on each device, copied there once (a copy per call would wait for the host).
_TABLES: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}


def _on(table: torch.Tensor, ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    found = _TABLES.get((ids, device))
    if found is None:
        found = _TABLES[(ids, device)] = table.to(device)
    return found


class DeviceRanges:
    """The value ranges and counts of one call's device tensors, read by the writer thread.

    Stands for both the ``int_min`` and ``int_max`` lists of a call record until `resolve`.

    Args:
        tensors: The call's tensors.
        positions: The tracked ones.
        counts: `Structure.counts`.

    Example:
        >>> rows = DeviceRanges([torch.tensor([[3, 9]])], [0], ())
        >>> resolve(rows, rows)
        ([3], [9])
    """

    __slots__ = ("_empty", "_event", "_host", "_n_ranges")

    def __init__(
        self,
        tensors: Sequence[torch.Tensor],
        positions: Sequence[int],
        counts: Sequence[tuple[int, tuple[int, ...], torch.Tensor]],
    ) -> None:
        parts: list[torch.Tensor] = []
        self._empty: list[bool] = []
        device: torch.device | None = None
        for i in positions:
            t = tensors[i]
            empty = t.numel() == 0  # metadata: no sync
            self._empty.append(empty)
            if empty:
                continue
            device = device or t.device
            t = t.to(_INT64) if t.dtype in _WIDEN else t
            lo, hi = torch.aminmax(t)
            parts += [lo.reshape(1).to(_INT64), hi.reshape(1).to(_INT64)]
        self._n_ranges = len(parts)
        for i, ids, table in counts:
            t = tensors[i]
            device = device or t.device
            parts.append((t.reshape(-1, 1) == _on(table, ids, t.device)).sum(0).to(_INT64))
        self._event: Any = None
        if not parts:
            self._host = torch.zeros(0, dtype=_INT64)
            return
        packed = torch.cat([p.to(device) for p in parts])
        if packed.device.type == "cpu":
            self._host = packed
            return
        # A D2H copy with non_blocking lands in pinned memory and returns at once.
        self._host = packed.to("cpu", non_blocking=True)
        try:
            self._event = torch.Event(device=packed.device)
            self._event.record()
        except (RuntimeError, TypeError, ValueError):  # a device without events: read now
            torch.accelerator.synchronize(packed.device)

    def values(self) -> tuple[list[int | None], list[int | None]]:
        """Waits for the device (the writer thread does) and returns (minimums, maximums)."""
        if self._event is not None:
            self._event.synchronize()
        flat: list[int] = self._host.tolist()
        lows: list[int | None] = []
        highs: list[int | None] = []
        at = 0
        for empty in self._empty:
            if empty:
                lows.append(None)
                highs.append(None)
            else:
                lows.append(flat[at])
                highs.append(flat[at + 1])
                at += 2
        counts: list[int | None] = list(flat[self._n_ranges :])
        return lows + counts, highs + counts


def resolve(mins: Any, maxs: Any) -> tuple[Any, Any]:
    """A call record's ``int_min``/``int_max`` as lists: `DeviceRanges` read, others as they are.

    Args:
        mins: The record's minimums (a list, None, or a `DeviceRanges`).
        maxs: The record's maximums (the same `DeviceRanges` when deferred).

    Returns:
        ``(mins, maxs)``.
    """
    if type(mins) is DeviceRanges:
        return mins.values()
    return mins, maxs
