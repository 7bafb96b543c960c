"""A guard's flat checks (`replay.runtime.guards.Plan`) accept exactly the calls its full check
accepts, and drop only size conditions the other checks imply."""

from __future__ import annotations

import itertools
import random

import pytest

from replay.runtime.conditions import Condition
from replay.runtime.guards import MAX_CASES, Axis, ProgramGuard, Relation, implied


def _guard(axes: list[Axis], relations=(), conditions=(), rejected=None) -> ProgramGuard:
    return ProgramGuard(
        "", "g0", "g0", None, (), tuple(axes), tuple(relations), rejected or {}, tuple(conditions)
    )


def _cond(expr: str) -> Condition:
    return Condition(expr, f"<{expr}>")


def _decode_like() -> ProgramGuard:
    """A decode step's guard as torch.export and the recordings give it: batch shared by the
    ids, the mask and the cache; past length shared by both cache layers; mask = past + 1."""
    axes = [
        Axis("kwargs['input_ids']", 0, 1, 4, True, "batch"),
        Axis("kwargs['input_ids']", 1, 1, 1, False),
        Axis("kwargs['cache'][0]", 0, 1, 4, True, "batch"),
        Axis("kwargs['cache'][0]", 2, 3, 12, True, "past"),
        Axis("kwargs['cache'][1]", 0, 1, 4, True, "batch"),
        Axis("kwargs['cache'][1]", 2, 3, 12, True, "past"),
        Axis("kwargs['attention_mask']", 0, 1, 4, True, "batch"),
        Axis("kwargs['attention_mask']", 1, 4, 13, True, "mask"),
    ]
    conditions = [
        _cond("(d0) == (d2)"),  # one symbol: implied
        _cond("(1 + (d3)) == (1 + (d5))"),  # one symbol: implied
        _cond("1 + (d3) + ((-1)*(d7)) <= 0"),  # mask = past + 1: implied
        _cond("min(256 + 256*(d3), 512 + 512*(d3)) == (256 + 256*(d3))"),  # any size >= 0
        _cond("(16*d3) != 80"),  # a hole at past = 5: kept
    ]
    return _guard(axes, [Relation("mask", ("past",), 1)], conditions)


def test_torch_s_guards_implied_by_symbols_relations_and_ranges_are_dropped() -> None:
    guard = _decode_like()
    assert [c.expr for c in guard._plan.conditions] == ["(16*d3) != 80"]


def test_the_flat_checks_agree_with_the_full_check_on_every_size() -> None:
    guard = _decode_like()
    seen = {True: 0, False: 0}
    for batch, past, mask, one in itertools.product(
        range(0, 6), range(2, 14), range(3, 15), (1, 2)
    ):
        for other_batch in (batch, batch + 1):
            dims = [batch, one, batch, past, other_batch, past, batch, mask]
            full = guard._failure(dims)
            assert guard.check(dims) == full
            assert guard._plan.accepts(dims) is (full is None)
            seen[full is None] += 1
    assert seen[True] and seen[False]  # the box holds calls of both kinds
    assert (
        guard.check([2, 1, 2, 5, 2, 5, 2, 6]) == "its program's guard <(16*d3) != 80> does not hold"
    )


def test_random_guards_accept_exactly_what_their_full_check_accepts() -> None:
    rng = random.Random(0)
    templates = [
        "(d{a}) == (d{b})",
        "(d{a}) <= {k} + (d{b})",
        "{k}*(d{a}) != {m}",
        "max(d{a}, d{b}) <= {m}",
        "min({k} + d{a}, d{b}) >= 2",
        "(d{a}) % {k} == 0 or d{b} > {k}",
        "(d{a}) + (d{b}) == {m}",
    ]
    checked = dropped = kept = 0
    for _ in range(150):
        n = rng.randint(2, 4)
        symbols = [rng.choice([None, "s", "t"]) for _ in range(n)]
        axes = []
        for i in range(n):
            lo = rng.randint(0, 4)
            dynamic = rng.random() < 0.8
            axes.append(Axis(f"x{i}", 0, lo, lo + rng.randint(0, 5), dynamic, symbols[i]))
        relations = [Relation("t", ("s",), rng.randint(-1, 2))] if rng.random() < 0.3 else []
        conditions = [
            _cond(
                rng.choice(templates).format(
                    a=rng.randrange(n),
                    b=rng.randrange(n),
                    k=rng.randint(1, 4),
                    m=rng.randint(2, 12),
                )
            )
            for _ in range(rng.randint(0, 3))
        ]
        guard = _guard(axes, relations, conditions)
        kept += len(guard._plan.conditions)
        dropped += len(conditions) - len(guard._plan.conditions)
        for dims in itertools.product(*(range(max(0, a.min - 1), a.max + 2) for a in axes)):
            assert guard.check(list(dims)) == guard._failure(list(dims)), (guard, dims)
            checked += 1
    assert checked > 10_000 and dropped and kept  # both kinds of condition were met


def test_a_condition_over_too_many_combinations_is_kept_not_guessed() -> None:
    axes = [Axis("x", 0, 0, 4096, True), Axis("y", 0, 0, 4096, True)]
    condition = _cond("(d0) + (d1) >= 0")  # true everywhere, but 4097**2 > MAX_CASES
    assert 4097**2 > MAX_CASES
    assert not implied(condition, (0, 0), (4096, 4096), [], [], 2)
    assert _guard(axes, conditions=[condition])._plan.conditions == (condition,)


def test_an_empty_range_implies_everything_and_refuses_everything() -> None:
    # a symbol whose axes' ranges do not overlap: no call passes, so no condition matters
    axes = [Axis("x", 0, 1, 2, True, "s"), Axis("y", 0, 5, 6, True, "s")]
    guard = _guard(axes, conditions=[_cond("(d0) == 99")])
    assert guard._plan.conditions == ()
    for dims in itertools.product(range(0, 8), repeat=2):
        assert guard.check(list(dims)) is not None


@pytest.mark.parametrize("signature", [(2, 1, 2, 5, 2, 5, 2, 6), (2, 1, 2, 6, 2, 6, 2, 7)])
def test_a_rejected_signature_is_refused_before_the_flat_checks(signature: tuple) -> None:
    base = _decode_like()
    guard = _guard(list(base.axes), base.relations, base.conditions, {signature: "mismatch 0.3"})
    assert guard.check(list(signature)) == (
        "this recorded signature failed the export's check (mismatch 0.3)"
    )
