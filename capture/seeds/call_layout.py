"""What the seed API keeps about a call: its arguments as passed and the method's signature.

A call is described once per structure (`CallLayout`: per argument its pytree spec, leaf key paths,
leaf kinds and dtype/rank or scalar value); the calls themselves keep only their tensor sizes
(`Observation`). `capture.seeds.alignment` normalises and aligns them, naming arguments with the
method's `capture.signature.Signature`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from capture.schema import (
    KIND_BOOL,
    KIND_FLOAT,
    KIND_INT,
    KIND_NONE,
    KIND_OPAQUE,
    KIND_STR,
    KIND_TENSOR,
)

__all__ = ["ArgInfo", "CallLayout", "Dims", "LeafInfo", "Observation", "SCALAR_KINDS"]

SCALAR_KINDS = {bool: KIND_BOOL, int: KIND_INT, float: KIND_FLOAT, str: KIND_STR}
"""Python scalar type -> leaf kind; any other non-tensor, non-None leaf is opaque."""

Dims = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class LeafInfo:
    """One leaf of an argument: its kind, and dtype/rank/device or value."""

    kind: str
    dtype: torch.dtype | None = None
    rank: int = 0
    device: torch.device | None = None
    value: Any = None  # the scalar value; for an opaque leaf, the object itself

    @classmethod
    def of(cls, value: Any) -> LeafInfo:
        if isinstance(value, torch.Tensor):
            return cls(KIND_TENSOR, value.dtype, value.dim(), value.device)
        if value is None:
            return cls(KIND_NONE)
        kind = SCALAR_KINDS.get(type(value))
        return cls(kind, value=value) if kind else cls(KIND_OPAQUE, value=value)


@dataclass(frozen=True)
class ArgInfo:
    """One top-level argument of a call structure."""

    spec: pytree.TreeSpec
    paths: tuple[str, ...]  # leaf key paths relative to the argument ('.key_cache[0]')
    leaves: tuple[LeafInfo, ...]
    tensor_index: tuple[int, ...]  # per leaf: index in the call's tensor list, -1 otherwise

    @classmethod
    def of(cls, value: Any, offset: int = 0) -> ArgInfo:
        flat, spec = pytree.tree_flatten_with_path(value)
        leaves, index = [], []
        for _, leaf in flat:
            info = LeafInfo.of(leaf)
            leaves.append(info)
            index.append(offset if info.kind == KIND_TENSOR else -1)
            offset += info.kind == KIND_TENSOR
        paths = tuple(pytree.keystr(kp) for kp, _ in flat)
        return cls(spec, paths, tuple(leaves), tuple(index))

    @property
    def n_tensors(self) -> int:
        return sum(1 for i in self.tensor_index if i >= 0)

    def is_empty(self) -> bool:
        """Not passed: None or an empty container."""
        return not self.leaves or (len(self.leaves) == 1 and self.leaves[0].kind == KIND_NONE)

    def is_scalar(self) -> bool:
        return len(self.leaves) == 1 and self.leaves[0].kind in SCALAR_KINDS.values()


@dataclass(frozen=True)
class CallLayout:
    """A call's arguments as passed: positional ones, then keywords in call order."""

    positional: tuple[ArgInfo, ...]
    keywords: tuple[tuple[str, ArgInfo], ...]

    @classmethod
    def of(cls, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> CallLayout:
        """Describes a call; tensors are numbered in pytree order over ``(args, kwargs)``."""
        offset, positional, keywords = 0, [], []
        for value in args:
            positional.append(ArgInfo.of(value, offset))
            offset += positional[-1].n_tensors
        for name, value in kwargs.items():
            keywords.append((name, ArgInfo.of(value, offset)))
            offset += keywords[-1][1].n_tensors
        return cls(tuple(positional), tuple(keywords))


@dataclass
class Observation:
    """Calls with one layout and one set of tensor sizes; `first`/`last` are call indexes."""

    layout: CallLayout
    dims: Dims
    first: int
    last: int
