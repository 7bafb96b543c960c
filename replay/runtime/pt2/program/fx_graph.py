"""torch.export's graph JSON read into a `torch.fx.Graph`: each node's target resolved to its
torch operator by name (`resolve_target`), each argument to its value (tensors and sizes to the
nodes that produce them, dtypes, devices, layouts, memory formats and scalars to their torch
values, a subgraph to a sub-module). Nothing is evaluated: the JSON is data read field by field.
"""

from __future__ import annotations

import importlib
import keyword
import operator
from collections.abc import Callable, Mapping
from typing import Any

from replay.runtime.guards import ArtifactError
from replay.runtime.pt2.limits.arguments import check_names
from replay.runtime.pt2.op_table import OTHER_MODULES

__all__ = ["GraphBuilder", "one_field", "resolve_target"]

_DTYPES = {
    1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16", 7: "float32",
    8: "float64", 9: "complex32", 10: "complex64", 11: "complex128", 12: "bool",
    13: "bfloat16", 28: "uint16", 29: "float8_e4m3fn", 30: "float8_e5m2",
    31: "float8_e4m3fnuz", 32: "float8_e5m2fnuz", 33: "float8_e8m0fnu", 34: "uint32",
    35: "uint64",
}  # fmt: skip
"""torch.export's serialized ``ScalarType`` -> the torch dtype's name (schema 8)."""

_LAYOUTS = {1: "sparse_coo", 2: "sparse_csr", 3: "sparse_csc", 4: "sparse_bsr",
            5: "sparse_bsc", 6: "_mkldnn", 7: "strided"}  # fmt: skip
_MEMORY_FORMATS = {1: "contiguous_format", 2: "channels_last", 3: "channels_last_3d",
                   4: "preserve_format"}  # fmt: skip

_RESOLVED: dict[str, Callable[..., Any]] = {}
"""Target name -> its callable: every name is resolved once per process."""


def resolve_target(name: str) -> Callable[..., Any]:
    """The callable a graph node names: ``torch.ops.<namespace>.<op>.<overload>``, a
    ``_operator``/``math`` function, or a ``torch.sym_*`` function.

    One table lookup per name (the graph check has accepted the name before: only operators
    it allows reach here).

    Raises:
        ArtifactError: torch has no such operator in this process.
    """
    found = _RESOLVED.get(name)
    if found is None:
        found = _lookup(name)
        _RESOLVED[name] = found
    return found


def _lookup(name: str) -> Callable[..., Any]:
    import math

    import torch

    head, _, rest = name.partition(".")
    namespace = rest.split(".")[1] if rest.startswith("ops.") and rest.count(".") > 1 else ""
    if namespace in OTHER_MODULES:  # registered by importing the module that defines them
        importlib.import_module(OTHER_MODULES[namespace])
    roots: dict[str, Any] = {"torch": torch, "_operator": operator, "math": math}
    target = roots.get(head)
    if target is None or not rest:
        raise ArtifactError(f"the operator {name[:200]} is not one torch.export writes")
    for part in rest.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ArtifactError(
                f"the operator {name[:200]} does not exist in this torch ({torch.__version__})"
            )
    if not callable(target):
        raise ArtifactError(f"{name[:200]} is not an operator")
    return target  # type: ignore[no-any-return]


class GraphBuilder:
    """Builds one fx graph (and its sub-graphs) from torch.export's graph JSON."""

    def __init__(self, root: Any, device: Any, source: str) -> None:
        import torch

        self.torch = torch
        self.root = root  # the module sub-graphs are registered on
        self.device = device  # a torch.device every device argument becomes, or None
        self.source = source
        self.subgraphs = 0

    def fail(self, what: str) -> ArtifactError:
        return ArtifactError(f"{self.source}: torch cannot read this program: {what}")

    def graph(self, tree: Mapping[str, Any], inputs: list[str] | None = None) -> Any:
        """The fx graph of a serialized graph; `inputs` names its placeholders."""
        import torch.fx as fx

        graph = fx.Graph()
        names: dict[str, Any] = {}
        for i, arg in enumerate(tree["inputs"]):
            kind, value = one_field(arg)
            if kind in ("as_tensor", "as_custom_obj"):
                key = value["name"]
            elif kind == "as_sym_int" and "as_name" in value:
                key = value["as_name"]
            else:
                key = inputs[i] if inputs else f"arg{i}"
            names[key] = graph.placeholder(_identifier(key))
        for node in tree["nodes"]:
            self.node(graph, node, names)
        outputs = [self.output(o, names) for o in tree["outputs"]]
        if tree.get("is_single_tensor_return"):
            graph.output(outputs[0])
        else:
            graph.output(tuple(outputs))
        return graph

    def output(self, arg: Mapping[str, Any], names: dict[str, Any]) -> Any:
        kind, value = one_field(arg)
        if kind == "as_tensor":
            return self.ref(names, value["name"])
        if kind in ("as_sym_int", "as_sym_bool", "as_sym_float"):
            return self.sym(value, names)
        if kind == "as_float":
            return _float(value)
        if kind in ("as_int", "as_bool"):
            return value
        if kind == "as_none":
            return None
        raise self.fail(f"a graph output of kind {kind} is not one torch.export writes")

    def ref(self, names: dict[str, Any], name: str) -> Any:
        found = names.get(name)
        if found is None:
            raise self.fail(f"the graph uses {name[:200]} before any node produces it")
        return found

    def sym(self, value: Mapping[str, Any], names: dict[str, Any]) -> Any:
        kind, inner = one_field(value)
        if kind == "as_name":
            return self.ref(names, inner)
        return _float(inner) if kind == "as_float" else inner  # as_int, as_bool

    def node(self, graph: Any, node: Mapping[str, Any], names: dict[str, Any]) -> None:
        try:
            target = resolve_target(node["target"])
        except ArtifactError as e:
            raise self.fail(str(e)) from None
        check_names(target, node, self.source)
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for named in node["inputs"]:
            value = self.value(named["arg"], names, graph)
            name = named.get("name", "")
            if named.get("kind", 1) == 2 and name and not keyword.iskeyword(name):
                kwargs[name] = value
            else:
                args.append(value)
        created = graph.call_function(target, tuple(args), kwargs)
        self.outputs(graph, node, created, names)

    def outputs(
        self, graph: Any, node: Mapping[str, Any], created: Any, names: dict[str, Any]
    ) -> None:
        outs = node["outputs"]
        if not outs:
            return
        hop = node["target"].startswith("torch.ops.higher_order.")
        if len(outs) == 1 and not (hop and node.get("is_hop_single_tensor_return") is False):
            kind, value = one_field(outs[0])
            if kind == "as_tensor":
                names[value["name"]] = created
                return
            if kind in ("as_sym_int", "as_sym_bool", "as_sym_float"):
                names[value["as_name"]] = created
                return
            if kind == "as_none":
                return
            if kind == "as_tensors":
                self.items(graph, created, [{"as_tensor": v} for v in value], names)
                return
        self.items(graph, created, outs, names)

    def items(self, graph: Any, parent: Any, outs: list[Any], names: dict[str, Any]) -> None:
        for i, out in enumerate(outs):
            kind, value = one_field(out)
            if kind == "as_none":
                continue
            item = graph.call_function(operator.getitem, (parent, i))
            if kind == "as_tensor":
                names[value["name"]] = item
            elif kind in ("as_sym_int", "as_sym_float", "as_sym_bool"):
                if "as_name" in value:
                    names[value["as_name"]] = item
            elif kind == "as_tensors":
                self.items(graph, item, [{"as_tensor": v} for v in value], names)
            elif kind in ("as_sym_ints", "as_sym_floats", "as_sym_bools"):
                self.items(graph, item, [{"as_sym_int": v} for v in value], names)
            elif kind not in ("as_ints", "as_floats", "as_bools", "as_strings"):
                raise self.fail(f"a node output of kind {kind} is not one torch.export writes")

    def value(self, arg: Mapping[str, Any], names: dict[str, Any], graph: Any) -> Any:
        torch = self.torch
        kind, value = one_field(arg)
        if kind == "as_tensor":
            return self.ref(names, value["name"])
        if kind == "as_float":
            return _float(value)
        if kind in ("as_int", "as_bool", "as_string"):
            return value
        if kind == "as_none":
            return None
        if kind in ("as_sym_int", "as_sym_float", "as_sym_bool"):
            return self.sym(value, names)
        if kind == "as_scalar_type":
            return getattr(torch, _table(_DTYPES, value, "dtype", self))
        if kind == "as_layout":
            return getattr(torch, _table(_LAYOUTS, value, "layout", self))
        if kind == "as_memory_format":
            return getattr(torch, _table(_MEMORY_FORMATS, value, "memory format", self))
        if kind == "as_device":
            if self.device is not None:
                return self.device
            index = value.get("index")
            return (
                torch.device(value["type"], index)
                if index is not None
                else torch.device(value["type"])
            )
        if kind == "as_tensors":
            return [self.ref(names, v["name"]) for v in value]
        if kind == "as_floats":
            return [_float(v) for v in value]
        if kind in ("as_ints", "as_bools", "as_strings"):
            return list(value)
        if kind in ("as_sym_ints", "as_sym_floats", "as_sym_bools"):
            return [self.sym(v, names) for v in value]
        if kind == "as_optional_tensors":
            out = []
            for v in value:
                k, inner = one_field(v)
                out.append(self.ref(names, inner["name"]) if k == "as_tensor" else None)
            return out
        if kind == "as_complex":
            return complex(value["real"], value["imag"])
        if kind == "as_int_lists":
            return [tuple(v) for v in value]
        if kind == "as_float_lists":
            return [[_float(x) for x in v] for v in value]
        if kind == "as_string_to_argument":
            return {k: self.value(v, names, graph) for k, v in value.items()}
        if kind == "as_operator":
            try:
                return resolve_target(value)
            except ArtifactError as e:
                raise self.fail(str(e)) from None
        if kind == "as_graph":
            import torch.fx as fx

            subgraph = self.graph(value["graph"])
            self.subgraphs += 1
            sub = fx.GraphModule(self.root, subgraph)
            attr = f"subgraph_{self.subgraphs}"
            self.root.add_module(attr, sub)
            return graph.get_attr(attr)
        raise self.fail(f"a node argument of kind {kind[:60]} is not one the loader runs")


_NON_FINITE = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}
"""How torch's serializer writes a float JSON cannot hold (`torch._export.serde.serialize`)."""


def _float(value: Any) -> Any:
    """A serialized float: a JSON number, or torch's spelling of inf, -inf and nan."""
    return _NON_FINITE.get(value, value) if isinstance(value, str) else value


def one_field(arg: Any) -> tuple[str, Any]:
    """The one (kind, value) pair of a serialized union."""
    if not isinstance(arg, dict) or len(arg) != 1:
        raise ArtifactError(f"a graph value is not a one-field union: {str(arg)[:200]}")
    return next(iter(arg.items()))


def _table(table: Mapping[int, str], value: Any, what: str, builder: GraphBuilder) -> str:
    found = table.get(value) if isinstance(value, int) else None
    if found is None:
        raise builder.fail(f"{what} {str(value)[:20]} is not one torch.export writes")
    return found


def _identifier(name: str) -> str:
    text = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return text if text and not text[0].isdigit() and not keyword.iskeyword(text) else f"v_{text}"
