"""The one seam for private torch APIs: each use, the torch versions it was checked on.

capture relies on a few torch internals with no public equivalent. Each use goes through a function
here, which names the private API (`PRIVATE_APIS`), the versions it was checked on (`CHECKED_ON`)
and what breaks without it; `tests/test_compat.py` calls each against the installed torch, so a
torch release that moves one fails there, loudly, not deep in a recording or an export. At run
time a missing private API is never passed over in silence: one warning says what is lost, or an
error where nothing works without it. Where torch gives only text (the names a constraint
violation lists, a violation raised without its type), the text is read here and nowhere else.

Private means: a name starting with ``_`` anywhere in torch, and the names of
``torch.utils._pytree`` outside its ``__all__`` (``SUPPORTED_NODES``, the serialized-type tables,
``treespec_leaf``). Its ``__all__`` (``register_pytree_node``, ``tree_flatten_with_path``,
``treespec_dumps``, ``keystr``, ...) and the key classes its path functions return are **not**
routed through here: torch has no other pytree module (2.13 ships no ``torch.utils.pytree``),
torch.export's documentation sends users to ``torch.utils._pytree.register_pytree_node``, and
``dynamic_shapes`` and treespec serialization are defined over it: it is torch's pytree API in
all but name, and wrapping it (the recorder's hot path walks with it) would add a layer, no check.

No torch import at import time (the store side reads treespecs without torch).

Example:
    >>> from capture import compat
    >>> "2.11.0" in compat.CHECKED_ON
    True
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sympy
    import torch

__all__ = [
    "TESTED",
    "CHECKED_ON",
    "PRIVATE_APIS",
    "guards_code",
    "set_guards_code",
    "deregister_pytree_node",
    "pytree_nodes",
    "serialized_pytree_types",
    "leaf_treespec",
    "tensor_metadata_check",
    "run_outside_dynamo",
    "export_check",
    "dim_kind",
    "is_constraint_violation",
    "violation_names",
    "ShapeFacts",
    "shape_facts",
    "mark_unbacked",
]

logger = logging.getLogger(__name__)

TESTED = (
    ("2.11.0", "5.23.0"),
    ("2.15.0", "5.24.0"),
)
"""The (torch, transformers) pairs `.ci/run` installs and runs the tests on, oldest first: the
oldest with the fast and the slow suites, the newest with the fast suite. ``pyproject.toml``
declares the range they bound (`tests/test_compat.py` checks both), and `.ci/run` reads this
table (with ``ast``, without importing capture), so a pair is added here and nowhere else."""

CHECKED_ON = tuple(torch for torch, _ in TESTED)
"""torch versions every entry of this module was checked on: those of `TESTED`, on which
`tests/test_compat.py` exercises each entry (and fails on a torch that is not one of them)."""

PRIVATE_APIS = {
    "guards_code": "torch.export.ExportedProgram._guards_code",
    "set_guards_code": "torch.export.ExportedProgram._guards_code",
    "deregister_pytree_node": "torch.utils._pytree._deregister_pytree_node",
    "pytree_nodes": "torch.utils._pytree.SUPPORTED_NODES",
    "serialized_pytree_types": (
        "torch.utils._pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE, SUPPORTED_SERIALIZED_TYPES"
    ),
    "leaf_treespec": "torch.utils._pytree.treespec_leaf",
    "tensor_metadata_check": "torch._C._dynamo.guards.TensorGuards",
    "dim_kind": "torch.export.dynamic_shapes._DerivedDim, _Dim, _DimHint",
    "is_constraint_violation": (
        "torch._dynamo.exc.UserError(UserErrorType.CONSTRAINT_VIOLATION), "
        "torch.fx.experimental.symbolic_shapes.ConstraintViolationError"
    ),
    "violation_names": "the text of a constraint violation (no structured list)",
    "shape_facts": (
        "torch.export.exported_program._get_shape_env, ShapeEnv.guards, ShapeEnv.replacements"
    ),
    "mark_unbacked": "torch._dynamo.decorators.mark_unbacked (its min=/max= since 2.13)",
    "run_outside_dynamo": (
        "torch._C._dynamo.eval_frame.set_code_exec_strategy, _FrameExecStrategy, _FrameAction; "
        "the _torchdynamo_disable function attribute"
    ),
    "export_check": "torch.compiler._is_exporting_flag",
}
"""Function of this module -> the private torch API it uses (`tests/test_compat.py` checks
that every function here is listed, and exercises each)."""

_warned: set[str] = set()


def _lost(function: str, consequence: str, error: BaseException) -> None:
    """Logs, once per function, that a private API is missing and what is lost."""
    if function in _warned:
        return
    _warned.add(function)
    import torch

    logger.warning(
        "capture: torch %s has no %s (%s: %s; capture was checked on torch %s): %s",
        torch.__version__,
        PRIVATE_APIS[function],
        type(error).__name__,
        error,
        ", ".join(CHECKED_ON),
        consequence,
    )


# -- torch.export -------------------------------------------------------------------------------
def guards_code(program: Any) -> list[str] | None:
    """The input guards of an exported program, as the Python lines ``ep.module()`` checks.

    Private API: ``ExportedProgram._guards_code`` (torch 2.13.0). Without it the guards cannot
    be rewritten (`replay.pipeline.exporting`), and a program whose inputs are reached through a
    custom pytree key (a transformers cache) fails every call with NameError.

    Args:
        program: A ``torch.export.ExportedProgram``.

    Returns:
        The guard lines (empty: none), or None when torch keeps none under that name.
    """
    if not hasattr(program, "_guards_code"):
        _lost(
            "guards_code",
            "guards over custom pytree keys are not rewritten; programs taking a cache may "
            "fail with NameError when called",
            AttributeError("_guards_code"),
        )
        return None
    code = program._guards_code
    return list(code) if code else []


def set_guards_code(program: Any, code: Sequence[str]) -> None:
    """Replaces the input guards of an exported program (see `guards_code`).

    Private API: ``ExportedProgram._guards_code`` (torch 2.13.0): ``ep.module()`` builds its
    guard function from this list when it is called.
    """
    program._guards_code = list(code)


# -- torch.utils._pytree, outside its __all__ --------------------------------------------------
def deregister_pytree_node(cls: type) -> bool:
    """Removes a class from torch's pytree registry.

    Private API: ``torch.utils._pytree._deregister_pytree_node`` (torch 2.13.0); there is no
    public way to undo ``register_pytree_node``. Without it `register_flattening_functions`
    cannot undo its registrations: the classes stay registered for the life of the process.

    Returns:
        True when the class was deregistered, False when this torch cannot.
    """
    import torch.utils._pytree as pytree

    try:
        deregister = pytree._deregister_pytree_node
    except AttributeError as e:
        _lost("deregister_pytree_node", "registered cache classes stay registered", e)
        return False
    deregister(cls)
    return True


def pytree_nodes() -> Mapping[type, Any]:
    """torch's pytree registry: class -> its node definition (``flatten_fn``, ...), live.

    Private API: ``torch.utils._pytree.SUPPORTED_NODES`` (torch 2.13.0), the table every torch
    pytree walker reads. The recorder's walker (`capture.record.flatten`) looks registered
    classes up in it, as torch's own walkers do; without it nothing can be flattened the way
    torch flattens it, so its absence is an error at import, not a fallback.

    Raises:
        ImportError: This torch has no such registry.
    """
    import torch.utils._pytree as pytree

    try:
        nodes: Mapping[type, Any] = pytree.SUPPORTED_NODES
    except AttributeError as e:
        raise ImportError(
            f"capture needs torch.utils._pytree.SUPPORTED_NODES (checked on torch "
            f"{', '.join(CHECKED_ON)}); this torch has none ({e})"
        ) from e
    return nodes


def serialized_pytree_types() -> tuple[Mapping[str, type], Mapping[type, Any]] | None:
    """torch's tables of serializable pytree classes, when this process imported torch's pytree.

    Private API: ``torch.utils._pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE`` (serialized name ->
    class) and ``SUPPORTED_SERIALIZED_TYPES`` (class -> how its context is (de)serialized),
    torch 2.13.0. `capture.pytree.treespec` reads a stored treespec against them instead of
    ``treespec_loads`` (which would import what a store names). Without them only the builtin
    containers and transformers' caches are accepted in stored treespecs.

    Returns:
        ``(name -> class, class -> serialization)``, or None when torch's pytree is not imported
        (it is never imported here: the store side runs without torch).
    """
    pytree = sys.modules.get("torch.utils._pytree")
    if pytree is None:
        return None
    try:
        return pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE, pytree.SUPPORTED_SERIALIZED_TYPES
    except AttributeError as e:
        _lost(
            "serialized_pytree_types",
            "stored treespecs naming user-registered classes cannot be read",
            e,
        )
        return None


def leaf_treespec() -> Any:
    """The treespec of one leaf.

    Private API: ``torch.utils._pytree.treespec_leaf`` (torch 2.13.0; ``LeafSpec()``, public
    before, is deprecated there). Without either no stored treespec can be rebuilt.

    Raises:
        ImportError: This torch has neither.
    """
    import torch.utils._pytree as pytree

    make = getattr(pytree, "treespec_leaf", None) or getattr(pytree, "LeafSpec", None)
    if make is None:
        raise ImportError(
            "torch.utils._pytree has neither treespec_leaf nor LeafSpec (capture was checked on "
            f"torch {', '.join(CHECKED_ON)})"
        )
    return make()


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
        _lost("tensor_metadata_check", "the recorder matches structures in Python (slower)", e)
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
        _lost(
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
        _lost(
            "export_check",
            "calls of a torch.compile'd model may run unrecorded where Dynamo folds "
            "torch.compiler.is_exporting() to True",
            AttributeError("_is_exporting_flag"),
        )
        return torch.compiler.is_exporting
    _torch_compiler = torch.compiler
    return _exporting


# -- torch.export.dynamic_shapes ----------------------------------------------------------------
def dim_kind(obj: Any) -> str | None:
    """What kind of torch.export ``Dim`` object `obj` is: 'derived', 'dim', 'hint', or None.

    Private API: the classes ``torch.export.dynamic_shapes._DerivedDim`` (``Dim`` arithmetic),
    ``_Dim`` (``Dim(name)``) and ``_DimHint`` (``Dim.DYNAMIC``, ``Dim.AUTO``), torch 2.13.0:
    ``Dim`` objects have no public type to test against. Without them `capture.string_type`
    prints such objects as their repr instead of the seeds' ``Dim(name)`` / ``DYNAMIC``.

    Example:
        >>> import torch
        >>> dim_kind(torch.export.Dim("batch")), dim_kind(torch.export.Dim.DYNAMIC), dim_kind(3)
        ('dim', 'hint', None)
    """
    import torch.export.dynamic_shapes as dyn

    try:
        classes = (("derived", dyn._DerivedDim), ("dim", dyn._Dim), ("hint", dyn._DimHint))
    except AttributeError as e:
        _lost("dim_kind", "string_type prints Dim objects as their repr", e)
        return None
    # A derived Dim is also a Dim: the first class that matches, in this order.
    return next((kind for kind, cls in classes if isinstance(obj, cls)), None)


# -- torch.export's constraint violations and symbolic shapes ------------------------------------
_CONSTRAINT_TEXT = "Constraints violated"
"""What torch 2.13 writes first in a constraint violation's message: the text fallback of
`is_constraint_violation`, kept here only, for errors torch raises without its type."""


def is_constraint_violation(error: BaseException) -> bool:
    """Tells whether torch.export rejected a group's dynamic shapes because a guard of the
    traced code cuts or pins a dim that was declared dynamic (``Constraints violated``).

    Private API: ``torch._dynamo.exc.UserError`` with
    ``error_type == UserErrorType.CONSTRAINT_VIOLATION`` (checked on torch 2.13.0), walking the
    ``__cause__`` chain; ``torch.fx.experimental.symbolic_shapes.ConstraintViolationError``
    (public name, private module) counts too. Only when torch gave neither type anywhere in the
    chain is the message read, for the text ``Constraints violated``: the one text fallback.
    Without it, a cut range would be reported as an unexplained export failure instead of
    being split into regimes (`replay.pipeline.splitting`).

    Args:
        error: What ``torch.export.export`` raised.

    Returns:
        True for a constraint violation.

    Example:
        >>> is_constraint_violation(ValueError("Constraints violated (x)! ..."))
        True
        >>> is_constraint_violation(ValueError("shape mismatch"))
        False
    """
    from torch._dynamo.exc import UserError, UserErrorType
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

    seen: BaseException | None = error
    typed = False
    while seen is not None:
        if isinstance(seen, ConstraintViolationError):
            return True
        if isinstance(seen, UserError):
            typed = True
            if seen.error_type == UserErrorType.CONSTRAINT_VIOLATION:
                return True
        seen = seen.__cause__
    if typed:
        return False
    return _CONSTRAINT_TEXT in str(error)


_VIOLATED = re.compile(r"Constraints violated \(([^)]*)\)")


def violation_names(error: BaseException) -> set[str]:
    """The dim names torch lists in a constraint violation (``Constraints violated (a, b)!``).

    torch 2.13 gives these names in the message only (``UserError`` carries the text, no
    structured list): the one place capture reads them from text. Without it,
    `replay.pipeline.bounded` would hint every symbol instead of the violated ones first.

    Args:
        error: A constraint violation (`is_constraint_violation`).

    Returns:
        The identifiers inside the parentheses; empty when the text has none.

    Example:
        >>> sorted(violation_names(Exception("Constraints violated (m - 1, b)! ...")))
        ['b', 'm']
    """
    match = _VIOLATED.search(str(error))
    if match is None:
        return set()
    return set(re.findall(r"[A-Za-z_]\w*", match.group(1)))


@dataclasses.dataclass(frozen=True)
class ShapeFacts:
    """What an exported program accepts, as torch's symbolic shapes state it.

    Attributes:
        inputs: Per tensor input of the program (its user inputs, in call order), each axis'
            size: an int (static) or a sympy expression over torch's size symbols.
        ranges: torch symbol -> (min, max) of the program's ``range_constraints`` (``max``
            None when unbounded).
        guards: The ShapeEnv's guards, with torch's symbol replacements applied: each a sympy
            boolean that must hold for a call to be accepted.
    """

    inputs: tuple[tuple[Any, ...], ...]
    ranges: dict[sympy.Symbol, tuple[int, int | None]]
    guards: tuple[sympy.Basic, ...]


def shape_facts(program: Any) -> ShapeFacts | None:
    """The symbolic shapes of an exported program's inputs, its ranges and its guards.

    Private APIs (checked on torch 2.13.0): ``torch.export.exported_program._get_shape_env``
    (the ShapeEnv behind the graph's fake values), ``ShapeEnv.guards`` (``ShapeGuard.expr``)
    and ``ShapeEnv.replacements``, and ``SymInt.node.expr`` of each placeholder's fake tensor
    size. ``range_constraints`` and ``graph_signature.user_inputs`` are public. These are the
    same facts torch turns into the program's runtime input checks (``_guards_code`` and
    ``_check_input_constraints_for_graph``); without them, where torch cut a recorded range
    could only be read from error text.

    Args:
        program: A `torch.export.ExportedProgram`.

    Returns:
        A `ShapeFacts`, or None when the program carries no symbolic shapes (nothing dynamic).

    Example:
        >>> ep = torch.export.export(model, (x,), dynamic_shapes=({0: Dim.DYNAMIC},))
        ... # doctest: +SKIP
        >>> shape_facts(ep).ranges  # doctest: +SKIP
        {s0: (2, 3)}
    """
    import torch
    from torch.export.exported_program import _get_shape_env
    from torch.utils._sympy.numbers import IntInfinity

    env = _get_shape_env(program.graph_module)  # type: ignore[no-untyped-call]
    users = set(program.graph_signature.user_inputs)
    inputs: list[tuple[Any, ...]] = []
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in users:
            continue
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            inputs.append(
                tuple(s.node.expr if isinstance(s, torch.SymInt) else int(s) for s in value.shape)
            )
    ranges: dict[Any, tuple[int, int | None]] = {}
    for symbol, bounds in program.range_constraints.items():
        upper = bounds.upper
        ranges[symbol] = (int(bounds.lower), None if isinstance(upper, IntInfinity) else int(upper))
    if env is None:
        return ShapeFacts(tuple(inputs), ranges, ()) if ranges else None
    replacements = dict(env.replacements)
    # Replacements may chain (s9 -> s5 -> s70): applied until nothing changes.
    guards = [_replaced(guard.expr, replacements) for guard in env.guards]
    inputs = [tuple(_replaced(e, replacements) for e in shape) for shape in inputs]
    return ShapeFacts(tuple(inputs), ranges, tuple(guards))


def _replaced(expr: Any, replacements: dict[Any, Any]) -> Any:
    if isinstance(expr, int):
        return expr
    for _ in range(8):
        replaced = expr.xreplace(replacements)
        if replaced == expr:
            return expr
        expr = replaced
    return expr


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
        _lost(
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
