"""The recorded shape facts of a program's inputs: one `Axis` per tensor axis, and the
`Relation`s between their symbols, as an artifact's manifest stores them.

Needs neither torch nor the model's code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["NAME", "MAX_RANK", "Axis", "Relation"]

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
"""A Python identifier (ASCII): argument names, symbols."""

MAX_RANK = 64
"""Most axes a recorded tensor may have in a manifest."""


@dataclass(frozen=True)
class Axis:
    """One tensor axis of a program's inputs, as the export was checked on it.

    Attributes:
        path: The input's key path (``kwargs['input_ids']``).
        axis: The axis index.
        min: Smallest recorded size.
        max: Largest recorded size.
        dynamic: Whether the program takes more than one size here (else only `min`).
        symbol: The shared symbol of axes equal in every recorded call (None: none).
        narrowed: `min` and `max` are the program's own bounds, tighter than the recorded
            range (an ONNX file, which does not check them itself: `replay.onnx`).
    """

    path: str
    axis: int = field(metadata={"low": 0, "high": MAX_RANK})
    min: int = field(metadata={"low": 0})
    max: int = field(metadata={"low": 0})
    dynamic: bool
    symbol: str | None = field(default=None, metadata={"pattern": NAME, "max_len": 256})
    narrowed: bool = field(default=False, metadata={"omit_default": True})

    def invalid(self) -> str | None:
        """What is wrong beyond the fields' types (`replay.runtime.checked_json.read`)."""
        return f"has min {self.min} > max {self.max}" if self.min > self.max else None


@dataclass(frozen=True)
class Relation:
    """A recorded relation between symbols: ``symbol == sum(terms) + offset``."""

    symbol: str = field(metadata={"pattern": NAME, "max_len": 256})
    terms: tuple[str, ...] = field(metadata={"pattern": NAME, "max_len": 256})
    offset: int
