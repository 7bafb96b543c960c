"""``replay.load`` and the manifest readers, by file type: a ``.pt2`` artifact or an ONNX set.

``model.pt2`` is the artifact `replay.ship.artifact` writes; ``model.onnx`` (or its manifest
``model.onnx.json``) is the ONNX set ``export(..., onnx=PATH)`` writes (`replay.onnx`). Both
manifests describe their programs with the same guard entries (`replay.ship.guards`), so
``capture check`` and ``capture report`` read either through `read_any_manifest`, without torch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replay.onnx.runner import OnnxRunner
    from replay.ship.runner import Runner

__all__ = ["load", "read_any_manifest"]


def load(path: str | os.PathLike[str]) -> Runner | OnnxRunner:
    """Loads what ``capture export --out`` wrote and returns a runner callable like the model.

    Args:
        path: A ``.pt2`` artifact (`replay.ship.artifact.load`), or the ``onnx=`` path of an
            ONNX set (``model.onnx``, or ``model.onnx.json``; `replay.onnx.runner.load_onnx`).

    Returns:
        A `replay.ship.runner.Runner` or an `replay.onnx.runner.OnnxRunner`: the same contract
        (structure and guards pick the program; `CallNotServed` names the groups tried).

    Raises:
        ArtifactError: Not a capture artifact (see `replay.ship.artifact.load`).
        OnnxFileError: Not a capture ONNX set (see `replay.onnx.runner.load_onnx`).

    Example:
        >>> runner = replay.load("model.onnx")  # doctest: +SKIP
        >>> out = runner(input_ids=ids, attention_mask=mask)  # doctest: +SKIP
    """
    from replay.onnx.manifest import is_onnx_path

    if is_onnx_path(path):
        from replay.onnx.runner import load_onnx

        return load_onnx(path)
    from replay.ship.artifact import load as load_artifact

    return load_artifact(path)


def read_any_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a ``.pt2`` artifact or of an ONNX set (json and zipfile only).

    Raises:
        ArtifactError: Not a capture artifact.
        OnnxFileError: Not a capture ONNX set.

    Example:
        >>> read_any_manifest("model.onnx")["model"]  # doctest: +SKIP
        'LlamaForCausalLM'
    """
    from replay.onnx.manifest import is_onnx_path

    if is_onnx_path(path):
        from replay.onnx.manifest import read_manifest

        return read_manifest(path)
    from replay.ship.artifact import read_manifest as read_artifact

    return read_artifact(path)
