"""``replay.load`` and the manifest readers, by file type: a ``.pt2`` artifact or an ONNX set.

``model.pt2`` is the artifact `replay.artifact.saving` writes; ``model.onnx`` (or its manifest
``model.onnx.json``) is the ONNX set ``export(..., onnx=PATH)`` writes (`replay.onnx`). Both
manifests parse into the same typed `replay.runtime.manifest.Manifest` (the same program entries
and guards, routed by the one `replay.runtime.guards.route`), so ``capture check``, ``capture
report`` and ``capture summary --artifact`` read either through `read_any_manifest`, as data
and without torch: a ``.pt2`` checked whole (`replay.runtime.pt2.loading.read_artifact`), an
ONNX set through `replay.runtime.ort.manifest.read_onnx_set`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replay.runtime.manifest import Manifest
    from replay.runtime.ort.runner import OnnxRunner
    from replay.runtime.runner import Runner

__all__ = ["load", "read_any_manifest"]


def load(
    path: str | os.PathLike[str],
    *,
    device: str | None = None,
    compiled: bool = False,
    allow_ops: Iterable[str] | None = None,
    verify_weights: bool = False,
    share_weights: bool = True,
) -> Runner | OnnxRunner:
    """Loads what ``capture export --out`` wrote and returns a runner callable like the model.

    Works in a fresh process: no capture context is needed, nothing is printed, nothing is
    unpickled, imported or evaluated from the artifact. It is validated in full first
    (`replay.validation.validate`, what ``capture check`` runs): its files against the
    manifest's digests, its programs' operators against the model's math, and everything the
    loader reads, as data. A ``.pt2``'s weights are materialised once (memory-mapped on CPU)
    and every program uses them.

    Args:
        path: A ``.pt2`` artifact (`replay.runtime.pt2.loading.open_artifact`), or the ``onnx=``
            path of an ONNX set (``model.onnx``, or ``model.onnx.json``;
            `replay.runtime.ort.runner.load_onnx`).
        device: Where a ``.pt2``'s weights go and its programs run (``cuda``, ``cuda:1``;
            default ``cpu``): each weight is copied there once, and every program's graph is
            moved.
        compiled: Run the AOTInductor builds of a ``.pt2`` saved with ``aoti=True`` (native
            code from the archive: loading it runs it, so it is asked for, never assumed).
        allow_ops: Operator namespaces (``mylib``) or operators (``mylib.op``) the programs
            may call beyond the model's math (`replay.runtime.pt2.operators`; ONNX domains for
            an ONNX set, `replay.runtime.ort.checks`).
        verify_weights: Also hash the weights against the manifest (the graphs and model
            files always are): docs/benchmarks.md says what it costs per GiB.
        share_weights: An ONNX set's files may be served by one onnxruntime session, the
            weights loaded and prepacked once (True: from 128 MiB of weights; below it a
            session per file costs less per call, `replay.runtime.ort.sessions`), or each file
            by its own session with its own copy (False); ``runner.mode`` says which serves and
            docs/onnx.md measures both. A ``.pt2``'s programs always share one copy.

    Returns:
        A `replay.runtime.runner.Runner` or an `replay.runtime.ort.runner.OnnxRunner`: the same
        contract (structure and guards pick the program; `CallNotServed` names the groups tried;
        ``runner.modules[name]`` serves a recorded sub-module).

    Raises:
        ArtifactError: Not a capture artifact, a changed one, or one the loader refuses (see
            `replay.validation.validate`: an operator that is not the model's math, a pytree
            type it cannot register, a program torch cannot read, ``compiled`` for an artifact
            without AOTInductor builds), or `device` or `compiled` asked of an ONNX set.
        OnnxFileError: Not a capture ONNX set (an `ArtifactError` too).

    Example:
        >>> runner = replay.load("model.onnx")  # doctest: +SKIP
        >>> out = runner(input_ids=ids, attention_mask=mask)  # doctest: +SKIP
    """
    from replay.validation import validate

    checked = validate(
        path,
        device=device,
        compiled=compiled,
        allow_ops=allow_ops,
        verify_weights=verify_weights,
        share_weights=share_weights,
    )
    return checked.runner()


def read_any_manifest(path: str | os.PathLike[str]) -> Manifest:
    """The typed manifest of a ``.pt2`` artifact or of an ONNX set, the whole set checked as
    data first (json and zipfile only: no torch, no onnx).

    Raises:
        ArtifactError: Not a capture artifact, or changed or damaged (named).
        OnnxFileError: Not a capture ONNX set, or changed or damaged (an `ArtifactError` too).

    Example:
        >>> read_any_manifest("model.onnx").model_name  # doctest: +SKIP
        'LlamaForCausalLM'
    """
    from replay.runtime.ort.manifest import is_onnx_path

    if is_onnx_path(path):
        from replay.runtime.ort.manifest import read_onnx_set

        return read_onnx_set(path).manifest
    from replay.runtime.pt2.loading import read_manifest

    return read_manifest(path)
