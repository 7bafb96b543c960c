"""A program's graph JSON, checked before torch reads it: the strings torch would run as code.

torch's deserializer (2.13) and ``ExportedProgram.module()`` turn parts of a program's JSON
into code: every ``expr_str`` goes through ``sympy.sympify`` (which evaluates Python), every
``guards_code`` line is ``exec``-ed into a guard function, names, targets and keyword names are
pasted into the Python source torch.fx generates and executes, the input/output treespecs go
through ``treespec_loads`` (which imports a defaultdict's factory module), and node targets
are resolved as attributes of ``torch``, ``operator`` and ``math`` and then called. A changed
program JSON could run anything through any of them. `check_program` parses every such string
with our own grammar (Python's `ast`, node by node against an allow-list) and refuses, with
one `ArtifactError` naming the entry and the string, anything that is not what torch.export
writes: arithmetic on sizes, comparisons, ``L[...].size()[i]``, sympy constructors, torch
operators. Needs no torch.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any, NoReturn

from replay.runtime.checked_json import NAME, load
from replay.runtime.guards import ArtifactError

__all__ = ["check_program", "spec_types", "BUILTIN_SPEC_TYPES"]

BUILTIN_SPEC_TYPES = frozenset(
    {
        "builtins.tuple",
        "builtins.list",
        "builtins.dict",
        "collections.OrderedDict",
        "collections.defaultdict",
        "collections.deque",
        "collections.namedtuple",
    }
)
"""Treespec node types torch rebuilds without a registration."""

_NAMES = re.compile(r"[A-Za-z0-9_.]*\Z")
_NAME_KEYS = frozenset(
    {
        "name",
        "as_name",
        "fqn",
        "parameter_name",
        "buffer_name",
        "tensor_constant_name",
        "custom_obj_name",
        "user_input_name",
    }
)
_STR_CONST = re.compile(r"[A-Za-z0-9_.+\-]*\Z")
_SYMBOL = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
_SYMPY_SYMBOL = re.compile(r"[a-z]{1,8}[0-9]{1,12}\Z")  # torch's symbols: s0, u3, zuf1
_IDENT_COMPONENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

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

# Node targets: torch operators, and the few Python callables torch.export graphs call.
_TORCH_CALLABLES = frozenset(
    """sym_float sym_int sym_max sym_min sym_not sym_ite sym_sqrt sym_sum _sym_sqrt _check
    _check_is_size _assert _assert_async _assert_scalar _constrain_as_size _constrain_as_value
    amp.autocast_mode._enter_autocast amp.autocast_mode._exit_autocast _C._set_grad_enabled
    autograd.grad_mode.set_grad_enabled""".split()
)
_OPERATORS = frozenset(
    """add sub mul truediv floordiv mod pow neg pos abs eq ne lt le gt ge and_ or_ xor not_
    invert getitem lshift rshift matmul truth index""".split()
)
_OP_DUNDERS = frozenset(
    {f"__{n}__" for n in "and or xor lshift rshift iand ior ixor ilshift irshift".split()}
)
_OPS_ATTRIBUTES = frozenset({"load_library", "import_module", "loaded_libraries"})


def check_program(data: bytes, source: str, known_type: Callable[[str], bool]) -> dict[str, Any]:
    """Checks one program's JSON; returns it parsed.

    Args:
        data: The ``models/<program>.json`` bytes (bounded by the caller).
        source: The entry's name, for errors.
        known_type: Whether a pytree node type a treespec names may be rebuilt (the loader
            accepts the types registered in its process and the ``transformers.*`` ones it
            registers itself).

    Returns:
        The parsed JSON.

    Raises:
        ArtifactError: A string torch would evaluate, execute, import or paste into code is not
            one torch.export writes (named, with the entry).

    Example:
        >>> check_program(b'{"guards_code": ["__import__(1)"]}', "m.json", str.isidentifier)
        Traceback (most recent call last):
        ...
        replay.runtime.guards.ArtifactError: m.json: the guard '__import__(1)' is not a size \
comparison torch.export writes (it names __import__); the program is not loaded
    """
    tree = load(data, source)
    if not isinstance(tree, dict):
        raise ArtifactError(f"{source} is not a program: a JSON object was expected")
    stack: list[tuple[str | None, Any]] = [(None, tree)]
    checked: set[tuple[str | None, str]] = set()  # a graph repeats each size thousands of times
    while stack:
        key, value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.items())
            if key == "range_constraints":
                for symbol in value:
                    _require(_SYMBOL.match(symbol), source, "symbol", symbol)
            if key == "as_custom_obj" or "custom_obj" in value:
                raise ArtifactError(
                    f"{source}: the program uses a custom object; an artifact holds tensors "
                    "only, so it is not loaded"
                )
        elif isinstance(value, list):
            if key == "guards_code":
                for guard in value:
                    _check_guard(guard, source)
            elif key == "forward_arg_names":
                for name in value:
                    _require(isinstance(name, str) and NAME.match(name), source, "name", name)
            else:
                stack.extend((key, item) for item in value)
        elif isinstance(value, str) and (key, value) not in checked:
            _check_string(key, value, source, known_type)
            checked.add((key, value))
    return tree


def _check_string(key: str | None, value: str, source: str, known: Callable[[str], bool]) -> None:
    if key == "expr_str":
        _check_sympy(value, source)
    elif key in _NAME_KEYS:
        _require(_NAMES.match(value), source, "name", value)
    elif key in ("target", "as_operator"):
        _require(_is_target(value), source, "call target", value)
    elif key in ("in_spec", "out_spec"):
        _check_spec(value, source, known, key == "in_spec")


def _require(ok: Any, source: str, what: str, value: Any) -> None:
    if not ok:
        _refuse(source, what, value)


def _refuse(source: str, what: str, value: Any) -> NoReturn:
    raise ArtifactError(
        f"{source}: the {what} {str(value)[:120]!r} is not one torch.export writes; the "
        "program is not loaded (an artifact is data: nothing in it may run as code)"
    )


def _is_target(target: str) -> bool:
    if target.startswith("#"):  # torch's registered extension operators
        return bool(re.fullmatch(r"#[A-Za-z0-9_]+:[A-Za-z0-9_.]+", target))
    module, _, rest = target.partition(".")
    parts = rest.split(".")
    if not all(_IDENT_COMPONENT.match(p) for p in parts):
        return False
    if module == "_operator":
        return len(parts) == 1 and parts[0] in _OPERATORS
    if module == "math":
        return len(parts) == 1 and not parts[0].startswith("_")
    if module != "torch":
        return False
    if parts[0] != "ops":
        return rest in _TORCH_CALLABLES
    if len(parts) not in (3, 4) or parts[1] in _OPS_ATTRIBUTES or parts[1].startswith("__"):
        return False
    op = parts[2]
    if op.startswith("__") and op not in _OP_DUNDERS:
        return False
    return len(parts) == 3 or not parts[3].startswith("__")


def _parse(text: Any, source: str, what: str) -> ast.expr:
    if not isinstance(text, str) or len(text) > 100_000 or any(c in text for c in '#\\\r\n"\0'):
        _refuse(source, what, text)
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        _refuse(source, what, text)
    return tree.body


def _check_expr(
    text: Any, source: str, what: str, expected: str, rule: Callable[[ast.AST], str | None]
) -> None:
    """Refuses `text` unless every node of its expression passes `rule` (None: allowed)."""
    for node in ast.walk(_parse(text, source, what)):
        bad = rule(node)
        if bad:
            raise ArtifactError(
                f"{source}: the {what} {str(text)[:120]!r} is not {expected} "
                f"(it names {bad}); the program is not loaded"
            )


def _check_guard(text: Any, source: str) -> None:
    _check_expr(text, source, "guard", "a size comparison torch.export writes", _guard_node)


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


def _check_sympy(text: Any, source: str) -> None:
    _check_expr(text, source, "symbolic expression", "one torch.export writes", _sympy_node)


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


def _check_spec(text: str, source: str, known: Callable[[str], bool], is_input: bool) -> None:
    """A program's input/output treespec: builtin containers, safe contexts, known types."""
    try:
        protocol, root = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        _refuse(source, "treespec", text)
    _require(protocol == 1, source, "treespec protocol", protocol)
    if is_input:
        _check_kwargs_names(root, source)
    stack = [root]
    count = 0
    while stack:
        node = stack.pop()
        count += 1
        _require(
            count < 1_000_000
            and isinstance(node, dict)
            and set(node) == {"type", "context", "children_spec"}
            and isinstance(node["children_spec"], list),
            source,
            "treespec node",
            str(node)[:80],
        )
        kind, context = node["type"], node["context"]
        stack.extend(node["children_spec"])
        if kind is None:
            continue
        _require(isinstance(kind, str), source, "treespec type", kind)
        if kind not in BUILTIN_SPEC_TYPES:
            _require(known(kind), source, "pytree type", kind)
            continue
        if kind == "collections.defaultdict":
            _require(
                isinstance(context, dict)
                and context.get("default_factory_module") == "builtins"
                and context.get("default_factory_name") in ("list", "dict", "set", "int"),
                source,
                "defaultdict factory",
                context,
            )
            continue
        if kind == "collections.namedtuple":
            _require(isinstance(context, str) and _NAMES.match(context), source, "type", context)
            continue
        _require(isinstance(context, str), source, "treespec context", context)
        try:
            decoded = json.loads(context)
        except (ValueError, RecursionError):
            decoded = object()
        _require(
            decoded is None
            or isinstance(decoded, int)
            or (
                isinstance(decoded, list)
                and all(isinstance(k, (str, int, float, bool)) or k is None for k in decoded)
            ),
            source,
            "treespec context",
            context,
        )


def _check_kwargs_names(root: Any, source: str) -> None:
    """torch.fx pastes the keyword names of the top-level ``(args, kwargs)`` into code."""
    children = root.get("children_spec") if isinstance(root, dict) else None
    if root.get("type") != "builtins.tuple" or not isinstance(children, list) or len(children) != 2:
        return
    kwargs = children[1]
    if isinstance(kwargs, dict) and kwargs.get("type") == "builtins.dict":
        try:
            names = json.loads(kwargs.get("context") or "[]")
        except (ValueError, TypeError, RecursionError):
            names = [object()]
        for name in names if isinstance(names, list) else [names]:
            _require(isinstance(name, str) and NAME.match(name), source, "keyword name", name)


def spec_types(tree: dict[str, Any]) -> set[str]:
    """The pytree node types the program's module call graph names (beyond builtins).

    Args:
        tree: A program's JSON, checked by `check_program`.

    Returns:
        Type names such as ``transformers.cache_utils.DynamicCache``.
    """
    out: set[str] = set()
    graph = tree.get("graph_module") if isinstance(tree, dict) else None
    entries = graph.get("module_call_graph") if isinstance(graph, dict) else None
    for entry in entries if isinstance(entries, list) else ():
        signature = entry.get("signature") if isinstance(entry, dict) else None
        for key in ("in_spec", "out_spec"):
            text = signature.get(key) if isinstance(signature, dict) else None
            if isinstance(text, str) and text:
                stack = [json.loads(text)[1]]
                while stack:
                    node = stack.pop()
                    if isinstance(node, dict):
                        if isinstance(node.get("type"), str):
                            out.add(node["type"])
                        stack.extend(node.get("children_spec") or ())
    return {t for t in out if t not in BUILTIN_SPEC_TYPES}
