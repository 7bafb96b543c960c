"""What a saved program accepts: its call structure and the recorded ranges of its dims.

An artifact (`replay.runtime.pt2.loading`) stores one `ProgramGuard` per program in its JSON
manifest. The runner (`replay.load`) and the drift check (``capture check``) both ask the same two
questions of a call, through one function (`route`), so that what ``capture check`` reports as
served is
exactly what the runner serves:

1. **Structure**: does the call have the program's recorded structure? The treespec of
   ``(args, kwargs)`` and, per leaf, its path, kind, dtype, rank and scalar value must be the
   recorded ones (devices and value-range bookkeeping are left out: they do not change what the
   program computes).
2. **Dims**: is every input size within what the export was checked on? A static dim must have
   its recorded size; a dynamic dim must lie within its recorded ``[min, max]``; dims that were
   equal in every recorded call (one symbol) must be equal; a recorded relation
   (``mask = past + 1``) must hold; for a program that does not check its own size guards
   (an ONNX file, `replay.onnx`), those guards must hold too (`conditions`, parsed by
   `replay.runtime.conditions`, never evaluated as code).

A served call needs only the yes; the sentence is wanted once a check fails. So each guard is
also laid out as a `Plan`, flat tuples a few C-level loops read (every axis's accepted range,
the pairs of axes that must be equal, the relations over dim indices, the size conditions left
to evaluate), and `ProgramGuard.check` describes a failure only when the plan refuses. A size
condition is left out of the plan only when the other checks imply it: evaluated on every
assignment of the dims it reads that the range, equality and relation checks let through (at
most `MAX_CASES`), it holds on each. That is an exhaustive evaluation of the condition's own
closures, never a symbolic argument; torch.export's guards on a cache or a mask (``(d0) ==
(d18)`` for two axes of one symbol, ``1 + d4 - d21 <= 0`` for a recorded ``mask = past + 1``)
are implied this way, the ones that carve a hole in a range (``16*d1 != 80``) are kept.

A program refused for its structure is refused with what differs, by key path
(`structure_difference`: an input the call does not pass, one the program does not take, a
dtype, a rank, a constant); the number of differing inputs says which program came closest.

The ``.pt2`` runner, the ONNX runner and ``capture check`` (of either) all route with `route`.

Reading a manifest and checking guards needs neither torch nor the model's code. The package
holds one concept per module: `leaves` (structure matching and its difference), `axes` (the
recorded axes and relations), `plans` (the flat checks and implied conditions), `program_guard`
(one program's guard), `routing` (`route`); import the names from here.
"""

from __future__ import annotations

from collections.abc import Mapping

from capture.errors import ReplayError
from replay.runtime.guards.axes import MAX_RANK, NAME, Axis, Relation
from replay.runtime.guards.leaves import (
    LEAF_FIELDS,
    STRUCTURE_DIFFERS,
    LeafFacts,
    leaf_key,
    structure_difference,
)
from replay.runtime.guards.plans import MAX_CASES, Plan, implied, plan
from replay.runtime.guards.program_guard import ProgramGuard
from replay.runtime.guards.routing import CallFacts, route

__all__ = [
    "ProgramGuard",
    "Axis",
    "Relation",
    "route",
    "CallFacts",
    "STRUCTURE_DIFFERS",
    "ArtifactError",
    "CallNotServed",
    "LeafFacts",
    "leaf_key",
    "LEAF_FIELDS",
    "structure_difference",
    "Plan",
    "plan",
    "implied",
    "MAX_CASES",
    "NAME",
    "MAX_RANK",
]


class ArtifactError(ReplayError):
    """An artifact cannot be written or read (not a capture artifact, unknown format, ...)."""


class CallNotServed(ArtifactError):
    """No program of the artifact accepts a call; the message names each group tried and why.

    Attributes:
        reasons: Group label -> the guard that failed, or "different call structure: " and
            the inputs that differ, by key path (`structure_difference`).
    """

    def __init__(self, message: str, reasons: Mapping[str, str]) -> None:
        super().__init__(message)
        self.reasons = dict(reasons)
