"""The aligned calls' parts: one argument of one call, one call by name, one leaf over every call.

Shared by `capture.seeds.alignment` (which builds them while aligning an observer's calls) and
`capture.seeds.alignment_checks` (which checks them), so that neither of the two imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from capture.errors import CaptureError
from capture.seeds.call_layout import ArgInfo, LeafInfo, Observation

__all__ = ["Slot", "View", "LeafAgg"]


@dataclass(frozen=True)
class Slot:
    """One argument of one call after normalisation."""

    name: str
    passed: str  # "positional", "keyword" or "filled"
    position: int | None
    arg: ArgInfo
    dims: tuple[tuple[int, ...] | None, ...]  # per leaf
    tensors: Sequence[torch.Tensor] | None  # the leaves' source for a filled argument

    def path(self, rel: str = "") -> str:
        if self.passed == "positional":
            return f"args[{self.position}]{rel}"
        if self.passed == "filled":
            return f"value_if_missing[{self.name!r}]{rel}"
        return f"kwargs[{self.name!r}]{rel}"


@dataclass
class View:
    """One observation's arguments by name."""

    obs: Observation
    slots: dict[str, Slot]

    @property
    def n_tensors(self) -> int:
        return sum(s.arg.n_tensors for s in self.slots.values())

    @property
    def label(self) -> str:
        return "the given inputs" if self.obs.first < 0 else f"call {self.obs.first}"


@dataclass
class LeafAgg:
    """One leaf of the reference call, over every call."""

    info: LeafInfo
    call: int  # the call `info` comes from, for messages
    last: tuple[int, tuple[int, ...]] | None = None  # (call, shape) of the latest call
    column: int = -1  # a tensor's first column in `Analysis.matrix`

    def empty(self, dynamic: Sequence[bool]) -> torch.Tensor:
        """Stands for a missing tensor: the last shape with its last dynamic dim set to 0,
        zeros of that shape when no dim is dynamic (as the seeds do).

        Args:
            dynamic: Per column of the analysis matrix, whether it varies.
        """
        if self.last is None or self.info.dtype is None:
            raise CaptureError("internal: a tensor leaf without any observed tensor")
        shape = list(self.last[1])
        dims = [d for d in range(self.info.rank) if dynamic[self.column + d]]
        if 0 not in shape:
            if not dims:
                return torch.zeros(shape, dtype=self.info.dtype, device=self.info.device)
            shape[max(dims)] = 0
        return torch.empty(shape, dtype=self.info.dtype, device=self.info.device)
