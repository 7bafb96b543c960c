"""A table on a terminal fits its width, as duckdb's, gh's and kubectl's tables do.

Only the ``table`` format of a command whose stdout is a terminal is fitted, and only with
`--wide` off; piped or redirected output, and every other format, carry every column in full
(STYLE.md "CLI conventions": the format never changes with the terminal, only its fitting).
Fitting a table to ``W`` columns:

1. the command's identifier columns (structure ids, leaf numbers: what a script joins on, not
   what a person reads) are left out;
2. when the rest is still wider than ``W``, the widest text columns are shortened together
   (numbers never are, nor the names a user copies into the next command: `COPIED`, such as
   a group for ``--group``, a symbol for ``--symbol``, an expression, a TensorRT input name),
   down to their header's width or 6 characters, whichever is more; a shortened cell ends
   with ``…``; a column of key paths may stay twice as wide as the others and its cells keep
   their end, which tells leaves apart (``kwargs…'].key_cache[0]``);
3. when that is not enough, the command's least needed columns (`Fit.drop_first`) are left
   out, in its order; then the copied names are shortened too; and when even that is too
   wide, the rightmost columns are left out. One line on stderr says which columns were left
   out (``--wide`` shows them).

Column widths come from the first rows (`cli.output` sizes a streamed table on its first
batch, as duckdb does); a later, longer cell is shortened to its column on a terminal.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import click

from .cells import width as text_width

__all__ = [
    "COPIED",
    "Fit",
    "Layout",
    "ELLIPSIS",
    "terminal_width",
    "stdout_is_terminal",
    "layout",
    "cut",
    "wide_option",
    "constant_columns",
]

ELLIPSIS = "…"

COPIED: tuple[str, ...] = (
    "group",
    "symbol",
    "expr",
    "input",
    "argument",
    "served_as",
    "program",
)
"""Columns of names a user copies into the next command (``--group decode``, ``--symbol
past_key_values_2``, an expression for ``dynamic_shapes``, a TensorRT input name): shortened
only when nothing else is left to shorten or leave out."""

_SEPARATOR = 2
_MIN_CELL = 6


def stdout_is_terminal() -> bool:
    """Whether stdout is a terminal now (a table fits it; data shown there is escaped)."""
    # sys.stdout at call time: click.echo writes there (a test runner may have replaced it).
    isatty = getattr(sys.stdout, "isatty", None)
    return bool(isatty is not None and isatty())


def terminal_width(wide: bool = False) -> int | None:
    """The width to fit tables to: None when `wide`, or when stdout is not a terminal.

    The width is ``$COLUMNS`` when set, else the terminal's (`shutil.get_terminal_size`).

    Args:
        wide: The command's ``--wide`` flag.

    Returns:
        Columns of the terminal, or None for output in full.

    Example:
        >>> terminal_width(wide=True) is None
        True
    """
    if wide or not stdout_is_terminal():
        return None
    # $COLUMNS first, then the terminal; a terminal that says 0 columns gets the fallback.
    return max(20, shutil.get_terminal_size(fallback=(80, 24)).columns)


def wide_option(func: click.decorators.FC) -> click.decorators.FC:
    """The ``--wide`` flag, stored in the ``wide`` parameter.

    Example:
        >>> @click.command()
        ... @wide_option
        ... def cmd(wide: bool) -> None:
        ...     click.echo(terminal_width(wide), err=True)
    """
    return click.option(
        "--wide",
        is_flag=True,
        default=False,
        help="On a terminal, show every column in full. Default: the table fits the terminal "
        "(identifier columns left out, long cells shortened with …); piped output and the "
        "other formats are always in full.",
    )(func)


def constant_columns(table: Any, names: Sequence[str]) -> tuple[str, ...]:
    """Those of `names` whose column holds one value in every row of `table`.

    A command leaves these out on a terminal as identifiers (the ``model`` of a store with
    one model), as kubectl leaves out the namespace of a listing scoped to one.

    Args:
        table: A `pyarrow.Table`.
        names: Candidate columns (absent ones are skipped).

    Returns:
        The constant columns, in the order of `names`.

    Example:
        >>> import pyarrow as pa
        >>> constant_columns(pa.table({"model": ["m", "m"], "n": [1, 2]}), ["model", "n"])
        ('model',)
    """
    import pyarrow.compute as pc

    return tuple(
        n
        for n in names
        if n in table.column_names and table.num_rows and pc.count_distinct(table[n]).as_py() == 1
    )


@dataclass(frozen=True)
class Fit:
    """How a command's table meets the terminal: what `cli.output.render` is told.

    Attributes:
        width: The terminal's width (`terminal_width`), or None for every column in full.
        hide: Identifier columns, left out on a terminal.
        keep_end: Columns of key paths, whose shortened cells keep their end.
        whole: Columns never shortened, like numbers (shapes: a cut shape misleads).
        keep: Columns of names a user copies (`COPIED`): shortened last.
        drop_first: Columns left out first, in this order, when shortening the others is not
            enough (before the copied names are shortened).

    Example:
        >>> Fit(width=100, hide=("structure_id", "leaf"), keep_end=("path",)).width
        100
    """

    width: int | None = None
    hide: tuple[str, ...] = ()
    keep_end: tuple[str, ...] = ()
    whole: tuple[str, ...] = ()
    keep: tuple[str, ...] = COPIED
    drop_first: tuple[str, ...] = ()


@dataclass(frozen=True)
class Layout:
    """Which columns a table shows and how wide each is.

    Attributes:
        shown: Indexes of the columns shown, in order.
        widths: Width of each shown column.
        limit: When true, a cell wider than its column is shortened (a terminal); else it
            runs over (piped output keeps every character).
        keep_end: Shown columns (indexes into `shown`) whose cut cells keep their end.
        dropped: Names of the columns left out for lack of room (not the identifiers).
    """

    shown: list[int]
    widths: list[int]
    limit: bool
    keep_end: set[int] = field(default_factory=set)
    dropped: list[str] = field(default_factory=list)


def layout(
    names: Sequence[str],
    natural: Sequence[int],
    numeric: Sequence[bool],
    available: int | None,
    *,
    hide: Sequence[str] = (),
    keep_end: Sequence[str] = (),
    headers: bool = True,
    keep: Sequence[str] = (),
    drop_first: Sequence[str] = (),
) -> Layout:
    """Fits columns of `natural` widths into `available` characters (module docstring).

    Args:
        names: Column names (their width is each column's smallest width when shortened).
        natural: The widest cell of each column, header included.
        numeric: Which columns are never shortened (numbers, and `Fit.whole`).
        available: The terminal's width, or None for every column in full.
        hide: Identifier columns, left out when fitting.
        keep_end: Columns whose shortened cells keep their end (key paths).
        headers: Whether the header row is shown (its names then bound the shortening).
        keep: Columns shortened only after the `drop_first` ones are left out (copied names).
        drop_first: Columns left out first, in order, when shortening the others is not enough.

    Returns:
        The `Layout`.

    Example:
        >>> fitted = layout(["id", "path", "n"], [16, 40, 3], [False, False, True], 30,
        ...                 hide=["id"])
        >>> fitted.shown, fitted.widths
        ([1, 2], [25, 3])
    """
    if available is None:
        return Layout(list(range(len(names))), list(natural), limit=False)
    shown = [i for i, n in enumerate(names) if n not in hide] or list(range(len(names)))
    floors = {
        i: min(natural[i], max(text_width(names[i]) if headers else 0, _MIN_CELL)) for i in shown
    }
    dropped: list[str] = []
    last: list[str] = []  # the columns left out from the right, named last
    order = [n for n in drop_first if n in names]
    keeping = bool(keep)
    while True:
        room = available - _SEPARATOR * (len(shown) - 1)
        widths = _widths(
            [natural[i] for i in shown],
            [floors[i] for i in shown],
            [numeric[i] or (keeping and names[i] in keep) for i in shown],
            [2 if names[i] in keep_end else 1 for i in shown],
            room,
        )
        if widths is not None or len(shown) == 1:
            break
        leaving = [i for n in order for i in shown if names[i] == n]
        if leaving:  # the command's least needed column first
            shown.remove(leaving[0])
            order.remove(names[leaving[0]])
            dropped.append(names[leaving[0]])
        elif keeping:  # then the copied names are shortened too
            keeping = False
        else:
            last.insert(0, names[shown.pop()])
    dropped += last
    if widths is None:  # one column left, wider than the terminal even cut: cut it to the width
        widths = [max(1, room)]
    ends = {k for k, i in enumerate(shown) if names[i] in keep_end}
    return Layout(shown, widths, limit=True, keep_end=ends, dropped=dropped)


def _widths(
    natural: list[int], floors: list[int], numeric: list[bool], weights: list[int], room: int
) -> list[int] | None:
    """The text columns capped at the largest common width that fits `room` (water-filling).

    Numbers keep their width; a text column never goes below its floor; a column of key
    paths (weight 2) may be twice as wide as the others, as it is what a row is about.
    Room left under the cap goes back, one character each from the left, to the columns
    that were cut.

    Returns:
        The widths, or None when even the floors do not fit.
    """
    if sum(natural) <= room:
        return list(natural)
    if sum(n if num else f for n, f, num in zip(natural, floors, numeric, strict=True)) > room:
        return None

    def capped(cap: int) -> list[int]:
        return [
            n if num else max(f, min(n, w * cap))
            for n, f, num, w in zip(natural, floors, numeric, weights, strict=True)
        ]

    low, high = 0, max(natural)  # capped(low) fits (floors), capped(high) does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if sum(capped(middle)) <= room else (low, middle)
    widths = capped(low)
    spare = room - sum(widths)
    for k in range(len(widths)):
        if spare and widths[k] < natural[k] and not numeric[k]:
            widths[k] += 1
            spare -= 1
    return widths


def cut(text: str, size: int, keep_end: bool = False) -> str:
    """`text` shortened to `size` display columns, ``…`` marking the cut.

    Args:
        text: A cell.
        size: The column's width.
        keep_end: Cut in the middle, keeping the start and the end (key paths).

    Returns:
        `text` itself when it fits.

    Example:
        >>> cut("decode_no_attention_mask", 10), cut("kwargs['x'].key_cache[0]", 14, True)
        ('decode_no…', 'kwar…_cache[0]')
    """
    if text_width(text) <= size:
        return text
    if size <= 1:
        return ELLIPSIS[:size]
    if not keep_end:
        return _take(text, size - 1) + ELLIPSIS
    # The end of a key path tells its leaves apart (key_cache[0] / value_cache[1]): keep more.
    head = (size - 1) // 3
    tail = size - 1 - head
    return _take(text, head) + ELLIPSIS + _take(text[::-1], tail)[::-1]


def _take(text: str, size: int) -> str:
    """The longest start of `text` at most `size` display columns wide."""
    if text.isascii():
        return text[:size]
    out = []
    used = 0
    for char in text:
        w = text_width(char)
        if used + w > size:
            break
        out.append(char)
        used += w
    return "".join(out)
