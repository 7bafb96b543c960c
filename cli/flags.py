"""Flags several commands share: ``--model NAME``, ``--group NAME``, ``-f/--format``.

One definition each, so the commands spell them (metavar, default, stored parameter) alike;
the help text stays per command, since what "every model" means differs between them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

__all__ = [
    "EVERY_MODEL",
    "model_option",
    "group_option",
    "count_option",
    "choice_format_option",
]

F = TypeVar("F", bound=Callable[..., Any])

EVERY_MODEL = "Only this model (the Recorder's name). Default: every model in the store."
"""The help of ``--model`` for commands that otherwise cover every model."""


def model_option(help: str = EVERY_MODEL) -> Callable[[F], F]:
    """The ``--model NAME`` option (default None), stored in the ``model_name`` parameter: a
    store's name for a model, never the model itself.

    Args:
        help: The option's help text, stating its default.

    Returns:
        A click decorator.

    Example:
        >>> @click.command()
        ... @model_option()
        ... def cmd(model_name: str | None) -> None:
        ...     click.echo(model_name)
    """
    return click.option("--model", "model_name", metavar="NAME", default=None, help=help)


def group_option(help: str) -> Callable[[F], F]:
    """The ``--group NAME`` option (default None), stored in the ``group`` parameter.

    Args:
        help: The option's help text, stating its default.

    Returns:
        A click decorator.
    """
    return click.option("--group", metavar="NAME", default=None, help=help)


def count_option(flag: str, default: int | None, help: str) -> Callable[[F], F]:
    """An option taking a count N of at least 1 (``--budget N``), with its help stating the
    default; a default of None makes the option required.

    Args:
        flag: The long option.
        default: Its default, or None when it must be given.
        help: The option's help text, stating its default.

    Returns:
        A click decorator.
    """
    return click.option(
        flag,
        type=click.IntRange(min=1),
        default=default,
        required=default is None,
        metavar="N",
        help=help,
    )


def choice_format_option(formats: Sequence[str], help: str) -> Callable[[F], F]:
    """A ``-f/--format`` option with its own help, stored in ``fmt``; the first format is the
    default. (`capture.cli.output.format_option` writes the help of the renderer's formats.)

    Args:
        formats: The accepted formats; the first one is the default.
        help: The option's help text, stating its default.

    Returns:
        A click decorator.
    """
    return click.option(
        "-f", "--format", "fmt", type=click.Choice(list(formats)), default=formats[0], help=help
    )
