"""The seam to what torch.export keeps private about a program: its guard lines, its ``Dim``
classes, its constraint violations and its symbolic shapes.

No torch import at import time.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from capture.compat.versions import warn_lost

if TYPE_CHECKING:
    import sympy

__all__ = [
    "guards_code",
    "set_guards_code",
    "dim_kind",
    "is_constraint_violation",
    "violation_names",
    "ShapeFacts",
    "shape_facts",
]


# -- torch.export -------------------------------------------------------------------------------
def guards_code(program: Any) -> list[str] | None:
    """The input guards of an exported program, as the Python lines ``ep.module()`` checks.

    Private API: ``ExportedProgram._guards_code`` (torch 2.13.0). Without it the guards cannot
    be rewritten (`replay.pipeline.exporting`), and a program whose inputs are reached through a
    custom pytree key (a transformers cache) fails every call with NameError.

    Args:
        program: A ``torch.export.ExportedProgram``.

    Returns:
        The guard lines (empty: none), or None when torch keeps none under that name.
    """
    if not hasattr(program, "_guards_code"):
        warn_lost(
            "guards_code",
            "guards over custom pytree keys are not rewritten; programs taking a cache may "
            "fail with NameError when called",
            AttributeError("_guards_code"),
        )
        return None
    code = program._guards_code
    return list(code) if code else []


def set_guards_code(program: Any, code: Sequence[str]) -> None:
    """Replaces the input guards of an exported program (see `guards_code`).

    Private API: ``ExportedProgram._guards_code`` (torch 2.13.0): ``ep.module()`` builds its
    guard function from this list when it is called.
    """
    program._guards_code = list(code)


# -- torch.export.dynamic_shapes ----------------------------------------------------------------
def dim_kind(obj: Any) -> str | None:
    """What kind of torch.export ``Dim`` object `obj` is: 'derived', 'dim', 'hint', or None.

    Private API: the classes ``torch.export.dynamic_shapes._DerivedDim`` (``Dim`` arithmetic),
    ``_Dim`` (``Dim(name)``) and ``_DimHint`` (``Dim.DYNAMIC``, ``Dim.AUTO``), torch 2.13.0:
    ``Dim`` objects have no public type to test against. Without them `capture.string_type`
    prints such objects as their repr instead of the seeds' ``Dim(name)`` / ``DYNAMIC``.

    Example:
        >>> import torch
        >>> dim_kind(torch.export.Dim("batch")), dim_kind(torch.export.Dim.DYNAMIC), dim_kind(3)
        ('dim', 'hint', None)
    """
    import torch.export.dynamic_shapes as dyn

    try:
        classes = (("derived", dyn._DerivedDim), ("dim", dyn._Dim), ("hint", dyn._DimHint))
    except AttributeError as e:
        warn_lost("dim_kind", "string_type prints Dim objects as their repr", e)
        return None
    # A derived Dim is also a Dim: the first class that matches, in this order.
    return next((kind for kind, cls in classes if isinstance(obj, cls)), None)


# -- torch.export's constraint violations and symbolic shapes ------------------------------------
_CONSTRAINT_TEXT = "Constraints violated"
"""What torch 2.13 writes first in a constraint violation's message: the text fallback of
`is_constraint_violation`, kept here only, for errors torch raises without its type."""


def is_constraint_violation(error: BaseException) -> bool:
    """Tells whether torch.export rejected a group's dynamic shapes because a guard of the
    traced code cuts or pins a dim that was declared dynamic (``Constraints violated``).

    Private API: ``torch._dynamo.exc.UserError`` with
    ``error_type == UserErrorType.CONSTRAINT_VIOLATION`` (checked on torch 2.13.0), walking the
    ``__cause__`` chain; ``torch.fx.experimental.symbolic_shapes.ConstraintViolationError``
    (public name, private module) counts too. Only when torch gave neither type anywhere in the
    chain is the message read, for the text ``Constraints violated``: the one text fallback.
    Without it, a cut range would be reported as an unexplained export failure instead of
    being split into regimes (`replay.pipeline.splitting`).

    Args:
        error: What ``torch.export.export`` raised.

    Returns:
        True for a constraint violation.

    Example:
        >>> is_constraint_violation(ValueError("Constraints violated (x)! ..."))
        True
        >>> is_constraint_violation(ValueError("shape mismatch"))
        False
    """
    from torch._dynamo.exc import UserError, UserErrorType
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

    seen: BaseException | None = error
    typed = False
    while seen is not None:
        if isinstance(seen, ConstraintViolationError):
            return True
        if isinstance(seen, UserError):
            typed = True
            if seen.error_type == UserErrorType.CONSTRAINT_VIOLATION:
                return True
        seen = seen.__cause__
    if typed:
        return False
    return _CONSTRAINT_TEXT in str(error)


_VIOLATED = re.compile(r"Constraints violated \(([^)]*)\)")


def violation_names(error: BaseException) -> set[str]:
    """The dim names torch lists in a constraint violation (``Constraints violated (a, b)!``).

    torch 2.13 gives these names in the message only (``UserError`` carries the text, no
    structured list): the one place capture reads them from text. Without it,
    `replay.pipeline.bounded` would hint every symbol instead of the violated ones first.

    Args:
        error: A constraint violation (`is_constraint_violation`).

    Returns:
        The identifiers inside the parentheses; empty when the text has none.

    Example:
        >>> sorted(violation_names(Exception("Constraints violated (m - 1, b)! ...")))
        ['b', 'm']
    """
    match = _VIOLATED.search(str(error))
    if match is None:
        return set()
    return set(re.findall(r"[A-Za-z_]\w*", match.group(1)))


@dataclasses.dataclass(frozen=True)
class ShapeFacts:
    """What an exported program accepts, as torch's symbolic shapes state it.

    Attributes:
        inputs: Per tensor input of the program (its user inputs, in call order), each axis'
            size: an int (static) or a sympy expression over torch's size symbols.
        ranges: torch symbol -> (min, max) of the program's ``range_constraints`` (``max``
            None when unbounded).
        guards: The ShapeEnv's guards, with torch's symbol replacements applied: each a sympy
            boolean that must hold for a call to be accepted.
    """

    inputs: tuple[tuple[Any, ...], ...]
    ranges: dict[sympy.Symbol, tuple[int, int | None]]
    guards: tuple[sympy.Basic, ...]


def shape_facts(program: Any) -> ShapeFacts | None:
    """The symbolic shapes of an exported program's inputs, its ranges and its guards.

    Private APIs (checked on torch 2.13.0): ``torch.export.exported_program._get_shape_env``
    (the ShapeEnv behind the graph's fake values), ``ShapeEnv.guards`` (``ShapeGuard.expr``)
    and ``ShapeEnv.replacements``, and ``SymInt.node.expr`` of each placeholder's fake tensor
    size. ``range_constraints`` and ``graph_signature.user_inputs`` are public. These are the
    same facts torch turns into the program's runtime input checks (``_guards_code`` and
    ``_check_input_constraints_for_graph``); without them, where torch cut a recorded range
    could only be read from error text.

    Args:
        program: A `torch.export.ExportedProgram`.

    Returns:
        A `ShapeFacts`, or None when the program carries no symbolic shapes (nothing dynamic).

    Example:
        >>> ep = torch.export.export(model, (x,), dynamic_shapes=({0: Dim.DYNAMIC},))
        ... # doctest: +SKIP
        >>> shape_facts(ep).ranges  # doctest: +SKIP
        {s0: (2, 3)}
    """
    import torch
    from torch.export.exported_program import _get_shape_env
    from torch.utils._sympy.numbers import IntInfinity

    env = _get_shape_env(program.graph_module)  # type: ignore[no-untyped-call]
    users = set(program.graph_signature.user_inputs)
    inputs: list[tuple[Any, ...]] = []
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in users:
            continue
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            inputs.append(
                tuple(s.node.expr if isinstance(s, torch.SymInt) else int(s) for s in value.shape)
            )
    ranges: dict[Any, tuple[int, int | None]] = {}
    for symbol, bounds in program.range_constraints.items():
        upper = bounds.upper
        ranges[symbol] = (int(bounds.lower), None if isinstance(upper, IntInfinity) else int(upper))
    if env is None:
        return ShapeFacts(tuple(inputs), ranges, ()) if ranges else None
    replacements = dict(env.replacements)
    # Replacements may chain (s9 -> s5 -> s70): applied until nothing changes.
    guards = [_replaced(guard.expr, replacements) for guard in env.guards]
    inputs = [tuple(_replaced(e, replacements) for e in shape) for shape in inputs]
    return ShapeFacts(tuple(inputs), ranges, tuple(guards))


def _replaced(expr: Any, replacements: dict[Any, Any]) -> Any:
    if isinstance(expr, int):
        return expr
    for _ in range(8):
        replaced = expr.xreplace(replacements)
        if replaced == expr:
            return expr
        expr = replaced
    return expr
