"""The seam to torch.compile's internals: Dynamo's tensor checks, frames it must not trace, the
export flag it reads, and unbacked sizes (``torch._C._dynamo``, ``torch._dynamo``,
``torch.compiler``).

No torch import at import time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from capture.compat.versions import warn_lost

if TYPE_CHECKING:
    import torch

__all__ = ["tensor_metadata_check", "run_outside_dynamo", "export_check", "mark_unbacked"]


# -- torch._C._dynamo ---------------------------------------------------------------------------
def tensor_metadata_check(tensors: Sequence[torch.Tensor]) -> Callable[..., bool] | None:
    """A C++ check that tensors have the dtypes, devices and ranks of `tensors`, or None.

    Private API: ``torch._C._dynamo.guards.TensorGuards`` (torch 2.13.0), the checks
    torch.compile's guards use. ``check(*others)`` is true when each of `others` has the same
    dtype, device, rank, tensor type, requires_grad and dispatch keys as its counterpart here,
    whatever its sizes and strides (sizes and strides are given as free). Without it the
    recorder matches structures by its Python key (`capture.record.flatten.tensor_key`):
    correct, about 3x slower per call.

    Returns:
        The check, or None when this torch has no such class (warned once) or cannot check one
        of these tensors.
    """
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError as e:
        warn_lost("tensor_metadata_check", "the recorder matches structures in Python (slower)", e)
        return None
    free: Any = [[None] * t.dim() for t in tensors]  # None: any size, any stride
    try:
        guards = TensorGuards(*tensors, dynamic_dims_sizes=free, dynamic_dims_strides=free)
    except (TypeError, RuntimeError):  # a tensor it cannot check (a subclass, a nested one)
        return None
    check: Callable[..., bool] = guards.check
    return check


def run_outside_dynamo(
    entry: Callable[..., Any],
    skipped: Iterable[Callable[..., Any]],
    opaque: Iterable[Callable[..., Any]],
    reason: str,
) -> None:
    """Makes Dynamo graph-break at `entry` and run it, `skipped` and `opaque` eagerly.

    Private APIs (torch 2.13.0): the ``_torchdynamo_disable`` / ``_torchdynamo_disable_msg``
    function attributes (what ``torch.compiler.disable`` sets, without importing Dynamo: seconds
    at start-up), and ``torch._C._dynamo.eval_frame.set_code_exec_strategy`` with
    ``_FrameExecStrategy(_FrameAction.SKIP, ...)``: the frames of `entry` and `skipped` are not
    compiled while the frames they call are (the recorded model's forward); the frames of
    `opaque` and of everything they call are not compiled (the recording itself). Without the
    frame strategies (warned once), Dynamo may trace into the recorder's helpers when a
    compiled model calls them: slower compiles, the recording still right.

    Args:
        entry: The function a compiled caller reaches.
        skipped: Functions whose own frames are skipped, their callees compiled.
        opaque: Functions skipped with everything they call.
        reason: Why, as torch shows it in graph-break reports.
    """
    entry._torchdynamo_disable = True  # type: ignore[attr-defined]
    entry._torchdynamo_disable_msg = reason  # type: ignore[attr-defined]
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )

        for fn in (entry, *skipped):
            set_code_exec_strategy(
                fn.__code__, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT)
            )
        for fn in opaque:
            set_code_exec_strategy(
                fn.__code__, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
            )
    except (ImportError, AttributeError, TypeError) as e:
        warn_lost(
            "run_outside_dynamo",
            "torch.compile may trace into the recorder's helpers (slower compiles)",
            e,
        )


_torch_compiler: Any = None  # torch.compiler, once `export_check` imported it


def _exporting() -> bool:
    flag: bool = _torch_compiler._is_exporting_flag  # a global: Dynamo guards on its value
    return flag


def export_check() -> Callable[[], bool]:
    """A function telling whether torch.export is tracing, also right while Dynamo traces.

    Private API: ``torch.compiler._is_exporting_flag``, the flag ``is_exporting()`` returns.
    Dynamo folds ``torch.compiler.is_exporting()`` to True while it traces any
    ``torch.compile`` on torch 2.11.0, and reads the flag on torch 2.13.0; the flag is right
    on both. Without it (warned once) ``is_exporting`` is used: on a torch that folds it, the
    recorder cannot tell a compile from an export and lets a compiled caller run the model
    unrecorded.
    """
    global _torch_compiler
    import torch.compiler

    if not hasattr(torch.compiler, "_is_exporting_flag"):
        warn_lost(
            "export_check",
            "calls of a torch.compile'd model may run unrecorded where Dynamo folds "
            "torch.compiler.is_exporting() to True",
            AttributeError("_is_exporting_flag"),
        )
        return torch.compiler.is_exporting
    _torch_compiler = torch.compiler
    return _exporting


# -- torch.compile ------------------------------------------------------------------------------
def mark_unbacked(t: torch.Tensor, axis: int, bounds: Mapping[str, int]) -> None:
    """Marks `axis` of `t` as an unbacked dynamic size for torch.compile, within `bounds`.

    Private API: ``torch._dynamo.decorators.mark_unbacked`` (``torch._dynamo.mark_dynamic``
    is public but specializes a size of 1). It takes ``min=``/``max=`` from torch 2.13 on
    (checked on 2.13.0 and 2.15.0); torch 2.11 and 2.12 take no bounds: there the size is
    marked without them (warned once), which compiles the same graph for any size, so no
    answer changes, only the range the compiler may assume.

    Args:
        t: A tensor of the call.
        axis: Its dynamic dim.
        bounds: ``{"min": ..., "max": ...}`` or empty.

    Example:
        >>> mark_unbacked(torch.ones(3, 4), 0, {"min": 2, "max": 8})  # doctest: +SKIP
    """
    from torch._dynamo.decorators import mark_unbacked as mark

    if bounds and not _mark_unbacked_takes_range():
        warn_lost(
            "mark_unbacked",
            "torch.compile hints mark unbacked sizes without their recorded ranges",
            TypeError("mark_unbacked() takes no min= or max="),
        )
        bounds = {}
    mark(t, axis, **bounds)


@functools.cache
def _mark_unbacked_takes_range() -> bool:
    """Whether this torch's ``mark_unbacked`` takes ``min=``/``max=`` (read once: the hints'
    pre-hook marks tensors on every call)."""
    import inspect

    from torch._dynamo.decorators import mark_unbacked

    return "min" in inspect.signature(mark_unbacked).parameters
