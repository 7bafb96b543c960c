"""Weights once: every ONNX file of an export references one external-data file.

Each group's ONNX model holds the same weights (and often the same folded constants). ONNX
external data lets an initializer live in another file, referenced by ``location``, ``offset``
and ``length``, so `write_models` writes each distinct tensor once into ``<PATH>.data`` (found by
its bytes: names differ between conversions) and points the initializers of every model at it.
Tensors under `INLINE_BYTES` stay inside their model (shape constants: not weights, and a
reference would cost more than the bytes). Offsets are aligned to `ALIGNMENT` bytes, so
onnxruntime and numpy read the tensors in place.

The files are written under temporary names and renamed, the weights first: a reader never
sees a model that references weights not yet written.

`external_initializers` reads the references back (for the runner's shared initializers),
refusing any that leaves the weights file: a set of ONNX files is data.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from replay.runtime.guards import ArtifactError

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = [
    "ALIGNMENT",
    "INLINE_BYTES",
    "ExternalInitializer",
    "OnnxFileError",
    "external_initializers",
    "write_models",
]

ALIGNMENT = 64
"""Offset alignment of every tensor in the weights file (bytes)."""

INLINE_BYTES = 1024
"""Tensors smaller than this stay inside their model file (onnx's own default threshold)."""


class OnnxFileError(ArtifactError):
    """A set of ONNX files cannot be written or read as capture wrote it (an ONNX set is an
    artifact: ``except ArtifactError`` catches both kinds)."""


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


def write_models(models: Sequence[tuple[str, ir.Model]], weights: str) -> int:
    """Writes `models` (path -> model) with their large initializers in one weights file.

    Args:
        models: ``(path, model)`` pairs; every path in the weights file's directory.
        weights: The weights file to write (``<PATH>.data``).

    Returns:
        The size of the weights file in bytes.

    Raises:
        OnnxFileError: A model path outside the weights file's directory.

    Example:
        >>> write_models([("m.decode.onnx", model)], "m.onnx.data")  # doctest: +SKIP
        1048576
    """
    import onnx_ir as ir

    folder = os.path.dirname(os.path.abspath(weights))
    location = os.path.basename(weights)
    for path, _ in models:
        if os.path.dirname(os.path.abspath(path)) != folder:
            raise OnnxFileError(f"{path}: the ONNX files and {location} must share one directory")
    written: dict[bytes, int] = {}
    tmp_weights = _tmp(weights)
    size = 0
    try:
        with open(tmp_weights, "wb") as out:
            for _, model in models:
                for value in list(model.graph.initializers.values()):
                    tensor = value.const_value
                    if tensor is None or tensor.nbytes < INLINE_BYTES:
                        continue
                    dims = [d for d in tensor.shape if isinstance(d, int)]
                    if len(dims) != len(tensor.shape):
                        continue  # not a constant's static shape: left as it is
                    data = tensor.tobytes()
                    digest = hashlib.sha256(data).digest() + len(data).to_bytes(8, "little")
                    offset = written.get(digest)
                    if offset is None:
                        pad = -size % ALIGNMENT
                        out.write(b"\0" * pad)
                        offset = size + pad
                        out.write(data)
                        size = offset + len(data)
                        written[digest] = offset
                    value.const_value = ir.ExternalTensor(
                        location,
                        offset,
                        len(data),
                        tensor.dtype,
                        shape=ir.Shape(dims),
                        name=str(value.name),
                        base_dir=folder,
                    )
        os.replace(tmp_weights, weights)
        for path, model in models:
            tmp = _tmp(path)
            ir.save(model, tmp, format="protobuf")
            os.replace(tmp, path)
    finally:
        for tmp in [tmp_weights, *(_tmp(p) for p, _ in models)]:
            if os.path.exists(tmp):
                os.remove(tmp)
    return size


def _tmp(path: str) -> str:
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.tmp")


def external_initializers(path: str, weights: str) -> list[ExternalInitializer]:
    """The initializers of the ONNX model at `path` that live in the weights file.

    Reads the model without its weights (``onnx.load(load_external_data=False)``).

    Args:
        path: An ONNX file written by `write_models`.
        weights: The weights file's name (no directory: it sits beside `path`).

    Returns:
        One `ExternalInitializer` per external initializer.

    Raises:
        OnnxFileError: The file is not ONNX, or an initializer references another file, a
            path, or bytes past the end of the weights file.

    Example:
        >>> external_initializers("m.decode.onnx", "m.onnx.data")[0].name  # doctest: +SKIP
        'model.embed_tokens.weight'
    """
    import onnx

    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as e:  # protobuf's DecodeError and friends: not an ONNX file
        raise OnnxFileError(f"{path} is not an ONNX model: {type(e).__name__}: {e}") from e
    stray = _nested_external(proto.graph, top=True)
    if stray:
        raise OnnxFileError(
            f"{path}: {stray} references external data outside the graph's initializers; "
            "capture's ONNX files never do"
        )
    folder = os.path.dirname(os.path.abspath(path))
    total = os.path.getsize(os.path.join(folder, weights))
    out: list[ExternalInitializer] = []
    for init in proto.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in init.external_data}
        if info.get("location") != weights:
            raise OnnxFileError(
                f"{path}: initializer {init.name} references {info.get('location')!r}; "
                f"capture's ONNX files keep their weights in {weights} only"
            )
        try:
            offset, length = int(info.get("offset", 0)), int(info["length"])
        except (KeyError, ValueError) as e:
            raise OnnxFileError(f"{path}: initializer {init.name} has no valid length") from e
        if offset < 0 or length < 0 or offset + length > total:
            raise OnnxFileError(
                f"{path}: initializer {init.name} reads bytes {offset}-{offset + length} of "
                f"{weights}, which holds {total}"
            )
        out.append(ExternalInitializer(init.name, offset, length, init.data_type, tuple(init.dims)))
    return out


def _nested_external(graph: Any, top: bool) -> str | None:
    """The name of a tensor with external data anywhere but the top graph's initializers
    (Constant attributes, subgraphs, sparse initializers): onnxruntime would open its file."""
    import onnx

    tensors = [] if top else list(graph.initializer)
    tensors += [t.values for t in graph.sparse_initializer]
    graphs = []
    for node in graph.node:
        for attr in node.attribute:
            tensors += ([attr.t] if attr.HasField("t") else []) + list(attr.tensors)
            graphs += ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
    for tensor in tensors:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            return f"tensor {tensor.name!r}"
    for sub in graphs:
        found = _nested_external(sub, top=False)
        if found:
            return found
    return None
