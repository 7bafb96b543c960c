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
writes: arithmetic on sizes, comparisons, ``L[...].size()[i]``, sympy constructors, bounded
(`replay.runtime.pt2.expressions`). Every node target must be an operator of the model's math
(`replay.runtime.pt2.operators`), and what a node writes or draws is held to
`replay.runtime.pt2.limits.effects`: never a parameter, a constant or a caller's tensor
outside its caches, never the global random generator. Needs no torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, NoReturn

from replay.runtime.allowed import AllowOps
from replay.runtime.checked_json import NAME, load
from replay.runtime.guards import ArtifactError
from replay.runtime.pt2.expressions import check_guard, check_sympy, refuse
from replay.runtime.pt2.limits.effects import Effects, check_effects
from replay.runtime.pt2.operators import op_kind

__all__ = ["check_program", "spec_types", "BUILTIN_SPEC_TYPES", "MAX_NESTING"]

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
MAX_NESTING = 200
"""Deepest nesting of a program's JSON read (a Llama's graph nests 17 levels, each subgraph
adds about ten)."""
_STRING_KEYS = _NAME_KEYS | {"expr_str", "target", "as_operator", "in_spec", "out_spec"}
"""Keys whose string values torch evaluates, executes, imports or pastes into code."""
# A range constraint's key: a symbol, or (torch 2.11 and 2.12, for a derived dim) a linear
# expression of symbols and small integers as sympy prints it ("s5 + 1", "2*s3 - 1"): nothing
# sympy could call or raise to a power.
_LINEAR = re.compile(r"(?:\d{1,6}\*)?[A-Za-z][A-Za-z0-9_]{0,15}|\d{1,6}")
_RANGE_KEY = re.compile(rf"-?(?:{_LINEAR.pattern})(?: [+-] (?:{_LINEAR.pattern})){{0,8}}\Z")


def check_program(
    data: bytes,
    source: str,
    known_type: Callable[[str], bool],
    allowed: AllowOps = frozenset(),
    checked: set[tuple[str, Any]] | None = None,
    effects: list[Effects] | None = None,
) -> dict[str, Any]:
    """Checks one program's JSON; returns it parsed.

    Args:
        data: The ``models/<program>.json`` bytes (bounded by the caller).
        source: The entry's name, for errors.
        known_type: Whether a pytree node type a treespec names may be rebuilt (the loader
            accepts the types registered in its process and the ``transformers.*`` ones it
            registers itself).
        allowed: Operator namespaces (or ``namespace.op``) the caller allows beyond
            `replay.runtime.pt2.operators`.
        checked: The (key, string) pairs found good so far, updated: the programs of one
            artifact, checked with the same `known_type` and `allowed`, share one set.
        effects: What the program may write (`replay.runtime.pt2.limits.effects.Effects`) is
            appended here.

    Returns:
        The parsed JSON.

    Raises:
        ArtifactError: A string torch would evaluate, execute, import or paste into code is not
            one torch.export writes, bounded (`replay.runtime.pt2.expressions`); a node calls an
            operator that is not the model's math (`replay.runtime.pt2.operators`), writes a
            tensor it may not or draws random numbers (`replay.runtime.pt2.limits.effects`).

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
    # A graph repeats each name and size thousands of times, and two programs of one model
    # most of theirs: each (key, string) is checked once per `checked` set.
    _Walk(source, known_type, allowed, set() if checked is None else checked).mapping(None, tree, 0)
    found = check_effects(tree, source, allowed)
    if effects is not None:
        effects.append(found)
    return tree


class _Walk:
    """Every value of a program's JSON, depth first: the strings under `_STRING_KEYS` (and the
    guards, the forward argument names and the range symbols) checked, each once per `seen`."""

    def __init__(
        self,
        source: str,
        known: Callable[[str], bool],
        allowed: AllowOps,
        seen: set[tuple[str, Any]],
    ) -> None:
        self.source = source
        self.known = known
        self.allowed = allowed
        self.seen = seen

    def too_deep(self) -> NoReturn:
        raise ArtifactError(
            f"{self.source}: the program nests deeper than {MAX_NESTING} levels, which "
            "torch.export never writes; it is not loaded"
        )

    def mapping(self, key: str | None, value: dict[str, Any], depth: int) -> None:
        if depth > MAX_NESTING:
            self.too_deep()
        if key == "range_constraints":
            for symbol in value:
                _require(_RANGE_KEY.match(symbol), self.source, "symbol", symbol)
        if key == "as_custom_obj" or "custom_obj" in value:
            raise ArtifactError(
                f"{self.source}: the program uses a custom object; an artifact holds tensors "
                "only, so it is not loaded"
            )
        seen = self.seen
        for item_key, item in value.items():
            kind = type(item)
            if kind is str:
                if item_key in _STRING_KEYS and (item_key, item) not in seen:
                    _check_string(item_key, item, self.source, self.known, self.allowed)
                    seen.add((item_key, item))
            elif kind is dict:
                self.mapping(item_key, item, depth + 1)
            elif kind is list:
                self.sequence(item_key, item, depth + 1)

    def sequence(self, key: str | None, value: list[Any], depth: int) -> None:
        if depth > MAX_NESTING:
            self.too_deep()
        seen = self.seen
        if key == "guards_code":
            for guard in value:
                if type(guard) is not str or (key, guard) not in seen:
                    check_guard(guard, self.source)  # refuses anything but a string
                    seen.add((key, guard))
            return
        if key == "forward_arg_names":
            for name in value:
                _require(isinstance(name, str) and NAME.match(name), self.source, "name", name)
            return
        for item in value:
            kind = type(item)
            if kind is str:
                if key in _STRING_KEYS and (key, item) not in seen:
                    _check_string(key, item, self.source, self.known, self.allowed)
                    seen.add((key, item))
            elif kind is dict:
                self.mapping(key, item, depth + 1)
            elif kind is list:
                self.sequence(key, item, depth + 1)


def _check_string(
    key: str | None, value: str, source: str, known: Callable[[str], bool], allowed: AllowOps
) -> None:
    if key == "expr_str":
        check_sympy(value, source)
    elif key in _NAME_KEYS:
        _require(_NAMES.match(value), source, "name", value)
    elif key in ("target", "as_operator"):
        if op_kind(value, allowed) is None:
            raise ArtifactError(
                f"{source}: the program calls {value[:120]!r}, which is not an operator an "
                "artifact may call (the model's math: replay.runtime.pt2.operators lists them; "
                "a custom operator library's namespace is allowed by naming it: "
                "replay.load(path, allow_ops=[...]), capture check --allow-ops); it is not loaded"
            )
    elif key in ("in_spec", "out_spec"):
        _check_spec(value, source, known, key == "in_spec")


def _require(ok: Any, source: str, what: str, value: Any) -> None:
    if not ok:
        refuse(source, what, value)


def _check_spec(text: str, source: str, known: Callable[[str], bool], is_input: bool) -> None:
    """A program's input/output treespec: builtin containers, safe contexts, known types."""
    try:
        protocol, root = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        refuse(source, "treespec", text)
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
