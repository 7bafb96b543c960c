"""An ONNX model of a set, checked before onnxruntime opens it: operators, external data.

- **Operators**: every node (of the graph, its subgraphs and the model's local functions) is
  in a standard domain (`DOMAINS`: ONNX's own and onnxruntime's built-in contrib operators), or
  calls a function the model itself defines (checked the same way), or is in a domain the caller
  names (``replay.load(path, allow_ops=["my.domain"])``, ``capture check --allow-ops``). A
  custom-domain operator would make onnxruntime look for a library the set does not hold.
- **Loops**: every ``Loop`` and ``Scan`` runs a number of times known at load and bounded
  from the guards' ranges (`replay.runtime.ort.loops`).
- **External data**: only the top graph's initializers may live outside the model, in the
  set's weights file, within it, with a length that is exactly the tensor's shape times its
  element size (`external_initializers`); any other tensor with external data (a Constant's
  dense or sparse value, a local function's default attribute, a subgraph's or a sparse
  initializer, a training graph's) refuses the file, wherever it points.

Needs onnx (not onnxruntime, not torch).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from replay.runtime.ort.loops import check_loops
from replay.runtime.ort.manifest import OnnxFile
from replay.runtime.ort.weights import OnnxFileError

__all__ = [
    "DOMAINS",
    "ITEMSIZE",
    "ExternalInitializer",
    "check_operators",
    "external_initializers",
    "read_checked",
]

DOMAINS = frozenset({"", "ai.onnx", "com.microsoft"})
"""Operator domains a set's models may use without the caller naming them."""

ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}
"""ONNX element type -> bytes per element (float, uint8, int8, uint16, int16, int32, int64,
bool, float16, double, uint32, uint64, bfloat16): the types an external initializer may have."""


@dataclass(frozen=True)
class ExternalInitializer:
    """One initializer of a model that lives in the weights file.

    Attributes:
        name: The initializer's name in its model.
        offset: Where its bytes start in the weights file.
        length: How many bytes.
        data_type: Its ONNX element type (``TensorProto.DataType``).
        dims: Its shape.
    """

    name: str
    offset: int
    length: int
    data_type: int
    dims: tuple[int, ...]


def check_operators(proto: Any, path: str, allowed: Iterable[str] = ()) -> None:
    """Refuses a node in a domain that is neither standard, nor a function of the model, nor
    named by the caller.

    Raises:
        OnnxFileError: Names the node, its operator and domain.
    """
    domains = DOMAINS | set(allowed)
    local = {(f.domain, f.name) for f in proto.functions}
    graphs = [proto.graph] + [f for f in proto.functions]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            if node.domain not in domains and (node.domain, node.op_type) not in local:
                raise OnnxFileError(
                    f"{path}: node {node.name[:80]!r} calls {node.op_type[:80]} of the domain "
                    f"{node.domain[:80]!r}, which is not a standard ONNX operator; name the "
                    "domain to allow it (replay.load(path, allow_ops=[...]), capture check "
                    "--allow-ops); it is not loaded"
                )
            for attr in node.attribute:
                graphs += ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)


def external_initializers(
    path: str, weights: str, allowed: Iterable[str] = ()
) -> list[ExternalInitializer]:
    """The initializers of the ONNX model at `path` that live in the weights file, the model's
    operators checked (`read_checked`).

    Args:
        path: An ONNX file written by `replay.runtime.ort.weights.write_models`.
        weights: The weights file's name (no directory: it sits beside `path`).
        allowed: Operator domains the caller allows beyond `DOMAINS`.

    Returns:
        One `ExternalInitializer` per external initializer.

    Raises:
        OnnxFileError: See `read_checked`.

    Example:
        >>> external_initializers("m.decode.onnx", "m.onnx.data")[0].name  # doctest: +SKIP
        'model.embed_tokens.weight'
    """
    return read_checked(path, weights, allowed)[1]


def read_checked(
    path: str, weights: str, allowed: Iterable[str] = (), served: Sequence[OnnxFile] = ()
) -> tuple[Any, list[ExternalInitializer]]:
    """Reads the ONNX model at `path` without its weights (``onnx.load(load_external_data=False)``)
    and checks it: its operators (`check_operators`), its external data and, for the manifest
    entries it serves (`served`), the work of its loops (`replay.runtime.ort.loops`).

    Returns:
        The ``onnx.ModelProto`` and one `ExternalInitializer` per initializer of the top graph
        that lives in the weights file.

    Raises:
        OnnxFileError: The file is not ONNX, a node is outside the allowed domains, an
            initializer references another file, a path, bytes outside the weights file, or a
            length that is not its shape's, or a loop's count is unknown or too large.
    """
    import onnx

    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as e:  # protobuf's DecodeError and friends: not an ONNX file
        text = str(e).strip().splitlines()
        raise OnnxFileError(
            f"{path} is not an ONNX model: {type(e).__name__}: {text[0][:200] if text else ''}"
        ) from None
    check_operators(proto, path, allowed)
    stray = _nested_external(proto.graph, top=True)
    for function in proto.functions:  # a local function's Constant: its nodes, like a subgraph's
        stray = stray or _nested_external(function, top=True)
    for training in proto.training_info:  # graphs onnxruntime does not run: none may hold any
        for graph in (training.initialization, training.algorithm):
            stray = stray or _nested_external(graph, top=False)
    if stray:
        raise OnnxFileError(
            f"{path}: {stray} references external data outside the graph's initializers; "
            "capture's ONNX files never do"
        )
    check_loops(proto, path, served)
    folder = os.path.dirname(os.path.abspath(path))
    total = os.path.getsize(os.path.join(folder, weights))
    out: list[ExternalInitializer] = []
    for init in proto.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        out.append(_external(init, path, weights, total))
    return proto, out


def _external(init: Any, path: str, weights: str, total: int) -> ExternalInitializer:
    info = {entry.key: entry.value for entry in init.external_data}
    where = f"{path}: initializer {init.name[:120]}"
    if info.get("location") != weights:
        raise OnnxFileError(
            f"{where} references {str(info.get('location'))[:120]!r}; capture's ONNX files keep "
            f"their weights in {weights} only"
        )
    try:
        offset, length = int(info.get("offset", 0)), int(info["length"])
    except (KeyError, ValueError):
        raise OnnxFileError(f"{where} has no valid offset and length") from None
    if offset < 0 or length < 0 or offset + length > total:
        raise OnnxFileError(
            f"{where} reads bytes {offset}-{offset + length} of {weights}, which holds {total}"
        )
    size = ITEMSIZE.get(init.data_type)
    count = 1
    for d in init.dims:
        count *= d
    if size is None or min(init.dims, default=0) < 0 or count * size != length:
        raise OnnxFileError(
            f"{where} of type {init.data_type} and shape {list(init.dims)[:8]} does not fit its "
            f"{length} bytes"
        )
    return ExternalInitializer(init.name, offset, length, init.data_type, tuple(init.dims))


def _attribute_parts(attr: Any) -> tuple[list[Any], list[Any]]:
    """The tensors (a sparse tensor's values and indices too) and graphs an attribute holds."""
    tensors = ([attr.t] if attr.HasField("t") else []) + list(attr.tensors)
    sparse = ([attr.sparse_tensor] if attr.HasField("sparse_tensor") else []) + list(
        attr.sparse_tensors
    )
    tensors += [part for s in sparse for part in (s.values, s.indices)]
    return tensors, ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)


def _nested_external(graph: Any, top: bool) -> str | None:
    """The name of a tensor with external data anywhere but the top graph's initializers
    (Constant attributes, dense or sparse, subgraphs, sparse initializers; `graph` may be a
    local function, which has nodes and its attributes' defaults only): onnxruntime would
    open its file."""
    import onnx

    tensors = [] if top else list(graph.initializer)
    for sparse in getattr(graph, "sparse_initializer", ()):  # none in a function
        tensors += [sparse.values, sparse.indices]
    graphs = []
    attributes = [a for node in graph.node for a in node.attribute]
    attributes += list(getattr(graph, "attribute_proto", ()))  # a function's defaults
    for attr in attributes:
        held, sub = _attribute_parts(attr)
        tensors += held
        graphs += sub
    for tensor in tensors:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            return f"tensor {tensor.name!r}"
    for sub in graphs:
        found = _nested_external(sub, top=False)
        if found:
            return found
    return None
