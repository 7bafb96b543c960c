"""The work of an ONNX file's loops, bounded at load from the guards' ranges.

onnxruntime runs a ``Loop`` as many times as its trip count says and a ``Scan`` once per slice
of its scanned inputs, in C++, where the runner's deadline cannot stop a call: a ``Loop`` whose
trip count is 10^15 runs for days. So every ``Loop`` and ``Scan`` of a file (its graph, their
subgraphs, the model's local functions) must have a count known at load, at most `MAX_TRIPS`
(nested ones: their product), for every call the entry's guard lets through:

- a ``Loop``'s trip count must be a constant, or computed from sizes by the shape operators
  `_evaluate` knows, over intervals: each input axis spans its guard's ``[min, max]``
  (`replay.runtime.ort.manifest.OnnxInput`), so the bound holds for every size the guard
  admits. A ``Loop`` without a trip count (it runs until its condition says stop) or whose
  count depends on anything else (a value of an input) is refused;
- a ``Scan`` runs once per slice along its scanned axis, whose size onnx's shape inference
  must give: a number, or a dim of the inputs (bounded by its guard).

A refusal is one `OnnxFileError` naming the file and the node. Needs onnx, imported only for a
file that has a ``Loop`` or a ``Scan`` (no other file pays for the check).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from replay.runtime.ort.manifest import OnnxFile
from replay.runtime.ort.weights import OnnxFileError

__all__ = ["MAX_TRIPS", "check_loops"]

MAX_TRIPS = 1 << 20
"""Most iterations a loop (or nested loops, multiplied) may run in one call: a body of a few
microseconds runs for seconds per million, with no deadline to stop it."""

_MAX_ELEMENTS = 64
"""Largest integer tensor `_evaluate` follows (shapes and their pieces are a few values)."""

Interval = tuple[int, int]
Value = list[Interval]
"""An integer tensor's elements (flattened), each the interval of values it may take."""

_BINARY: dict[str, Callable[[Interval, Interval], Interval | None]] = {
    "Add": lambda a, b: (a[0] + b[0], a[1] + b[1]),
    "Sub": lambda a, b: (a[0] - b[1], a[1] - b[0]),
    "Mul": lambda a, b: _span([x * y for x in a for y in b]),
    "Div": lambda a, b: None if b[0] <= 0 <= b[1] else _span([int(x / y) for x in a for y in b]),
    "Min": lambda a, b: (min(a[0], b[0]), min(a[1], b[1])),
    "Max": lambda a, b: (max(a[0], b[0]), max(a[1], b[1])),
}
_SAME = frozenset({"Identity", "Cast", "Squeeze", "Unsqueeze", "Reshape", "Flatten"})
"""Operators whose output holds their first input's elements, in the same order."""


def _span(values: Sequence[int]) -> Interval:
    return min(values), max(values)


def check_loops(proto: Any, path: str, files: Sequence[OnnxFile]) -> None:
    """Refuses the ONNX model `proto` (the file at `path`) when one of its loops may run more
    than `MAX_TRIPS` times, or an unknown number of times, for a call one of `files` (the
    manifest entries the file serves) admits.

    Raises:
        OnnxFileError: Names the file, the node and its count.
    """
    if not any(node.op_type in ("Loop", "Scan") for node, _ in _nodes(proto)):
        return
    import onnx

    try:
        proto = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # noqa: BLE001 - shapes not inferred: a Scan is refused below
        pass
    for owned in files:
        bounds = _Bounds(proto, owned, path)
        bounds.graph(proto.graph, [], 1)
        for function in proto.functions:
            bounds.graph(function, [], 1)


def _nodes(proto: Any) -> Iterator[tuple[Any, int]]:
    """Every node of the model (graph, subgraphs, local functions), with its nesting depth."""
    graphs = [(proto.graph, 0)] + [(f, 0) for f in proto.functions]
    while graphs:
        graph, depth = graphs.pop()
        for node in graph.node:
            yield node, depth
            for attr in node.attribute:
                subs = ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
                graphs += [(g, depth + 1) for g in subs]


class _Scope:
    """One graph's names: what produces each, its constants, and the names it takes in
    (inputs, a subgraph's iteration values: unknown)."""

    def __init__(self, graph: Any) -> None:
        self.producers = {out: node for node in graph.node for out in node.output}
        self.constants = {t.name: t for t in getattr(graph, "initializer", ())}
        self.inputs = {getattr(i, "name", i) for i in graph.input}


class _Bounds:
    """The interval evaluation of one file for one manifest entry's ranges."""

    def __init__(self, proto: Any, owned: OnnxFile, path: str) -> None:
        self.path = path
        self.inputs = {i.name: list(zip(i.min, i.max, strict=True)) for i in owned.inputs}
        self.named: dict[str, Interval] = dict(owned.dims)
        for i in owned.inputs:  # a dim name the file's inputs carry, with its guard's range
            for name, low, high in zip(i.shape, i.min, i.max, strict=True):
                if isinstance(name, str):
                    self.named.setdefault(name, (low, high))
        graph = proto.graph
        infos = [*graph.input, *graph.value_info, *graph.output]
        self.shapes = {info.name: info.type.tensor_type.shape for info in infos}

    def graph(self, graph: Any, outer: list[_Scope], trips: int) -> None:
        """Checks every loop of `graph` (whose enclosing loops run `trips` times)."""
        scopes = [_Scope(graph), *outer]
        for node in graph.node:
            runs = trips
            if node.op_type == "Loop":
                runs = trips * self._loop_trips(node, scopes)
            elif node.op_type == "Scan":
                runs = trips * self._scan_trips(node)
            if runs > MAX_TRIPS:
                self._refuse(node, f"would run {runs:,} times (more than {MAX_TRIPS:,})")
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    self.graph(sub, scopes, runs)

    def _refuse(self, node: Any, why: str) -> None:
        raise OnnxFileError(
            f"{self.path}: the {node.op_type} node {node.name[:80]!r} {why} at the sizes the "
            "guards admit; onnxruntime runs it where no deadline can stop a call, so the file "
            "is not loaded"
        )

    def _loop_trips(self, node: Any, scopes: list[_Scope]) -> int:
        count = node.input[0] if node.input else ""
        if not count:
            self._refuse(node, "has no trip count (it runs until its condition says stop)")
        value = self._evaluate(count, scopes, 0)
        if value is None or len(value) != 1:
            self._refuse(node, f"has a trip count ({count[:80]!r}) not computed from sizes")
        return max(0, value[0][1]) if value else 0

    def _scan_trips(self, node: Any) -> int:
        attrs = {a.name: a for a in node.attribute}
        scanned = attrs["num_scan_inputs"].i if "num_scan_inputs" in attrs else 0
        names = list(node.input)[len(node.input) - scanned :] if scanned > 0 else []
        axes = list(attrs["scan_input_axes"].ints) if "scan_input_axes" in attrs else []
        highs = []
        for k, name in enumerate(names):
            dims = self._dims(name)
            axis = axes[k] if k < len(axes) else 0
            if dims is None or not -len(dims) <= axis < len(dims) or dims[axis] is None:
                self._refuse(node, f"scans {name[:80]!r}, whose length is not known at load")
            highs.append(dims[axis][1])  # type: ignore[index]
        if not highs:
            self._refuse(node, "scans no input")
        return min(highs)

    def _dims(self, name: str) -> list[Interval | None] | None:
        """Each axis's range of the tensor `name`: its guard's for an input, else what shape
        inference says (a number, or a dim name the guards bound); None when unknown."""
        if name in self.inputs:
            return list(self.inputs[name])
        shape = self.shapes.get(name)
        if shape is None or not shape.dim:
            return None if shape is None else []
        out: list[Interval | None] = []
        for dim in shape.dim:
            if dim.HasField("dim_value"):
                out.append((dim.dim_value, dim.dim_value))
            else:
                out.append(self.named.get(dim.dim_param))
        return out

    def _evaluate(self, name: str, scopes: list[_Scope], depth: int) -> Value | None:
        """The elements of the integer tensor `name`, over intervals; None when not known."""
        if depth > 64:
            return None
        for scope in scopes:
            if name in scope.producers:
                return self._node(scope.producers[name], scopes, depth)
            if name in scope.constants:
                return _constant(scope.constants[name])
            if name in scope.inputs:
                return None
        return None

    def _node(self, node: Any, scopes: list[_Scope], depth: int) -> Value | None:
        op, attrs = node.op_type, {a.name: a for a in node.attribute}

        def arg(i: int) -> Value | None:
            if i >= len(node.input) or not node.input[i]:
                return None
            return self._evaluate(node.input[i], scopes, depth + 1)

        if op == "Constant":
            return _constant_attribute(attrs)
        if op in ("Shape", "Size"):
            dims = self._dims(node.input[0])
            if dims is None or any(d is None for d in dims):
                return None
            known = [d for d in dims if d is not None]
            if op == "Size":
                return [(math.prod(d[0] for d in known), math.prod(d[1] for d in known))]
            start = attrs["start"].i if "start" in attrs else 0
            end = attrs["end"].i if "end" in attrs else len(known)
            return known[start:end]
        if op in _SAME:
            return arg(0)
        if op in _BINARY:
            return _broadcast(_BINARY[op], arg(0), arg(1))
        if op == "Concat":
            parts = [arg(i) for i in range(len(node.input))]
            return None if any(p is None for p in parts) else [x for p in parts if p for x in p]
        if op in ("Gather", "Slice"):
            return _pick(op, arg(0), [arg(i) for i in range(1, len(node.input))])
        if op in ("ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin") and len(node.input) == 1:
            return _reduce(op, arg(0))
        if op == "Neg":
            value = arg(0)
            return None if value is None else [(-hi, -lo) for lo, hi in value]
        return None


def _constant(tensor: Any) -> Value | None:
    """A small integer constant tensor's elements (None: external, float or large)."""
    import onnx
    from onnx import numpy_helper

    if tensor.data_location == onnx.TensorProto.EXTERNAL or math.prod(tensor.dims) > _MAX_ELEMENTS:
        return None
    array = numpy_helper.to_array(tensor)
    if array.dtype.kind not in "iub":
        return None
    return [(int(v), int(v)) for v in array.reshape(-1).tolist()]


def _constant_attribute(attrs: Mapping[str, Any]) -> Value | None:
    if "value" in attrs:
        return _constant(attrs["value"].t)
    if "value_int" in attrs:
        return [(attrs["value_int"].i, attrs["value_int"].i)]
    if "value_ints" in attrs and len(attrs["value_ints"].ints) <= _MAX_ELEMENTS:
        return [(v, v) for v in attrs["value_ints"].ints]
    return None


def _broadcast(
    fn: Callable[[Interval, Interval], Interval | None], a: Value | None, b: Value | None
) -> Value | None:
    if a is None or b is None or (len(a) != len(b) and 1 not in (len(a), len(b))):
        return None
    size = max(len(a), len(b))
    out = [fn(a[i if len(a) > 1 else 0], b[i if len(b) > 1 else 0]) for i in range(size)]
    return None if any(x is None for x in out) else [x for x in out if x is not None]


def _exact(value: Value | None) -> list[int] | None:
    """The values of a tensor known exactly (indices, slice bounds), None otherwise."""
    if value is None or any(lo != hi for lo, hi in value):
        return None
    return [lo for lo, _ in value]


def _pick(op: str, data: Value | None, rest: list[Value | None]) -> Value | None:
    """``Gather`` (axis 0) or ``Slice`` of a 1-D `data` by exactly known indices or bounds."""
    args = [_exact(r) for r in rest]
    if data is None or any(a is None for a in args):
        return None
    if op == "Gather":
        indices = args[0] or []
        if any(not -len(data) <= i < len(data) for i in indices):
            return None
        return [data[i] for i in indices]
    starts, ends, *more = args
    steps = more[1] if len(more) > 1 else [1]
    if not (starts and ends and steps) or len(starts) != 1 or steps[0] == 0:
        return None
    return data[slice(starts[0], ends[0], steps[0])]


def _reduce(op: str, value: Value | None) -> Value | None:
    if not value:
        return None
    lows, highs = [lo for lo, _ in value], [hi for _, hi in value]
    if op == "ReduceProd":
        if min(lows) < 0:
            return None
        return [(math.prod(lows), math.prod(highs))]
    if op == "ReduceSum":
        return [(sum(lows), sum(highs))]
    pick = max if op == "ReduceMax" else min
    return [(pick(lows), pick(highs))]
