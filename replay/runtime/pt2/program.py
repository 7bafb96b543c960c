"""A program of an artifact, built straight from its graph JSON into a runnable fx graph.

torch's own deserializer rebuilds a whole `torch.export.ExportedProgram` from a program's JSON:
a ShapeEnv, a sympy expression for every symbolic size and a fake tensor for every node, all
to reproduce what export knew at trace time. Running the graph needs none of it: the runner
checks its own guards before a call reaches a program (`replay.runtime.guards`), so a program
here is only its operators, wired as the JSON says. `build_program` reads the parsed (already
checked, `replay.runtime.pt2.graph_check`) JSON once, maps each node's target to its torch
operator through one table (`resolve_target`), each argument to its value (tensors and sizes
to the nodes that produce them, dtypes, devices, layouts, memory formats and scalars to
their torch values, a subgraph to a sub-module), and each input of the graph signature to
the artifact's parameter, buffer or constant, or to the call's flattened input. The result
is a `torch.fx.GraphModule` wrapped in a `Program`, which flattens a call by the program's
input treespec, runs the graph, writes buffer mutations back to the buffers (as the unlifted
module torch builds does) and rebuilds the output structure. The load builds every program's
fx graph and the Python code torch.fx generates for it, so a loaded runner answers its first
call at the eager model's speed; the parsed JSON is dropped once the graph is built.

Nothing is evaluated: the JSON is data read field by field, and an operator is reached only by
name through `resolve_target`.
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
from replay.runtime.pt2.shape_checks import ShapeChecks

__all__ = ["Program", "build_program", "resolve_target"]

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


class _Builder:
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
            kind, value = _one(arg)
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
        kind, value = _one(arg)
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
        kind, inner = _one(value)
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
            kind, value = _one(outs[0])
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
            kind, value = _one(out)
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
        kind, value = _one(arg)
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
                k, inner = _one(v)
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


def _one(arg: Any) -> tuple[str, Any]:
    """The one (kind, value) pair of a serialized union."""
    if not isinstance(arg, dict) or len(arg) != 1:
        raise ArtifactError(f"a graph value is not a one-field union: {str(arg)[:200]}")
    return next(iter(arg.items()))


def _table(table: Mapping[int, str], value: Any, what: str, builder: _Builder) -> str:
    found = table.get(value) if isinstance(value, int) else None
    if found is None:
        raise builder.fail(f"{what} {str(value)[:20]} is not one torch.export writes")
    return found


def _identifier(name: str) -> str:
    text = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return text if text and not text[0].isdigit() and not keyword.iskeyword(text) else f"v_{text}"


class Program:
    """One program of an artifact, runnable: its graph, its tensors, and its call structure.

    Called like the exported program's module (``ExportedProgram.module()``): the call is
    flattened by the program's input treespec, its sizes checked as torch's module checks them
    (`replay.runtime.pt2.shape_checks`), its constant inputs compared with the values export
    saw, the graph runs on the artifact's tensors and the call's, buffer
    mutations are written back, and the output is rebuilt by the output treespec.

    Attributes:
        name: The program's name.
        state_dict: Parameter and buffer name -> tensor (the artifact's memory-mapped one).
        constants: Tensor constant (and non-persistent buffer) name -> tensor.
        graph_module: The `torch.fx.GraphModule` that runs it (inputs: the graph's, in order).
    """

    def __init__(
        self,
        name: str,
        graph_module: Any,
        state_dict: dict[str, Any],
        constants: dict[str, Any],
        feeds: list[tuple[int, Any]],
        checks: list[tuple[int, str, Any]],
        writes: list[tuple[int, Any]],
        user_outputs: list[int],
        in_spec: Any,
        out_spec: Any,
        single: bool,
        shapes: ShapeChecks,
    ) -> None:
        self.name = name
        self.graph_module = graph_module
        self.state_dict = state_dict
        self.constants = constants
        self._feeds = feeds
        self._checks = checks
        self._writes = writes
        self._user_outputs = user_outputs
        self._in_spec = in_spec
        self._out_spec = out_spec
        self._single = single  # the graph returns one tensor, not a tuple
        self._shapes = shapes
        keys = in_spec.child(1).context if in_spec.num_children == 2 else None
        self._keys = list(keys) if isinstance(keys, list) else None

    @property
    def graph(self) -> Any:
        """The program's `torch.fx.Graph`."""
        return self.graph_module.graph

    def module(self) -> Program:
        """Itself (a program is already runnable; `ExportedProgram.module()`'s counterpart)."""
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the program on a call (see the class docstring).

        Raises:
            ValueError: The call's structure is not the program's, or a constant input differs
                from the value the program was exported with.
        """
        import torch.utils._pytree as pytree

        if self._keys is not None and list(kwargs) != self._keys:
            if set(kwargs) != set(self._keys):
                raise ValueError(
                    f"program {self.name} takes the keyword arguments {self._keys}, "
                    f"not {sorted(kwargs)}"
                )
            kwargs = {k: kwargs[k] for k in self._keys}
        paths = None
        if self._shapes.needs_paths():
            with_paths, spec = pytree.tree_flatten_with_path((args, kwargs))
            paths = [p for p, _ in with_paths]
            flat = [v for _, v in with_paths]
        else:
            flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self._in_spec:
            raise ValueError(f"the call's structure is not the one program {self.name} takes")
        refused = self._shapes.check(flat, paths)
        if refused is not None:
            raise ValueError(f"program {self.name} was not traced for this call: {refused}")
        for index, what, expected in self._checks:
            if flat[index] != expected:
                raise ValueError(
                    f"program {self.name} was exported with {what} = {expected!r}, "
                    f"the call gives {flat[index]!r}"
                )
        values = [flat[src] if tensor is None else tensor for src, tensor in self._feeds]
        out = self.graph_module(*values)
        if self._single:
            out = (out,)
        for index, target in self._writes:
            target.copy_(out[index])
        return pytree.tree_unflatten([out[i] for i in self._user_outputs], self._out_spec)

    def __repr__(self) -> str:
        return f"Program({self.name}, {len(self.graph.nodes)} nodes)"


def build_program(
    name: str,
    tree: Mapping[str, Any],
    state_dict: dict[str, Any],
    constants: dict[str, Any],
    device: str | None,
    source: str,
) -> Program:
    """A runnable `Program` from a program's parsed graph JSON and its tensors.

    Args:
        name: The program's name.
        tree: The program's JSON, parsed and checked (`replay.runtime.pt2.graph_check`).
        state_dict: Its parameters and buffers (`replay.runtime.pt2.weights.load_tensors`).
        constants: Its tensor constants.
        device: Every device argument of the graph becomes this one (None: as saved).
        source: The entry's name, for errors.

    Raises:
        ArtifactError: The JSON names an operator torch lacks, a value the loader does not
            run, an input no tensor backs, or an output a served program never has.
    """
    import torch
    import torch.fx as fx
    import torch.utils._pytree as pytree

    gm_tree = tree["graph_module"]
    signature = gm_tree["signature"]
    moved = torch.device(device) if device else None
    root = torch.nn.Module()
    builder = _Builder(root, moved, source)
    feeds: list[tuple[int, Any]] = []
    checks: list[tuple[int, str, Any]] = []
    user = 0
    spec_names: list[str] = []
    user_names: list[str | None] = []
    for spec in signature["input_specs"]:
        kind, value = _one(spec)
        if kind == "parameter":
            feeds.append((-1, _tensor(state_dict, value["parameter_name"], builder)))
            spec_names.append(value["arg"]["name"])
        elif kind == "buffer":
            table = state_dict if value["buffer_name"] in state_dict else constants
            feeds.append((-1, _tensor(table, value["buffer_name"], builder)))
            spec_names.append(value["arg"]["name"])
        elif kind == "tensor_constant":
            feeds.append((-1, _tensor(constants, value["tensor_constant_name"], builder)))
            spec_names.append(value["arg"]["name"])
        elif kind == "user_input":
            feeds.append((user, None))
            arg_kind, arg = _one(value["arg"])
            spec_names.append(arg.get("name", "") if isinstance(arg, dict) else f"arg{user}")
            user_names.append(arg["name"] if arg_kind == "as_tensor" else None)
            user += 1
        elif kind == "constant_input":
            const_kind, const = _one(value["value"])
            checks.append((user, value["name"], None if const_kind == "as_none" else const))
            feeds.append((user, None))
            spec_names.append(value["name"])
            user_names.append(None)
            user += 1
        else:
            raise builder.fail(f"an input of kind {kind[:40]} is not one the loader runs")
    graph = builder.graph(gm_tree["graph"], spec_names)
    if sum(node.op == "placeholder" for node in graph.nodes) != len(feeds):
        raise builder.fail("the graph's inputs are not its signature's")

    writes: list[tuple[int, Any]] = []
    user_outputs: list[int] = []
    for i, spec in enumerate(signature["output_specs"]):
        kind, value = _one(spec)
        if kind == "user_output":
            user_outputs.append(i)
        elif kind == "buffer_mutation":
            table = state_dict if value["buffer_name"] in state_dict else constants
            writes.append((i, _tensor(table, value["buffer_name"], builder)))
        else:
            raise builder.fail(f"an output of kind {kind[:40]} is not one a served program has")
    calls = gm_tree["module_call_graph"]
    top = calls[0]["signature"] if calls and calls[0].get("fqn") == "" else None
    if top is None:
        raise builder.fail("the program has no call signature")
    in_spec = pytree.treespec_loads(top["in_spec"])
    out_spec = pytree.treespec_loads(top["out_spec"])
    if in_spec.num_leaves != user:
        raise builder.fail("the input treespec does not match the program's inputs")
    module = fx.GraphModule(root, graph)  # torch.fx writes and compiles its Python code
    return Program(
        name, module, state_dict, constants, feeds, checks, writes, user_outputs,
        in_spec, out_spec, bool(gm_tree["graph"].get("is_single_tensor_return")),
        ShapeChecks(tree, user_names),
    )  # fmt: skip


def _tensor(table: dict[str, Any], name: str, builder: _Builder) -> Any:
    found = table.get(name)
    if found is None:
        raise builder.fail(f"the program needs {name[:200]}, which the artifact does not hold")
    return found
