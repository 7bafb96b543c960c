"""The guards of one program of an artifact: its recorded structure, axes, relations, rejected
signatures and size conditions, and the check of a call's sizes against them.

Needs neither torch nor the model's code.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from replay.runtime.conditions import Condition
from replay.runtime.guards.axes import Axis, Relation
from replay.runtime.guards.leaves import LeafFacts, leaf_key
from replay.runtime.guards.plans import Plan, plan

__all__ = ["ProgramGuard"]


@dataclass(frozen=True)
class ProgramGuard:
    """The guards of one program of an artifact (`replay.runtime.manifest.ProgramEntry.guard`).

    Attributes:
        module_name: The sub-module name (``""`` for the model itself, ``encoder``, ...).
        group: The call group name (``decode``, ``prefill``, ``g0``).
        program: The program's name inside the archive.
        treespec: The recorded treespec of ``(args, kwargs)`` (torch's JSON).
        leaves: The recorded leaves (their `LEAF_FIELDS` are compared).
        axes: One per tensor axis, in the order of a call's ``dims``.
        relations: Recorded relations between the axes' symbols.
        rejected: Recorded size vectors the program failed in the export's check -> why:
            within the ranges, yet not served.
        conditions: The program's own size guards over the call's dims, for a program that
            does not check them itself (an ONNX file; empty for a ``.pt2`` program, whose
            module checks them on every call).
    """

    module_name: str
    group: str
    program: str
    treespec: str | None
    leaves: tuple[LeafFacts, ...]
    axes: tuple[Axis, ...]
    relations: tuple[Relation, ...] = ()
    rejected: Mapping[tuple[int, ...], str] = field(default_factory=dict)
    conditions: tuple[Condition, ...] = ()

    @property
    def label(self) -> str:
        """``decode`` or ``encoder.g0``: how messages name the program's group."""
        return f"{self.module_name}.{self.group}" if self.module_name else self.group

    def matches(self, treespec: str | None, leaves: Iterable[LeafFacts]) -> bool:
        """Tells whether a call structure is the program's recorded structure: the same
        treespec and the same leaves (`LEAF_FIELDS`). Nothing else stands in for them (a
        structure id names a store's structure, not what the program takes)."""
        if treespec != self.treespec:
            return False
        return leaf_key(leaves) == self._leaf_key

    @functools.cached_property
    def _leaf_key(self) -> tuple[tuple[Any, ...], ...]:
        return leaf_key(self.leaves)

    def check(self, dims: Sequence[int]) -> str | None:
        """None when the sizes are within the guards, else the first guard that fails.

        Args:
            dims: Every input tensor size of the call, in leaf order then axis order (the
                store's ``calls.dims``).

        Returns:
            None, or a sentence naming the input, the axis, the size and the accepted range.

        Example:
            >>> guard = ProgramGuard("", "g0", "g0", None, (), (Axis("args[0]", 0, 4, 64, True),))
            >>> guard.check([300])
            'args[0] axis 0 = 300 is outside the recorded range [4, 64]'
        """
        if self.rejected:
            failed = self.rejected.get(tuple(int(v) for v in dims))
            if failed is not None:
                return f"this recorded signature failed the export's check ({failed})"
        if self._plan.accepts(dims):  # a served call: the flat checks only, no sentence
            return None
        return self._failure(dims)

    @functools.cached_property
    def _plan(self) -> Plan:
        return plan(self.axes, self.relations, self.conditions)

    def _failure(self, dims: Sequence[int]) -> str | None:
        """The first guard that refuses `dims`, in a sentence (None: all pass)."""
        if len(dims) != len(self.axes):
            return f"the call has {len(dims)} tensor dims, the program {len(self.axes)}"
        symbols: dict[str, tuple[int, Axis]] = {}
        for size, ax in zip(dims, self.axes, strict=True):
            if not ax.dynamic and size != ax.min:
                where = f"{ax.path} axis {ax.axis}"
                return f"{where} = {size}, the program takes {ax.min} only (static)"
            if not ax.min <= size <= ax.max:
                where = f"{ax.path} axis {ax.axis}"
                what = "its program's range" if ax.narrowed else "the recorded range"
                return f"{where} = {size} is outside {what} [{ax.min}, {ax.max}]"
            if ax.symbol:
                seen = symbols.setdefault(ax.symbol, (int(size), ax))
                if seen[0] != size:
                    first = seen[1]
                    return (
                        f"{ax.path} axis {ax.axis} = {size} but {first.path} axis {first.axis} = "
                        f"{seen[0]}: they were equal in every recorded call"
                    )
        for rel in self.relations:
            names = [rel.symbol, *rel.terms]
            if any(n not in symbols for n in names):
                continue
            left, at = symbols[rel.symbol]
            right = sum(symbols[n][0] for n in rel.terms) + rel.offset
            if left != right:
                where = f"{at.path} axis {at.axis}"
                expr = " + ".join([*rel.terms, str(rel.offset)])
                return (
                    f"{where} = {left}, but {rel.symbol} = {expr} held in every recorded call "
                    f"(= {right} here)"
                )
        for condition in self.conditions:
            if not condition.holds(dims):
                return f"its program's guard {condition.text} does not hold"
        return None
