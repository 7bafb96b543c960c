"""The options of a replay, built once at the API boundary and passed down the pipeline.

`ExportOptions` is the one place an option is defined, with its default: `replay.export` and
`replay.export_inputs` keep their documented keyword arguments, whose defaults are read from it
(`tests/test_replay_options.py` checks that they stay the same set with the same defaults), and
turn them into one `ExportOptions` with `ExportOptions.of` (the one conversion and check);
``capture export`` builds the same object from its command options (whose defaults it reads
here too), and ``capture dims --python`` builds one for its three options. A new option goes
into `ExportOptions` first. The pipeline: analysis (``set_batch_dimension_for``) ->
representative example -> per-group shapes (`replay.inputs.groupshapes`, ``named_dims``,
``keyword_only``, ``hinted``/``floor``) -> rebuilt arguments (``seed``, ``device``,
``fill_missing``) -> export and check (``modules``: the recorded sub-modules too). A retry
changes one option with `dataclasses.replace` and runs the same step again
(`replay.pipeline.bounded`: named Dims rejected by torch.export become bounded ``Dim.DYNAMIC``
hints) instead of a parallel path.

This module imports no torch (``capture dims --python`` builds options too).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from capture.store.payload_format import DEFAULT_MAX_CALL_BYTES

if TYPE_CHECKING:
    import torch

__all__ = [
    "ExportOptions",
    "batch_option",
    "DEFAULT_SEED",
    "INTERNAL",
    "SPECS",
]

DEFAULT_SEED = 0
"""Seed of the rebuilt example tensors (also the default of `replay.inputs.rebuild.rebuild`)."""

BatchOption = bool | tuple[str | int, ...] | None


def batch_option(value: bool | Iterable[str | int] | None) -> BatchOption:
    """``set_batch_dimension_for`` as an immutable value: None, a bool, or a tuple of names
    and/or positions.

    Example:
        >>> batch_option(["input_ids", 0])
        ('input_ids', 0)
    """
    if value is None or isinstance(value, bool):
        return value
    return tuple(value)


@dataclass(frozen=True)
class ExportOptions:
    """Every option of `replay.export_inputs` and `replay.export` (see their docstrings).

    Attributes:
        set_batch_dimension_for: None, True, or argument names/positions whose axis 0 is
            dynamic even when it never varied.
        named_dims: Named ``Dim(symbol, min=, max=)`` instead of ``Dim.DYNAMIC``.
        keyword_only: Pass positional arguments by keyword.
        hinted: With `named_dims`, the symbols given as bounded ``Dim.DYNAMIC(min=, max=)``
            hints instead (set by the `replay.pipeline.bounded` retry, not by users).
        floor: Raise the min of the hinted symbols to this (the same retry).
        auto: ``Dim.AUTO`` on every dynamic axis (set by `replay.pipeline.regimes` to learn where
            torch.export cuts a group's range, not by users).
        value_if_missing: Name -> tensor given where that argument is missing (fill_missing).
        fill_missing: Give every program the tensor arguments some group of the model passes.
        seed: Seed of the example tensors.
        device: Device of the example tensors.
        groups: Only these call groups (None: all).
        onnx: Also write ONNX to this path (`replay.export` only).
        modules: Also export the sub-modules recorded with ``Recorder(modules=...)`` into
            `replay.pipeline.exporting.ExportResult.modules` (`replay.export` only).
        strict: Passed to ``torch.export.export``.
        atol: Absolute tolerance of the output comparison.
        rtol: Relative tolerance of the output comparison.
        probes: Most probes checked per group.
        max_payloads: Most sampled real calls checked.
        max_payload_bytes: Most bytes of tensors a sampled call's file may hold (bigger ones
            are not covered, never read).
        max_regimes: Most regimes a call group is split into where torch.export cuts its
            recorded range (`replay.pipeline.regimes`); 1: never split.
        merge: Serve a group that lacks an optional input with another group's program, the
            input filled, where the check proves it on the group's own signatures
            (`replay.pipeline.merging`); False: one program per group.
        spec: ``"dims"``: ``dynamic_shapes`` of ``torch.export.Dim`` objects; ``"shapes"``:
            torch's ``ShapesSpec`` (torch >= 2.14) learned from the store
            (`replay.inputs.specs.shapesspec`).
    """

    set_batch_dimension_for: BatchOption = None
    named_dims: bool = False
    keyword_only: bool = False
    hinted: tuple[str, ...] = ()
    floor: int = 0
    auto: bool = False
    value_if_missing: Mapping[str, torch.Tensor] = field(default_factory=dict)
    fill_missing: bool = False
    seed: int = DEFAULT_SEED
    device: str | None = None
    groups: tuple[str, ...] | None = None
    onnx: str | None = None
    modules: bool = False
    strict: bool = False
    atol: float = 1e-4
    rtol: float = 1e-4
    probes: int = 4
    max_payloads: int = 64
    max_payload_bytes: int = DEFAULT_MAX_CALL_BYTES
    max_regimes: int = 4
    merge: bool = True
    spec: str = "dims"

    @classmethod
    def of(cls, **options: Any) -> ExportOptions:
        """Options from the keyword arguments of the public API (iterables become tuples,
        None mappings empty).

        Raises:
            TypeError: An unknown option, or one set by the pipeline only (`INTERNAL`).
            ValueError: ``spec`` is not ``"dims"`` or ``"shapes"``.

        Example:
            >>> ExportOptions.of(named_dims=True, groups=["decode"]).groups
            ('decode',)
        """
        internal = sorted(set(options) & set(INTERNAL))
        if internal:
            raise TypeError(f"{', '.join(internal)}: set by the replay itself, not an option")
        if options.get("spec", "dims") not in SPECS:
            raise ValueError(f"spec={options['spec']!r}: one of {', '.join(map(repr, SPECS))}")
        if options.get("onnx") is not None:
            options["onnx"] = os.fspath(options["onnx"])
        if "set_batch_dimension_for" in options:
            options["set_batch_dimension_for"] = batch_option(options["set_batch_dimension_for"])
        if options.get("groups") is not None:
            options["groups"] = tuple(options["groups"])
        if "value_if_missing" in options:
            options["value_if_missing"] = dict(options["value_if_missing"] or {})
        return cls(**options)


SPECS = ("dims", "shapes")
"""The forms of ``dynamic_shapes`` an export can use (`ExportOptions.spec`)."""

INTERNAL = ("hinted", "floor", "auto")
"""Fields of `ExportOptions` the pipeline sets (the `replay.pipeline.bounded` retry,
`replay.pipeline.regimes`' probe of torch's cuts), never a caller."""
