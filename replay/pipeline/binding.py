"""Does ``model.forward`` still accept the recorded calls, the same way? (`check_signature`)

A recorded structure keeps the recorded method's parameters and how many arguments its calls passed
positionally (`capture.pytree.recorded_structure.RecordedStructure`). Before exporting,
`replay.export` binds every group's recorded call form to the current ``forward``: a renamed
positional parameter, a removed one or a call that no longer binds stops the export with a message
naming it, instead of exporting a program that silently takes its inputs in the wrong places.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from capture.errors import ReplayError
from capture.renames import same_argument
from capture.signature import Signature

if TYPE_CHECKING:
    from capture.pytree.recorded_structure import RecordedStructure
    from replay.inputs.exportgroup import ExportGroup

__all__ = ["check_signature"]


def _recorded_keywords(structure: RecordedStructure) -> tuple[int, list[str], list[str]]:
    """(positional count, keyword names, positional names) of a structure's recorded calls."""
    n_args = structure.n_args
    keywords: list[str] = []
    positional = [""] * n_args
    for leaf in structure.leaves:
        if leaf.is_missing:
            continue
        if leaf.position is not None and leaf.position < n_args:
            positional[leaf.position] = str(leaf.argument)
        elif leaf.path.startswith("kwargs[") and leaf.argument not in keywords:
            keywords.append(str(leaf.argument))
    return n_args, keywords, positional


def check_signature(model: Any, groups: Iterable[ExportGroup]) -> None:
    """Checks that ``model.forward`` still accepts the recorded calls, the same way.

    Args:
        model: The model to export.
        groups: The groups of its recordings.

    Raises:
        ReplayError: A recorded call no longer binds, a positional argument now lands in a
            differently named parameter, or a recorded parameter is gone; the message names it.

    Example:
        >>> check_signature(model, export_inputs("capture-store").groups)  # doctest: +SKIP
    """
    current = Signature.of(getattr(model, "forward", model))
    for group in groups:
        structure = group.structure
        recorded = structure.checked_params()
        if [(p.name, p.kind) for p in recorded] == [(p.name, p.kind) for p in current]:
            continue
        n_args, keywords, positional = _recorded_keywords(structure)
        where = f"group {group.name} of model {group.model_name}"
        for i, name in enumerate(positional):
            now = current.name_at(i)
            if name in recorded.plain and now != name:
                raise ReplayError(
                    f"model.forward no longer matches the recordings: args[{i}] was recorded as "
                    f"parameter {name!r}, forward now names it {now!r} ({where})"
                )
        for name in keywords:
            # A parameter the library renamed since (capture.renames) is not gone: the old name
            # still reaches it (the program is exported taking it as recorded).
            renamed = same_argument(name, current.plain) is not None
            if name in recorded.plain and name not in current.plain and not renamed:
                raise ReplayError(
                    f"model.forward no longer matches the recordings: parameter {name!r} "
                    f"is gone ({where} passes it)"
                )
        try:
            current.check(n_args, keywords)
        except TypeError as e:
            raise ReplayError(
                f"model.forward no longer matches the recordings: {e} ({where} passes "
                f"{n_args} positional argument(s) and {', '.join(keywords) or 'no keyword'})"
            ) from e
