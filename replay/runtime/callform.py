"""How a group's program is called: which entries go positionally, by keyword, through ``**kwargs``.

The export job decides a group's call form (`call_form`), arranges its example arguments in it
(`arrange`) and shapes its ``dynamic_shapes`` after it (`shapes_of`); the runtime arranges every
served call the same way, so the form lives on the bottom floor, where both read it. Positional
arguments stay positional unless ``keyword_only``; ``dynamic_shapes`` is a tuple when the program
takes positional arguments only, else a dict keyed by parameter name (positional ones included,
as torch.export binds them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from capture.errors import ReplayError
from capture.signature import Signature

__all__ = ["CallForm", "call_form", "arrange", "shapes_of"]


@dataclass(frozen=True)
class CallForm:
    """How a group's program is called.

    Attributes:
        positional: Names of the entries passed positionally, in order.
        keywords: Names of the entries passed by keyword, in order.
        extra: Keyword names the recorded method only takes through ``**kwargs``: torch.export
            (2.13) cannot match `dynamic_shapes` to such entries, so the program is exported from a
            wrapper that names them (`replay.inputs.builder.ExportGroup.module`).
        var_positional: Name of ``*args`` when positional entries go past the named parameters.
    """

    positional: tuple[str, ...]
    keywords: tuple[str, ...]
    extra: tuple[str, ...] = ()
    var_positional: str | None = None


def call_form(
    n_args: int, keywords: Sequence[str], signature: Signature, *, keyword_only: bool = False
) -> CallForm:
    """The call form of a group: which names go positionally, by keyword, through ``**kwargs``.

    Args:
        n_args: How many arguments the group's calls pass positionally.
        keywords: The keywords they pass.
        signature: The recorded method's signature (`capture.signature`: it names the
            positional arguments and tells which keywords go through ``**kwargs``).
        keyword_only: Pass the positional arguments by keyword.

    Raises:
        ReplayError: ``keyword_only`` is asked for a call passing ``*args`` entries, or the
            positional arguments cannot be named (no recorded signature).

    Example:
        >>> from capture.signature import Signature
        >>> call_form(1, ["mask"], Signature.of(lambda x, mask=None: x))
        CallForm(positional=('x',), keywords=('mask',), extra=(), var_positional=None)
    """
    positional = [signature.name_at(i) or f"args[{i}]" for i in range(n_args)]
    extra_positional = n_args > len(signature.positional)
    if n_args and not signature.params:
        raise ReplayError(
            "the store has no forward signature for this model, so its positional arguments "
            "cannot be named; record again with a current capture"
        )
    extra = tuple(signature.extra_keywords(keywords))
    var_pos = signature.var_positional
    if keyword_only and n_args:
        if extra_positional or signature.positional_only & set(positional):
            raise ReplayError(
                "keyword_only: the recorded calls pass positional-only or *args entries, "
                "which cannot move to keyword arguments"
            )
        return CallForm((), tuple(positional) + tuple(keywords), extra)
    return CallForm(
        tuple(positional), tuple(keywords), extra, var_pos if extra_positional else None
    )


def arrange(
    form: CallForm, args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Moves recorded ``(args, kwargs)`` values into the group's call form (positional ones to
    keyword arguments under ``keyword_only``); `kwargs` may hold added entries."""
    if form.positional or not args:
        return tuple(args), dict(kwargs)
    moved = dict(zip(form.keywords, args, strict=False))
    moved.update(kwargs)
    return (), moved


def shapes_of(form: CallForm, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """The top-level `dynamic_shapes`: a tuple for positional-only calls, else a dict by name."""
    named = [n for n in form.positional if not n.startswith("args[")]
    if not kwargs:
        if form.var_positional is not None:
            return tuple(args[: len(named)]) + (tuple(args[len(named) :]),)
        return tuple(args)
    out: dict[str, Any] = {}
    out.update(zip(named, args, strict=False))
    if form.var_positional is not None:
        out[form.var_positional] = tuple(args[len(named) :])
    out.update(kwargs)
    return out
