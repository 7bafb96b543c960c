"""A runnable program: the fx graph wired to the artifact's tensors and a call's flattened
inputs by the program's graph signature (`build_program`), and called like
``ExportedProgram.module()`` (`Program`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from replay.runtime.pt2.program.fx_graph import GraphBuilder, one_field
from replay.runtime.pt2.shape_checks import ShapeChecks

__all__ = ["Program", "build_program"]


@dataclass(frozen=True)
class _Wiring:
    """How a program's graph meets a call, from its graph signature.

    Attributes:
        feeds: Per graph input: ``(-1, tensor)`` for an artifact tensor, ``(i, None)`` for the
            call's flat input ``i``.
        checks: ``(i, name, value)``: the call's flat input ``i`` must equal the constant the
            program was exported with.
        writes: ``(output index, buffer)``: a buffer mutation written back after the run.
        user_outputs: The graph outputs the caller gets, in order.
        in_spec: The call's ``(args, kwargs)`` treespec.
        out_spec: The output treespec.
        single: The graph returns one tensor, not a tuple.
    """

    feeds: list[tuple[int, Any]]
    checks: list[tuple[int, str, Any]]
    writes: list[tuple[int, Any]]
    user_outputs: list[int]
    in_spec: Any
    out_spec: Any
    single: bool


class Program:
    """One program of an artifact, runnable: its graph, its tensors, and its call structure.

    Called like the exported program's module (``ExportedProgram.module()``): the call is
    flattened by the program's input treespec, its sizes checked as torch's module checks them
    (`replay.runtime.pt2.shape_checks`), its constant inputs compared with the values export
    saw, the graph runs on the artifact's tensors and the call's, buffer
    mutations are written back, and the output is rebuilt by the output treespec (by a
    builder made once, what ``tree_unflatten`` builds: `capture.pytree.unflatten`).

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
        wiring: _Wiring,
        shapes: ShapeChecks,
    ) -> None:
        self.name = name
        self.graph_module = graph_module
        self.state_dict, self.constants = state_dict, constants
        self._wiring = wiring
        self._shapes = shapes
        in_spec = wiring.in_spec
        keys = in_spec.child(1).context if in_spec.num_children == 2 else None
        self._keys = list(keys) if isinstance(keys, list) else None
        # builds the output tree from the graph's outputs (`capture.pytree.unflatten`)
        self._build: Any = None

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
        wiring = self._wiring
        if spec != wiring.in_spec:
            raise ValueError(f"the call's structure is not the one program {self.name} takes")
        refused = self._shapes.check(flat, paths)
        if refused is not None:
            raise ValueError(f"program {self.name} was not traced for this call: {refused}")
        for index, what, expected in wiring.checks:
            if flat[index] != expected:
                raise ValueError(
                    f"program {self.name} was exported with {what} = {expected!r}, "
                    f"the call gives {flat[index]!r}"
                )
        values = [flat[src] if tensor is None else tensor for src, tensor in wiring.feeds]
        out = self.graph_module(*values)
        if wiring.single:
            out = (out,)
        for index, target in wiring.writes:
            target.copy_(out[index])
        leaves = [out[i] for i in wiring.user_outputs]
        if self._build is None:  # the output builder, made and proven at the first call
            from capture.pytree.unflatten import builder

            self._build, tree = builder(wiring.out_spec, leaves)
            return tree
        return self._build(leaves)

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
    root = torch.nn.Module()
    builder = GraphBuilder(root, torch.device(device) if device else None, source)
    inputs = _Inputs(state_dict, constants, builder)
    for spec in signature["input_specs"]:
        inputs.add(spec)
    graph = builder.graph(gm_tree["graph"], inputs.spec_names)
    if sum(node.op == "placeholder" for node in graph.nodes) != len(inputs.feeds):
        raise builder.fail("the graph's inputs are not its signature's")
    writes: list[tuple[int, Any]] = []
    user_outputs: list[int] = []
    for i, spec in enumerate(signature["output_specs"]):
        kind, value = one_field(spec)
        if kind == "user_output":
            user_outputs.append(i)
        elif kind == "buffer_mutation":
            writes.append((i, inputs.buffer(value["buffer_name"])))
        else:
            raise builder.fail(f"an output of kind {kind[:40]} is not one a served program has")
    calls = gm_tree["module_call_graph"]
    top = calls[0]["signature"] if calls and calls[0].get("fqn") == "" else None
    if top is None:
        raise builder.fail("the program has no call signature")
    in_spec = pytree.treespec_loads(top["in_spec"])
    if in_spec.num_leaves != inputs.user:
        raise builder.fail("the input treespec does not match the program's inputs")
    single = bool(gm_tree["graph"].get("is_single_tensor_return"))
    wiring = _Wiring(
        inputs.feeds, inputs.checks, writes, user_outputs, in_spec,
        pytree.treespec_loads(top["out_spec"]), single,
    )  # fmt: skip
    module = fx.GraphModule(root, graph)  # torch.fx writes and compiles its Python code
    return Program(
        name, module, state_dict, constants, wiring, ShapeChecks(tree, inputs.user_names)
    )


class _Inputs:
    """The graph's inputs, read from its signature's input specs in order: what feeds each
    (an artifact tensor, or the call's flat input at an index) and the names they carry."""

    def __init__(
        self, state_dict: dict[str, Any], constants: dict[str, Any], builder: GraphBuilder
    ) -> None:
        self.state_dict, self.constants, self.builder = state_dict, constants, builder
        self.feeds: list[tuple[int, Any]] = []
        self.checks: list[tuple[int, str, Any]] = []
        self.spec_names: list[str] = []
        self.user_names: list[str | None] = []
        self.user = 0  # the call's flat inputs seen so far

    def buffer(self, name: str) -> Any:
        """A buffer: persistent ones are in the state dict, the others among the constants."""
        table = self.state_dict if name in self.state_dict else self.constants
        return _tensor(table, name, self.builder)

    def add(self, spec: Any) -> None:
        kind, value = one_field(spec)
        if kind in ("parameter", "buffer", "tensor_constant"):
            if kind == "parameter":
                tensor = _tensor(self.state_dict, value["parameter_name"], self.builder)
            elif kind == "buffer":
                tensor = self.buffer(value["buffer_name"])
            else:
                tensor = _tensor(self.constants, value["tensor_constant_name"], self.builder)
            self.feeds.append((-1, tensor))
            self.spec_names.append(value["arg"]["name"])
            return
        if kind == "user_input":
            arg_kind, arg = one_field(value["arg"])
            name = arg.get("name", "") if isinstance(arg, dict) else f"arg{self.user}"
            self.spec_names.append(name)
            self.user_names.append(arg["name"] if arg_kind == "as_tensor" else None)
        elif kind == "constant_input":
            const_kind, const = one_field(value["value"])
            expected = None if const_kind == "as_none" else const
            self.checks.append((self.user, value["name"], expected))
            self.spec_names.append(value["name"])
            self.user_names.append(None)
        else:
            raise self.builder.fail(f"an input of kind {kind[:40]} is not one the loader runs")
        self.feeds.append((self.user, None))
        self.user += 1


def _tensor(table: dict[str, Any], name: str, builder: GraphBuilder) -> Any:
    found = table.get(name)
    if found is None:
        raise builder.fail(f"the program needs {name[:200]}, which the artifact does not hold")
    return found
