"""The work one call may do, bounded at load from the sizes the guards admit.

A program's sizes are symbols (``s0``) whose largest values the artifact states: the program's
own ranges (``range_constraints``) and, tighter, the largest size recorded for each input axis
(the runner serves no call outside them). `check_budget` computes, without running anything, an
upper bound of every size the graph computes and of every tensor it makes, at those maxima, by
interval arithmetic over the nodes themselves (the sizes a node passes as arguments: ``expand``,
``zeros``, ``full``, ``view``, ``repeat``, ``arange``...) and over the sizes torch.export declares
for each tensor. A program is refused, naming the node, when:

- a tensor it makes (an ``expand``'s view counts its full size: a sum over it reads them all)
  may hold more than `budget` elements: `ELEMENT_FLOOR`, or `INPUT_FACTOR` times the largest
  input or weight at the maxima when that is more;
- a size a node passes as an argument is not bounded by the guards (a value read from a tensor);
- size arithmetic (``_operator.mul``, ``pow``, ``lshift``) may leave int64: Python would
  compute an integer of any length.

Needs no torch.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any

from replay.runtime.guards import ArtifactError

__all__ = ["ELEMENT_FLOOR", "INPUT_FACTOR", "INT_LIMIT", "check_budget", "symbol_maxima"]

ELEMENT_FLOOR = 2**31
"""The smallest per-tensor element budget (a sum over 2**31 floats takes about a second)."""
INPUT_FACTOR = 64
"""The budget grows with the model: this many times its largest input or weight."""
INT_LIMIT = 2**63
"""Sizes are int64: size arithmetic that may pass this is refused."""

Bound = tuple[int, int | None]
"""(lowest, highest) value of a size; None: not bounded."""
_UNBOUNDED: Bound = (0, None)
_CAP = 2**256  # products stop growing here: the bound is only compared with the budget
_SIZE_ARGS = ("as_ints", "as_sym_ints")
_SIZE_NAMES = frozenset({"size", "sizes", "shape", "repeats", "output_size", "input_sizes"})
"""The arguments that are a result's sizes (``expand(self, size)``, ``view(self, size)``,
``reshape(self, shape)``, ``repeat(self, repeats)``), not dims or strides."""
_DATA = ("item.default", "_local_scalar_dense.default")
"""Operators whose symbolic int is a tensor's value, not a size."""
_SCALED = frozenset({"repeat", "tile", "repeat_interleave", "one_hot"})
"""Operators whose result is their input times the sizes they are given."""
_SCALAR_SIZES = {
    "arange": ("end", "start"),
    "linspace": ("steps",),
    "logspace": ("steps",),
    "eye": ("n", "m"),
    "randperm": ("n",),
    "one_hot": ("num_classes",),
    "repeat_interleave": ("repeats",),
}
"""Operators whose result's size is a scalar argument (the product of those named)."""


def symbol_maxima(
    tree: Mapping[str, Any], recorded: Sequence[Sequence[int | None]]
) -> dict[str, int]:
    """The largest value of each size symbol: its range's, or tighter, the largest recorded
    size of an input axis it names (`recorded`: per user input, its axes' maxima)."""
    out: dict[str, int] = {}
    for symbol, bound in (tree.get("range_constraints") or {}).items():
        high = bound.get("max_val") if isinstance(bound, dict) else None
        if isinstance(high, int) and 0 <= high < INT_LIMIT:
            out[symbol] = high
    graph = tree["graph_module"]
    values = graph["graph"].get("tensor_values") or {}
    users = [
        spec["user_input"]["arg"].get("as_tensor", {}).get("name") if "user_input" in spec else None
        for spec in graph["signature"].get("input_specs") or ()
        if "user_input" in spec or "constant_input" in spec
    ]
    # the recorded leaves start with the program's inputs, in order (more may follow: inputs
    # the recorded calls passed as None); the pairing stops where their ranks disagree
    for name, maxima in zip(users, recorded, strict=False):
        sizes = (values.get(name) or {}).get("sizes") or [] if name else []
        if len(sizes) != len(maxima):
            break
        for size, high in zip(sizes, maxima, strict=True):
            text = (size.get("as_expr") or {}).get("expr_str") if isinstance(size, dict) else None
            symbol = _plain_symbol(text)
            if symbol is not None and high is not None:
                out[symbol] = min(out.get(symbol, high), high)
    return out


def check_budget(tree: Mapping[str, Any], maxima: Mapping[str, int], source: str) -> int:
    """Refuses a program whose work exceeds its budget (module docstring); returns the budget.

    Raises:
        ArtifactError: One line naming the node, its bound and the budget.
    """
    graph = tree["graph_module"]["graph"]
    walk = _Bounds(graph.get("tensor_values") or {}, maxima, source)
    largest = max((walk.declared(n) or 0 for n in walk.values), default=0)
    walk.budget = max(ELEMENT_FLOOR, INPUT_FACTOR * largest)
    graphs = [graph]
    while graphs:
        current = graphs.pop()
        for node in current.get("nodes") or ():
            if isinstance(node, dict):
                graphs += walk.node(node)
    return walk.budget


class _Bounds:
    def __init__(self, values: Mapping[str, Any], maxima: Mapping[str, int], source: str) -> None:
        self.values = values
        self.maxima = maxima
        self.source = source
        self.budget = ELEMENT_FLOOR
        self.ints: dict[str, Bound] = {}
        self.data: set[str] = set()  # symbolic ints computed from a tensor's values
        self._declared: dict[str, int | None] = {}
        self.exprs: dict[str, Bound] = {}

    def fail(self, node: Mapping[str, Any], what: str) -> ArtifactError:
        return ArtifactError(
            f"{self.source}: node {str(node.get('name'))[:80]} ({str(node.get('target'))[:120]}) "
            f"{what}; it is not loaded"
        )

    def declared(self, name: str) -> int | None:
        """The elements of a tensor as torch.export declares it, at the maxima (None: not
        bounded)."""
        if name not in self._declared:
            sizes = (self.values.get(name) or {}).get("sizes")
            total: int | None = 1
            for size in sizes if isinstance(sizes, list) else []:
                high = _size_bound(size, self.maxima, self.exprs)[1]
                total = None if high is None or total is None else total * high
            self._declared[name] = total
        return self._declared[name]

    def node(self, node: Mapping[str, Any]) -> list[dict[str, Any]]:
        target = str(node.get("target"))
        inputs = [i for i in node.get("inputs") or () if isinstance(i, dict)]
        args = {str(i.get("name")): i.get("arg") or {} for i in inputs}
        subgraphs = [a["as_graph"]["graph"] for a in args.values() if "as_graph" in a]
        op = target.split(".")[3] if target.startswith("torch.ops.aten.") else ""
        largest = 0
        for name, arg in args.items():
            if name not in _SIZE_NAMES and not (op == "tile" and name == "dims"):
                continue
            for kind in _SIZE_ARGS:
                if kind in arg:
                    largest = max(largest, self.product(node, arg[kind]))
        for name in _SCALAR_SIZES.get(op, ()):
            if name in args:
                largest = max(largest, self.scalar(node, args[name]))
        if op in _SCALED and "self" in args:
            largest = min(largest * max(1, self.declared(_tensor(args["self"])) or 1), _CAP)
        for out in node.get("outputs") or ():
            tensor = (out or {}).get("as_tensor") if isinstance(out, dict) else None
            if isinstance(tensor, dict):
                largest = max(largest, min(self.declared(str(tensor.get("name"))) or 0, _CAP))
        if largest > self.budget:
            raise self.fail(
                node,
                f"makes a tensor of up to {float(largest):.3g} elements at the guards' largest "
                f"sizes, over the budget of {float(self.budget):.3g} "
                "(replay.runtime.pt2.limits.budget)",
            )
        self.symbols(node, target, list(args.values()))
        return subgraphs

    def product(self, node: Mapping[str, Any], sizes: Any) -> int:
        total = 1
        for size in sizes if isinstance(sizes, list) else []:
            if isinstance(size, int):
                total = min(total * max(size, 1), _CAP)
                continue
            high = self.value(size)[1]
            if high is None and not self.from_data(size):
                continue  # an input size no guard bounds: the program's own ranges are open
            if high is None:
                raise self.fail(node, "passes a size the guards do not bound (a value read "
                                "from a tensor): its work cannot be bounded at load")  # fmt: skip
            total = min(total * max(high, 1), _CAP)
        return total

    def scalar(self, node: Mapping[str, Any], arg: Any) -> int:
        if "as_sym_int" in arg:
            return self.product(node, [arg["as_sym_int"]])
        value = arg.get("as_int", arg.get("as_float", 1))
        return int(min(abs(value), INT_LIMIT)) if isinstance(value, (int, float)) else 1

    def from_data(self, size: Any) -> bool:
        return isinstance(size, dict) and size.get("as_name") in self.data

    def value(self, size: Any) -> Bound:
        """A size argument: a literal, or a symbolic int a node made."""
        if isinstance(size, int):
            return (size, size)
        if isinstance(size, dict):
            if "as_int" in size:
                return (size["as_int"], size["as_int"])
            if "as_name" in size:
                return self.ints.get(str(size["as_name"]), _UNBOUNDED)
        return _UNBOUNDED

    def symbols(self, node: Mapping[str, Any], target: str, args: list[Any]) -> None:
        """The bound of each symbolic int the node makes; refuses size arithmetic that may
        leave int64."""
        outs = [o.get("as_sym_int", {}).get("as_name") for o in node.get("outputs") or ()
                if isinstance(o, dict)]  # fmt: skip
        if not outs or not isinstance(outs[0], str):
            return
        ints = [a.get("as_sym_int", a) for a in args if _is_int(a)]
        operands = [self.value(a) for a in ints]
        bound = _apply(target, operands, args, self)
        if target.endswith(_DATA) or any(self.from_data(a) for a in ints):
            self.data.add(outs[0])
        if bound[1] is not None and bound[1] >= INT_LIMIT:
            raise self.fail(
                node,
                "computes a size that may exceed int64 at the guards' largest sizes (Python "
                "would compute an integer of any length)",
            )
        self.ints[outs[0]] = bound


def _is_int(arg: Any) -> bool:
    return isinstance(arg, dict) and ("as_int" in arg or "as_sym_int" in arg)


def _tensor(arg: Any) -> str:
    return str((arg.get("as_tensor") or {}).get("name")) if isinstance(arg, dict) else ""


def _apply(target: str, operands: list[Bound], args: list[Any], walk: _Bounds) -> Bound:
    """The bound of one symbolic int node's result."""
    name = target.rpartition(".")[2]
    if target in ("torch.ops.aten.sym_size.int", "torch.ops.aten.sym_numel.default"):
        tensor = _tensor(args[0]) if args else ""
        dims = (walk.values.get(tensor) or {}).get("sizes")
        if name == "int" and len(args) > 1 and isinstance(dims, list):
            dim = args[1].get("as_int") if isinstance(args[1], dict) else None
            if isinstance(dim, int) and -len(dims) <= dim < len(dims):
                return (0, _size_bound(dims[dim], walk.maxima, walk.exprs)[1])
        return (0, walk.declared(tensor))
    if target.startswith(("torch.ops.aten.sym_stride", "torch.ops.aten.sym_storage_offset")):
        return (0, walk.budget)
    if len(operands) == 2 and target.startswith("_operator."):
        return _binary(name, operands[0], operands[1])
    if target in ("torch.sym_max", "torch.sym_min") and operands:
        highs = [b[1] for b in operands]
        top = None if None in highs else (max if name == "sym_max" else min)(highs)  # type: ignore[type-var]
        return (min(b[0] for b in operands), top)
    if name in ("neg", "abs", "pos", "floor", "ceil", "trunc", "sym_int") and operands:
        lo, hi = operands[0]
        return _UNBOUNDED if hi is None else (-max(abs(lo), hi), max(abs(lo), hi))
    return _UNBOUNDED


def _binary(name: str, a: Bound, b: Bound) -> Bound:
    """Interval arithmetic of one ``_operator`` function (None: not bounded)."""
    (alo, ahi), (blo, bhi) = a, b
    if name in ("eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "truth", "not_"):
        return (0, 1)
    if ahi is None or bhi is None:
        return _UNBOUNDED
    top = max(abs(alo), abs(ahi))
    if name == "add":
        return (alo + blo, ahi + bhi)
    if name == "sub":
        return (alo - bhi, ahi - blo)
    if name == "mul":
        corners = [alo * blo, alo * bhi, ahi * blo, ahi * bhi]
        return (min(corners), max(corners))
    if name in ("floordiv", "truediv", "mod"):
        return (-top, top)
    if name in ("pow", "lshift"):
        bits = top.bit_length() if name == "pow" else 1
        exponent = max(abs(blo), abs(bhi))
        if exponent * bits > 64 and top > 1:
            return (0, INT_LIMIT)  # refused: never computed
        value = top**exponent if name == "pow" else top << exponent
        return (-value, value)
    if name == "rshift":
        return (-top, top)
    return _UNBOUNDED


def _plain_symbol(text: Any) -> str | None:
    if not isinstance(text, str):
        return None
    tree = _parse(text)
    if isinstance(tree, ast.Name):
        return tree.id
    if isinstance(tree, ast.Call) and getattr(tree.func, "id", None) == "Symbol" and tree.args:
        first = tree.args[0]
        return (
            first.value
            if isinstance(first, ast.Constant) and isinstance(first.value, str)
            else None
        )
    return None


def _parse(text: str) -> ast.expr | None:
    try:
        return ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _size_bound(size: Any, maxima: Mapping[str, int], seen: dict[str, Bound]) -> Bound:
    """A declared size (``{"as_int": 3}`` or ``{"as_expr": {"expr_str": ...}}``) at the maxima;
    `seen` caches each expression's bound (a graph repeats a few expressions thousands of
    times)."""
    if not isinstance(size, dict):
        return _UNBOUNDED
    if isinstance(size.get("as_int"), int):
        return (size["as_int"], size["as_int"])
    text = (size.get("as_expr") or {}).get("expr_str")
    if not isinstance(text, str):
        return _UNBOUNDED
    found = seen.get(text)
    if found is None:
        tree = _parse(text)
        found = seen[text] = _UNBOUNDED if tree is None else _expr_bound(tree, maxima)
    return found


def _expr_bound(node: ast.expr, maxima: Mapping[str, int]) -> Bound:
    """Interval bound of a sympy expression torch writes (already checked by
    `replay.runtime.pt2.expressions`: bounded in size and exponents)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return (node.value, node.value)
    if isinstance(node, ast.Name):
        high = maxima.get(node.id)
        return _UNBOUNDED if high is None else (0, high)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        lo, hi = _expr_bound(node.operand, maxima)
        return _UNBOUNDED if hi is None else (-hi, -lo)
    if isinstance(node, ast.BinOp):
        ops = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.FloorDiv: "floordiv",
               ast.Mod: "mod", ast.Pow: "pow"}  # fmt: skip
        name = ops.get(type(node.op))
        if name is None:
            return _UNBOUNDED
        left, right = _expr_bound(node.left, maxima), _expr_bound(node.right, maxima)
        return _binary(name, left, right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        func, args = node.func.id, [_expr_bound(a, maxima) for a in node.args]
        if func == "Symbol":
            first = node.args[0] if node.args else None
            symbol = first.value if isinstance(first, ast.Constant) else None
            high = maxima.get(symbol) if isinstance(symbol, str) else None
            return _UNBOUNDED if high is None else (0, high)
        if func == "Integer" and node.args and isinstance(node.args[0], ast.Constant):
            value = node.args[0].value
            return (
                (int(value), int(value))
                if isinstance(value, (int, str)) and str(value).lstrip("-").isdigit()
                else _UNBOUNDED
            )
        folds = {"Add": "add", "Mul": "mul"}
        if func in folds and args:
            out = args[0]
            for arg in args[1:]:
                out = _binary(folds[func], out, arg)
            return out
        if func in ("Max", "Min") and args:
            highs = [a[1] for a in args]
            return (
                _UNBOUNDED
                if None in highs
                else (min(a[0] for a in args), max(h for h in highs if h is not None))
            )
        pairs = {"FloorDiv": "floordiv", "Mod": "mod", "PythonMod": "mod", "CleanDiv": "floordiv",
                 "CeilDiv": "floordiv", "Pow": "pow", "PowByNatural": "pow"}  # fmt: skip
        if func in pairs and len(args) == 2:
            return _binary(pairs[func], args[0], args[1])
    return _UNBOUNDED
