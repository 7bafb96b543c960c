"""capture.signature: the one binder binds as ``inspect.Signature.bind`` does."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capture.errors import ReplayError
from capture.signature import (
    KEYWORD_ONLY,
    POSITIONAL_ONLY,
    POSITIONAL_OR_KEYWORD,
    VAR_KEYWORD,
    VAR_POSITIONAL,
    Param,
    Signature,
)


@st.composite
def _signature(draw: st.DrawFn) -> Signature:
    """A signature Python accepts: kinds in order, defaults only after the positional ones
    without, unique names."""
    names = iter(f"p{i}" for i in range(20))
    params: list[Param] = []
    defaulted = False
    for kind in (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD):
        for _ in range(draw(st.integers(0, 3))):
            defaulted = defaulted or draw(st.booleans())
            params.append(Param(next(names), kind, defaulted))
    if draw(st.booleans()):
        params.append(Param("rest", VAR_POSITIONAL, False))
    for _ in range(draw(st.integers(0, 2))):
        params.append(Param(next(names), KEYWORD_ONLY, draw(st.booleans())))
    if draw(st.booleans()):
        params.append(Param("extra", VAR_KEYWORD, False))
    return Signature(tuple(params))


@settings(max_examples=200, deadline=None)
@given(
    _signature(),
    st.integers(0, 6),
    st.lists(st.sampled_from(["p0", "p2", "p3", "p5", "p7", "other", "rest"]), unique=True),
)
def test_missing_and_positional_names_follow_inspect_bind(
    sig: Signature, n_args: int, keywords: list[str]
) -> None:
    reference = sig.to_inspect()
    try:
        bound = reference.bind(*range(n_args), **dict.fromkeys(keywords))
    except TypeError:
        with pytest.raises(TypeError):  # `check` is bind itself: it refuses the same calls
            sig.check(n_args, keywords)
        return
    sig.check(n_args, keywords)
    unbound = [
        p.name
        for p in reference.parameters.values()
        if p.name not in bound.arguments and p.default is not p.empty
    ]
    assert [p.name for p in sig.missing(n_args, keywords)] == unbound
    by_position = {v: k for k, v in bound.arguments.items() if isinstance(v, int)}
    assert [sig.name_at(i) for i in range(n_args)] == [by_position.get(i) for i in range(n_args)]
    through_kwargs = list(bound.arguments.get("extra", {})) if sig.var_keyword else []
    assert sig.extra_keywords(keywords) == through_kwargs


@settings(max_examples=50, deadline=None)
@given(_signature())
def test_a_stored_signature_reads_back_equal(sig: Signature) -> None:
    assert Signature.loads(sig.dumps()) == sig


def test_the_stored_json_keeps_kind_names() -> None:
    sig = Signature.of(lambda x, y=1: x)
    assert sig.dumps() == (
        '[{"name": "x", "kind": "POSITIONAL_OR_KEYWORD", "has_default": false}, '
        '{"name": "y", "kind": "POSITIONAL_OR_KEYWORD", "has_default": true}]'
    )


@pytest.mark.parametrize(
    "text",
    [
        "[{]",
        '[{"name": "x", "kind": "SOMETIMES", "has_default": false}]',
        '[{"name": "x", "kind": "VAR_KEYWORD", "has_default": false}, '
        '{"name": "y", "kind": "POSITIONAL_ONLY", "has_default": false}]',
        '[{"name": "x"}]',
    ],
    ids=["not-json", "unknown-kind", "kinds-out-of-order", "no-kind"],
)
def test_a_malformed_stored_signature_is_one_replay_error(text: str) -> None:
    with pytest.raises(ReplayError, match="signature is malformed"):
        Signature.loads(text)


def test_a_function_without_a_signature_names_nothing() -> None:
    sig = Signature.of(dict.fromkeys)  # a C function inspect may not read
    if sig.params:  # some Pythons can: then it binds like any other
        assert sig.names == tuple(inspect.signature(dict.fromkeys).parameters)
    assert Signature().positional_name(2) == "args[2]"


def test_star_args_elements_are_named_by_the_star_args_parameter() -> None:
    def forward(x: Any, *rest: Any) -> None: ...

    sig = Signature.of(forward)
    assert [sig.positional_name(i) for i in range(3)] == ["x", "rest[0]", "rest[1]"]
    assert sig.is_var_element("rest[1]") and sig.order("rest[1]") > sig.order("x")
