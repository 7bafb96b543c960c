"""Each weight once, the ONNX side: every ONNX file of an export references one data file.

Each group's ONNX model holds the same weights (and often the same folded constants). ONNX
external data lets an initializer live in another file, referenced by ``location``, ``offset``
and ``length``, so `write_models` writes each distinct tensor once into ``<PATH>.data`` (found by
its bytes: names differ between conversions) and points the initializers of every model at it.
Tensors under `INLINE_BYTES` stay inside their model (shape constants: not weights, and a
reference would cost more than the bytes). Offsets are aligned to `ALIGNMENT` bytes, so
onnxruntime and numpy read the tensors in place.

The files are written under temporary names and renamed, the weights first: a reader never
sees a model that references weights not yet written.

`replay.runtime.ort.checks.external_initializers` reads the references back (for the runner's
shared initializers), refusing any that leaves the weights file: a set of ONNX files is data.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from replay.runtime.guards import ArtifactError

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = [
    "ALIGNMENT",
    "INLINE_BYTES",
    "OnnxFileError",
    "write_models",
]

ALIGNMENT = 64
"""Offset alignment of every tensor in the weights file (bytes)."""

INLINE_BYTES = 1024
"""Tensors smaller than this stay inside their model file (onnx's own default threshold)."""


class OnnxFileError(ArtifactError):
    """A set of ONNX files cannot be written or read as capture wrote it (an ONNX set is an
    artifact: ``except ArtifactError`` catches both kinds)."""


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
