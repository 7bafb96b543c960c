"""What the seed API keeps about a call: its arguments as passed and the method's signature.

A call is described once per structure (`CallLayout`: per argument its pytree spec, leaf key paths,
leaf kinds and dtype/rank or scalar value); the calls themselves keep only their tensor sizes
(`Observation`). `capture.seeds.alignment` normalises and aligns them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from capture.record.flatten import Param, signature_of
from capture.schema import (
    KIND_BOOL,
    KIND_FLOAT,
    KIND_INT,
    KIND_NONE,
    KIND_OPAQUE,
    KIND_STR,
    KIND_TENSOR,
)

__all__ = ["ArgInfo", "CallLayout", "Dims", "LeafInfo", "Observation", "Signature", "SCALAR_KINDS"]

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


@dataclass(frozen=True)
class Signature:
    """What the analysis needs from the observed method's signature."""

    params: tuple[Param, ...]
    names: tuple[str, ...]
    positional: tuple[str, ...]
    positional_only: frozenset[str]
    var_positional: str | None
    var_keyword: str | None
    defaults: Mapping[str, Any]

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> Signature:
        params = signature_of(fn)
        try:
            defaults = {
                p.name: p.default
                for p in inspect.signature(fn).parameters.values()
                if p.default is not inspect.Parameter.empty
            }
        except (TypeError, ValueError):
            defaults = {}
        kinds = {p.name: p.kind for p in params}
        return cls(
            params=params,
            names=tuple(kinds),
            positional=tuple(
                n for n, k in kinds.items() if k in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")
            ),
            positional_only=frozenset(n for n, k in kinds.items() if k == "POSITIONAL_ONLY"),
            var_positional=next((n for n, k in kinds.items() if k == "VAR_POSITIONAL"), None),
            var_keyword=next((n for n, k in kinds.items() if k == "VAR_KEYWORD"), None),
            defaults=defaults,
        )

    def positional_name(self, i: int) -> str:
        """The name of the i-th positional argument (``args[2]`` for a ``*args`` element)."""
        if i < len(self.positional):
            return self.positional[i]
        if self.var_positional:
            return f"{self.var_positional}[{i - len(self.positional)}]"
        return f"args[{i}]"

    def is_var_element(self, name: str) -> bool:
        return bool(self.var_positional) and name.startswith(f"{self.var_positional}[")

    def order(self, name: str) -> float:
        if name in self.names:
            return float(self.names.index(name))
        if self.var_positional and self.is_var_element(name):
            return self.names.index(self.var_positional) + int(name.rsplit("[", 1)[1][:-1]) / 1e6
        return float("inf")
