"""Which parameter is positional and its name: a method's signature, and how a call binds to it.

The one binder of capture: the recorder names the positional leaves of a call and finds the
optionals it did not pass (`capture.record.flatten`), the seed API aligns calls by argument name
(`capture.seeds.alignment`), replay decides a program's call form (`replay.inputs.shapes`) and
checks that ``model.forward`` still accepts the recorded calls (`replay.pipeline.binding`), and the
store keeps the signature as JSON (the ``signature`` column, read back by
`capture.pytree.recorded_structure.RecordedStructure`): all of them ask a `Signature`. A parameter's
kind is ``inspect.Parameter.kind``; binding follows ``inspect.Signature.bind`` (positional arguments
fill the positional parameters in order, then ``*args``; keywords fill their parameters, then
``**kwargs``), and `Signature.check` is ``bind`` itself. Imports nothing but the standard library
(the store side reads signatures without torch).

Example:
    >>> def forward(x, mask=None, *rest, scale=1.0, **extra): ...
    >>> sig = Signature.of(forward)
    >>> sig.positional, sig.var_positional, sig.var_keyword
    (('x', 'mask'), 'rest', 'extra')
    >>> [p.name for p in sig.missing(1, ["extra_key"])]
    ['mask', 'scale']
    >>> Signature.loads(sig.dumps()) == sig
    True
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from capture import untrusted
from capture.errors import ReplayError
from capture.renames import same_argument

__all__ = [
    "Kind",
    "POSITIONAL_ONLY",
    "POSITIONAL_OR_KEYWORD",
    "VAR_POSITIONAL",
    "KEYWORD_ONLY",
    "VAR_KEYWORD",
    "Param",
    "Signature",
]

Kind = inspect._ParameterKind
"""``inspect.Parameter.kind``'s type (the standard library names it only privately)."""

POSITIONAL_ONLY = inspect.Parameter.POSITIONAL_ONLY
POSITIONAL_OR_KEYWORD = inspect.Parameter.POSITIONAL_OR_KEYWORD
VAR_POSITIONAL = inspect.Parameter.VAR_POSITIONAL
KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY
VAR_KEYWORD = inspect.Parameter.VAR_KEYWORD

_KINDS = {
    k.name: k
    for k in (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD, VAR_POSITIONAL, KEYWORD_ONLY, VAR_KEYWORD)
}
_POSITIONAL = (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD)
_VARIADIC = (VAR_POSITIONAL, VAR_KEYWORD)


@dataclass(frozen=True, repr=False)
class Param:
    """One parameter of a method's signature (one item of the stored ``signature`` column).

    Attributes:
        name: The parameter name.
        kind: Its ``inspect.Parameter.kind`` (stored by name: ``"POSITIONAL_OR_KEYWORD"``).
        has_default: Whether it has a default value.
    """

    name: str
    kind: Kind
    has_default: bool

    @property
    def is_positional(self) -> bool:
        """True for a parameter a positional argument can fill (not ``*args``)."""
        return self.kind in _POSITIONAL

    @property
    def is_variadic(self) -> bool:
        """True for ``*args`` and ``**kwargs``."""
        return self.kind in _VARIADIC

    def __repr__(self) -> str:
        return f"Param({self.name!r}, {self.kind.name}, has_default={self.has_default})"


@dataclass(frozen=True)
class Signature:
    """A method's parameters, and what a call passing them binds to.

    Attributes:
        params: The parameters, in signature order (empty: unknown, nothing can be named).
        defaults: Parameter name -> default value; only for a live method (`of`), empty for a
            stored signature (`loads`), which keeps whether a default exists, not its value.
    """

    params: tuple[Param, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> Signature:
        """The signature of a function or bound method (empty when Python cannot tell).

        Example:
            >>> Signature.of(lambda x, y=2: x).params[1]
            Param('y', POSITIONAL_OR_KEYWORD, has_default=True)
        """
        try:
            parameters = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # a builtin or C function without a signature
            return cls()
        empty = inspect.Parameter.empty
        return cls(
            tuple(Param(p.name, p.kind, p.default is not empty) for p in parameters),
            {p.name: p.default for p in parameters if p.default is not empty},
        )

    @classmethod
    def loads(cls, text: str | None) -> Signature:
        """The signature stored as JSON (`dumps`); empty when none was recorded.

        Raises:
            ReplayError: The stored signature is malformed (one line, not a traceback).

        Example:
            >>> Signature.loads('[{"name": "x", "kind": "VAR_KEYWORD", "has_default": false}]')
            Signature(params=(Param('x', VAR_KEYWORD, has_default=False),))
        """
        if not text:
            return cls()
        try:
            params = tuple(
                Param(str(p["name"]), _KINDS[str(p["kind"])], bool(p["has_default"]))
                for p in untrusted.loads(text)
            )
            signature = cls(params)
            signature.to_inspect()  # the order of kinds and names is one Python accepts
        except (ValueError, TypeError, KeyError) as e:
            raise ReplayError(f"the recorded method signature is malformed ({e!r:.80})") from None
        return signature

    def dumps(self) -> str:
        """The JSON the store keeps: ``[{"name", "kind", "has_default"}, ...]``."""
        return json.dumps(
            [{"name": p.name, "kind": p.kind.name, "has_default": p.has_default} for p in self]
        )

    def to_inspect(self) -> inspect.Signature:
        """The same parameters as an ``inspect.Signature`` (defaults stand in as None).

        Raises:
            ValueError: The parameters are not in an order Python accepts.
        """
        empty = inspect.Parameter.empty
        return inspect.Signature(
            [
                inspect.Parameter(p.name, p.kind, default=None if p.has_default else empty)
                for p in self
            ]
        )

    def __iter__(self) -> Iterator[Param]:
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)

    # -- names ---------------------------------------------------------------------------------
    @cached_property
    def names(self) -> tuple[str, ...]:
        """Every parameter name, in signature order."""
        return tuple(p.name for p in self)

    @cached_property
    def positional(self) -> tuple[str, ...]:
        """The names positional arguments fill, in order (``*args`` excluded)."""
        return tuple(p.name for p in self if p.is_positional)

    @cached_property
    def positional_only(self) -> frozenset[str]:
        """The names only a positional argument can fill."""
        return frozenset(p.name for p in self if p.kind is POSITIONAL_ONLY)

    @cached_property
    def plain(self) -> tuple[str, ...]:
        """The names that are neither ``*args`` nor ``**kwargs``, in order."""
        return tuple(p.name for p in self if not p.is_variadic)

    @cached_property
    def var_positional(self) -> str | None:
        """The name of ``*args``, if any."""
        return next((p.name for p in self if p.kind is VAR_POSITIONAL), None)

    @cached_property
    def var_keyword(self) -> str | None:
        """The name of ``**kwargs``, if any."""
        return next((p.name for p in self if p.kind is VAR_KEYWORD), None)

    @cached_property
    def index(self) -> dict[str, int]:
        """Parameter name -> its index in the signature."""
        return {p.name: i for i, p in enumerate(self)}

    # -- binding -------------------------------------------------------------------------------
    def name_at(self, i: int) -> str | None:
        """The parameter the ``i``-th positional argument fills; None when it goes to
        ``*args`` or nowhere.

        Example:
            >>> sig = Signature.of(lambda x, *rest: x)
            >>> sig.name_at(0), sig.name_at(1)
            ('x', None)
        """
        return self.positional[i] if 0 <= i < len(self.positional) else None

    def positional_name(self, i: int) -> str:
        """The ``i``-th positional argument's name: its parameter, ``rest[k]`` for the k-th
        element of ``*rest``, ``args[i]`` when the method takes no such argument.

        Example:
            >>> Signature.of(lambda x, *rest: x).positional_name(2)
            'rest[1]'
        """
        name = self.name_at(i)
        if name is not None:
            return name
        if self.var_positional:
            return f"{self.var_positional}[{i - len(self.positional)}]"
        return f"args[{i}]"

    def is_var_element(self, name: str) -> bool:
        """True for a name `positional_name` gives an element of ``*args``."""
        return bool(self.var_positional) and name.startswith(f"{self.var_positional}[")

    def order(self, name: str) -> float:
        """Where an argument name sorts in signature order (``*args`` elements in their
        place, unknown names last)."""
        if name in self.index:
            return float(self.index[name])
        if self.var_positional and self.is_var_element(name):
            element = int(name.rsplit("[", 1)[1][:-1])
            return self.index[self.var_positional] + element / 1e6
        return float("inf")

    def missing(self, n_args: int, keywords: Iterable[str]) -> list[Param]:
        """The optional parameters a call passing `n_args` positional arguments and
        `keywords` leaves to their defaults (what ``bind`` leaves unbound, ``*args`` and
        ``**kwargs`` aside)."""
        bound = set(self.positional[:n_args]) | (set(keywords) & self.keyword_names)
        return [p for p in self if p.has_default and not p.is_variadic and p.name not in bound]

    @cached_property
    def keyword_names(self) -> frozenset[str]:
        """The names a keyword argument can fill (neither positional-only nor variadic)."""
        return frozenset(p.name for p in self if p.kind in (POSITIONAL_OR_KEYWORD, KEYWORD_ONLY))

    def keyword_order(self, keywords: Iterable[str]) -> tuple[str, ...] | None:
        """The canonical order of a call's keywords, None when they come in it already.

        Python keyword order carries no meaning (``f(a=1, b=2)`` is ``f(b=2, a=1)``), so a
        call's structure takes its keywords in one order: the parameters' order in the
        signature (the order ``inspect.Signature.bind`` and torch.export bind them in; a
        renamed argument's other spelling, `capture.renames`, in its parameter's place), then
        the keywords it declares no parameter for (``**kwargs``), by name.

        Example:
            >>> Signature.of(lambda x, mask=None, **extra: x).keyword_order(["z", "mask", "x"])
            ('x', 'mask', 'z')
            >>> Signature.of(lambda x, mask=None: x).keyword_order(["x", "mask"]) is None
            True
        """
        given = tuple(keywords)
        index = self.index

        def place(name: str) -> tuple[int, str]:
            # a renamed argument passed under its other spelling takes its parameter's place
            declared = same_argument(name, index) or name
            return index.get(declared, len(index)), name

        ordered = tuple(sorted(given, key=place))
        return None if ordered == given else ordered

    def extra_keywords(self, keywords: Iterable[str]) -> list[str]:
        """The keywords the method takes only through its ``**kwargs`` (none without one):
        every keyword that names no parameter a keyword can fill."""
        if self.var_keyword is None:
            return []
        return [k for k in keywords if k not in self.keyword_names]

    def check(self, n_args: int, keywords: Iterable[str]) -> None:
        """Checks that a call passing `n_args` positional arguments and `keywords` binds.

        Raises:
            TypeError: ``inspect.Signature.bind``'s, saying why it does not.

        Example:
            >>> Signature.of(lambda x: x).check(2, [])
            Traceback (most recent call last):
            TypeError: too many positional arguments
        """
        self.to_inspect().bind(*([None] * n_args), **dict.fromkeys(keywords))
