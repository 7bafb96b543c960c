"""Stored treespecs, parsed by our own code against an allow-list: a store is data, never code.

torch's ``treespec_loads`` imports whatever module a ``collections.defaultdict`` node or an
``__enum__`` context names, so a file planted in a store could run code in every reader. Here a
treespec (the JSON of ``torch.utils._pytree.treespec_dumps``, protocol `PROTOCOL`) is read with
`capture.untrusted.loads` (plain JSON, its nesting bounded) and checked node by node:

- builtin containers (tuple, list, dict, OrderedDict, deque, defaultdict whose factory is one
  of `DEFAULT_FACTORIES`) are rebuilt from their own kind;
- a namedtuple is the class registered under its name in this process when there is one, else
  an equivalent namedtuple class made here (the named module is never imported);
- any other node type must be a class registered with torch's pytree *in this process* (the
  transformers caches by `capture.pytree.nodes`, or the user's own registrations); its context is
  the stored JSON value, given to the loader that registration provided.

Anything else raises `UnsafeTreespec` naming the file it came from. `parse` needs no torch
(``capture dims --python`` uses it); `to_treespec` builds a torch ``TreeSpec`` from the result.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass
from typing import Any

from capture import compat, untrusted
from capture.errors import CaptureError

__all__ = [
    "PROTOCOL",
    "DEFAULT_FACTORIES",
    "Node",
    "UnsafeTreespec",
    "parse",
    "to_treespec",
]

PROTOCOL = 1
"""The ``treespec_dumps`` JSON protocol this module reads."""

DEFAULT_FACTORIES: dict[str, type] = {
    "list": list,
    "dict": dict,
    "set": set,
    "tuple": tuple,
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
}
"""``default_factory`` values a stored defaultdict may name (module ``builtins`` only)."""

_TUPLE, _LIST, _DICT = "builtins.tuple", "builtins.list", "builtins.dict"
_ODICT, _DDICT = "collections.OrderedDict", "collections.defaultdict"
_DEQUE, _NTUPLE = "collections.deque", "collections.namedtuple"
BUILTIN_TYPES = frozenset({_TUPLE, _LIST, _DICT, _ODICT, _DDICT, _DEQUE, _NTUPLE})

_MAX_DEPTH = 64
_MAX_NODES = 200_000
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_KEY_TYPES = (str, int, float, bool, type(None))


class UnsafeTreespec(CaptureError):
    """A stored treespec names something outside the allow-list, or is malformed."""


@dataclass(frozen=True)
class Node:
    """One checked treespec node.

    ``type`` is None for a leaf. ``context`` is decoded for builtin kinds: the keys (dict,
    OrderedDict), ``(factory name, keys)`` (defaultdict), ``maxlen`` (deque), the type name
    (namedtuple), None (tuple, list); for a registered class it is the stored context as is.
    """

    type: str | None
    context: Any
    children: tuple[Node, ...]

    @property
    def is_leaf(self) -> bool:
        """True for a leaf (no type)."""
        return self.type is None

    @property
    def num_leaves(self) -> int:
        """How many leaves are below this node (1 for a leaf)."""
        if self.type is None:
            return 1
        return sum(child.num_leaves for child in self.children)


def parse(text: str, source: str = "a stored treespec") -> Node:
    """Parses a stored treespec JSON without importing or evaluating anything it names.

    Args:
        text: ``treespec_dumps`` output, ``[protocol, node]``.
        source: What it was read from (a file or store), named in errors.

    Returns:
        The root `Node`.

    Raises:
        UnsafeTreespec: Bad JSON, another protocol, a node type outside the allow-list, or a
            malformed node; the message names `source`.

    Example:
        >>> parse('[1, {"type": null, "context": null, "children_spec": []}]').is_leaf
        True
    """
    try:
        loaded = untrusted.loads(text)
    except (ValueError, TypeError, RecursionError) as e:
        raise UnsafeTreespec(f"the treespec in {source} is not JSON ({e})") from None
    if not (isinstance(loaded, list) and len(loaded) == 2):
        raise UnsafeTreespec(f"the treespec in {source} is not [protocol, node]")
    protocol, root = loaded
    if protocol != PROTOCOL or isinstance(protocol, bool):
        raise UnsafeTreespec(
            f"the treespec in {source} uses protocol {protocol!r}; this library reads "
            f"protocol {PROTOCOL} only"
        )
    count = [0]
    return _node(root, source, 0, count)


def _fail(source: str, what: str) -> UnsafeTreespec:
    return UnsafeTreespec(
        f"the treespec in {source} {what}; a store holds only data, so it is not loaded "
        "(record again with this library, or register the class in this process)"
    )


def _node(raw: Any, source: str, depth: int, count: list[int]) -> Node:
    count[0] += 1
    if depth > _MAX_DEPTH or count[0] > _MAX_NODES:
        raise _fail(source, f"is deeper than {_MAX_DEPTH} or larger than {_MAX_NODES} nodes")
    if not isinstance(raw, dict) or set(raw) != {"type", "context", "children_spec"}:
        raise _fail(source, "has a malformed node")
    kind, context, children_raw = raw["type"], raw["context"], raw["children_spec"]
    if not isinstance(children_raw, list):
        raise _fail(source, "has a malformed node")
    if kind is None:
        if context is not None or children_raw:
            raise _fail(source, "has a malformed leaf")
        return Node(None, None, ())
    if not isinstance(kind, str) or not _DOTTED.match(kind):
        raise _fail(source, f"names the node type {kind!r}")
    children = tuple(_node(c, source, depth + 1, count) for c in children_raw)
    if kind in BUILTIN_TYPES:
        decoded = _builtin_context(kind, context, len(children), source)
    elif _registered_name(kind):
        decoded = context
    else:
        raise _fail(source, f"names the node type {kind!r}, which is not allowed")
    return Node(kind, decoded, children)


def _json(context: Any, source: str, kind: str) -> Any:
    if not isinstance(context, str):
        raise _fail(source, f"has a malformed {kind} context")
    try:
        return untrusted.loads(context)  # plain: no object hook, so no `__enum__` import
    except (ValueError, RecursionError):
        raise _fail(source, f"has a malformed {kind} context") from None


def _keys(keys: Any, n: int, source: str, kind: str) -> list[Any]:
    if not isinstance(keys, list) or len(keys) != n:
        raise _fail(source, f"has {kind} keys that do not match its children")
    for key in keys:
        if not isinstance(key, _KEY_TYPES):  # a dict here would be torch's `__enum__` import
            raise _fail(source, f"has a {kind} key of type {type(key).__name__}")
    return keys


def _builtin_context(kind: str, context: Any, n: int, source: str) -> Any:
    if kind in (_TUPLE, _LIST):
        if _json(context, source, kind) is not None:
            raise _fail(source, f"has a malformed {kind} context")
        return None
    if kind in (_DICT, _ODICT):
        return tuple(_keys(_json(context, source, kind), n, source, kind))
    if kind == _DEQUE:
        maxlen = _json(context, source, kind)
        if maxlen is not None and (not isinstance(maxlen, int) or isinstance(maxlen, bool)):
            raise _fail(source, f"has a malformed {kind} context")
        return maxlen
    if kind == _NTUPLE:
        if not isinstance(context, str) or not _DOTTED.match(context):
            raise _fail(source, "has a malformed namedtuple name")
        return context
    # defaultdict: {"default_factory_module", "default_factory_name", "dict_context"}
    if not isinstance(context, dict) or set(context) != {
        "default_factory_module",
        "default_factory_name",
        "dict_context",
    }:
        raise _fail(source, "has a malformed defaultdict context")
    module, name = context["default_factory_module"], context["default_factory_name"]
    if module != "builtins" or name not in DEFAULT_FACTORIES:
        raise _fail(
            source,
            f"names the defaultdict factory {module!s:.60}.{name!s:.60}, which is not allowed "
            f"(allowed: builtins {', '.join(sorted(DEFAULT_FACTORIES))})",
        )
    return (name, tuple(_keys(context["dict_context"], n, source, kind)))


def _registered_name(kind: str) -> bool:
    """True when a class is registered with torch's pytree under `kind` in this process.

    The transformers cache names are accepted too (without importing transformers): they only
    become objects in `to_treespec`, which requires the registration.
    """
    tables = compat.serialized_pytree_types()
    if tables is not None and kind in tables[0]:
        return True
    return kind.startswith("transformers.cache_utils.") and kind.endswith("Cache")


def _namedtuple_class(name: str, n: int) -> type:
    tables = compat.serialized_pytree_types()
    registered = tables[0].get(name) if tables is not None else None
    fields = getattr(registered, "_fields", None)
    if registered is not None and fields is not None:
        if len(fields) != n:
            raise UnsafeTreespec(f"namedtuple {name!r} has {len(fields)} fields")
        return registered
    short = name.rsplit(".", 1)[-1]
    return collections.namedtuple(short, [f"field{i}" for i in range(n)])


def to_treespec(node: Node, source: str = "a stored treespec") -> Any:
    """Builds torch's ``TreeSpec`` for a parsed `Node` (imports torch).

    Args:
        node: From `parse`.
        source: Named in errors.

    Returns:
        A ``torch.utils._pytree.TreeSpec``.

    Raises:
        UnsafeTreespec: A node type is not registered with torch pytree in this process.
    """
    import torch.utils._pytree as pytree

    if node.type is None:
        return compat.leaf_treespec()
    children = [to_treespec(child, source) for child in node.children]
    kind, context = node.type, node.context
    typ: Any
    ctx: Any
    if kind == _TUPLE:
        typ, ctx = tuple, None
    elif kind == _LIST:
        typ, ctx = list, None
    elif kind == _DICT:
        typ, ctx = dict, list(context)
    elif kind == _ODICT:
        typ, ctx = collections.OrderedDict, list(context)
    elif kind == _DEQUE:
        typ, ctx = collections.deque, context
    elif kind == _DDICT:
        typ, ctx = collections.defaultdict, [DEFAULT_FACTORIES[context[0]], list(context[1])]
    elif kind == _NTUPLE:
        # torch's namedtuple node: type `collections.namedtuple`, context the class.
        typ, ctx = collections.namedtuple, _namedtuple_class(str(context), len(children))
    else:
        tables = compat.serialized_pytree_types()
        typ = tables[0].get(kind) if tables is not None else None
        node_def = tables[1].get(typ) if tables is not None and typ is not None else None
        if node_def is None:
            raise _fail(source, f"names the node type {kind!r}, not registered in this process")
        # A class registered in this process was imported by this process's own code: its
        # context loader (ours for the caches, the user's for their own classes) gets the
        # stored JSON value; nothing named by the store is imported.
        loader = getattr(node_def, "from_dumpable_context", None)
        # torch dumps a context without a dumper as JSON text, and loads it back the same way.
        ctx = untrusted.loads(context) if loader is None else loader(context)
    return pytree.TreeSpec(typ, ctx, children)
