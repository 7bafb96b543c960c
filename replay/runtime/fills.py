"""Inputs a program is given that the call did not pass: a group served by another's program.

generate() drops an all-ones ``attention_mask`` at batch 1, so a model's traffic splits into
groups that differ only by that optional input (``decode``, ``decode_no_attention_mask``).
Where the check proves it (`replay.pipeline.merging`), the group without the input is served by the
other group's program, the input **filled**: a constant tensor whose shape follows the call's
own sizes by the recorded relations (``attention_mask``: ``(batch, past + seq)``). A `Fill` is
that rule, as data: the argument's name, dtype and value, and per axis a sum of the call's
sizes plus an offset. `replay.inputs.exportgroup.ExportGroup.program_call` (the check) and the
runner `replay.load` returns (`fill_call`) apply the same rule, so what was proven is what runs.

A manifest's fills are parsed against what we write (`Fill.from_dict`): a malformed entry is
one `ArtifactError`, never evaluated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from replay.runtime.checked_json import NAME, Fields, read
from replay.runtime.guards import ArtifactError

__all__ = ["FillAxis", "Fill", "fill_call", "fills_of"]

_DTYPES = ("int64", "int32", "int16", "int8", "uint8")
"""The dtypes a fill may have: integer tensors (the only ones with recorded value ranges)."""
_DTYPE = re.compile(f"({'|'.join(_DTYPES)})\\Z")


@dataclass(frozen=True)
class FillAxis:
    """One axis of a filled input: ``sum(dims[i] for i in terms) + offset``.

    Attributes:
        terms: Indices into the call's size vector (every input tensor size in leaf order).
        offset: Added to the sum (the size itself when `terms` is empty).
    """

    terms: tuple[int, ...] = field(metadata={"low": 0, "max_items": 1024})
    offset: int = 0

    def size(self, dims: Sequence[int]) -> int:
        """The axis' size for a call with these sizes.

        Example:
            >>> FillAxis((0, 3), 1).size([2, 1, 9, 5])
            8
        """
        return sum(int(dims[i]) for i in self.terms) + self.offset


@dataclass(frozen=True)
class Fill:
    """An input the program takes and the call lacks: a constant tensor shaped by the call.

    Attributes:
        argument: The keyword the program takes it by (``attention_mask``).
        dtype: Its dtype name (`_DTYPES`).
        value: The constant every element holds.
        shape: One `FillAxis` per axis.
        text: How the rule reads (``ones of shape (batch, past_key_values_2 + 1)``), for notes.
    """

    argument: str = field(metadata={"pattern": NAME, "max_len": 256})
    dtype: str = field(metadata={"pattern": _DTYPE})
    value: int
    shape: tuple[FillAxis, ...] = field(metadata={"max_items": 64})
    text: str = ""

    def shape_for(self, dims: Sequence[int]) -> tuple[int, ...]:
        """The filled tensor's shape for a call with these sizes."""
        return tuple(axis.size(dims) for axis in self.shape)

    def tensor(self, dims: Sequence[int], device: Any = None) -> Any:
        """The filled tensor for a call with these sizes, on `device`.

        Example:
            >>> Fill("mask", "int64", 1, (FillAxis((0,)), FillAxis((1,), 1))).tensor([2, 3])
            tensor([[1, 1, 1, 1],
                    [1, 1, 1, 1]])
        """
        import torch

        dtype = getattr(torch, self.dtype)
        return torch.full(self.shape_for(dims), self.value, dtype=dtype, device=device)

    @classmethod
    def from_dict(cls, data: Any, width: int, where: str = "a manifest fill") -> Fill:
        """A fill read back from a manifest (`replay.runtime.checked_json.read`), its size
        indices checked against the call's.

        Args:
            data: The manifest's entry.
            width: How many sizes a call of the program's group has (term indices must be
                below it).
            where: Where the entry sits, named in errors.

        Returns:
            The `Fill`.

        Raises:
            ArtifactError: The entry is not a fill capture writes (the message says where).

        Example:
            >>> Fill.from_dict({"argument": "mask", "dtype": "int64", "value": 1,
            ...                 "shape": [{"terms": [0], "offset": 0}]}, width=2).shape
            (FillAxis(terms=(0,), offset=0),)
        """
        fill = read(cls, data, where)
        for i, axis in enumerate(fill.shape):
            if any(term >= width for term in axis.terms):
                Fields.fail(
                    f"{where}.shape[{i}].terms", f"has {list(axis.terms)}: indices below {width}"
                )
        return fill


def fills_of(entry: Mapping[str, Any], width: int) -> tuple[Fill, ...]:
    """The fills of a manifest's program entry (none when it has no ``fills``).

    Args:
        entry: The manifest's ``programs`` entry.
        width: How many sizes a call of its group has.

    Returns:
        The entry's fills, in order.

    Raises:
        ArtifactError: ``fills`` is not a list of fills (`Fill.from_dict`).

    Example:
        >>> fills_of({"group": "g0"}, width=2)
        ()
    """
    data = entry.get("fills") or []
    if not isinstance(data, list):
        raise ArtifactError(f"program {entry.get('group')!r}: fills must be a list")
    return tuple(
        Fill.from_dict(item, width, f"program {entry.get('group')!r}: fills[{i}]")
        for i, item in enumerate(data)
    )


def fill_call(
    fills: Sequence[Fill], args: tuple[Any, ...], kwargs: dict[str, Any], dims: Sequence[int]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call with every fill added as a keyword argument, on the call's device.

    Args:
        fills: The program entry's fills.
        args: The call's positional arguments.
        kwargs: Its keyword arguments (not changed).
        dims: Every input tensor size of the call, in leaf order.

    Returns:
        ``(args, kwargs)`` with the filled inputs.

    Example:
        >>> import torch
        >>> fill = Fill("mask", "int64", 1, (FillAxis((0,)), FillAxis((1,))))
        >>> _, kwargs = fill_call([fill], (), {"x": torch.zeros(2, 3)}, [2, 3])
        >>> tuple(kwargs["mask"].shape)
        (2, 3)
    """
    if not fills:
        return args, kwargs
    device = _device(args, kwargs)
    out = dict(kwargs)
    for fill in fills:
        out[fill.argument] = fill.tensor(dims, device)
    return args, out


def _device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The device of the call's first tensor (CPU when it has none at the top level)."""
    import torch
    import torch.utils._pytree as pytree

    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device
    for value in pytree.tree_leaves((args, kwargs)):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")
