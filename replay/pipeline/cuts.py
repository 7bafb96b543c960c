"""Where an exported program's guards cut a group's recorded signatures, and along which dim.

torch.export traces a group from one example; code that branches on a size (a sliding window,
``if seq <= window``; ``Eq(s, 1)``) makes the program valid on one side of the branch only.
torch says where, as data: the program's ``range_constraints``, the symbolic size of each
input axis and the ShapeEnv's guards (`capture.compat.shape_facts`). `verdicts` evaluates those
facts on every recorded signature of the group, as the program's own input checks would
(torch 2.13's rules: a symbol's lower bound of 2 or less is not checked, 0 and 1 pass), without
building a tensor or running the program; `find_cut` then looks for the dim along which the
accepted and refused signatures separate into runs of consecutive recorded sizes, which
`replay.pipeline.splitting` turns into regimes.

A cut is only what torch's guards say; whether a program is *right* on a signature is still the
coverage check's question (`replay.check.checking`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from capture.compat import ShapeFacts, shape_facts
from replay.inputs import shapes
from replay.runtime import callform

if TYPE_CHECKING:
    from replay.inputs.exportgroup import ExportGroup

__all__ = ["Verdict", "Cut", "program_columns", "verdicts", "find_cut", "readable"]

_UNCHECKED_LOW = 2
"""torch 2.13 does not check a symbol's lower bound of 2 or less at run time (0/1 pass)."""


@dataclass(frozen=True)
class Verdict:
    """What a program's guards say of one recorded signature.

    Attributes:
        sizes: The signature (the group's size vector).
        refused: None when the guards accept it, else the first guard that refuses it, in the
            group's symbol names (``input_ids_1 <= 4``).
    """

    sizes: tuple[int, ...]
    refused: str | None = None
    symbols: tuple[str, ...] = ()
    """The group's symbols the refusing guard is over."""

    @property
    def accepted(self) -> bool:
        """The program's guards accept the signature."""
        return self.refused is None


@dataclass(frozen=True)
class Cut:
    """Where a group splits: runs of consecutive recorded sizes of one symbol.

    Attributes:
        symbol: The group's symbol the runs are taken along (``input_ids_1``).
        column: Its first column in the group's size vectors.
        runs: ``(low, high, accepted)`` per run, in increasing order: every recorded signature
            whose size of `symbol` lies in ``[low, high]`` is accepted by the program, or
            every one is refused.
        guard: The guard torch refused the other signatures with, in the group's names.
    """

    symbol: str
    column: int
    runs: tuple[tuple[int, int, bool], ...]
    guard: str

    def sides(self) -> list[tuple[int | None, int | None]]:
        """Per run, the side of the cut it stands for: ``(low, high)``, None where the run is
        open (the first run has no low, the last no high).

        Example:
            >>> Cut("s", 0, ((4, 4, True), (5, 5, False), (6, 12, True)), "").sides()
            [(None, 4), (5, 5), (6, None)]
        """
        last = len(self.runs) - 1
        return [
            (None if i == 0 else low, None if i == last else high)
            for i, (low, high, _) in enumerate(self.runs)
        ]


class _Slot:
    """A tensor leaf of a program's call: the columns of its sizes in a size vector (None: an
    added input of static size, ``fill_missing``)."""

    def __init__(self, columns: tuple[int, ...] | None) -> None:
        self.columns = columns


class _Other:
    """A non-tensor leaf of a program's call (a scalar, an explicit None)."""


def program_columns(group: ExportGroup) -> list[tuple[int, ...] | None]:
    """Per tensor input of the group's program, in the order torch.export flattens the call:
    the columns of the group's size vector holding its sizes.

    The call is laid out as `replay.inputs.exportgroup.ExportGroup.program_call` lays it out (the
    recorded tree, added inputs, the call form), with markers instead of tensors.

    Args:
        group: The group (its recorded structure, added inputs and call form).

    Returns:
        Per tensor input, the columns of its sizes (None for an added input).

    Example:
        >>> program_columns(group)  # doctest: +SKIP
        [(0, 1), (2, 3)]
    """
    import torch.utils._pytree as pytree

    structure = group.structure
    values: list[Any] = []
    for leaf in structure.leaves:
        if leaf.is_missing:
            continue
        if leaf.is_tensor:
            offset = int(leaf.dim_offset or 0)
            values.append(_Slot(tuple(range(offset, offset + leaf.ndim))))
        else:
            values.append(_Other())
    args, kwargs = shapes.spec_tree(structure.tree, values)
    kwargs.update({name: _Slot(None) for name in group.example.added})
    args_t, kwargs = callform.arrange(group.example.form, args, kwargs)
    leaves = pytree.tree_leaves((args_t, kwargs))
    return [leaf.columns for leaf in leaves if isinstance(leaf, _Slot)]


def verdicts(
    program: Any, group: ExportGroup, signatures: Sequence[Sequence[int]]
) -> list[Verdict] | None:
    """The program's guards on each signature (module docstring).

    Args:
        program: The group's `torch.export.ExportedProgram`.
        group: The group it was exported from.
        signatures: Size vectors of the group.

    Returns:
        One `Verdict` per signature, or None when the program's inputs cannot be matched with
        the group's (then nothing is decided from them).

    Example:
        >>> [v.refused for v in verdicts(program, group, [(3, 3), (5, 3)])]  # doctest: +SKIP
        [None, "x_0 = 5 is outside the program's range [2, 3]"]
    """
    facts = shape_facts(program)
    if facts is None:
        return [Verdict(tuple(int(s) for s in sizes)) for sizes in signatures]
    columns = program_columns(group)
    if len(columns) != len(facts.inputs):
        return None
    names = _names(group, columns, facts)
    memo: dict[tuple[Any, ...], Verdict] = {}
    out = []
    for sizes in signatures:
        sizes = tuple(int(s) for s in sizes)
        refused, bound = _bind(group, columns, facts, sizes, names)
        if refused is not None:
            out.append(Verdict(sizes, *refused))
            continue
        key = tuple(sorted(bound.items(), key=lambda kv: str(kv[0])))
        if key not in memo:
            memo[key] = Verdict((), *_check(facts, bound, names))
        out.append(Verdict(sizes, memo[key].refused, memo[key].symbols))
    return out


def _names(
    group: ExportGroup, columns: list[tuple[int, ...] | None], facts: ShapeFacts
) -> dict[Any, Any]:
    """torch symbol -> a sympy symbol named like the group's symbol (or ``path[axis]``)."""
    import sympy

    out: dict[Any, Any] = {}
    for cols, shape in zip(columns, facts.inputs, strict=True):
        if cols is None:
            continue
        for col, expr in zip(cols, shape, strict=False):
            if isinstance(expr, sympy.Symbol) and expr not in out:
                dim = group.dims[col]
                out[expr] = sympy.Symbol(dim.symbol or f"{dim.path}[{dim.axis}]")
    return out


_Refusal = tuple[str, tuple[str, ...]]
"""Why a signature is refused, and the group's symbols that says it over."""


def _bind(
    group: ExportGroup,
    columns: list[tuple[int, ...] | None],
    facts: ShapeFacts,
    sizes: tuple[int, ...],
    names: dict[Any, Any],
) -> tuple[_Refusal | None, dict[Any, int]]:
    """torch symbol -> its size in `sizes`, or why the input sizes themselves are refused."""
    import sympy

    bound: dict[Any, int] = {}
    derived: list[tuple[Any, int, str, tuple[str, ...]]] = []
    for cols, shape in zip(columns, facts.inputs, strict=True):
        if cols is None:
            continue
        if len(cols) != len(shape):
            why = f"an input of rank {len(cols)} where the program takes {len(shape)}"
            return (why, ()), bound
        for col, expr in zip(cols, shape, strict=True):
            size, dim = sizes[col], group.dims[col]
            where = f"{dim.path} axis {dim.axis}"
            named: tuple[str, ...] = (dim.symbol,) if dim.symbol else ()
            if isinstance(expr, int):
                if size != expr:
                    return (f"{where} = {size}, the program takes {expr} only", named), bound
            elif isinstance(expr, sympy.Symbol):
                if bound.setdefault(expr, size) != size:
                    why = f"{where} = {size}, the program wants it equal to another dim"
                    return (why, named), bound
            else:
                derived.append((expr, size, where, named))
    for expr, size, where, named in derived:
        value = expr.xreplace(bound)
        if value.is_number and int(value) != size:
            return (f"{where} = {size}, the program takes {value}", named), bound
    for symbol, size in bound.items():
        low, high = facts.ranges.get(symbol, (0, None))
        if (low > _UNCHECKED_LOW and size < low) or (high is not None and size > high):
            name = str(names.get(symbol, symbol))
            why = f"{name} = {size} is outside the program's range [{low}, {high}]"
            return (why, (name,)), bound
    return None, bound


def _check(
    facts: ShapeFacts, bound: dict[Any, int], names: dict[Any, Any]
) -> tuple[str | None, tuple[str, ...]]:
    """The first guard that is false under `bound` (guards over unbound symbols are skipped:
    torch does not check them at run time either), in the group's names, with its symbols."""
    import sympy

    known = set(bound)
    for guard in facts.guards:
        if not guard.free_symbols <= known:
            continue
        try:
            value = guard.xreplace(bound)
        except (TypeError, ValueError, ZeroDivisionError):  # not decidable here: not a cut
            continue
        if value is sympy.false:
            renamed = guard.xreplace(names)
            symbols = tuple(sorted(str(s) for s in renamed.free_symbols))
            return readable(renamed), symbols
    return None, ()


def readable(guard: Any) -> str:
    """A guard over one symbol, linear, as ``symbol OP bound`` (``-s > -5`` reads
    ``s < 5``); any other guard as sympy prints it.

    Example:
        >>> import sympy
        >>> s, p = sympy.Symbol("input_ids_1"), sympy.Symbol("past")
        >>> readable(-s > -5), readable(sympy.Ne(16 * s + 16, 80)), readable(s + p <= 6)
        ('input_ids_1 < 5', 'input_ids_1 != 4', 'input_ids_1 + past <= 6')
    """
    import sympy

    flip = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
    if not isinstance(guard, sympy.core.relational.Relational) or len(guard.free_symbols) != 1:
        return str(guard)
    (symbol,) = guard.free_symbols
    expr = sympy.expand(guard.lhs - guard.rhs)
    if not expr.is_polynomial(symbol) or sympy.degree(expr, symbol) != 1:
        return str(guard)
    a, b = expr.coeff(symbol, 1), expr.coeff(symbol, 0)
    if not (a.is_number and b.is_number) or a == 0:
        return str(guard)
    op = str(guard.rel_op)
    bound = -b / a
    if a < 0:
        op = flip[op]
    return f"{symbol} {op} {bound}"


def find_cut(group: ExportGroup, found: Sequence[Verdict]) -> Cut | None:
    """The symbol along which accepted and refused signatures separate, with its runs.

    A symbol separates them when every recorded size of it is either accepted in every
    signature that has it or refused in every one. Among those, the one with the fewest runs
    wins, a symbol the refusing guard names first on a tie.

    Args:
        group: The group (its dims name the symbols; ``group.analysis`` holds its matrix).
        found: `verdicts` of the group's recorded signatures.

    Returns:
        A `Cut`, or None when every signature is accepted, none is, or no symbol separates them.

    Example:
        >>> find_cut(group, verdicts(program, group, signatures)).runs  # doctest: +SKIP
        ((2, 3, True), (5, 6, False))
    """
    if not found or all(v.accepted for v in found) or not any(v.accepted for v in found):
        return None
    matrix = np.asarray([v.sizes for v in found], dtype=np.int64)
    accepted = np.asarray([v.accepted for v in found], dtype=bool)
    refusing = next(v for v in found if v.refused is not None)
    best: tuple[tuple[int, int, int], Cut] | None = None
    seen: set[str] = set()
    for column, dim in enumerate(group.dims):
        if not dim.dynamic or dim.symbol is None or dim.symbol in seen:
            continue
        seen.add(dim.symbol)
        runs = _runs(matrix[:, column], accepted)
        if runs is None or len(runs) < 2:
            continue
        rank = (len(runs), 0 if dim.symbol in refusing.symbols else 1, column)
        if best is None or rank < best[0]:
            best = (rank, Cut(dim.symbol, column, tuple(runs), str(refusing.refused)))
    return best[1] if best is not None else None


def _runs(values: Any, accepted: Any) -> list[tuple[int, int, bool]] | None:
    """Runs of consecutive distinct values with one verdict; None when a value has both."""
    verdict: dict[int, bool] = {}
    for value, ok in zip(values.tolist(), accepted.tolist(), strict=True):
        if verdict.setdefault(value, ok) != ok:
            return None
    runs: list[tuple[int, int, bool]] = []
    for value in sorted(verdict):
        if runs and runs[-1][2] == verdict[value]:
            runs[-1] = (runs[-1][0], value, verdict[value])
        else:
            runs.append((value, value, verdict[value]))
    return runs
