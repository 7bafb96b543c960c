"""The onnxruntime sessions of an ONNX set: which mode serves it, and opening them.

A set runs in one of two modes (`OnnxRunner.mode`):

- **combined**: the set's files combined in memory into one model (`replay.runtime.ort.combined`:
  each file an ``If`` branch, the weights initializers of the main graph), one session that loads
  the weights once and prepacks each matmul weight once: about the weights' size in memory;
- **per-file**: a session per file, each with its own prepacked copy of the weights (about four
  times the weights for a four-file set).

Measured (bench/bench_onnx.py, docs/benchmarks.md: two runs on a loaded machine, and one on
another): below about 0.12 GiB of weights (a 2-layer Llama of 0.05 and 0.11 GiB) a call through
the combined model costs 3-8 % more CPU than through a session per file, which stays within a few
% of a bare session; from 0.16 GiB up the difference is within the runs' noise. The kernels are
the same in both (onnxruntime's profile: the same nodes, the same fusions); the difference is
the ``If`` around them. So ``"auto"`` picks a session per file for a set whose weights file is
under `COMBINED_FROM` bytes (the extra copies small in absolute terms: under half a GiB for
four files), the combined session from there up; ``"combined"`` or ``"per-file"`` force one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from replay.runtime.ort.weights import OnnxFileError

__all__ = ["COMBINED_FROM", "MODES", "chosen_mode", "session", "release_freed_memory"]

MODES = ("auto", "combined", "per-file")
"""How a set's files may be served (module docstring)."""

COMBINED_FROM = 2**27
"""Weights (bytes) from which ``"auto"`` serves a set by its combined session (128 MiB)."""


def chosen_mode(mode: str, share_weights: bool, weights: str) -> str:
    """The mode a set is served in: `mode` unless ``"auto"``, then by the size of the set's
    weights file `weights` (module docstring); ``share_weights=False`` is ``"per-file"``.

    Raises:
        ReplayError: `mode` is not one of `MODES`.
    """
    from capture.errors import ReplayError

    if mode not in MODES:
        raise ReplayError(f"unknown ONNX runner mode {mode!r}; use one of {', '.join(MODES)}")
    if not share_weights or mode == "per-file":
        return "per-file"
    if mode == "combined":
        return mode
    size = os.path.getsize(weights) if os.path.isfile(weights) else 0
    return "combined" if size >= COMBINED_FROM else "per-file"


def session(
    ort: Any,
    model: str | bytes,
    names: str,
    folder: str,
    providers: Sequence[str],
    threads: int | None,
) -> Any:
    """An onnxruntime session of a model file, or of a combined model's bytes whose weights
    are in the set's folder.

    Raises:
        OnnxFileError: onnxruntime cannot load it.
    """
    options = ort.SessionOptions()
    options.log_severity_level = 3  # onnxruntime's warnings are not the caller's output
    if threads is not None:
        options.intra_op_num_threads = threads
    if isinstance(model, bytes):  # external data is looked for beside the combined model
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", folder
        )
    try:
        return ort.InferenceSession(model, options, providers=list(providers))
    except Exception as e:  # onnxruntime's own load errors: one clear line
        text = str(e).strip().splitlines()
        raise OnnxFileError(
            f"onnxruntime cannot load {names}: {type(e).__name__}: {text[0][:200] if text else ''}"
        ) from None


def release_freed_memory() -> None:
    """Hands the C heap's free pages back to the system (glibc's ``malloc_trim``).

    onnxruntime prepacks a weight once per kernel that reads it and keeps one packed copy per
    session; the other kernels' packs are freed, but glibc's allocator keeps such freed blocks
    (its mmap threshold grows with each large block freed) and the process would hold about a
    third of the weights more per extra file. Elsewhere than glibc there is nothing to call.
    """
    import ctypes

    try:  # the process's own symbols (dlopen(NULL)): libc's, where the C heap is glibc's
        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    except (OSError, TypeError):  # Windows: no process handle by None
        trim = None
    if trim is not None:
        trim(0)
