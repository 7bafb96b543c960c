"""The one seam for private torch APIs: each use, the torch versions it was checked on.

capture relies on a few torch internals that have no public equivalent (guards of an exported
program, pytree deregistration, the recorder's tensor guards, the PT2 archive's packaging).
Every such use goes through a function of this module, which names the private API, the
versions it was checked on, and what breaks without it; `tests/test_compat.py` calls each one
against the installed torch, so a torch release that moves one fails there, loudly, rather
than somewhere deep in a recording or an export.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sympy

__all__ = [
    "CHECKED_ON",
    "is_constraint_violation",
    "violation_names",
    "ShapeFacts",
    "shape_facts",
    "serialize_program",
    "deserialize_program",
    "write_archive_storage",
    "aoti_compile",
    "aoti_load",
]

CHECKED_ON = ("2.13.0",)
"""torch versions every entry of this module was checked on."""

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
    being split into regimes (`replay.regimes`).

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
    structured list): the one place capture reads them from text. Without it, `replay.bounded`
    would hint every symbol instead of the violated ones first.

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


# -- the artifact (replay.ship): torch's PT2 archive, program JSON, AOTInductor ---------------
# Checked on torch 2.13.0. Callers import torch; importing this module does not.


def serialize_program(program: Any) -> bytes:
    """An exported program's graph as torch's JSON, without its weights or example inputs.

    Private API: ``torch._export.serde.serialize.serialize`` (``serialize_state_dict``,
    ``serialize_constants``, ``serialize_example_inputs`` = False). Without it an artifact
    could only be written by ``package_pt2``, which stores every program's weights again.

    Example:
        >>> data = serialize_program(torch.export.export(model, args))  # doctest: +SKIP
    """
    from torch._export.serde.serialize import serialize

    artifact = serialize(
        program,
        serialize_state_dict=False,
        serialize_constants=False,
        serialize_example_inputs=False,
    )
    return bytes(artifact.exported_program)


def deserialize_program(data: bytes, state_dict: dict[str, Any], constants: dict[str, Any]) -> Any:
    """An exported program from torch's JSON and tensors the caller already holds.

    Private API: ``torch._export.serde.serialize._bytes_to_dataclass`` and
    ``ExportedProgramDeserializer.deserialize``. The program uses the given tensors as they
    are (no copy), which is what lets several programs share one weight; without it a loader
    must go through ``load_pt2``, which reads every program's weights again.

    Example:
        >>> program = deserialize_program(data, {"w": w}, {})  # doctest: +SKIP
    """
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _bytes_to_dataclass

    serialized = _bytes_to_dataclass(schema.ExportedProgram, data)
    return ExportedProgramDeserializer().deserialize(serialized, state_dict, constants, None)


def write_archive_storage(writer: Any, name: str, storage: Any) -> None:
    """Writes a CPU tensor storage's bytes as one record of a PT2 archive, without a copy.

    Private API: ``PT2ArchiveWriter.archive_file`` (a ``torch._C.PyTorchFileWriter``) and its
    ``write_record(name, storage, nbytes)`` overload. Without it every record would be copied
    into a Python ``bytes`` first (twice the memory of the largest weight).

    Example:
        >>> write_archive_storage(writer, "w/weight_0", w.untyped_storage())  # doctest: +SKIP
    """
    writer.archive_file.write_record(name, storage, storage.nbytes())


def aoti_compile(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """AOTInductor-compiles a module into package files *without its weights*.

    Private API: ``torch._inductor.aot_compile`` with ``aot_inductor.package`` and
    ``aot_inductor.package_constants_in_so=False`` (weights are neither in the shared library
    nor on disk: the loader hands them over with ``load_constants(user_managed=True)``, so the
    compiled programs use the artifact's one copy).

    Example:
        >>> files = aoti_compile(program.module(), args, kwargs)  # doctest: +SKIP
    """
    import warnings

    from torch._inductor import aot_compile

    options = {"aot_inductor.package": True, "aot_inductor.package_constants_in_so": False}
    with warnings.catch_warnings():
        # torch 2.13's own deprecation warnings while it copies graphs (LeafSpec): chatter
        warnings.simplefilter("ignore", FutureWarning)
        return list(aot_compile(module, args, kwargs, options=options))  # type: ignore[arg-type]


def aoti_load(path: str, name: str, device_index: int = -1) -> Any:
    """Loads one AOTInductor build of a PT2 archive (its weights not yet loaded).

    Private API: ``torch.export.pt2_archive._package._load_aoti`` (an ``AOTICompiledModel``
    over ``torch._C._aoti.AOTIModelPackageLoader``). Loading it runs the build's native code.

    Example:
        >>> compiled = aoti_load("model.pt2", "g0")  # doctest: +SKIP
    """
    from torch.export.pt2_archive._package import _load_aoti

    return _load_aoti(path, name, False, 1, device_index)
