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
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from capture.errors import ReplayError
from capture.store.payload_format import DEFAULT_MAX_CALL_BYTES

if TYPE_CHECKING:
    import torch

__all__ = [
    "ExportOptions",
    "OptionDoc",
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

_T = TypeVar("_T")


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


SPECS = ("dims", "shapes")
"""The forms of ``dynamic_shapes`` an export can use (`ExportOptions.spec`)."""


@dataclass(frozen=True)
class OptionDoc:
    """What an `ExportOptions` field means, kept in the field's metadata: the one source of its
    help in ``help(ExportOptions)`` and of its ``capture export`` option (name, help, default).

    Attributes:
        help: What the option does, for the Python API and the command line alike.
        flag: The ``capture export`` option (``--probes``, ``--merge/--no-merge``); None: the
            Python API only (a tensor, a callable, or what ``--out`` decides).
        cli_help: Said on the command line only, after `help` (its spelling of a value).
        api_help: Said in the Python docs only, after `help`.
        default_text: The default as the command line's help states it; None: the default
            itself (``--merge`` for a flag on by default).
        metavar: The option's value in the usage line.
        minimum: The least value the command line accepts.
        choices: The values the option accepts.
        repeatable: The command line gives one value per occurrence (a tuple in Python).
        none_as: The command line's value for None (``--time-budget 0``: no bound).
    """

    help: str
    flag: str | None = None
    cli_help: str = ""
    api_help: str = ""
    default_text: str | None = None
    metavar: str | None = None
    minimum: float | None = None
    choices: tuple[str, ...] = ()
    repeatable: bool = False
    none_as: float | None = None


_NAMES: dict[str, Any] = {"metavar": "NAME", "repeatable": True}
"""An option given as names, one per occurrence on the command line."""


def _doc(help: str, **cli: Any) -> dict[str, OptionDoc]:
    return {"doc": OptionDoc(help, **cli)}


def _with_attributes(cls: type[_T]) -> type[_T]:
    """Appends an ``Attributes:`` section written from each field's `OptionDoc` to the class
    docstring, so ``help(ExportOptions)`` and ``capture export --help`` say the same."""
    lines = ["", "    Attributes:"]
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        doc: OptionDoc = f.metadata["doc"]
        text = " ".join(t for t in (doc.help, doc.api_help) if t)
        lines += textwrap.wrap(
            f"{f.name}: {text}", 96, initial_indent=" " * 8, subsequent_indent=" " * 12
        )
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n" + "\n".join(lines) + "\n"
    return cls


@_with_attributes
@dataclass(frozen=True)
class ExportOptions:
    """Every option of `replay.export_inputs` and `replay.export` (see their docstrings).

    Each field's `OptionDoc` (``ExportOptions.docs()``) says what it does; the ``Attributes``
    section below is written from them, and ``capture export`` builds its options from them.
    """

    set_batch_dimension_for: BatchOption = field(
        default=None,
        metadata=_doc(
            "Make axis 0 of these arguments (names or positions) dynamic even when it never "
            "varied.",
            flag="--set-batch-dimension-for",
            cli_help="Repeatable; 'all' for every input tensor.",
            api_help="True: every input tensor.",
            default_text="only dims that varied",
            **_NAMES,
        ),
    )
    named_dims: bool = field(
        default=False,
        metadata=_doc(
            "Use named Dim(symbol, min, max) with the recorded ranges, shared and derived "
            "dims; where torch.export rejects them, bounded Dim.DYNAMIC(min, max) hints "
            "(reported not honoured when neither is accepted: the command exits 3).",
            flag="--named-dims",
            default_text="Dim.DYNAMIC",
        ),
    )
    keyword_only: bool = field(
        default=False,
        metadata=_doc(
            "Pass positional arguments by keyword in the exported program.",
            flag="--keyword-only",
            default_text="as recorded",
        ),
    )
    value_if_missing: Mapping[str, torch.Tensor] = field(
        default_factory=dict,
        metadata=_doc("Name -> tensor given where that argument is missing (fill_missing)."),
    )
    fill_missing: bool = field(
        default=False,
        metadata=_doc("Give every program the tensor arguments some group of the model passes."),
    )
    seed: int = field(default=DEFAULT_SEED, metadata=_doc("Seed of the example tensors."))
    device: str | None = field(default=None, metadata=_doc("Device of the example tensors."))
    groups: tuple[str, ...] | None = field(
        default=None,
        metadata=_doc(
            "Export only these call groups (decode, prefill, g0, ... as `capture dims` shows "
            "them).",
            flag="--group",
            cli_help="Repeatable.",
            api_help="None: every group.",
            default_text="every group",
            **_NAMES,
        ),
    )
    # ``capture export --out x.onnx`` sets it.
    onnx: str | None = field(
        default=None, metadata=_doc("Also write ONNX to this path (`replay.export` only).")
    )
    # ``capture export --out`` sets it: an artifact holds the recorded sub-modules' programs.
    modules: bool = field(
        default=False,
        metadata=_doc(
            "Also export the sub-modules recorded with ``Recorder(modules=...)`` into "
            "``ExportResult.modules`` (`replay.export` only)."
        ),
    )
    strict: bool = field(default=False, metadata=_doc("Passed to ``torch.export.export``."))
    atol: float = field(default=1e-4, metadata=_doc("Absolute tolerance of the output comparison."))
    rtol: float = field(default=1e-4, metadata=_doc("Relative tolerance of the output comparison."))
    probes: int = field(
        default=4,
        metadata=_doc(
            "Unseen sizes inside the recorded ranges checked per group besides every recorded "
            "signature (coverage rows of kind probe); 0 for none.",
            flag="--probes",
            minimum=0,
        ),
    )
    max_payloads: int = field(default=64, metadata=_doc("Most sampled real calls checked."))
    max_payload_bytes: int = field(
        default=DEFAULT_MAX_CALL_BYTES,
        metadata=_doc(
            "Most bytes of tensors a sampled call's file may hold (bigger ones are not "
            "covered, never read)."
        ),
    )
    # The split: `replay.pipeline.splitting`.
    max_regimes: int = field(
        default=4,
        metadata=_doc(
            "Where torch.export cuts a group's recorded range (a sliding window, a branch on a "
            "size), export each side as a regime of its own (prefill[input_ids_1<=4], ...), at "
            "most this many per group; 1 never splits.",
            flag="--max-regimes",
            minimum=1,
        ),
    )
    # The merge: `replay.pipeline.merging`.
    merge: bool = field(
        default=True,
        metadata=_doc(
            "Serve a group lacking an optional input (generate()'s batch-1 calls without "
            "attention_mask) with the program of a group passing it, the input filled, where "
            "the check proves it on the group's own signatures.",
            flag="--merge/--no-merge",
            api_help="False: one program per group.",
        ),
    )
    # The deadline and the static fallback: `replay.pipeline.budget`.
    time_budget: float | None = field(
        default=DEFAULT_TIME_BUDGET,
        metadata=_doc(
            "Seconds of torch.export per call group; each export is stopped at the deadline. "
            "The dynamic exports (plain, retries, regimes) may use half; the recorded "
            "signatures they do not serve get one static program each, most calls first, in "
            "the rest. A group past it is named with what served it instead.",
            flag="--time-budget",
            cli_help="0 for no bound.",
            api_help="None: no bound.",
            metavar="SECONDS",
            minimum=0,
            none_as=0,
        ),
    )
    max_static: int = field(
        default=16,
        metadata=_doc(
            "Most static programs per group, one per recorded signature its dynamic program "
            "does not serve (past the time budget, or cut where regimes cannot serve), most "
            "calls first; 0: none.",
            flag="--max-static",
            minimum=0,
        ),
    )
    # shapes: `replay.inputs.specs.shapesspec`.
    spec: str = field(
        default="dims",
        metadata=_doc(
            "The form of dynamic_shapes: torch.export.Dim objects (dims), or torch's "
            "ShapesSpec learned from the store (shapes, torch >= 2.14: recorded ranges, the "
            "most called size as optimization hint, trusted divisors as assumptions; every "
            "size unbacked, no retries or regimes).",
            flag="--spec",
            choices=SPECS,
        ),
    )
    # The loader's refusal: `replay.artifact.loadable`.
    allow_ops: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "Operator namespaces, operators or overloads (mylib, aten.bincount, "
            "mylib.op.default) the programs may call beyond the model's math, as the artifact "
            "will be loaded with replay.load(path, allow_ops=[...]); a program the loader "
            "would refuse is reported not covered, with the loader's reason.",
            flag="--allow-ops",
            cli_help="Repeat for several.",
            default_text="none",
            **_NAMES,
        ),
    )
    # Entering a state: `capture.state.entering`.
    set_state: Callable[[dict[str, Any] | None], None] | None = field(
        default=None,
        metadata=_doc(
            "Puts the model in a recorded state's declared items (``fn(items)``) and back "
            "(``fn(None)``), for a store recorded with ``Recorder(..., state=fn)``; peft "
            "adapters and ``training`` are entered without it."
        ),
    )

    @classmethod
    def docs(cls) -> dict[str, OptionDoc]:
        """Option name -> its `OptionDoc`, in the fields' order.

        Example:
            >>> ExportOptions.docs()["probes"].flag
            '--probes'
        """
        return {f.name: f.metadata["doc"] for f in dataclasses.fields(cls)}

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
