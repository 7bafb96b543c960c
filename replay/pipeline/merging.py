"""Fewer programs where it is proven safe: a group served by another's program.

generate() leaves out an all-ones ``attention_mask`` at batch 1, so a tiny Llama's traffic comes in
four groups: ``decode``, ``decode_no_attention_mask``, ``prefill``, ``prefill_no_attention_mask``.
A group **B** that differs from a group **A** only by optional tensor inputs A passes and B's
calls leave out may be served by A's program with those inputs **filled** (`replay.runtime.fills`),
never by assumption:

1. **Same call otherwise** (`missing_inputs`): B's recorded leaves are A's without the missing
   inputs (same paths, kinds, dtypes, ranks, constants), and each missing input is a plain
   keyword tensor in A.
2. **The fill is derived from the recordings** (`derive_fills`): each axis of the input follows
   the other inputs as A's recorded symbols and relations say (``attention_mask`` axis 1 =
   ``past_key_values_2 + 1`` in A's decode calls), expressed over B's sizes; its value is a
   constant inside A's recorded value range of that input (its recorded maximum is tried
   first, then its minimum). An input that follows no recorded relation, or has no recorded
   value range (a float tensor), is not filled: B keeps its own program, and a note says why.
3. **Proven on B's own traffic** (`prove`): A's program, given B's rebuilt calls with the fill,
   is compared with eager on B's calls as they were recorded (without the input): every
   recorded signature of B, its probes, and its sampled real calls (payloads). Every one must
   agree within the export's tolerance; the first that does not is the reason B keeps its own
   program.

A merged B is still a group of the result: its coverage rows are the proof's rows, its entry in
an artifact names A's program and the fill (the runner fills the input per call, after B's own
guards accepted the call), and a note says what serves it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from capture.pytree import nodes
from replay.check.checking import coverage_rows
from replay.runtime.fills import Fill, FillAxis

if TYPE_CHECKING:
    from capture.pytree.recorded_structure import RecordedLeaf
    from capture.store.reader import StoreReader
    from replay.inputs.exportgroup import ExportGroup, ExportInputs
    from replay.inputs.options import ExportOptions
    from replay.runtime.coverage import CoverageRow

__all__ = ["Merged", "missing_inputs", "derive_fills", "prove", "merge"]

_INTEGER = ("int64", "int32", "int16", "int8", "uint8")


@dataclasses.dataclass(frozen=True)
class Merged:
    """What `merge` found for a group.

    Attributes:
        group: The group served by another group's program (`ExportGroup.served_by`), or
            None when no program serves it.
        rows: Its coverage rows (the proof), when served.
        reasons: Why each candidate program was refused, when not served.
    """

    group: ExportGroup | None
    rows: tuple[CoverageRow, ...] = ()
    reasons: tuple[str, ...] = ()


def _facts(leaf: RecordedLeaf) -> tuple[Any, ...]:
    return (leaf.path, leaf.kind, leaf.dtype, leaf.rank, leaf.value)


def missing_inputs(lacking: ExportGroup, full: ExportGroup) -> list[str]:
    """The inputs `full`'s calls pass and `lacking`'s leave out, when that is all that differs.

    Args:
        lacking: The group whose calls leave inputs out (B).
        full: The group whose program would serve it (A).

    Returns:
        The argument names, each a plain keyword tensor in `full` and missing in `lacking`;
        empty when the structures differ otherwise (or do not differ).

    Example:
        >>> missing_inputs(inputs.group("decode_no_attention_mask"), inputs.group("decode"))
        ... # doctest: +SKIP
        ['attention_mask']
    """
    b, a = lacking.structure, full.structure
    if b.n_args != a.n_args or b.signature != a.signature:
        return []
    missing = {leaf.argument for leaf in b.leaves if leaf.is_missing and leaf.argument}
    passed = {
        leaf.argument
        for leaf in a.leaves
        if leaf.is_tensor and leaf.argument in missing and leaf.path == f"kwargs['{leaf.argument}']"
    }
    if not passed:
        return []
    mine = [_facts(leaf) for leaf in b.leaves if leaf.argument not in passed]
    theirs = [_facts(leaf) for leaf in a.leaves if leaf.argument not in passed]
    return sorted(passed) if mine == theirs else []


def _index(group: ExportGroup) -> dict[tuple[str, int], int]:
    """(path, axis) -> position in the group's size vector."""
    out = {}
    for leaf in group.structure.tensors:
        for axis in range(leaf.ndim):
            out[(leaf.path, axis)] = int(leaf.dim_offset or 0) + axis
    return out


def _shape(
    lacking: ExportGroup, full: ExportGroup, argument: str
) -> tuple[tuple[FillAxis, ...], str] | str:
    """The fill's axes over `lacking`'s sizes, with their text; or why they cannot be derived."""
    path = f"kwargs['{argument}']"
    where = _index(lacking)
    # A symbol of the full group, found on an input both groups pass: its place in B's sizes.
    found: dict[str, int] = {}
    for d in full.dims:
        if d.symbol and d.dynamic and d.path != path and (d.path, d.axis) in where:
            found.setdefault(d.symbol, where[(d.path, d.axis)])
    relations = {r.symbol: r for r in full.relations}
    axes, texts = [], []
    for d in (d for d in full.dims if d.path == path):
        if not d.dynamic or d.symbol is None:
            axes.append(FillAxis((), d.min))
            texts.append(str(d.min))
            continue
        rel = relations.get(d.symbol)
        terms, offset = (rel.terms, rel.offset) if rel is not None else ((d.symbol,), 0)
        unknown = [t for t in terms if t not in found]
        if unknown:
            return (
                f"{argument} axis {d.axis} ({d.symbol}) follows no recorded size of the inputs "
                f"{lacking.name} passes"
            )
        axes.append(FillAxis(tuple(found[t] for t in terms), offset))
        text = " + ".join(lacking.dims[found[t]].symbol or str(t) for t in terms)
        texts.append(f"{text} {'+' if offset > 0 else '-'} {abs(offset)}" if offset else text)
    return tuple(axes), f"({', '.join(texts)})"


def _values(full: ExportGroup, leaf: RecordedLeaf) -> list[int]:
    """The constants to try: the recorded maximum of the input, then its minimum."""
    if leaf.range_index is None:
        return []
    lows, highs = [], []
    for mins, maxs in full.ranges.values():
        if leaf.range_index < len(mins) and mins[leaf.range_index] is not None:
            lows.append(int(mins[leaf.range_index]))  # type: ignore[arg-type]
        if leaf.range_index < len(maxs) and maxs[leaf.range_index] is not None:
            highs.append(int(maxs[leaf.range_index]))  # type: ignore[arg-type]
    out = [max(highs)] if highs else []
    if lows and min(lows) not in out:
        out.append(min(lows))
    return out


def _named(value: int) -> str:
    return {0: "zeros", 1: "ones"}.get(value, f"constant {value}")


def derive_fills(
    lacking: ExportGroup, full: ExportGroup, arguments: Iterable[str]
) -> tuple[list[tuple[Fill, ...]], str | None]:
    """The fills to try for `lacking`'s calls on `full`'s program (module docstring, step 2).

    Args:
        lacking: B.
        full: A.
        arguments: `missing_inputs` of the two.

    Returns:
        ``(candidates, None)``: fill sets to try, in order; or ``([], why none can be derived)``.

    Example:
        >>> candidates, _ = derive_fills(lacking, full, ["attention_mask"])  # doctest: +SKIP
        >>> [fill.text for (fill,) in candidates]  # doctest: +SKIP
        ['attention_mask = ones of shape (batch, past_key_values_2 + 1)', ...]
    """
    per_argument: list[list[Fill]] = []
    for argument in arguments:
        leaf = next(x for x in full.structure.leaves if x.path == f"kwargs['{argument}']")
        if leaf.dtype not in _INTEGER:
            return [], f"{argument} is a {leaf.dtype} tensor: no recorded value range to fill from"
        shaped = _shape(lacking, full, argument)
        if isinstance(shaped, str):
            return [], shaped
        axes, text = shaped
        values = _values(full, leaf)
        if not values:
            return [], f"{argument} has no recorded value range in {full.name}"
        per_argument.append(
            [
                Fill(
                    argument, str(leaf.dtype), v, axes, f"{argument} = {_named(v)} of shape {text}"
                )
                for v in values
            ]
        )
    # One value per argument at a time: the recorded maximum of every input first.
    depth = max(len(options) for options in per_argument)
    candidates = [
        tuple(options[min(i, len(options) - 1)] for options in per_argument) for i in range(depth)
    ]
    return candidates, None


def prove(
    model: Any,
    lacking: ExportGroup,
    full: ExportGroup,
    program: Any,
    fills: Sequence[Fill],
    options: ExportOptions,
    store: StoreReader,
    inputs: ExportInputs,
) -> tuple[ExportGroup, list[CoverageRow], str | None]:
    """`lacking` served by `full`'s program with `fills`, checked on its own traffic (step 3).

    Args:
        model: The eager model.
        lacking: B.
        full: A (its call form is the program's).
        program: A's `torch.export.ExportedProgram`.
        fills: The fills to prove.
        options: The tolerances, probes and payload limit of the export.
        store: The open store (payloads).
        inputs: The export's inputs (its model name and analysed groups).

    Returns:
        ``(B served by A, its coverage rows, None)`` when every row agrees with eager, else
        ``(B served by A, the rows, why not)``.

    Example:
        >>> served, rows, why = prove(model, lacking, full, program, fills, options, store,
        ...                           inputs)  # doctest: +SKIP
        >>> served.program_name, why  # doctest: +SKIP
        ('decode', None)
    """
    from replay.check.payload_rows import payload_rows
    from replay.inputs.exportgroup import ExportInputs

    example = dataclasses.replace(lacking.example, form=full.example.form, fills=tuple(fills))
    served = dataclasses.replace(lacking, example=example, served_by=full.program_name)
    with nodes.register_flattening_functions():
        rows = coverage_rows(
            model, served, program, None, options.atol, options.rtol, options.probes
        )
    real, _ = payload_rows(
        model,
        store,
        ExportInputs(inputs.model_name, [served], inputs.analysed),
        {served.program_name: program},
        {},
        atol=options.atol,
        rtol=options.rtol,
        limit=options.max_payloads,
        device=options.device,
    )
    failed = next((r for r in [*rows, *real] if not r.covered), None)
    if failed is not None:
        return served, rows, f"{failed.kind} {failed.signature}: {failed.error}"
    served = served.noted(
        f"served by the program of {full.program_name} with {'; '.join(f.text for f in fills)}: "
        f"proven on its {sum(r.kind == 'recorded' for r in rows)} recorded signatures, "
        f"{sum(r.kind == 'probe' for r in rows)} probes and {len(real)} sampled real calls "
        "against eager without the input"
    )
    return served, rows, None


def merge(
    model: Any,
    lacking: ExportGroup,
    exported: Sequence[tuple[ExportGroup, Any]],
    options: ExportOptions,
    store: StoreReader,
    inputs: ExportInputs,
) -> Merged:
    """`lacking` served by one of the `exported` programs, proven; or why none serves it.

    Args:
        model: The eager model.
        lacking: The group to serve (B).
        exported: ``(group, program)`` of every program made so far.
        options: The export's options.
        store: The open store (payloads).
        inputs: The export's inputs.

    Returns:
        A `Merged`: B served and its coverage rows; else the reasons each candidate was
        refused (none when no group differs from B only by inputs B leaves out).

    Example:
        >>> merged = merge(model, lacking, [(full, program)], options, store, inputs)
        ... # doctest: +SKIP
        >>> merged.group.served_by  # doctest: +SKIP
        'decode'
    """
    reasons: list[str] = []
    if lacking.example.added:
        return Merged(None)  # fill_missing: every program already takes every input, as asked
    for full, program in exported:
        arguments = missing_inputs(lacking, full)
        if not arguments or full.example.added or full.served_by is not None:
            continue
        candidates, why = derive_fills(lacking, full, arguments)
        for fills in candidates:
            served, rows, why = prove(model, lacking, full, program, fills, options, store, inputs)
            if why is None:
                return Merged(served, tuple(rows))
        reasons.append(
            f"not served by the program of {full.name} with {', '.join(arguments)} filled: {why}"
        )
    return Merged(None, reasons=tuple(reasons))
