"""The options of a replay, built once at the API boundary and passed down the pipeline.

`ExportOptions` is the one place an option is defined, with its default: `replay.export` and
`replay.export_inputs` keep their documented keyword arguments, whose defaults are read from it
(`tests/test_replay_options.py` checks that they stay the same set with the same defaults), and
turn them into one `ExportOptions` with `ExportOptions.of` (the one conversion and check);
``capture export`` builds the same object from its command options (whose defaults it reads
here too), and ``capture dims --python`` builds one for its three options. A new option goes
into `ExportOptions` first. The pipeline: analysis (``set_batch_dimension_for``) ->
representative example -> per-group shapes (`replay.inputs.groupshapes`, ``named_dims``,
``keyword_only``; a retry's `ShapeRetry`) -> rebuilt arguments (``seed``, ``device``,
``fill_missing``) -> export and check (``modules``: the recorded sub-modules too). A retry
reshapes a group with a `ShapeRetry` and runs the same step again (`replay.pipeline.bounded`:
named Dims rejected by torch.export become bounded ``Dim.DYNAMIC`` hints) instead of a parallel
path; the options stay the caller's.

This module imports no torch (``capture dims --python`` builds options too).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from capture.errors import ReplayError
from capture.store.payload_format import DEFAULT_MAX_CALL_BYTES

if TYPE_CHECKING:
    import torch

__all__ = [
    "ExportOptions",
    "batch_option",
    "DEFAULT_SEED",
    "DEFAULT_TIME_BUDGET",
    "ShapeRetry",
    "EXPORT_ONLY",
    "INPUT_OPTIONS",
    "takes_options",
    "SPECS",
]

DEFAULT_SEED = 0
"""Seed of the rebuilt example tensors (also the default of `replay.inputs.rebuild.rebuild`)."""

DEFAULT_TIME_BUDGET: float | None = 300.0
"""Seconds of torch.export per call group by default. A few times what the slowest group of the
test suite's real models takes on a loaded 2-core machine (tens of seconds), so no ordinary group
meets it, while a group torch.export would spend many minutes on (a vision model at several image
sizes) falls back to static programs within five minutes. The deadline runs in this process and
costs nothing until it passes (`replay.pipeline.budget.deadline`)."""

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
            recorded range (`replay.pipeline.splitting`); 1: never split.
        merge: Serve a group that lacks an optional input with another group's program, the
            input filled, where the check proves it on the group's own signatures
            (`replay.pipeline.merging`); False: one program per group.
        time_budget: Seconds of torch.export per call group (its dynamic exports, retries and
            regimes get half, the static fallback the rest;
            `replay.pipeline.budget.deadline`); None: no bound.
        max_static: Most static programs per group for the recorded signatures its dynamic
            program does not serve (`replay.pipeline.budget.static`); 0: no static fallback.
        spec: ``"dims"``: ``dynamic_shapes`` of ``torch.export.Dim`` objects; ``"shapes"``:
            torch's ``ShapesSpec`` (torch >= 2.14) learned from the store
            (`replay.inputs.specs.shapesspec`).
        allow_ops: Operators the programs may call beyond the allow-list, as the artifact will
            be loaded with (``replay.load(path, allow_ops=...)``): a program the loader would
            refuse is not claimed (`replay.artifact.loadable`).
        set_state: Puts the model in a recorded state's declared items (``fn(items)``) and
            back (``fn(None)``), for a store recorded with ``Recorder(..., state=fn)``
            (`capture.state.entering`); peft adapters and ``training`` are entered without it.
    """

    set_batch_dimension_for: BatchOption = None
    named_dims: bool = False
    keyword_only: bool = False
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
    time_budget: float | None = DEFAULT_TIME_BUDGET
    max_static: int = 16
    spec: str = "dims"
    allow_ops: tuple[str, ...] = ()
    set_state: Callable[[dict[str, Any] | None], None] | None = None

    @classmethod
    def of(cls, **options: Any) -> ExportOptions:
        """Options from the keyword arguments of the public API (iterables become tuples,
        None mappings empty).

        Raises:
            TypeError: An unknown option (the pipeline's own retry state is `ShapeRetry`).
            ValueError: ``spec`` is not ``"dims"`` or ``"shapes"``.

        Example:
            >>> ExportOptions.of(named_dims=True, groups=["decode"]).groups
            ('decode',)
        """
        if options.get("spec", "dims") not in SPECS:
            raise ValueError(f"spec={options['spec']!r}: one of {', '.join(map(repr, SPECS))}")
        if options.get("onnx") is not None:
            options["onnx"] = os.fspath(options["onnx"])
        if "set_batch_dimension_for" in options:
            options["set_batch_dimension_for"] = batch_option(options["set_batch_dimension_for"])
        if options.get("groups") is not None:
            options["groups"] = tuple(options["groups"])
        if "allow_ops" in options:
            from replay.runtime.allowed import allow_ops

            options["allow_ops"] = tuple(sorted(allow_ops(options["allow_ops"])))
        if "value_if_missing" in options:
            options["value_if_missing"] = dict(options["value_if_missing"] or {})
        set_state = options.get("set_state")
        if set_state is not None and not callable(set_state):
            raise ReplayError(f"set_state={set_state!r}: give a callable (fn(items), fn(None))")
        budget = options.get("time_budget")
        if budget is not None and not budget > 0:
            raise ReplayError(
                f"time_budget={budget!r}: give a number of seconds above 0, or None for no bound"
            )
        return cls(**options)

    @classmethod
    def of_inputs(cls, **options: Any) -> ExportOptions:
        """`of` for `replay.export_inputs`: the options that shape the inputs only.

        Raises:
            TypeError: An option of `replay.export` only (`EXPORT_ONLY`), or an unknown one.

        Example:
            >>> ExportOptions.of_inputs(probes=0)
            Traceback (most recent call last):
            ...
            TypeError: probes: an option of replay.export, not of export_inputs
        """
        only = sorted(set(options) & set(EXPORT_ONLY))
        if only:
            raise TypeError(f"{', '.join(only)}: an option of replay.export, not of export_inputs")
        return cls.of(**options)


SPECS = ("dims", "shapes")
"""The forms of ``dynamic_shapes`` an export can use (`ExportOptions.spec`)."""


@dataclass(frozen=True)
class ShapeRetry:
    """How a retry reshapes a group's ``dynamic_shapes``: the pipeline's own state, never an
    option (`replay.inputs.exportgroup.ExportGroup.reshaped`).

    Attributes:
        hinted: With ``named_dims``, the symbols given as bounded ``Dim.DYNAMIC(min=, max=)``
            hints instead (the `replay.pipeline.bounded` retry).
        floor: Raise the min of the hinted symbols to this (the same retry).
        unbounded: Every dynamic axis ``Dim.DYNAMIC``, whatever ``named_dims`` asks (the
            retry of last resort, reported as not honoured).
        auto: ``Dim.AUTO`` on every dynamic axis (`replay.pipeline.splitting`, to learn where
            torch.export cuts a group's range).

    Example:
        >>> ShapeRetry(hinted=("seq",), floor=2).auto
        False
    """

    hinted: tuple[str, ...] = ()
    floor: int = 0
    unbounded: bool = False
    auto: bool = False


EXPORT_ONLY = (
    "onnx",
    "modules",
    "strict",
    "atol",
    "rtol",
    "probes",
    "max_payloads",
    "max_payload_bytes",
    "max_regimes",
    "merge",
    "time_budget",
    "max_static",
    "allow_ops",
    "set_state",
)
"""Options only `replay.export` takes: the inputs are the same whatever the check does."""

INPUT_OPTIONS = tuple(
    f.name for f in dataclasses.fields(ExportOptions) if f.name not in EXPORT_ONLY
)
"""The options `replay.export_inputs` takes."""

_F = TypeVar("_F", bound=Callable[..., Any])


def takes_options(names: Iterable[str]) -> Callable[[_F], _F]:
    """Gives a function that takes ``**options`` the signature of one keyword per option of
    `names`, with `ExportOptions`' defaults and types (a mapping default: None): what
    ``help()``, ``inspect.signature`` and editors show, derived from the dataclass instead of
    restated by hand.

    Example:
        >>> @takes_options(["probes"])
        ... def check(store, **options): ...
        >>> inspect.signature(check)
        <Signature (store, *, probes: 'int' = 4)>
    """
    fields = {f.name: f for f in dataclasses.fields(ExportOptions)}
    chosen = [fields[name] for name in names]

    def decorate(fn: _F) -> _F:
        signature = inspect.signature(fn)
        params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        params += [
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=None if f.default is dataclasses.MISSING else f.default,
                annotation=f.type,
            )
            for f in chosen
        ]
        fn.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        return fn

    return decorate
