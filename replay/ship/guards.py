"""What a saved program accepts: its call structure and the recorded ranges of its dims.

An artifact (`replay.ship.artifact`) stores one `ProgramGuard` per program in its JSON manifest. The
runner (`replay.load`) and the drift check (``capture check``) both ask the same two questions
of a call, so that what ``capture check`` reports as served is exactly what the runner serves:

1. **Structure**: does the call have the program's recorded structure? The treespec of
   ``(args, kwargs)`` and, per leaf, its path, kind, dtype, rank and scalar value must be the
   recorded ones (devices and value-range bookkeeping are left out: they do not change what the
   program computes).
2. **Dims**: is every input size within what the export was checked on? A static dim must have
   its recorded size; a dynamic dim must lie within its recorded ``[min, max]``; dims that were
   equal in every recorded call (one symbol) must be equal; a recorded relation
   (``mask = past + 1``) must hold.

Reading a manifest and checking guards needs neither torch nor the model's code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from capture import schema
from capture.errors import ReplayError
from capture.pytree.structure import RecordedLeaf
from replay.ship import conditions as cond

__all__ = [
    "ProgramGuard",
    "ArtifactError",
    "CallNotServed",
    "LeafFacts",
    "leaf_key",
    "LEAF_FIELDS",
]


class ArtifactError(ReplayError):
    """An artifact cannot be written or read (not a capture artifact, unknown format, ...)."""


class CallNotServed(ArtifactError):
    """No program of the artifact accepts a call; the message names each group tried and why.

    Attributes:
        reasons: Group label -> the guard that failed (or "different structure").
    """

    def __init__(self, message: str, reasons: Mapping[str, str]) -> None:
        super().__init__(message)
        self.reasons = dict(reasons)


LEAF_FIELDS = ("path", "kind", "dtype", "rank", "value")
"""The leaf columns that make a structure, for matching (device and bookkeeping left out)."""


_TENSOR = schema.KIND_TENSOR


class LeafFacts(Protocol):
    """The facts of a leaf that matching compares (`LEAF_FIELDS`): a recorded leaf
    (`capture.pytree.structure.RecordedLeaf`) or a live call's (`capture.record.flatten.Leaf`)."""

    @property
    def path(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def dtype(self) -> str | None: ...
    @property
    def rank(self) -> int | None: ...
    @property
    def value(self) -> str | None: ...


def leaf_key(leaves: Iterable[LeafFacts]) -> tuple[tuple[Any, ...], ...]:
    """The comparable form of a structure's leaves.

    Example:
        >>> from capture.pytree.structure import RecordedLeaf
        >>> leaf_key([RecordedLeaf(0, "args[0]", None, 0, "tensor", dtype="float32", rank=2)])
        (('args[0]', 'tensor', 'float32', 2, None),)
    """
    # A tensor leaf's value is bookkeeping (where its special token counts are, issue 22),
    # written only where value ranges were recorded: not part of the structure.
    return tuple(
        (leaf.path, leaf.kind, leaf.dtype, leaf.rank, None if leaf.kind == _TENSOR else leaf.value)
        for leaf in leaves
    )


@dataclass
class ProgramGuard:
    """The guards of one program of an artifact (built from its manifest entry).

    Attributes:
        module: The sub-module name (``""`` for the model itself, ``encoder``, ...).
        group: The call group name (``decode``, ``prefill``, ``g0``).
        program: The program's name inside the archive.
        structure_id: The recorded input structure of the group.
        treespec: The recorded treespec of ``(args, kwargs)`` (torch's JSON).
        leaves: The recorded leaves (the manifest keeps `LEAF_FIELDS`, argument and position
            of each).
        axes: One entry per tensor axis, in the order of a call's ``dims``: ``path``,
            ``axis``, ``min``, ``max``, ``dynamic``, ``symbol`` (and ``narrowed`` where an ONNX
            file's axis carries its program's tighter range, `replay.onnx.manifest`).
        relations: ``{"symbol", "terms", "offset"}``: ``symbol == sum(terms) + offset``.
        rejected: Recorded signatures (``{"dims", "error"}``) the program failed in the
            export's check: within the ranges, yet not served.
        conditions: The program's own size guards over the call's dims, for a file that does
            not check them itself (an ONNX file: `replay.ship.conditions`), each with its
            parsed tree.
    """

    module: str
    group: str
    program: str
    structure_id: str
    treespec: str | None
    leaves: tuple[RecordedLeaf, ...]
    axes: list[dict[str, Any]]
    relations: list[dict[str, Any]] = field(default_factory=list)
    rejected: dict[tuple[int, ...], str] = field(default_factory=dict)
    conditions: list[tuple[cond.Condition, Any]] = field(default_factory=list)

    @classmethod
    def from_manifest(cls, entry: Mapping[str, Any]) -> ProgramGuard:
        """The guard of a manifest ``programs`` entry."""
        return cls(
            module=str(entry.get("module", "")),
            group=str(entry["group"]),
            program=str(entry["program"]),
            structure_id=str(entry["structure_id"]),
            treespec=entry.get("treespec"),
            leaves=tuple(
                RecordedLeaf.from_row({**row, "leaf": i}) for i, row in enumerate(entry["leaves"])
            ),
            axes=list(entry["axes"]),
            relations=list(entry.get("relations", [])),
            rejected={
                tuple(int(v) for v in r["dims"]): str(r["error"]) for r in entry.get("rejected", [])
            },
            conditions=[
                (cond.Condition(str(c["expr"]), str(c["text"])), cond.parse(str(c["expr"])))
                for c in entry.get("conditions", [])
            ],
        )

    @property
    def label(self) -> str:
        """``decode`` or ``encoder.g0``: how messages name the program's group."""
        return f"{self.module}.{self.group}" if self.module else self.group

    def matches(
        self, treespec: str | None, leaves: Iterable[LeafFacts], structure_id: str = ""
    ) -> bool:
        """Tells whether a call structure is the program's recorded structure."""
        if structure_id and structure_id == self.structure_id:
            return True
        if treespec != self.treespec:
            return False
        return leaf_key(leaves) == leaf_key(self.leaves)

    def check(self, dims: Sequence[int]) -> str | None:
        """None when the sizes are within the guards, else the first guard that fails.

        Args:
            dims: Every input tensor size of the call, in leaf order then axis order (the
                store's ``calls.dims``).

        Returns:
            None, or a sentence naming the input, the axis, the size and the accepted range.

        Example:
            >>> guard.check([1, 300])  # doctest: +SKIP
            "kwargs['input_ids'] axis 1 = 300 is outside the recorded range [4, 64]"
        """
        if len(dims) != len(self.axes):
            return f"the call has {len(dims)} tensor dims, the program {len(self.axes)}"
        failed = self.rejected.get(tuple(int(v) for v in dims))
        if failed is not None:
            return f"this recorded signature failed the export's check ({failed})"
        symbols: dict[str, tuple[int, str]] = {}
        for size, ax in zip(dims, self.axes, strict=True):
            where = f"{ax['path']} axis {ax['axis']}"
            low, high = int(ax["min"]), int(ax["max"])
            if not ax.get("dynamic") and size != low:
                return f"{where} = {size}, the program takes {low} only (static)"
            if not low <= size <= high:
                # An ONNX file's axis may be cut to its program's bounds (replay.onnx.manifest)
                what = "its program's range" if ax.get("narrowed") else "the recorded range"
                return f"{where} = {size} is outside {what} [{low}, {high}]"
            symbol = ax.get("symbol")
            if symbol:
                seen = symbols.setdefault(symbol, (int(size), where))
                if seen[0] != size:
                    return (
                        f"{where} = {size} but {seen[1]} = {seen[0]}: they were equal in "
                        "every recorded call"
                    )
        for rel in self.relations:
            names = [str(rel["symbol"]), *map(str, rel["terms"])]
            if any(n not in symbols for n in names):
                continue
            left, where = symbols[names[0]]
            right = sum(symbols[n][0] for n in names[1:]) + int(rel["offset"])
            if left != right:
                expr = " + ".join([*names[1:], str(rel["offset"])])
                return (
                    f"{where} = {left}, but {names[0]} = {expr} held in every recorded call "
                    f"(= {right} here)"
                )
        for condition, tree in self.conditions:
            if not cond.holds(tree, dims):
                return f"its program's guard {condition.text} does not hold"
        return None
