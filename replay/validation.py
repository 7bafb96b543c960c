"""One validation of an artifact, run in full by ``replay.load`` and ``capture check``.

`validate` reads a ``.pt2`` artifact or an ONNX set as the loader does, everything but running a
program: for a ``.pt2`` the archive's entries, the manifest, the payload configs, the program
graphs (strings torch would run as code, the operators they call:
`replay.runtime.pt2.graph_check`), the file digests, the weights mapped and placed, the pytree
types registered, every program's graph built (`replay.runtime.pt2.program`); for an ONNX set
the manifest, every file it names (a regular file beside it, its digest), each model's operators
and external data (`replay.runtime.ort.checks`), and onnxruntime's own session for its models
(one for the set, its files combined: `replay.runtime.ort.combined`).
What ``capture check`` accepts, ``replay.load`` serves, and the other way around; both refuse
with the same one-line `ArtifactError`.

**File digests.** The manifest records the SHA-256 of every file it describes (a ``.pt2``'s
graphs, payload configs, weight records and AOTInductor files; an ONNX set's model files and
its weights file), so a file swapped for another (a different model with the same inputs and
outputs) is refused. The graphs and model files are verified on every load (they are read
anyway); the weights when asked (``verify_weights=True``), always by ``capture check``:
docs/benchmarks.md says what hashing costs per GiB.

**The cyclic garbage collector is off while an artifact is validated**
(`replay.runtime.checked_json.collector_paused`): the parsed graphs, alive while they are
checked, would otherwise make CPython run a full collection of the whole process (more than a
third of a 1 GiB Llama's load, freeing nothing); they are dropped before it is on again.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from replay.runtime.allowed import allow_ops as normalised
from replay.runtime.checked_json import collector_paused
from replay.runtime.guards import ArtifactError

if TYPE_CHECKING:
    from replay.runtime.manifest import Manifest
    from replay.runtime.ort.runner import OnnxRunner
    from replay.runtime.runner import Runner

__all__ = ["Validated", "validate"]


@dataclass
class Validated:
    """An artifact validated by `validate`: its manifest and what the loader opened.

    Attributes:
        manifest: The typed manifest.
        opened: The ``.pt2``'s `replay.runtime.pt2.loading.Opened`, or the ONNX set's
            `replay.runtime.ort.runner.OpenedSet`.
    """

    manifest: Manifest
    opened: Any

    def runner(self) -> Runner | OnnxRunner:
        """The runner serving what was validated (nothing is read again)."""
        return self.opened.runner()  # type: ignore[no-any-return]


def validate(
    path: str | os.PathLike[str],
    *,
    allow_ops: Iterable[str] | None = None,
    verify_weights: bool = True,
    device: str | None = None,
    compiled: bool = False,
    share_weights: bool = True,
    providers: Sequence[str] | None = None,
    threads: int | None = None,
) -> Validated:
    """Reads and checks an artifact in full, as ``replay.load`` does, without running it.

    Args:
        path: A ``.pt2`` artifact, or an ONNX set's ``model.onnx`` (or ``model.onnx.json``).
        allow_ops: Operator namespaces (``mylib``) or operators (``mylib.op``) a program may
            call beyond the model's math (`replay.runtime.pt2.operators`; for ONNX, operator
            domains beyond the standard ones, `replay.runtime.ort.checks`).
        verify_weights: Also hash every weight record / the weights file against the manifest
            (``capture check`` always does; ``replay.load`` when asked).
        device: A ``.pt2``'s device (default ``cpu``).
        compiled: Load a ``.pt2``'s AOTInductor builds (native code: `replay.load` only).
        share_weights: An ONNX set's files may be served by one session, the weights once
            (True: from 128 MiB of weights, `replay.runtime.ort.sessions`), or each by its own
            session (False).
        providers: An ONNX set's onnxruntime execution providers (default: CPU).
        threads: An ONNX set's intra-op threads per session.

    Returns:
        The `Validated` artifact (its `Validated.runner` serves it).

    Raises:
        ArtifactError: Anything the loader refuses, one line naming it (an `OnnxFileError`
            for an ONNX set).

    Example:
        >>> validate("model.pt2").manifest.model_name  # doctest: +SKIP
        'LlamaForCausalLM'
    """
    with collector_paused():
        return _validate(path, allow_ops, verify_weights, device, compiled, share_weights,
                         providers, threads)  # fmt: skip


def _validate(
    path: str | os.PathLike[str],
    allow_ops: Iterable[str] | None,
    verify_weights: bool,
    device: str | None,
    compiled: bool,
    share_weights: bool,
    providers: Sequence[str] | None,
    threads: int | None,
) -> Validated:
    from replay.runtime.ort.manifest import is_onnx_path

    allowed = normalised(allow_ops)
    if is_onnx_path(path):
        from replay.runtime.ort.runner import CPU, open_onnx

        if compiled or device not in (None, "cpu"):
            raise ArtifactError(
                f"{os.fspath(path)} is an ONNX set: it runs on onnxruntime, without device= or "
                "compiled=; pick its execution providers with providers=..."
            )
        opened = open_onnx(
            path,
            allowed=allowed,
            verify_weights=verify_weights,
            share_weights=share_weights,
            providers=CPU if providers is None else providers,
            threads=threads,
        )
        return Validated(opened.manifest.manifest, opened)
    from replay.runtime.pt2.loading import open_artifact

    pt2 = open_artifact(
        path, device=device, compiled=compiled, allowed=allowed, verify_weights=verify_weights
    )
    return Validated(pt2.art.manifest, pt2)
