"""The ``capture export`` options that are `replay.ExportOptions` fields, built from the fields.

Each field's `OptionDoc` (its metadata) names its option, its help and how the command line
spells its values; the option's default is the field's. A field without a flag is the Python
API's only (a tensor, a callable, or what ``--out`` decides). The command receives the options
under the fields' names and turns them into `replay.export`'s keyword arguments with
`export_keywords`, so a new field reaches the command by its `OptionDoc` alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from replay import ExportOptions

__all__ = ["export_option_flags", "export_keywords", "cli_fields"]

F = TypeVar("F", bound=Callable[..., Any])


def cli_fields() -> dict[str, Any]:
    """Field name -> its `OptionDoc`, for the fields that have a ``capture export`` option."""
    return {name: doc for name, doc in ExportOptions.docs().items() if doc.flag is not None}


def _default_text(doc: Any, default: Any) -> str:
    if doc.default_text is not None:
        return str(doc.default_text)
    if isinstance(default, bool):
        on, _, off = doc.flag.partition("/")
        return on if default else (off or "off")
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def _type(doc: Any, default: Any) -> Any:
    if doc.choices:
        return click.Choice(list(doc.choices))
    if isinstance(default, bool) or doc.repeatable:
        return None
    if isinstance(default, int):
        return click.IntRange(min=None if doc.minimum is None else int(doc.minimum))
    if isinstance(default, float):
        return click.FloatRange(min=doc.minimum)
    return None


def _option(name: str, doc: Any, default: Any) -> Callable[[F], F]:
    text = " ".join(t for t in (doc.help, doc.cli_help) if t)
    help = f"{text} Default: {_default_text(doc, default)}."
    if default is None and doc.none_as is not None:
        default = doc.none_as
    if doc.repeatable:
        return click.option(doc.flag, name, metavar=doc.metavar, multiple=True, help=help)
    if isinstance(default, bool) and "/" not in doc.flag:
        return click.option(doc.flag, name, is_flag=True, default=default, help=help)
    return click.option(
        doc.flag, name, type=_type(doc, default), default=default, metavar=doc.metavar, help=help
    )


def export_option_flags(command: F) -> F:
    """Adds one click option per `replay.ExportOptions` field that has a flag, in field order,
    each stored under the field's name.

    Example:
        >>> @click.command()
        ... @export_option_flags
        ... def cmd(**options: object) -> None: ...
        >>> "--probes" in cmd.get_help(click.Context(cmd))
        True
    """
    defaults = {f.name: f.default for f in dataclasses.fields(ExportOptions)}
    for name, doc in reversed(cli_fields().items()):  # click lists the last decorator first
        command = _option(name, doc, defaults[name])(command)
    return command


def _batch(values: tuple[str, ...]) -> bool | list[str | int] | None:
    """``--set-batch-dimension-for``: 'all' is every input tensor, a number a position."""
    if not values:
        return None
    if "all" in values:
        return True
    return [int(v) if v.isdigit() else v for v in values]


def export_keywords(values: Mapping[str, Any]) -> dict[str, Any]:
    """`replay.export`'s keyword arguments of the command's option values (keyed by field
    name): the command line's spellings (``all``, ``0``, no ``--group``) in the API's terms.

    Example:
        >>> export_keywords({"groups": (), "time_budget": 0.0})
        {'groups': None, 'time_budget': None}
    """
    docs = cli_fields()
    options: dict[str, Any] = {}
    for name, value in values.items():
        doc = docs[name]
        if name == "set_batch_dimension_for":
            value = _batch(value)
        elif doc.repeatable and not value and getattr(ExportOptions, name, ()) is None:
            value = None  # no --group: every group
        elif doc.none_as is not None and value == doc.none_as:
            value = None
        options[name] = value
    return options
