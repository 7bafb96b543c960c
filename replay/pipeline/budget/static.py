"""Static programs for the recorded signatures a group's dynamic program does not serve.

When torch.export runs past the time budget on a group's dynamic shapes (a vision model at
several image sizes: torch's value-range analysis of a ``view``), or cuts its recorded range in a
way regimes cannot serve (`replay.pipeline.splitting`: no one dim separates the sizes its guards
refuse, or more regimes than ``max_regimes``), the recorded signatures left unserved are
exported another way: **one static program per signature**, the most frequent first (most calls
served per export), at most ``max_static`` of them, while the group's time budget lasts.

Each is a regime of one signature (`capture.analysis.regimes.regime`: its ranges are that one
size vector, so its program is traced without dynamic dims and its artifact guard accepts
exactly those sizes), named by the values of the group's symbols (``g0[pixel_values_2=40]``),
checked like any program (coverage rows on the signature, rebuilt and compared with the eager
model on the original calls' form), and routed by the existing guards: static programs stand
before the group's dynamic program, so the runner tries them first. The first static export that
fails ends the fallback (the others would most likely fail the same way); the signatures left are
reported not covered, with the reason in the group's notes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from capture.analysis.regimes import regime
from replay.inputs.builder import build_group
from replay.pipeline.splitting import Exported, regime_name

if TYPE_CHECKING:
    from capture.analysis.groups import Group
    from replay.inputs.exportgroup import ExportGroup
    from replay.inputs.options import ExportOptions

__all__ = ["StaticFallback", "static_name", "export_static"]

Export = Callable[["ExportGroup"], tuple[Any, BaseException | None]]
"""Exports a group within the group's budget: ``(program, None)`` or ``(None, error)``."""


@dataclass(frozen=True)
class StaticFallback:
    """What the fallback made for one group.

    Attributes:
        exported: One static group per signature exported, each with its program.
        notes: What was done and why (for the group's notes).
    """

    exported: tuple[Exported, ...]
    notes: tuple[str, ...]


def static_name(group: ExportGroup, sizes: Sequence[int]) -> str:
    """``g0[pixel_values_2=40]``: the group's name with the value of each of its symbols.

    Example:
        >>> static_name(group, (1, 3, 40, 40))  # doctest: +SKIP
        'g0[pixel_values_2=40]'
    """
    sides: dict[str, tuple[int | None, int | None]] = {}
    for dim, value in zip(group.dims, sizes, strict=False):
        if dim.dynamic and dim.symbol and dim.symbol not in sides:
            sides[dim.symbol] = (int(value), int(value))
    name = regime_name(group.name, sides)
    return name if name != group.name else f"{group.name}[static]"


def export_static(
    group: ExportGroup,
    unserved: Sequence[tuple[int, ...]],
    why: str,
    options: ExportOptions,
    analysed: list[Group],
    export: Export,
) -> StaticFallback:
    """One static program per signature of `unserved`, most calls first (module docstring).

    Args:
        group: The group (or regime) whose dynamic program does not serve `unserved`.
        unserved: Its recorded signatures left unserved.
        why: Why they are (for the notes).
        options: The export's options (``max_static``).
        analysed: Every analysed group of the model (``fill_missing`` reads them).
        export: One export bounded by the group's budget.

    Returns:
        The static groups exported and the notes.
    """
    if group.analysis.matrix is None or options.max_static <= 0:
        return StaticFallback((), ())
    wanted = {tuple(s) for s in unserved}
    order = [sizes for sizes, _ in group.recorded() if tuple(sizes) in wanted]
    matrix = np.asarray(group.analysis.matrix, dtype=np.int64)
    done: list[Exported] = []
    stopped: str | None = None
    for sizes in order[: options.max_static]:
        rows = np.flatnonzero((matrix == np.asarray(sizes)).all(axis=1)).tolist()
        name = static_name(group, sizes)
        built = build_group(regime(group.analysis, rows, name), analysed, group.ranges, options)
        program, error = export(built)
        if program is None:
            stopped = f"the static export of {name} failed ({_first_line(error)})"
            break
        done.append(Exported(built, program, None))
    return StaticFallback(tuple(done), tuple(_notes(group, order, done, why, stopped, options)))


def _notes(
    group: ExportGroup,
    order: Sequence[tuple[int, ...]],
    done: Sequence[Exported],
    why: str,
    stopped: str | None,
    options: ExportOptions,
) -> list[str]:
    names = ", ".join(d.group.name for d in done) or "none"
    notes = [
        f"{len(order)} recorded signatures not served by a dynamic program ({why}); "
        f"static programs, one per signature, most calls first: {names}"
    ]
    left = len(order) - len(done)
    if left:
        reason = stopped or (
            f"max_static is {options.max_static}"
            if len(order) > options.max_static
            else "the time budget was spent"
        )
        notes.append(f"{left} of them left without a program: {reason}")
    return notes


def _first_line(error: BaseException | None) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
