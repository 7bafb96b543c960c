"""A program's size expressions and guards, checked and bounded before sympy or Python reads them.

torch's deserializer passes every ``expr_str`` to ``sympy.sympify`` (which evaluates Python)
and ``ExportedProgram.module()`` ``exec``-s every ``guards_code`` line. Each string is parsed
with Python's `ast` and walked node by node against an allow-list (`check_sympy`,
`check_guard`): sympy constructors and torch's size functions, comparisons, arithmetic,
``L[...].size()[i]``. What is allowed is also bounded, so that evaluating it is cheap:

- `MAX_CHARS` characters and `MAX_DEPTH` levels of nesting;
- integer constants within ±`MAX_INT`, string constants (``Integer('12')``) of at most
  `MAX_DIGITS` characters, a ``precision`` of at most `MAX_PRECISION` bits;
- the exponent of a power (``**``, ``Pow``, ``PowByNatural``, ``FloatPow``) and the count of a
  shift (``LShift``, ``RShift``) a literal of at most `MAX_EXPONENT`, and a power's base holds
  no other power: ``Integer(10)**Integer(10)**Integer(12)`` (a number of 10**12 digits, which
  sympy would compute) is refused as written.

Needs no torch.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import Any, NoReturn

from replay.runtime.guards import ArtifactError

__all__ = [
    "check_guard",
    "check_sympy",
    "refuse",
    "MAX_CHARS",
    "MAX_DEPTH",
    "MAX_INT",
    "MAX_DIGITS",
    "MAX_EXPONENT",
    "MAX_PRECISION",
]

MAX_CHARS = 20_000
"""Longest expression or guard line read."""
MAX_DEPTH = 100
"""Deepest nesting of its syntax tree."""
MAX_INT = 2**64
"""Largest integer constant (sizes, strides and their bounds are int64)."""
MAX_DIGITS = 40
"""Longest string constant (``Integer('123')``, ``Float('1.5')``, ``Symbol('s0')``)."""
MAX_EXPONENT = 64
"""Largest literal exponent or shift count."""
MAX_PRECISION = 1024
"""Largest ``Float(..., precision=n)``."""

# sympy constructors torch writes (srepr) and the functions of torch.utils._sympy.functions.
_SYMPY_CALLS = frozenset(
    """Add Mul Pow Integer Float Rational Symbol Max Min Abs Mod floor ceiling sqrt Eq Ne Lt Le
    Gt Ge StrictLessThan LessThan StrictGreaterThan GreaterThan Equality Unequality And Or Not
    Piecewise ExprCondPair Tuple FloorDiv ModularIndexing Where PythonMod CleanDiv CeilToInt
    FloorToInt CeilDiv LShift RShift PowByNatural FloatPow FloatTrueDiv IntTrueDiv
    IsNonOverlappingAndDenseIndicator TruncToFloat TruncToInt RoundToInt RoundDecimal ToFloat
    Identity Max Min""".split()
)
_SYMPY_FAMILIES = re.compile(r"(OpaqueUnaryFn|BitwiseFn)_[a-z0-9_]+\Z")
_SYMPY_VALUES = frozenset({"oo", "zoo", "nan", "true", "false", "pi", "E"})
_SYMPY_KEYWORDS = frozenset(
    {"positive", "negative", "integer", "real", "nonnegative", "nonpositive", "finite",
     "precision", "evaluate"}
)  # fmt: skip

# Guards (torch's Python printer of sympy): builtins and the names torch puts in scope.
_GUARD_CALLS = frozenset(
    """min max abs int float round Min Max Abs Mod FloorDiv Eq Ne floor ceiling CeilToInt
    FloorToInt TruncToInt IntTrueDiv FloatTrueDiv sym_min sym_max sym_float sym_int sym_sqrt
    PythonMod CleanDiv CeilDiv""".split()
)
_GUARD_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})
_GUARD_NAMES = frozenset({"L", "inf", "math"})
_CMP = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_ARITH = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_UNARY = (ast.USub, ast.UAdd, ast.Not)

_STR_CONST = re.compile(rf"[A-Za-z0-9_.+\-]{{0,{MAX_DIGITS}}}\Z")
_SYMPY_SYMBOL = re.compile(r"[a-z]{1,8}[0-9]{1,12}\Z")  # torch's symbols: s0, u3, zuf1
_POWERS = frozenset({"Pow", "PowByNatural", "FloatPow", "LShift", "RShift"})
_LITERALS = frozenset({"Integer", "Float", "Rational"})


def refuse(source: str, what: str, value: Any) -> NoReturn:
    """One `ArtifactError`: `value` (the `what` of `source`) is not one torch.export writes."""
    raise ArtifactError(
        f"{source}: the {what} {str(value)[:120]!r} is not one torch.export writes; the "
        "program is not loaded (an artifact is data: nothing in it may run as code)"
    )


def check_guard(text: Any, source: str) -> None:
    """Refuses a ``guards_code`` line that is not a bounded size comparison.

    Raises:
        ArtifactError: Names the line and what it names.

    Example:
        >>> check_guard("L['x'].size()[0] <= 4096", "m.json")
        >>> check_guard("2 ** 10 ** 12 > 0", "m.json")
        Traceback (most recent call last):
        ...
        replay.runtime.guards.ArtifactError: m.json: the guard '2 ** 10 ** 12 > 0' is not a \
size comparison torch.export writes (it names an exponent that is not a literal of at most 64); \
the program is not loaded
    """
    _check_expr(text, source, "guard", "a size comparison torch.export writes", _guard_node)


def check_sympy(text: Any, source: str) -> None:
    """Refuses an ``expr_str`` that is not a bounded sympy expression torch writes.

    Raises:
        ArtifactError: Names the expression and what it names.

    Example:
        >>> check_sympy("Add(Symbol('s0', positive=True, integer=True), Integer(1))", "m.json")
    """
    _check_expr(text, source, "symbolic expression", "one torch.export writes", _sympy_node)


def _parse(text: Any, source: str, what: str) -> ast.expr:
    if not isinstance(text, str) or len(text) > MAX_CHARS or any(c in text for c in '#\\\r\n"\0'):
        refuse(source, what, text)
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        refuse(source, what, text)
    return tree.body


def _check_expr(
    text: Any, source: str, what: str, expected: str, rule: Callable[[ast.AST], str | None]
) -> None:
    """Refuses `text` unless every node of its expression passes `rule` (None: allowed) and
    the bounds (module docstring)."""
    tree = _parse(text, source, what)
    for node in _walk(tree):
        bad = _unbounded(node) or rule(node)
        if bad:
            raise ArtifactError(
                f"{source}: the {what} {str(text)[:120]!r} is not {expected} "
                f"(it names {bad}); the program is not loaded"
            )


def _walk(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree` (None as soon as it nests deeper than `MAX_DEPTH`)."""
    out: list[ast.AST] = []
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            out.append(_TooDeep())
            return out
        out.append(node)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return out


class _TooDeep(ast.AST):
    """Stands for the node past `MAX_DEPTH` (what `_unbounded` names)."""


def _unbounded(node: ast.AST) -> str | None:
    """What makes `node` costly to evaluate (module docstring), or None."""
    if isinstance(node, _TooDeep):
        return f"more than {MAX_DEPTH} levels of nesting"
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return None if abs(node.value) <= MAX_INT else "an integer constant above 2**64"
    if isinstance(node, ast.Constant) and isinstance(node.value, float):
        return None
    if isinstance(node, ast.keyword) and node.arg == "precision":
        value = node.value
        ok = isinstance(value, ast.Constant) and isinstance(value.value, int)
        small = ok and 0 < value.value <= MAX_PRECISION  # type: ignore[attr-defined]
        return None if small else "a precision above 1024"
    base: ast.expr | None = None
    exponent: ast.expr | None = None
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.LShift, ast.RShift)):
        base, exponent = node.left, node.right
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _POWERS:
        if len(node.args) != 2:
            return f"{node.func.id} with {len(node.args)} arguments"
        base, exponent = node.args
    if base is None or exponent is None:
        return None
    if not _small_literal(exponent):
        return f"an exponent that is not a literal of at most {MAX_EXPONENT}"
    if any(_is_power(n) for n in ast.walk(base)):
        return "a power of a power"
    return None


def _small_literal(node: ast.AST) -> bool:
    """A number (or ``Integer(n)``, ``Float('x')``, ``-n``) of magnitude at most `MAX_EXPONENT`."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _small_literal(node.operand)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return (
            node.func.id in _LITERALS
            and bool(node.args)
            and all(_small_literal(a) for a in node.args)
        )
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return abs(float(node.value)) <= MAX_EXPONENT
        except ValueError:
            return False
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
        and abs(node.value) <= MAX_EXPONENT
    )


def _is_power(node: ast.AST) -> bool:
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, (ast.Pow, ast.LShift))
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (node.func.id in _POWERS)
    )


def _guard_node(node: ast.AST) -> str | None:
    """None when `node` may appear in a guard, else what it names."""
    if isinstance(node, (ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Subscript)):
        ops = getattr(node, "ops", None) or [getattr(node, "op", None)]
        allowed = _CMP + _ARITH + _UNARY + (ast.And, ast.Or)
        ok = all(op is None or isinstance(op, allowed) for op in ops)
        return None if ok else type(ops[0]).__name__
    if isinstance(node, ast.Constant):
        ok = isinstance(node.value, (int, float)) or (
            isinstance(node.value, str) and bool(_STR_CONST.match(node.value))
        )
        return None if ok else repr(node.value)[:40]
    if isinstance(node, ast.Name):
        return None if node.id in _GUARD_NAMES or node.id in _GUARD_CALLS else node.id
    if isinstance(node, ast.Attribute):
        return None if not node.attr.startswith("_") else node.attr
    if isinstance(node, ast.Call):
        if node.keywords:
            return "keyword arguments"
        func = node.func
        if isinstance(func, ast.Name):
            return None if func.id in _GUARD_CALLS else func.id
        if isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Name) and func.value.id == "math":
                return None
            return None if func.attr in _GUARD_METHODS and not node.args else func.attr
        return "a computed call"
    if isinstance(node, (ast.Load, *_CMP, *_ARITH, *_UNARY, ast.And, ast.Or)):
        return None
    return type(node).__name__


def _sympy_node(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else None
        if name is None or not (name in _SYMPY_CALLS or _SYMPY_FAMILIES.match(name)):
            return name or "a computed call"
        bad_kw = [k.arg for k in node.keywords if k.arg not in _SYMPY_KEYWORDS]
        return f"the keyword {bad_kw[0]}" if bad_kw else None
    if isinstance(node, ast.Name):
        known = node.id in _SYMPY_VALUES or node.id in _SYMPY_CALLS
        symbol = _SYMPY_FAMILIES.match(node.id) or _SYMPY_SYMBOL.match(node.id)
        return None if known or symbol else node.id
    if isinstance(node, ast.Constant):
        ok = isinstance(node.value, (int, float, bool)) or (
            isinstance(node.value, str) and bool(_STR_CONST.match(node.value))
        )
        return None if ok else repr(node.value)[:40]
    if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp)):
        return _guard_node(node)
    if isinstance(node, (ast.keyword, ast.Load, *_CMP, *_ARITH, *_UNARY, ast.And, ast.Or)):
        return None
    return type(node).__name__
