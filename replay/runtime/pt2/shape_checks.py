"""A program's own input checks, read from its graph JSON: what ``ExportedProgram.module()``
checks on every call, without sympy.

torch's unlifted module refuses a call whose sizes the graph was not traced for: a static
size that differs, two sizes of one symbol that differ, a size outside the symbol's range
(``range_constraints``), or a line of ``guards_code`` that does not hold. The runner's own
guards (`replay.runtime.guards`) check the recorded ranges; these are the program's, and a
graph built from its JSON (`replay.runtime.pt2.program`) checks them here:

- each user input's sizes (``tensor_values``): an integer must be equal; a plain symbol
  (``s13``) is bound on first sight and must agree afterwards, within its range (a lower
  bound of 2 is torch.export's 0/1 specialization floor, which torch does not check either);
- the ``guards_code`` lines, rewritten over the call's dims by `replay.runtime.conditions`
  (the grammar the ONNX runner evaluates), once the first call has told where each
  ``L[...]`` source sits.

Nothing is evaluated by Python: the conditions are parsed against a small grammar.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from replay.runtime.conditions import Condition, translate

__all__ = ["ShapeChecks"]

_SYMBOL = re.compile(
    r"(?:Symbol\(')?([a-z]{1,8}[0-9]{1,12})(?:'(?:, [a-z_]+=(?:True|False))*\))?\Z"
)
"""A size that is one symbol: ``s13``, or sympy's ``Symbol('s13', positive=True, ...)``."""


class ShapeChecks:
    """The size checks of one program's user inputs (module docstring).

    Args:
        tree: The program's parsed JSON.
        user_names: Per flattened user input, its placeholder name (None: not a tensor).
    """

    def __init__(self, tree: Mapping[str, Any], user_names: Sequence[str | None]) -> None:
        graph = tree["graph_module"]["graph"]
        values = graph.get("tensor_values", {})
        ranges: dict[str, tuple[int, int | None]] = {}
        for symbol, bound in (tree.get("range_constraints") or {}).items():
            low, high = bound.get("min_val"), bound.get("max_val")
            low = low if isinstance(low, int) and low > 2 else 0
            ranges[symbol] = (low, high if isinstance(high, int) else None)
        # (flat index, axis, static size or None, symbol or None)
        self._sizes: list[tuple[int, int, int | None, str | None]] = []
        for index, name in enumerate(user_names):
            meta = values.get(name) if name is not None else None
            if meta is None:
                continue
            for axis, size in enumerate(meta.get("sizes", [])):
                if "as_int" in size:
                    self._sizes.append((index, axis, int(size["as_int"]), None))
                    continue
                found = _SYMBOL.match(str(size.get("as_expr", {}).get("expr_str", "")))
                if found:
                    self._sizes.append((index, axis, None, found.group(1)))
        self._ranges = ranges
        self._code: list[str] = [str(line) for line in tree.get("guards_code") or []]
        self._conditions: list[Condition] | None = None
        self.unchecked: list[str] = []  # guard lines over something other than sizes

    def check(self, flat: Sequence[Any], paths: Any = None) -> str | None:
        """None when the call's flattened inputs pass, else why not.

        Args:
            flat: The call's flattened user inputs.
            paths: Their pytree key paths (needed on the first call only, to place the
                ``guards_code`` sources).
        """
        bound: dict[str, int] = {}
        for index, axis, static, symbol in self._sizes:
            shape = getattr(flat[index], "shape", None)
            if shape is None or axis >= len(shape):
                return f"input {index} has no axis {axis}"
            size = int(shape[axis])
            if static is not None:
                if size != static:
                    return f"input {index} axis {axis} = {size}, the program takes {static} only"
                continue
            assert symbol is not None
            seen = bound.setdefault(symbol, size)
            if seen != size:
                return f"input {index} axis {axis} = {size}, but {symbol} = {seen} elsewhere"
            low, high = self._ranges.get(symbol, (0, None))
            if size < low or (high is not None and size > high):
                return f"input {index} axis {axis} = {size} is outside [{low}, {high}]"
        if self._code:
            if self._conditions is None:
                if paths is None:
                    return None
                self._conditions = self._translate(flat, paths)
            dims = [int(s) for t in flat if hasattr(t, "shape") for s in t.shape]
            for condition in self._conditions:
                if not condition.holds(dims):
                    return f"the program's guard {condition.text} does not hold"
        return None

    def needs_paths(self) -> bool:
        """Whether the next `check` needs the call's key paths."""
        return bool(self._code) and self._conditions is None

    def _translate(self, flat: Sequence[Any], paths: Sequence[Any]) -> list[Condition]:
        import torch.utils._pytree as pytree

        sources: dict[str, tuple[int, int]] = {}
        start = 0
        for value, path in zip(flat, paths, strict=True):
            if hasattr(value, "shape"):
                rank = len(value.shape)
                sources["L" + pytree.keystr(tuple(path[1:]))] = (start, rank)
                start += rank
        conditions, self.unchecked = translate(self._code, sources)
        return conditions
