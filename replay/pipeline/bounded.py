"""Named dims that mean what they say: keep a program bounded when torch rejects named Dims.

With ``named_dims=True`` every dynamic axis gets a named ``Dim(symbol, min=, max=)`` with its
recorded range. torch.export rejects a named Dim when it cannot prove a guard over the whole
range (``Constraints violated``; torch 2.13 cannot prove the ``min(...)`` stride guard
``repeat_kv``'s reshape adds for the cache length of a grouped-query attention model, whatever
the range). Falling back to an unbounded ``Dim.DYNAMIC`` would silently give a program that
accepts sizes never recorded, so `export_bounded` tries, in order, until torch accepts one:

1. the named Dims as recorded;
2. the symbols torch names in the violation as bounded hints ``Dim.DYNAMIC(min=, max=)`` with
   their recorded range (torch keeps an unprovable guard as a runtime check), the other
   symbols still named;
3. every symbol as a bounded hint;
4. every symbol as a bounded hint with its min raised to 2 (torch specializes 0 and 1; the
   recorded signatures below 2 are then reported not covered by the coverage check).

Each step is said in the group's notes. When none is accepted, the caller exports with
``Dim.DYNAMIC`` and reports named dims as *not honoured* (`replay.ExportResult.not_honoured`),
never silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from capture.analysis.representative import MIN_DYNAMIC
from capture.compat import is_constraint_violation, violation_names
from replay.inputs import shapes
from replay.inputs.options import ShapeRetry

if TYPE_CHECKING:
    from replay.inputs.builder import ExportGroup

__all__ = ["with_hints", "violated_symbols", "export_bounded", "export_unbounded"]


def with_hints(group: ExportGroup, hinted: Iterable[str] | None, floor: int = 0) -> ExportGroup:
    """A copy of a named-dims group whose `hinted` symbols are bounded ``Dim.DYNAMIC`` hints.

    Args:
        group: A group built with ``named_dims=True``.
        hinted: The symbols to give as ``Dim.DYNAMIC(min=, max=)``; None: every dynamic axis
            unbounded ``Dim.DYNAMIC`` (no named Dims at all).
        floor: Raise the min of the hinted axes to this.

    Returns:
        The group with new ``dynamic_shapes`` (same example arguments and notes).

    Example:
        >>> with_hints(group, ["past_key_values_2"]).dynamic_shapes["attention_mask"]
        ... # doctest: +SKIP
        {0: Dim('batch', min=2, max=4), 1: DYNAMIC(min=6, max=23)}
    """
    retry = ShapeRetry(hinted=tuple(hinted or ()), floor=floor, unbounded=hinted is None)
    return group.reshaped(retry)


def violated_symbols(error: BaseException, symbols: Iterable[str]) -> list[str]:
    """The symbols of `symbols` that torch names in a ``Constraints violated (...)`` error.

    Example:
        >>> violated_symbols(Exception("Constraints violated (m - 1, b)! ..."), ["m", "b", "c"])
        ['m', 'b']
    """
    named = violation_names(error)
    return [s for s in symbols if s in named]


def export_bounded(
    group: ExportGroup,
    error: BaseException,
    export: Callable[[ExportGroup], tuple[Any, BaseException | None]],
    summary: Callable[[BaseException], str],
) -> tuple[ExportGroup, Any, BaseException | None]:
    """Steps 2-4 of the module docstring after torch.export rejected a group's named Dims.

    Args:
        group: The group built with ``named_dims=True``.
        error: What torch.export raised for it.
        export: Exports a group: ``(program, None)`` or ``(None, error)``.
        summary: One-line text of an error, for the notes.

    Returns:
        ``(group, program, None)`` with the group that exported (its notes say how), or
        ``(group, None, error)`` (the given group and error) when no bounded form was accepted.
    """
    specs = shapes.axis_specs(
        group.analysis, named_dims=True, example=group.example.representative.symbols
    )
    every = list(specs.symbols)
    violated = violated_symbols(error, every)
    attempts: list[tuple[list[str], int]] = []
    if violated and violated != every:
        attempts.append((violated, 0))
    attempts += [(every, 0), (every, MIN_DYNAMIC)]
    first = summary(error)
    for hinted, floor in attempts:
        candidate = with_hints(group, hinted, floor)
        program, failure = export(candidate)
        if program is not None:
            ranges = ", ".join(_range_text(specs, s, floor) for s in hinted)
            candidate = candidate.noted(
                f"named dims rejected by torch.export ({first}); exported with bounded "
                f"Dim.DYNAMIC hints for {ranges} instead (torch checks them at run time)"
            )
            return candidate, program, None
        if failure is not None and not is_constraint_violation(failure):
            break
    return group, None, error


def export_unbounded(
    group: ExportGroup,
    error: BaseException,
    export: Callable[[ExportGroup], tuple[Any, BaseException | None]],
    summary: Callable[[BaseException], str],
) -> tuple[ExportGroup, Any, BaseException | None, str]:
    """The last resort when no bounded form was accepted: unbounded ``Dim.DYNAMIC``.

    A program is still made (it may serve the calls, the coverage check says), but the caller
    must report named dims as not honoured: the returned reason says why.

    Returns:
        ``(group, program or None, error or None, why named dims are not honoured)``.
    """
    why = f"named dims rejected by torch.export ({summary(error)})"
    retry = with_hints(group, None).noted(f"{why}; exported with unbounded Dim.DYNAMIC instead")
    program, failure = export(retry)
    return retry, program, failure, f"named_dims: {why}"


def _range_text(specs: shapes.GroupSpecs, symbol: str, floor: int) -> str:
    low, high = shapes.bounds_of(specs, shapes.AxisSpec(symbol), floor)
    return f"{symbol} in [{low}, {high if high is not None else 'inf'}]"
