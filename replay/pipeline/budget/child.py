"""torch.export under a time budget: each export runs in a child process that can be stopped.

torch.export cannot be interrupted from inside its own process: it spends its time in Python
(sympy's value-range analysis, the tracer) holding global state (the fake mode, dynamo's frame
callback, the shape environment), and an exception thrown into it at an arbitrary point (a signal
handler) may leave that state half set up. A watchdog thread that stops waiting leaves the
export running beside the rest of the job, holding memory and a core, with no way to end it.
So `export_bounded_in_time` forks a child process after the model exists (the child shares the
model's memory copy-on-write, nothing is sent to it), runs ``torch.export.export`` there, and
ships the program back over a pipe as data: its graph in torch's own JSON serialization (the
one the artifact stores, `capture.compat_archive.serialize_program`) and, in safetensors, only
the tensors the model does not hold (constants torch lifted while tracing). Nothing is pickled:
``torch.export.save`` is not used, as it writes the example inputs with ``torch.save`` and its
loader falls back to unpickling them. Past the deadline the parent kills the child (SIGKILL: no
thread, no memory, no file left behind) and reports `BudgetSpent`. The program read back is
given the model's own parameters and buffers and the example it was exported from, so it is
the program an in-process export would have made, and the artifact stores each weight once.

A child process is forked only where that is safe: the ``fork`` start method exists (Linux,
macOS) and CUDA is not initialized in the parent (a forked child cannot use it). Elsewhere the
export runs in-process, unbounded, and `in_process_reason` says why (the pipeline notes it).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from capture import compat_archive
from capture.compat import SHIPPED_GUARDS, is_constraint_violation, shape_facts
from capture.errors import ReplayError
from capture.pytree import nodes

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from torch.export import ExportedProgram

__all__ = [
    "BudgetSpent",
    "ChildExportError",
    "Deadline",
    "export_bounded_in_time",
    "in_process_reason",
    "ChildCrashed",
    "crashed",
]

logger = logging.getLogger(__name__)

_PROGRAM = b"P"
_ERROR = b"E"
_MAX_MESSAGE = 20_000
"""Characters of a child's error message sent back (torch's messages can be long)."""


class BudgetSpent(ReplayError):
    """torch.export ran past the time budget (its child process was stopped)."""


class ChildExportError(Exception):
    """What torch.export raised in the child process: its type name and message.

    Attributes:
        kind: The name of the exception type torch raised (``UserError``, ``RuntimeError``).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Deadline:
    """A point in time (``time.monotonic``) an export must end by; None: no bound.

    Example:
        >>> Deadline.after(None).left() is None
        True
        >>> Deadline.after(60.0).left() > 59
        True
    """

    end: float | None

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        """The deadline `seconds` from now (None: none)."""
        return cls(None if seconds is None else time.monotonic() + seconds)

    def left(self) -> float | None:
        """Seconds left (at least 0), or None without a bound."""
        return None if self.end is None else max(0.0, self.end - time.monotonic())

    @property
    def passed(self) -> bool:
        """The deadline has passed."""
        left = self.left()
        return left is not None and left <= 0


class ChildCrashed(ReplayError):
    """The export's child process died without an answer (a signal, not the deadline)."""


_CRASHED: list[str] = []
"""A fact of this process, learnt once: a forked export child crashed here (some torch builds
do not survive a fork), so exports run in this process from then on, unbounded, and say so."""


def in_process_reason() -> str | None:
    """Why exports cannot run in a child process here (they then run unbounded), or None."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return "this platform cannot fork a process"
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return "CUDA is initialized in this process (a forked child cannot use it)"
    return _CRASHED[0] if _CRASHED else None


def crashed(error: ChildCrashed) -> None:
    """Records that a forked export child crashed in this process (`in_process_reason`)."""
    if not _CRASHED:
        _CRASHED.append(f"a forked export child crashed in this process ({error})")


def export_bounded_in_time(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dynamic_shapes: Any,
    strict: bool,
    seconds: float,
) -> tuple[ExportedProgram | None, BaseException | None]:
    """``torch.export.export`` in a forked child, stopped after `seconds` (module docstring).

    Args:
        module: The module to export (the model, or the wrapper naming its call form).
        args: Example positional arguments.
        kwargs: Example keyword arguments.
        dynamic_shapes: The ``dynamic_shapes`` of torch.export.
        strict: Passed to torch.export.
        seconds: How long to wait for the child.

    Returns:
        ``(program, None)``; or ``(None, error)``: a `BudgetSpent`, what torch.export raised
        (a `ConstraintViolationError` for a rejected dynamic shape, else a `ChildExportError`
        with the type's name), or a `ReplayError` when the child died without an answer.

    Example:
        >>> program, error = export_bounded_in_time(model, (x,), {}, None, False, 60.0)
        ... # doctest: +SKIP
    """
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(
        target=_child, args=(send, module, args, kwargs, dynamic_shapes, strict), daemon=True
    )
    started = time.monotonic()
    child.start()
    send.close()
    try:
        if not receive.poll(max(0.0, seconds)):
            return None, BudgetSpent(
                f"torch.export ran past the time budget ({seconds:.0f} s left for it, "
                f"stopped after {time.monotonic() - started:.0f} s)"
            )
        try:
            message = receive.recv_bytes()
        except EOFError:
            child.join()
            return None, ChildCrashed(
                f"the export's child process ended without an answer (exit code {child.exitcode})"
            )
    finally:
        receive.close()
        if child.is_alive():
            child.kill()
        child.join()
    return _answer(message, module, args, kwargs)


def _child(
    send: Connection,
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dynamic_shapes: Any,
    strict: bool,
) -> None:
    """The child's side: export, then send the serialized program or the error's text."""
    torch.set_num_threads(1)  # the parent's thread pool does not exist in a forked child
    try:
        with nodes.register_flattening_functions():
            program = torch.export.export(
                module, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=strict
            )
            graph = compat_archive.serialize_program(program)
        shared, extra = _tensors(program, module)
        facts = shape_facts(program)
        header = {**shared, "guards": [_encode(g) for g in facts.guards] if facts else None}
        send.send_bytes(_PROGRAM + _framed(json.dumps(header).encode()) + _framed(graph) + extra)
    except Exception as e:  # noqa: BLE001 - every failure goes back to the parent as data
        text = {
            "kind": type(e).__name__,
            "message": str(e)[:_MAX_MESSAGE],
            "constraint": is_constraint_violation(e),
        }
        send.send_bytes(_ERROR + json.dumps(text).encode())
    finally:
        send.close()


def _own_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    own: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    own.update(module.named_buffers(remove_duplicate=False))
    return own


def _same(a: Any, b: Any) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.shape == b.shape
        and a.dtype == b.dtype
        and a.device == b.device
    )


def _framed(data: bytes) -> bytes:
    return len(data).to_bytes(8, "little") + data


def _unframed(data: bytes, at: int) -> tuple[bytes, int]:
    size = int.from_bytes(data[at : at + 8], "little")
    return data[at + 8 : at + 8 + size], at + 8 + size


def _tensors(
    program: ExportedProgram, module: torch.nn.Module
) -> tuple[dict[str, list[str]], bytes]:
    """The names of the program's state-dict entries and constants that `module` holds (same
    name, shape, dtype, device), and the others in safetensors (``state.NAME``/``const.NAME``)."""
    from safetensors.torch import save

    own = _own_tensors(module)
    shared: dict[str, list[str]] = {"state": [], "const": []}
    extra: dict[str, torch.Tensor] = {}
    for prefix, table in (("state", program.state_dict), ("const", program.constants)):
        for name, value in table.items():
            if _same(own.get(name), value):
                shared[prefix].append(name)
                continue
            if not isinstance(value, torch.Tensor):
                raise ReplayError(f"the program holds a {type(value).__name__} constant {name}")
            extra[f"{prefix}.{name}"] = value.detach().to("cpu").contiguous().clone()
    return shared, save(extra)


def _answer(
    message: bytes,
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[ExportedProgram | None, BaseException | None]:
    """The child's answer: the program read back (with `module`'s tensors), or its error."""
    tag, body = message[:1], message[1:]
    if tag == _ERROR:
        text = json.loads(body)
        if text["constraint"]:
            from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

            return None, ConstraintViolationError(text["message"])
        return None, ChildExportError(str(text["kind"]), str(text["message"]))
    from safetensors.torch import load

    header, at = _unframed(body, 0)
    graph, at = _unframed(body, at)
    own = _own_tensors(module)
    shipped = json.loads(header)
    guards = shipped.pop("guards")
    tables: dict[str, dict[str, Any]] = {
        prefix: {name: own[name] for name in names} for prefix, names in shipped.items()
    }
    for key, value in load(body[at:]).items():
        prefix, name = key.split(".", 1)
        tables[prefix][name] = value
    with nodes.register_flattening_functions():
        program = compat_archive.deserialize_program(graph, tables["state"], tables["const"])
        program.example_inputs = (args, kwargs)
    if guards is not None:
        _ship_guards(program, guards)
    return program, None


def _encode(expr: Any) -> Any:
    """A sympy expression as JSON: ints, ``{"s": name}`` symbols, ``{"f", "m", "a"}`` calls."""
    import sympy

    if isinstance(expr, sympy.Symbol):
        return {"s": expr.name}
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.logic.boolalg.BooleanAtom):
        return {"b": bool(expr)}
    module = "torch" if type(expr).__module__.startswith("torch.") else "sympy"
    return {"f": type(expr).__name__, "m": module, "a": [_encode(a) for a in expr.args]}


def _decode(data: Any, symbols: dict[str, Any]) -> Any:
    """`_encode`'s JSON back to sympy, over the program's own symbols; only sympy's and
    torch's sympy functions are built (anything else raises KeyError)."""
    import sympy
    import torch.utils._sympy.functions as torch_functions

    if isinstance(data, int):
        return sympy.Integer(data)
    if "s" in data:
        return symbols[data["s"]]
    if "b" in data:
        return sympy.true if data["b"] else sympy.false
    home = torch_functions if data["m"] == "torch" else sympy
    cls = getattr(home, data["f"], None)
    if not (isinstance(cls, type) and issubclass(cls, sympy.Basic)):
        raise KeyError(data["f"])
    return cls(*(_decode(a, symbols) for a in data["a"]))


def _ship_guards(program: ExportedProgram, guards: list[Any]) -> None:
    """Gives the program read back the shape guards of the one exported (`SHIPPED_GUARDS`):
    torch's serialization keeps its ranges, not its ShapeEnv's guards, which
    `replay.pipeline.cuts` reads to find where torch cut a group."""
    symbols = {s.name: s for s in program.range_constraints}
    facts = shape_facts(program)
    for shape in facts.inputs if facts else ():
        for size in shape:
            symbols.update({s.name: s for s in getattr(size, "free_symbols", ())})
    try:
        decoded = tuple(_decode(g, symbols) for g in guards)
    except (KeyError, TypeError, ValueError) as e:
        logger.warning("the program's shape guards could not be read back: %s", e)
        return
    program.graph_module.meta[SHIPPED_GUARDS] = decoded
