"""What a program's nodes do besides computing: the tensors they write, the randomness they draw.

A served program shares its parameters and constants with every other program and every later
call, and the caller's tensors are the caller's. `check_effects` follows every tensor a node may
write back to the graph inputs it may be, and refuses a program that:

- writes (in place: ``copy_``, ``index_put_``, a whole ``_foreach_*_`` list) a parameter, a
  constant, a subgraph's input, or a caller's input that is not part of a cache the caller
  passes (a transformers ``*Cache``, whose tensors the model updates in place as eager does);
  buffers may be written, they are the program's state;
- changes the sizes, strides or autograd flags (``resize_``, ``t_``, ``requires_grad_``,
  `replay.runtime.pt2.operators.METADATA_OPS`) of any tensor it did not make;
- declares a ``buffer_mutation`` output for anything but one of its buffers;
- calls a random operator with its randomness on (`replay.runtime.pt2.operators.RANDOM_OFF`):
  ``dropout`` without ``train=False``, attention with a ``dropout_p`` other than 0.

"May be" is conservative: a view, an operator defined by others (``dropout`` in eval mode
returns its input, ``type_as`` may), an operator that returns its input's memory (``lift``,
``data``, ``_unsafe_view``, ``split``: `replay.runtime.pt2.operators.VIEW_OPS`), a
higher-order node and any target outside ``aten`` (``operator.getitem`` of a list, a caller's
operator library) may be any of their tensor arguments; an in-place node's result is its
``self``. Needs no torch.
"""

from __future__ import annotations

import json
import keyword
from dataclasses import dataclass, field
from typing import Any

from replay.runtime.allowed import AllowOps
from replay.runtime.guards import ArtifactError
from replay.runtime.pt2.operators import RANDOM_OFF, op_kind

__all__ = ["Effects", "check_effects", "tensor_names"]

_READ_ONLY = {
    "parameter": "a parameter",
    "tensor_constant": "a constant",
    "constant_input": "a constant input",
    "subgraph input": "a subgraph's input",
    "user_input": "an input of the caller",
}


@dataclass
class Effects:
    """What one program may change.

    Attributes:
        written: The buffers (their state-dict names) it may write.
        read_only: Its parameters and tensor constants (their state-dict names): no record a
            written buffer lies in may hold one of them.
    """

    written: set[str] = field(default_factory=set)
    read_only: set[str] = field(default_factory=set)


def tensor_names(arg: Any) -> list[str]:
    """The tensor names an argument or output refers to (``as_tensor``, ``as_tensors``...)."""
    if not isinstance(arg, dict):
        return []
    out = []
    for key in ("as_tensor", "as_optional_tensor"):
        value = arg.get(key)
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            out.append(value["name"])
    for key in ("as_tensors", "as_optional_tensors"):
        for item in arg.get(key) or ():
            out += tensor_names({"as_tensor": item}) + tensor_names(item)
    return out


def check_effects(tree: dict[str, Any], source: str, allowed: AllowOps) -> Effects:
    """Checks what a program's nodes write and draw (module docstring).

    Raises:
        ArtifactError: One line naming the node, what it writes (or draws) and why not.
    """
    top = tree.get("graph_module")
    if not isinstance(top, dict):
        return Effects()
    walk = _Writes(source, allowed, top)
    walk.outputs(top.get("signature") or {})
    graphs: list[tuple[dict[str, Any], bool]] = [(top.get("graph") or {}, True)]
    while graphs:
        graph, is_top = graphs.pop()
        graphs += [(sub, False) for sub in walk.graph(graph, is_top)]
    return walk.effects


class _Writes:
    """The placeholders of a program by kind, and the walk of its graphs."""

    def __init__(self, source: str, allowed: AllowOps, top: dict[str, Any]) -> None:
        self.source = source
        self.allowed = allowed
        self.kinds: dict[str, str] = {}  # placeholder -> input kind
        self.state: dict[str, str] = {}  # placeholder -> its state-dict name
        self.effects = Effects()
        self.op_kinds: dict[str, str | None] = {}
        signature = top.get("signature") or {}
        user: list[str | None] = []
        for spec in signature.get("input_specs") or ():
            if not isinstance(spec, dict) or len(spec) != 1:
                continue
            kind, body = next(iter(spec.items()))
            body = body if isinstance(body, dict) else {}
            names = tensor_names(body.get("arg")) or [str((body.get("arg") or {}).get("name"))]
            for name in names:
                self.kinds[name] = kind
                for key in ("parameter_name", "buffer_name", "tensor_constant_name"):
                    if isinstance(body.get(key), str):
                        self.state[name] = body[key]
                        if key != "buffer_name":
                            self.effects.read_only.add(body[key])
            if kind in ("user_input", "constant_input"):
                user.append(names[0] if kind == "user_input" else None)
        self.caches = _cache_leaves(top, user)

    def fail(self, node: dict[str, Any], what: str) -> ArtifactError:
        return ArtifactError(
            f"{self.source}: node {str(node.get('name'))[:80]} ({str(node.get('target'))[:120]}) "
            f"{what}; it is not loaded"
        )

    def outputs(self, signature: dict[str, Any]) -> None:
        """``buffer_mutation`` outputs name the program's own buffers, nothing else."""
        buffers = {self.state[n] for n, k in self.kinds.items() if k == "buffer"}
        for spec in signature.get("output_specs") or ():
            body = spec.get("buffer_mutation") if isinstance(spec, dict) else None
            if not isinstance(body, dict):
                continue
            name = body.get("buffer_name")
            if name not in buffers:
                raise ArtifactError(
                    f"{self.source}: an output writes back {str(name)[:80]}, which is not a "
                    "buffer of the program (a parameter, a constant or nothing); a program may "
                    "write only its buffers, so it is not loaded"
                )
            self.effects.written.add(name)

    def graph(self, graph: dict[str, Any], is_top: bool) -> list[dict[str, Any]]:
        """Walks one graph's nodes; returns its subgraphs."""
        alias: dict[str, frozenset[str]] = {}
        for name in self.kinds if is_top else ():
            alias[name] = frozenset({name})
        for arg in graph.get("inputs") or () if not is_top else ():
            for name in tensor_names(arg):
                self.kinds.setdefault(name, "subgraph input")
                alias[name] = frozenset({name})
        subgraphs: list[dict[str, Any]] = []
        for node in graph.get("nodes") or ():
            if isinstance(node, dict):
                subgraphs += self.node(node, alias)
        return subgraphs

    def node(self, node: dict[str, Any], alias: dict[str, frozenset[str]]) -> list[dict[str, Any]]:
        inputs = [i for i in node.get("inputs") or () if isinstance(i, dict)]
        subgraphs = []
        for item in inputs:
            sub = (item.get("arg") or {}).get("as_graph")
            if isinstance(sub, dict) and isinstance(sub.get("graph"), dict):
                subgraphs.append(sub["graph"])
        target = str(node.get("target"))
        kind = self.op_kinds.get(target, "")
        if kind == "":
            kind = self.op_kinds[target] = op_kind(target, self.allowed)
        self.random(node, target, inputs)
        may_be: frozenset[str] = frozenset()
        if kind in ("inplace", "metadata"):
            for name in _self_tensors(inputs):
                roots = alias.get(name, frozenset())
                for root in roots:
                    self.write(node, name, root, kind == "metadata")
                may_be |= roots
        elif kind == "view" or subgraphs or not target.startswith("torch.ops.aten."):
            for item in inputs:
                for name in tensor_names(item.get("arg")):
                    may_be |= alias.get(name, frozenset())
        if may_be:
            for out in node.get("outputs") or ():
                for name in tensor_names(out):
                    alias[name] = may_be
        return subgraphs

    def write(self, node: dict[str, Any], name: str, root: str, metadata: bool) -> None:
        kind = self.kinds.get(root, "")
        what = f"{name[:80]}" if name == root else f"{name[:80]} (a view of {root[:80]})"
        if metadata:
            raise self.fail(
                node,
                f"changes the sizes, strides or flags of {what}, "
                f"{_READ_ONLY.get(kind, 'a ' + kind)}; a program may change only those of the "
                "tensors it makes",
            )
        if kind == "buffer":
            self.effects.written.add(self.state[root])
            return
        if kind == "user_input" and root in self.caches:
            return
        raise self.fail(
            node,
            f"writes {what}, {_READ_ONLY.get(kind, 'a ' + kind)}; a program may write only its "
            "buffers, the caches its caller passes and the tensors it makes",
        )

    def random(self, node: dict[str, Any], target: str, inputs: list[dict[str, Any]]) -> None:
        """A random operator runs only with its randomness off (`RANDOM_OFF`)."""
        if not target.startswith("torch.ops.aten."):
            return
        rule = RANDOM_OFF.get(target[len("torch.ops.aten.") :])
        if rule is None:
            return
        argument, off, default_off = rule
        given = [i.get("arg") for i in inputs if i.get("name") == argument]
        if not given:
            ok = default_off
        else:
            value = given[0] if isinstance(given[0], dict) else {}
            found = value.get("as_bool", value.get("as_float", value.get("as_int", "absent")))
            ok = type(found) in (bool, int, float) and found == off and bool(found) == bool(off)
        if not ok:
            raise self.fail(
                node,
                f"draws from torch's global random generator ({argument} must be {off}); a "
                "served call changes no process state",
            )


def _self_tensors(inputs: list[dict[str, Any]]) -> list[str]:
    """The tensors an in-place node writes: its ``self`` (the first positional argument, as
    the program builder passes it, or the keyword ``self``), a whole list for ``_foreach_*_``."""
    for item in inputs:
        name = item.get("name", "")
        if item.get("kind", 1) != 2 or not name or keyword.iskeyword(name):
            return tensor_names(item.get("arg"))
    for item in inputs:
        if item.get("name") == "self":
            return tensor_names(item.get("arg"))
    return []


def _cache_leaves(top: dict[str, Any], user: list[str | None]) -> set[str]:
    """The user inputs that are tensors of a cache object (a ``*Cache`` type of the input
    treespec): their flattened order is the treespec's leaf order."""
    calls = top.get("module_call_graph") or []
    signature = calls[0].get("signature") if calls and isinstance(calls[0], dict) else None
    text = signature.get("in_spec") if isinstance(signature, dict) else None
    try:
        root = json.loads(text)[1] if isinstance(text, str) else None
    except (ValueError, TypeError, IndexError, RecursionError):
        return set()
    out: set[str] = set()
    index = 0
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, in_cache = stack.pop()
        if not isinstance(node, dict):
            continue
        kind = node.get("type")
        children = node.get("children_spec") or []
        if kind is None and not children:
            name = user[index] if index < len(user) else None
            if in_cache and name is not None:
                out.add(name)
            index += 1
            continue
        cache = in_cache or (isinstance(kind, str) and "Cache" in kind.rpartition(".")[2])
        stack += [(child, cache) for child in reversed(children)]
    return out
