"""Groups split where torch.export cuts them: one program per regime.

A group whose recorded sizes cross a branch of the model (prompts shorter and longer than a
sliding window; a size equal to 1 or not) cannot be served by one program: torch.export traces
one side, from the group's example, and guards the other out (``input_ids.size()[1] <= 4``), or
rejects the dynamic shapes outright (``Constraints violated``: the example sits where the code
pins the size). torch's maintainers answer "export once per regime and dispatch" (pytorch issue
136119); `export_regimes` does it:

1. export the group (`replay.pipeline.exporting`'s export, then its named-dims retries);
2. read where torch cut it, from facts (`replay.pipeline.cuts`): a program's guards evaluated on
every
   recorded signature; a rejected export is classified by its exception type
   (`capture.compat.is_constraint_violation`) and traced again with ``Dim.AUTO`` on every
   dynamic axis, whose program's guards say where the cut lies;
3. when the accepted and refused signatures separate along one symbol into runs of
   consecutive recorded sizes, make each run a regime (`capture.analysis.regimes.regime`:
   the group's symbols and relations, the regime's own ranges), named by its side of the cut
   (``prefill[input_ids_1<=4]``, ``prefill[input_ids_1>=5]``), with its own representative
   example inside it (`replay.inputs.select`: every dynamic dim >= 2, relations kept), and export
   each regime the same way, recursively, until no cut is left or `max_regimes` regimes exist.

Each regime is a group of its own from then on: a program, coverage rows, an entry of the
artifact whose guards are the regime's recorded ranges (the runner picks by range: regimes of a
group never overlap), a failure reported not covered with its reason. A cut that no symbol
separates, or one past the bound, is left as it is: the refused signatures fail the coverage
check with the program's guard, and a note says why the group was not split.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from capture.analysis.regimes import regime
from capture.compat import is_constraint_violation
from replay.inputs.builder import build_group
from replay.pipeline.cuts import Cut, find_cut, verdicts

if TYPE_CHECKING:
    from capture.analysis.groups import Group
    from replay.inputs.exportgroup import ExportGroup
    from replay.inputs.options import ExportOptions

__all__ = ["Exported", "export_regimes", "regime_name"]

Export = Callable[["ExportGroup"], tuple[Any, BaseException | None]]
"""Exports a group: ``(program, None)`` or ``(None, what torch.export raised)``."""
Retry = Callable[
    ["ExportGroup", BaseException],
    tuple["ExportGroup", Any, BaseException | None, str | None],
]
"""The retries after a rejected export (bounded named dims): ``(group, program, error, why
named dims are not honoured)``."""


@dataclass(frozen=True)
class Exported:
    """One group (or regime) after export.

    Attributes:
        group: The group as exported (a regime, a retried form).
        program: Its `torch.export.ExportedProgram`, or None.
        error: What torch.export raised when there is no program.
        not_honoured: Why named dims are not honoured, or None.
    """

    group: ExportGroup
    program: Any
    error: BaseException | None
    not_honoured: str | None = None


Side = tuple[int | None, int | None]
"""A regime's bounds on one symbol: ``(low, high)``, None where open."""


def regime_name(base: str, sides: dict[str, Side]) -> str:
    """``base[cond,cond]``: a regime's name, one condition per symbol it is cut along.

    Example:
        >>> regime_name("prefill", {"input_ids_1": (None, 4)})
        'prefill[input_ids_1<=4]'
        >>> regime_name("decode", {"past_2": (5, 5), "batch": (2, 3)})
        'decode[past_2=5,2<=batch<=3]'
    """
    conditions = []
    for symbol, (low, high) in sides.items():
        if low is None:
            conditions.append(f"{symbol}<={high}")
        elif high is None:
            conditions.append(f"{symbol}>={low}")
        elif low == high:
            conditions.append(f"{symbol}={low}")
        else:
            conditions.append(f"{low}<={symbol}<={high}")
    return f"{base}[{','.join(conditions)}]" if conditions else base


def _narrowed(sides: dict[str, Side], symbol: str, side: Side) -> dict[str, Side]:
    """`sides` with `symbol` narrowed to `side` (a regime of a regime)."""
    low, high = sides.get(symbol, (None, None))
    if side[0] is not None:
        low = side[0] if low is None else max(low, side[0])
    if side[1] is not None:
        high = side[1] if high is None else min(high, side[1])
    return {**sides, symbol: (low, high)}


@dataclass(frozen=True)
class _Pending:
    group: ExportGroup
    base: str
    sides: dict[str, Side] = field(default_factory=dict)


def export_regimes(
    group: ExportGroup,
    options: ExportOptions,
    analysed: list[Group],
    export: Export,
    retry: Retry,
) -> list[Exported]:
    """Exports a group, split into regimes where torch.export cuts it (module docstring).

    Args:
        group: The call group.
        options: The replay's options (``max_regimes``; each regime is built with them).
        analysed: Every analysed group of the model (``fill_missing`` reads them).
        export: One torch.export of a group.
        retry: The retries of a rejected export (named dims made bounded hints).

    Returns:
        The group, or its regimes in increasing order of the cut symbol, each exported or
        with its error.

    Example:
        >>> done = export_regimes(group, options, inputs.analysed, export, retry)
        ... # doctest: +SKIP
        >>> [d.group.name for d in done]  # doctest: +SKIP
        ['prefill[input_ids_1<=4]', 'prefill[input_ids_1=5]', 'prefill[input_ids_1>=6]']
    """
    budget = max(1, options.max_regimes)
    count = 1
    pending = [_Pending(group, group.name)]
    done: list[Exported] = []
    while pending:
        item = pending.pop(0)
        outcome, cut = _export_one(item.group, export, retry, budget - count)
        if cut is not None:
            pending[0:0] = _split(item, cut, options, analysed)
            count += len(cut.runs) - 1
            continue
        done.append(outcome)
    return done


def _export_one(
    group: ExportGroup, export: Export, retry: Retry, room: int
) -> tuple[Exported, Cut | None]:
    """The group exported (with its retries), or the cut torch makes in it when splitting
    there adds at most `room` regimes (a cut past that is said in the group's notes)."""
    if group.analysis.matrix is None:
        program, error = export(group)
        return Exported(group, program, error), None
    signatures = [sizes for sizes, _ in group.recorded()]
    program, error = export(group)
    if error is not None and is_constraint_violation(error):
        cut = _probe(group, export, signatures)
        if cut is not None:
            too_many = _too_many(cut, room)
            if too_many is None:
                return Exported(group, None, error), cut
            group = group.noted(too_many)
        exported, program, error, why = retry(group, error)
        outcome = Exported(exported, program, error, why)
    else:
        outcome = Exported(group, program, error)
    if outcome.program is None:
        return outcome, None
    found = verdicts(outcome.program, outcome.group, signatures)
    cut = find_cut(outcome.group, found) if found is not None else None
    refused = [v for v in found or () if not v.accepted]
    if cut is not None:
        too_many = _too_many(cut, room)
        if too_many is None:
            return outcome, cut
        return _noted(outcome, too_many), None
    if refused and len(refused) < len(signatures):
        outcome = _noted(
            outcome,
            f"the program's guards refuse {len(refused)} of {len(signatures)} recorded "
            f"signatures ({refused[0].refused}); no one dim separates them from the others "
            "into ranges, so the group is not split",
        )
    return outcome, None


def _noted(outcome: Exported, note: str) -> Exported:
    return dataclasses.replace(outcome, group=outcome.group.noted(note))


def _too_many(cut: Cut, room: int) -> str | None:
    """Why the group is not split at `cut` (more regimes than `room` allows), or None: it
    fits."""
    if len(cut.runs) - 1 <= room:
        return None
    return (
        f"torch.export cuts the recorded {cut.symbol} into {_runs_text(cut)} ({cut.guard}); "
        "not split there: that would make more regimes than max_regimes allows"
    )


def _probe(group: ExportGroup, export: Export, signatures: list[tuple[int, ...]]) -> Cut | None:
    """Where torch cuts a group whose dynamic shapes it rejected: the guards of the program
    traced with ``Dim.AUTO`` on every dynamic axis (nothing rejected, the cut kept as guards)."""
    if not signatures:
        return None
    probe = group.reshaped(dataclasses.replace(group.retry, auto=True))
    program, error = export(probe)
    if program is None or error is not None:
        return None
    found = verdicts(program, probe, signatures)
    return find_cut(probe, found) if found is not None else None


def _split(
    item: _Pending, cut: Cut, options: ExportOptions, analysed: list[Group]
) -> list[_Pending]:
    """One pending regime per run of the cut, in increasing order."""
    group = item.group
    analysis = group.analysis
    if analysis.matrix is None:
        return [item]
    column = analysis.matrix[:, cut.column]
    out = []
    for (low, high, _), side in zip(cut.runs, cut.sides(), strict=True):
        rows = [i for i, v in enumerate(column.tolist()) if low <= v <= high]
        sides = _narrowed(item.sides, cut.symbol, side)
        name = regime_name(item.base, sides)
        built = build_group(regime(analysis, rows, name), analysed, group.ranges, options)
        note = (
            f"a regime of {item.base}: torch.export cuts its recorded {cut.symbol} into "
            f"{_runs_text(cut)} (the program it traced refuses the other side: {cut.guard}); "
            "one program per side"
        )
        built = dataclasses.replace(built, notes=(note, *built.notes))
        out.append(_Pending(built, item.base, sides))
    return out


def _runs_text(cut: Cut) -> str:
    parts = [f"{low}" if low == high else f"{low}..{high}" for low, high, _ in cut.runs]
    return " | ".join(parts)
