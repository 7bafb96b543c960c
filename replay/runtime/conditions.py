"""A program's own size guards, as data: parsed and evaluated without ``eval``.

torch.export keeps, with a program, the conditions its graph assumed about input sizes
(``L['input_ids'].size()[1] <= 4`` for a sliding window's prefill, ``16*L['input_ids'].size()[1]
!= 80`` for a branch taken at one size); ``ep.module()`` checks them on every call. A file
converted from the program (ONNX) does not: outside them it answers, wrongly. So an ONNX file's
guard (`replay.runtime.guards.ProgramGuard.conditions`) carries them:

- `translate` rewrites each condition over the call's ``dims`` (``d5``: the sixth size of the
  call, in leaf then axis order), given where each ``L[...]`` source sits among them; a line
  that names anything else (a stride, a value, an unknown input) is not translated and is
  reported instead;
- `parse` checks a translated condition against a small grammar (integers, ``d<i>``, ``+ - *
  // %``, comparisons, ``and``/``or``/``not``, ``max``/``min``) with Python's `ast` parser, and
  at most `_MAX_DEPTH` levels deep; `holds` evaluates it by walking the tree. Nothing is
  compiled or evaluated by Python: a manifest is data, and a planted condition can only be
  refused.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from capture.errors import ReplayError

__all__ = ["Condition", "ConditionError", "translate", "parse", "holds"]

_SOURCE = re.compile(r"(L(?:\[[^\]]*\]|\.[A-Za-z_][A-Za-z0-9_]*)*?)\.size\(\)\[(\d+)\]")
_MAX_TEXT = 2000
_MAX_DEPTH = 200
"""Deepest expression tree a condition may have (torch writes a handful of levels; a sum of
many terms nests one level per term)."""
_COMPARE: dict[type[ast.cmpop], Callable[[int, int], bool]] = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}
_ARITH: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b if b else 0,
    ast.Mod: lambda a, b: a % b if b else 0,
}
_CALLS: dict[str, Callable[..., int]] = {"max": max, "min": min}


class ConditionError(ReplayError):
    """A stored size condition is not one `parse` accepts."""


@dataclass(frozen=True)
class Condition:
    """One program guard over a call's dims, parsed when made (`parse`).

    Attributes:
        expr: The condition over ``d<i>`` (``16*d1 != 80``).
        text: The program's own line, for messages.

    Raises:
        ConditionError: `expr` is not a condition of the grammar.

    Example:
        >>> Condition("16*d1 != 80", "16*L['x'].size()[1] != 80").holds([2, 5])
        False
    """

    expr: str = field(metadata={"max_len": 2000})
    text: str = field(metadata={"max_len": 10_000})
    tree: ast.expr = field(init=False, repr=False, compare=False)
    _run: Callable[[Sequence[int]], int | bool] = field(init=False, repr=False, compare=False)
    reads: tuple[int, ...] = field(init=False, repr=False, compare=False)
    """The dims the condition reads (``(1, 4)`` for ``d1 + d4 <= 9``)."""

    def __post_init__(self) -> None:
        tree = parse(self.expr)
        object.__setattr__(self, "tree", tree)
        object.__setattr__(self, "_run", _closure(tree))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in _CALLS}
        object.__setattr__(self, "reads", tuple(sorted(int(n[1:]) for n in names)))

    def holds(self, dims: Sequence[int]) -> bool:
        """Whether the condition holds for a call with these sizes (`holds`; evaluated by
        closures built once from the checked tree, as `holds` walks it)."""
        return bool(self._run(dims))


def translate(
    code: Sequence[str], sources: Mapping[str, tuple[int, int]]
) -> tuple[list[Condition], list[str]]:
    """The program's guard lines over the call's dims.

    Args:
        code: The program's guard lines (`capture.compat.guards_code`).
        sources: ``L[...]`` source of an input -> (its first index among the dims, its rank).

    Returns:
        ``(conditions, lines not translated)``; each translated condition parses (`parse`).

    Example:
        >>> translate(["L['x'].size()[1] <= 4"], {"L['x']": (0, 2)})[0][0].expr
        'd1 <= 4'
    """
    done: list[Condition] = []
    skipped: list[str] = []
    for line in code:
        missing = False

        def dim(match: re.Match[str]) -> str:
            nonlocal missing
            found = sources.get(match.group(1))
            axis = int(match.group(2))
            if found is None or axis >= found[1]:
                missing = True
                return match.group(0)
            return f"d{found[0] + axis}"

        expr = _SOURCE.sub(dim, line)
        if missing or "L[" in expr or "L." in expr:
            skipped.append(line)
            continue
        try:
            done.append(Condition(expr, line))
        except ConditionError:
            skipped.append(line)
    return done, skipped


def parse(expr: str) -> ast.expr:
    """The checked syntax tree of a condition (module docstring's grammar).

    Raises:
        ConditionError: Not a condition of that grammar.

    Example:
        >>> isinstance(parse("d0 + 1 == d2"), ast.Compare)
        True
    """
    if not isinstance(expr, str) or len(expr) > _MAX_TEXT:
        raise ConditionError(f"the size condition {expr!r:.80} is not a short string")
    try:
        tree = ast.parse(expr, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ConditionError(f"the size condition {expr!r:.80} does not parse: {e}") from None
    if _nested_deeper(tree, _MAX_DEPTH):
        raise ConditionError(
            f"the size condition {expr!r:.80} nests deeper than {_MAX_DEPTH} levels, which "
            "a size condition never does"
        )
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if not _allowed(node) or (
            isinstance(node, ast.Name) and (node.id in _CALLS) != (id(node) in called)
        ):
            raise ConditionError(
                f"the size condition {expr!r:.80} holds a {type(node).__name__}, which a size "
                "condition never does"
            )
    return tree


def _nested_deeper(tree: ast.AST, limit: int) -> bool:
    """Whether `tree` nests deeper than `limit` (walked without recursion: the closures
    `Condition` builds and `holds` recurse once per level)."""
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return False


def _allowed(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return type(node.value) is int
    if isinstance(node, ast.Name):
        return re.fullmatch(r"d\d+", node.id) is not None or node.id in _CALLS
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id in _CALLS and not node.keywords
    if isinstance(node, ast.BinOp | ast.BoolOp | ast.UnaryOp | ast.Compare):
        return True
    return isinstance(
        node,
        (ast.And, ast.Or, ast.Not, ast.USub, ast.UAdd, ast.Load, *_COMPARE, *_ARITH),
    )


def holds(tree: ast.expr, dims: Sequence[int]) -> bool:
    """Evaluates a parsed condition on a call's dims (a dim past the end fails it).

    Example:
        >>> holds(parse("16*d1 != 80"), [2, 5])
        False
    """
    return bool(_value(tree, dims))


_Eval = Callable[[Sequence[int]], int | bool]


def _closure(node: ast.expr) -> _Eval:
    """`_value` of `node` as nested closures (the same rules; no code is compiled)."""
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            raise ConditionError(f"{node.value!r} in a size condition is not an integer")
        constant = node.value
        return lambda dims: constant
    if isinstance(node, ast.Name):
        index = int(node.id[1:])
        return lambda dims: int(dims[index]) if index < len(dims) else -1
    if isinstance(node, ast.UnaryOp):
        operand = _closure(node.operand)
        if isinstance(node.op, ast.Not):
            return lambda dims: not operand(dims)
        if isinstance(node.op, ast.USub):
            return lambda dims: -operand(dims)
        return operand
    if isinstance(node, ast.BinOp):
        fn, left, right = _ARITH[type(node.op)], _closure(node.left), _closure(node.right)
        return lambda dims: int(fn(left(dims), right(dims)))
    if isinstance(node, ast.BoolOp):
        parts = [_closure(v) for v in node.values]
        if isinstance(node.op, ast.And):
            return lambda dims: all(p(dims) for p in parts)
        return lambda dims: any(p(dims) for p in parts)
    if isinstance(node, ast.Compare):
        first = _closure(node.left)
        pairs = zip(node.ops, node.comparators, strict=True)
        steps = [(_COMPARE[type(op)], _closure(r)) for op, r in pairs]

        def compare(dims: Sequence[int]) -> bool:
            left = first(dims)
            for test, right_of in steps:
                right = right_of(dims)
                if not test(left, right):
                    return False
                left = right
            return True

        return compare
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        call, args = _CALLS[node.func.id], [_closure(a) for a in node.args]
        return lambda dims: int(call(*(a(dims) for a in args)))
    raise ConditionError(f"unexpected {type(node).__name__} in a size condition")


def _value(node: ast.expr, dims: Sequence[int]) -> int | bool:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            raise ConditionError(f"{node.value!r} in a size condition is not an integer")
        return node.value
    if isinstance(node, ast.Name):
        index = int(node.id[1:])
        return int(dims[index]) if index < len(dims) else -1
    if isinstance(node, ast.UnaryOp):
        value = _value(node.operand, dims)
        if isinstance(node.op, ast.Not):
            return not value
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.BinOp):
        return int(_ARITH[type(node.op)](_value(node.left, dims), _value(node.right, dims)))
    if isinstance(node, ast.BoolOp):
        values = (_value(v, dims) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _value(node.left, dims)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _value(right_node, dims)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return int(_CALLS[node.func.id](*(_value(a, dims) for a in node.args)))
    raise ConditionError(f"unexpected {type(node).__name__} in a size condition")
