"""The models of an ONNX set combined, in memory, into one model for one onnxruntime session.

Each file of a set is its own model (prefill, decode, ...) reading the same weights file. One
session per file means one copy of the weights per session, once onnxruntime has prepacked its
matmul weights (a per-session layout); sharing the unpacked weights between sessions
(``SessionOptions.add_initializer``) turns prepacking off, and onnxruntime's Python API has no
container to share prepacked weights between sessions. Within one session it has: a weight read
by several kernels is packed once (its graph's prepacked-weights store, keyed by the packed
bytes), also by kernels inside an ``If`` branch reading it from the outer graph.

So `combine` builds one model whose main graph holds every weight once (an initializer over the
set's weights file, found by its bytes' place: offset, length, type, shape) and one ``If`` node
per file, side by side:

- the ``If`` of file *k* runs the file's graph as its ``then`` branch when the boolean input
  ``run/k`` is true, and its ``else`` branch (an empty tensor per output) when it is false,
  its default; the runner sets the one flag of the file the call routed to;
- every name of file *k* (values, nodes, dim names, local functions) is prefixed ``k/``, except
  its weights, which name the main graph's; each input of the file is a graph input with a
  default (``k/input_ids``: zeros of its static sizes, 0 along each dynamic axis), so a call
  feeds only its file's inputs;
- the file's outputs are the ``If``'s, ``out/k/0``, ``out/k/1``, ... (`Branch` maps the names).

An ``If`` whose flag is false costs about a microsecond (bench/bench_onnx.py). Models whose
operator sets disagree (one domain at two versions) cannot be one model: `partition` groups the
files into as few models as agree. Built from the checked models only
(`replay.runtime.ort.checks.read_checked`); the files on disk are not changed.

Needs onnx (not onnxruntime, not torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from replay.runtime.ort.checks import ITEMSIZE, ExternalInitializer
from replay.runtime.ort.weights import OnnxFileError

__all__ = ["Branch", "Checked", "combine", "partition"]


@dataclass(frozen=True)
class Checked:
    """One checked model of a set (`replay.runtime.ort.checks.read_checked`).

    Attributes:
        file: Its file name in the set.
        proto: Its ``onnx.ModelProto``, read without its weights.
        external: Its initializers in the weights file.
    """

    file: str
    proto: Any
    external: list[ExternalInitializer]


@dataclass(frozen=True)
class Branch:
    """Where one file of the set lives in the combined model.

    Attributes:
        flag: The boolean input that runs the file's branch.
        inputs: The file's input name -> the combined model's.
        outputs: The file's output name -> the combined model's.
    """

    flag: str
    inputs: dict[str, str]
    outputs: dict[str, str]


def partition(models: Sequence[Checked]) -> list[list[Checked]]:
    """The models grouped so that each group's operator sets agree (no domain at two versions):
    one group for the files of one export."""
    groups: list[tuple[dict[str, int], list[Checked]]] = []
    for model in models:
        opsets = {o.domain: o.version for o in model.proto.opset_import}
        for have, members in groups:
            if all(have.get(d, v) == v for d, v in opsets.items()):
                have.update(opsets)
                members.append(model)
                break
        else:
            groups.append((opsets, [model]))
    return [members for _, members in groups]


def combine(models: Sequence[Checked], weights: str) -> tuple[Any, dict[str, Branch]]:
    """One model running any of `models`, each weight of the weights file once in it.

    Args:
        models: The checked models (one group of `partition`).
        weights: The weights file's name: the combined model's weights reference it, so the
            session that opens it must be told the set's folder.

    Returns:
        The ``onnx.ModelProto`` and, per file, its `Branch`.

    Raises:
        OnnxFileError: An input or output that is not a tensor of a fixed-size element type
            (capture's files have none).
    """
    from onnx import TensorProto, helper

    shared: dict[tuple[int, int, int, tuple[int, ...]], Any] = {}
    nodes: list[Any] = []
    inputs: list[Any] = []
    outputs: list[Any] = []
    defaults: list[Any] = []
    branches: dict[str, Branch] = {}
    opsets: dict[str, int] = {}
    functions: list[Any] = []
    for k, checked in enumerate(models):
        proto = checked.proto
        graph = proto.graph
        opsets.update({o.domain: o.version for o in proto.opset_import})
        weight_names = _share_weights(checked, shared, weights)
        prefix = f"{k}/"
        branch_graph, known = _renamed(checked, prefix, weight_names, functions)
        constant = {i.name for i in branch_graph.initializer} | set(weight_names.values())
        feeds: dict[str, str] = {}
        for original, value in zip(graph.input, branch_graph.input, strict=True):
            if value.name in constant:  # an initializer listed as an input: not fed
                continue
            feeds[original.name] = value.name
            inputs.append(_copy(value))
            defaults.append(_default(value, checked.file))
        del branch_graph.input[:]
        fetches, otherwise = _outputs(checked, k, branch_graph, known, {*feeds.values(), *constant})
        outputs.extend(helper.make_tensor_value_info(n, *t) for n, t in otherwise.items())
        flag = f"run/{k}"
        inputs.append(helper.make_tensor_value_info(flag, TensorProto.BOOL, []))
        defaults.append(helper.make_tensor(flag, TensorProto.BOOL, [], [False]))
        then, orelse = branch_graph, _empty_branch(otherwise, prefix)
        outs = [fetches[o.name] for o in graph.output]
        nodes.append(
            helper.make_node(
                "If", [flag], outs, name=f"{prefix}if", then_branch=then, else_branch=orelse
            )
        )
        branches[checked.file] = Branch(flag, feeds, fetches)
    graph = helper.make_graph(
        nodes, "set", inputs, outputs, initializer=[*shared.values(), *defaults]
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(opsets.items())],
        ir_version=max(m.proto.ir_version for m in models),
        functions=functions,
    )
    return model, branches


def _renamed(
    checked: Checked, prefix: str, weights: dict[str, str], functions: list[Any]
) -> tuple[Any, dict[str, tuple[int, int]]]:
    """The file's graph, every name prefixed (its weights named as the main graph's, and left
    out of it: they live outside), its local functions renamed into `functions`; and the
    element type and rank of each value it types (an output the exporter left untyped, a
    constant it folded, is typed by what it names)."""
    from onnx import FunctionProto, GraphProto

    proto = checked.proto
    names = _Names(prefix, weights, {(f.domain, f.name) for f in proto.functions})
    graph = GraphProto()
    graph.CopyFrom(proto.graph)
    graph.name = f"{prefix}then"
    names.graph(graph)
    for function in proto.functions:
        renamed = FunctionProto()
        renamed.CopyFrom(function)
        renamed.name = prefix + function.name
        for node in renamed.node:  # its values are its own scope: only calls are renamed
            names.calls(node)
        functions.append(renamed)
    known = {t.name: (t.data_type, len(t.dims)) for t in graph.initializer}
    known.update(
        (v.name, (v.type.tensor_type.elem_type, len(v.type.tensor_type.shape.dim)))
        for v in graph.value_info
        if v.type.WhichOneof("value") == "tensor_type"
    )
    shared = set(weights.values())
    for field in (graph.initializer, graph.value_info):
        kept = [_copy(v) for v in field if v.name not in shared]
        del field[:]
        field.extend(kept)
    return graph, known


def _share_weights(
    checked: Checked, shared: dict[tuple[int, int, int, tuple[int, ...]], Any], weights: str
) -> dict[str, str]:
    """Each weight of `checked` as one initializer of the combined model's main graph, found
    by its bytes' place in the weights file (added to `shared` at its first reader): the
    file's initializer name -> the main graph's."""
    from onnx import TensorProto

    places = {init.name: init for init in checked.external}
    names: dict[str, str] = {}
    for init in checked.proto.graph.initializer:
        if init.name not in places:
            continue
        place = places[init.name]
        key = (place.offset, place.length, place.data_type, place.dims)
        if key not in shared:
            tensor = TensorProto()
            tensor.CopyFrom(init)
            tensor.name = f"w/{len(shared)}"
            del tensor.external_data[:]
            for field, value in (
                ("location", weights),
                ("offset", place.offset),
                ("length", place.length),
            ):
                tensor.external_data.add(key=field, value=str(value))
            shared[key] = tensor
        names[init.name] = shared[key].name
    return names


def _outputs(
    checked: Checked, k: int, branch: Any, known: dict[str, tuple[int, int]], passed: set[str]
) -> tuple[dict[str, str], dict[str, tuple[int, list[None]]]]:
    """File `k`'s outputs as its ``If``'s: the file's output name -> the combined model's
    (``out/k/i``), and each of those's element type and dynamic shape. An output that is an
    input or a constant (in `passed`) gets an ``Identity`` in `branch`: a branch outputs its
    own values."""
    from onnx import helper

    fetches: dict[str, str] = {}
    types: dict[str, tuple[int, list[None]]] = {}
    graph = checked.proto.graph
    for i, (original, value) in enumerate(zip(graph.output, branch.output, strict=True)):
        if value.type.WhichOneof("value") is None and value.name not in known:
            known.update(_inferred(checked.proto, f"{k}/"))
        elem, rank = _tensor_type(value, checked.file, "output", known)
        fetches[original.name] = f"out/{k}/{i}"
        types[f"out/{k}/{i}"] = (elem, [None] * rank)
        if value.name in passed:
            branch.node.append(helper.make_node("Identity", [value.name], [f"pass/{k}/{i}"]))
            value.name = f"pass/{k}/{i}"
    return fetches, types


def _empty_branch(types: dict[str, tuple[int, list[None]]], prefix: str) -> Any:
    """The ``else`` branch of a file's ``If``: an empty tensor per output (0 along each axis;
    a scalar output: one zero)."""
    from onnx import helper

    nodes, outputs = [], []
    for name, (elem, dims) in types.items():
        empty = "empty/" + name.removeprefix("out/")
        tensor = _zeros(empty, elem, [0] * len(dims))
        nodes.append(helper.make_node("Constant", [], [empty], value=tensor))
        outputs.append(helper.make_tensor_value_info(empty, elem, None))
    return helper.make_graph(nodes, f"{prefix}else", [], outputs)


class _Names:
    """Prefixes every name of one file's graph (values, nodes, dim names, its local functions),
    its weights renamed to the combined model's."""

    def __init__(self, prefix: str, weights: dict[str, str], local: set[tuple[str, str]]):
        self.prefix = prefix
        self.weights = weights
        self.local = local

    def value(self, name: str) -> str:
        if not name:  # an omitted optional input
            return name
        return self.weights.get(name) or self.prefix + name

    def call(self, node: Any) -> None:
        """A call of one of the file's local functions calls it by its new name."""
        if (node.domain, node.op_type) in self.local:
            node.op_type = self.prefix + node.op_type

    def calls(self, node: Any) -> None:
        """`call`, for a node and the nodes of its subgraphs (values left as they are)."""
        self.call(node)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                for inner in sub.node:
                    self.calls(inner)

    def graph(self, graph: Any) -> None:
        for node in graph.node:
            node.input[:] = [self.value(n) for n in node.input]
            node.output[:] = [self.value(n) for n in node.output]
            node.name = self.prefix + node.name if node.name else node.name
            self.call(node)
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    self.graph(sub)
        for tensor in graph.initializer:
            tensor.name = self.value(tensor.name)
        for sparse in graph.sparse_initializer:
            sparse.values.name = self.value(sparse.values.name)
            sparse.indices.name = self.value(sparse.indices.name)
        for info in [*graph.input, *graph.output, *graph.value_info]:
            info.name = self.value(info.name)
            self.dims(info.type)

    def dims(self, kind: Any) -> None:
        """Dim names are per file: ``batch`` of prefill is not ``batch`` of decode."""
        which = kind.WhichOneof("value")
        if which in ("tensor_type", "sparse_tensor_type"):
            for dim in getattr(kind, which).shape.dim:
                if dim.HasField("dim_param"):
                    dim.dim_param = self.prefix + dim.dim_param
        elif which in ("sequence_type", "optional_type"):
            self.dims(getattr(kind, which).elem_type)
        elif which == "map_type":
            self.dims(kind.map_type.value_type)


def _inferred(proto: Any, prefix: str) -> dict[str, tuple[int, int]]:
    """The element type and rank of each value of `proto`'s graph onnx's shape inference
    finds (its names prefixed as the combined model names them)."""
    from onnx.shape_inference import infer_shapes

    graph = infer_shapes(proto).graph
    return {
        prefix + v.name: (v.type.tensor_type.elem_type, len(v.type.tensor_type.shape.dim))
        for v in [*graph.value_info, *graph.output]
        if v.type.WhichOneof("value") == "tensor_type"
    }


def _copy(message: Any) -> Any:
    """A copy of a protobuf message, detached from the field it is in."""
    out = type(message)()
    out.CopyFrom(message)
    return out


def _tensor_type(
    value: Any, file: str, what: str, known: dict[str, tuple[int, int]] | None = None
) -> tuple[int, int]:
    """A tensor value's element type and rank (untyped: those of the tensor it names, when
    `known` has it)."""
    kind = value.type
    if kind.WhichOneof("value") is None and known and value.name in known:
        elem, rank = known[value.name]
        if elem in ITEMSIZE:
            return elem, rank
    if kind.WhichOneof("value") != "tensor_type" or kind.tensor_type.elem_type not in ITEMSIZE:
        raise OnnxFileError(
            f"{file}: the {what} {value.name[:120]!r} is not a tensor of a fixed-size element "
            "type, so the set's files cannot share one session; load it with "
            "share_weights=False (one session per file)"
        )
    tensor = kind.tensor_type
    return tensor.elem_type, len(tensor.shape.dim) if tensor.HasField("shape") else 1


def _default(value: Any, file: str) -> Any:
    """The value an input takes when its file does not run: zeros of its static sizes, 0
    along each dynamic axis (no element at all, unless every axis is static)."""
    elem, _ = _tensor_type(value, file, "input")
    tensor = value.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in tensor.shape.dim]
    if not tensor.HasField("shape"):
        dims = [0]
    return _zeros(value.name, elem, dims)


def _zeros(name: str, elem: int, dims: list[int]) -> Any:
    """A tensor of zeros (no element at all where an axis is 0)."""
    from onnx import TensorProto

    count = 1
    for d in dims:
        count *= d
    return TensorProto(
        name=name, data_type=elem, dims=dims, raw_data=b"\0" * (count * ITEMSIZE[elem])
    )
