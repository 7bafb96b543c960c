"""Bucket sizes from recorded traffic: the N sizes that minimise padded work (`capture buckets`).

A serving engine that captures CUDA graphs (vLLM ``cudagraph_capture_sizes`` / ``compile_sizes``,
SGLang ``--cuda-graph-bs``) or compiles per sequence length runs each call at the smallest
captured size that holds it: a batch of 5 runs as 8 when the captured sizes are 4 and 8. The
padding (3 here) is wasted work. Given the recorded distribution of one shared symbol (its
sizes and how many calls had each), `optimal_buckets` picks the ``budget`` sizes that minimise

    waste = sum over calls of (bucket(size) - size)

exactly, by 1-D dynamic programming; the largest bucket is the largest recorded size, so every
recorded call fits. An optimal set only ever uses recorded sizes (a bucket between two recorded
sizes can move down to the lower one and pad less), so the program runs over the distinct sizes:
``best[k][j]`` = least waste covering the ``j`` smallest sizes with ``k`` buckets, the last one at
size ``j``. Each layer is a lower envelope of lines queried at increasing sizes (the convex
hull trick), so the cost is ``O(budget x distinct sizes)`` with exact integer arithmetic.

The distribution is `capture.analysis.symbol_sizes.symbol_sizes`: every group that has one of the
symbol's dims, including those where it never varied (a group whose batch was always 1 counts
its calls at 1; the result names the groups it counted), from the groups' distinct
signatures and call counts (the ``stats`` rows), never from the raw calls. Imports pyarrow only
(numpy through the analysis), never torch or duckdb.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from capture.errors import NoSuchSymbol

if TYPE_CHECKING:
    from capture.analysis.groups import Group
    from capture.store.reader import StoreReader

__all__ = [
    "BUCKETS_SCHEMA",
    "METADATA_BUCKETS",
    "BucketPlan",
    "NoSuchSymbol",
    "buckets_table",
    "default_symbol",
    "optimal_buckets",
    "padding_waste",
    "plan_buckets",
    "vllm_default_sizes",
]

BUCKETS_SCHEMA = pa.schema(
    [
        pa.field("bucket", pa.int64()),
        pa.field("calls", pa.int64()),
        pa.field("smallest", pa.int64()),
        pa.field("padding", pa.int64()),
    ]
)
"""One row per chosen size: the size, the calls that run at it, the smallest recorded size
padded up to it, and the padding those calls waste (sum of ``bucket - size`` over them)."""

METADATA_BUCKETS = b"capture.buckets"
"""Schema metadata key of `buckets_table`'s result: JSON of `BucketPlan.summary()`."""


def vllm_default_sizes(max_size: int = 512) -> list[int]:
    """vLLM's default CUDA-graph capture sizes (``VllmConfig._set_cudagraph_sizes``).

    ``[1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)``, where vLLM's max is
    ``min(max_num_seqs * 2, 512)``: 512 with the default ``max_num_seqs`` of 256.

    Args:
        max_size: vLLM's ``max_cudagraph_capture_size``.

    Returns:
        The sizes, ascending.

    Example:
        >>> vllm_default_sizes()[:6], len(vllm_default_sizes())
        ([1, 2, 4, 8, 16, 24], 51)
    """
    sizes = [s for s in (1, 2, 4) if s <= max_size]
    if max_size >= 8:
        sizes += list(range(8, min(max_size + 1, 256), 8))
    if max_size >= 256:
        sizes += list(range(256, max_size + 1, 16))
    return sorted(set(sizes))


def _check(values: Sequence[int], weights: Sequence[int]) -> None:
    if len(values) != len(weights):
        raise ValueError(f"{len(values)} sizes but {len(weights)} weights")
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise ValueError("sizes must be distinct and ascending")
    if any(w <= 0 for w in weights):
        raise ValueError("every weight (call count) must be positive")


def optimal_buckets(values: Sequence[int], weights: Sequence[int], budget: int) -> list[int]:
    """The at most `budget` sizes that minimise the padding of the recorded calls.

    Args:
        values: Distinct recorded sizes, ascending.
        weights: Calls per size (positive).
        budget: How many sizes may be chosen (at least 1).

    Returns:
        The chosen sizes, ascending; the last one is ``values[-1]``. When there are no more
        distinct sizes than `budget`, every recorded size (no padding at all).

    Raises:
        ValueError: Bad arguments (unsorted sizes, non-positive weights or budget).

    Example:
        >>> optimal_buckets([1, 2, 3, 8], [10, 1, 1, 5], 2)
        [1, 8]
    """
    _check(values, weights)
    if budget < 1:
        raise ValueError(f"the budget must be at least 1, not {budget}")
    m = len(values)
    if m == 0:
        return []
    if budget >= m:
        return list(values)
    v = [int(x) for x in values]
    # Prefix sums: W[j] calls and S[j] work of the j smallest sizes.
    W = [0] * (m + 1)
    S = [0] * (m + 1)
    for j in range(m):
        W[j + 1] = W[j] + int(weights[j])
        S[j + 1] = S[j] + int(weights[j]) * v[j]
    # best[j]: least waste covering sizes 0..j-1 with the last bucket at size j-1.
    # One bucket: everything pads to v[j-1].
    best = [0] + [v[j - 1] * W[j] - S[j] for j in range(1, m + 1)]
    back: list[list[int]] = []
    for _ in range(2, budget + 1):
        # new[j] = min over i < j of best[i] + v[j-1] * (W[j] - W[i]) - (S[j] - S[i])
        #        = v[j-1] * W[j] - S[j] + min_i (best[i] + S[i] - v[j-1] * W[i]),
        # with best[0] = 0 (no earlier bucket: "at most k buckets"). Lines
        # y = -W[i] x + (best[i] + S[i]) have strictly decreasing slopes in i and are queried
        # at increasing x = v[j-1]: a monotone lower envelope, exact integer comparisons.
        new = [0] * (m + 1)
        arg = [0] * (m + 1)
        hull: list[int] = []
        head = 0
        for j in range(1, m + 1):
            i = j - 1  # line i is usable for every j > i
            while len(hull) - head >= 2 and _useless(hull[-2], hull[-1], i, W, S, best):
                hull.pop()
            hull.append(i)
            head = min(head, len(hull) - 1)
            x = v[j - 1]
            while head + 1 < len(hull) and _value(hull[head + 1], x, W, S, best) <= _value(
                hull[head], x, W, S, best
            ):
                head += 1
            new[j] = _value(hull[head], x, W, S, best) + x * W[j] - S[j]
            arg[j] = hull[head]
        best = new
        back.append(arg)
    sizes = [v[m - 1]]
    j = m
    for arg in reversed(back):
        j = arg[j]
        if j == 0:
            break
        sizes.append(v[j - 1])
    return sorted(sizes)


def _value(i: int, x: int, W: list[int], S: list[int], best: list[int]) -> int:
    return best[i] + S[i] - x * W[i]


def _useless(a: int, b: int, c: int, W: list[int], S: list[int], best: list[int]) -> bool:
    """Line b never beats both a and c (slopes -W[a] > -W[b] > -W[c])."""
    # Intersection x of (a, c) <= intersection x of (a, b)  <=>  b is never the minimum.
    ia, ib, ic = best[a] + S[a], best[b] + S[b], best[c] + S[c]
    # x_ab = (ib - ia) / (W[b] - W[a]); x_ac = (ic - ia) / (W[c] - W[a]); both denominators > 0.
    return (ic - ia) * (W[b] - W[a]) <= (ib - ia) * (W[c] - W[a])


def padding_waste(
    values: Sequence[int], weights: Sequence[int], buckets: Sequence[int]
) -> tuple[int, int]:
    """Padding of the recorded calls under `buckets`, and how many calls no bucket holds.

    Args:
        values: Distinct recorded sizes.
        weights: Calls per size.
        buckets: Candidate sizes (any order).

    Returns:
        ``(waste, uncovered)``: the sum of ``bucket - size`` over the calls that fit a bucket,
        and the number of calls larger than every bucket (they would run without one).

    Example:
        >>> padding_waste([1, 3, 9], [4, 2, 1], [1, 4])
        (2, 1)
    """
    ordered = sorted(set(int(b) for b in buckets))
    waste = uncovered = 0
    k = 0
    for size, calls in sorted(zip(values, weights, strict=True)):
        while k < len(ordered) and ordered[k] < size:
            k += 1
        if k == len(ordered):
            uncovered += int(calls)
        else:
            waste += (ordered[k] - int(size)) * int(calls)
    return waste, uncovered


@dataclass(frozen=True)
class BucketPlan:
    """The chosen sizes for one symbol, with the padding they cost and vLLM's for comparison."""

    model_name: str
    symbol: str
    kind: str
    groups: list[str]
    sizes: list[int]
    calls: list[int]
    budget: int
    buckets: list[int]
    waste: int
    vllm_sizes: list[int]
    vllm_waste: int
    vllm_uncovered: int

    @property
    def work(self) -> int:
        """Useful work: the sum of the recorded sizes over the calls."""
        return sum(s * c for s, c in zip(self.sizes, self.calls, strict=True))

    @property
    def total_calls(self) -> int:
        """Recorded calls the distribution stands for."""
        return sum(self.calls)

    def summary(self) -> dict[str, Any]:
        """JSON-serializable totals (the ``capture.buckets`` metadata of `buckets_table`)."""
        return {
            "model": self.model_name,
            "symbol": self.symbol,
            "measures": self.kind,
            "groups": self.groups,
            "calls": self.total_calls,
            "distinct_sizes": len(self.sizes),
            "min": self.sizes[0],
            "max": self.sizes[-1],
            "budget": self.budget,
            "buckets": self.buckets,
            "work": self.work,
            "padding": self.waste,
            "vllm_sizes": self.vllm_sizes,
            "vllm_padding": self.vllm_waste,
            "vllm_uncovered_calls": self.vllm_uncovered,
        }

    def rows(self) -> list[dict[str, int]]:
        """One row per chosen size (`BUCKETS_SCHEMA`)."""
        out = []
        k = 0
        for b in self.buckets:
            calls = padding = 0
            smallest = None
            while k < len(self.sizes) and self.sizes[k] <= b:
                smallest = self.sizes[k] if smallest is None else smallest
                calls += self.calls[k]
                padding += (b - self.sizes[k]) * self.calls[k]
                k += 1
            out.append({"bucket": b, "calls": calls, "smallest": smallest or b, "padding": padding})
        return out


def plan_buckets(
    groups: Sequence[Group], symbol: str, budget: int, model_name: str = ""
) -> BucketPlan:
    """Optimal buckets for `symbol` over `groups`, and vLLM's default ladder cut to `budget`.

    Raises:
        NoSuchSymbol: No group has the symbol.
        ValueError: `budget` < 1.
    """
    from capture.analysis.symbol_sizes import symbol_sizes

    distribution = symbol_sizes(groups, symbol)
    sizes, calls = distribution.sizes, distribution.calls
    found = [name for name, _, _ in distribution.groups]
    chosen = optimal_buckets(sizes, calls, budget)
    waste, _ = padding_waste(sizes, calls, chosen)
    ladder = vllm_default_sizes()[:budget]
    vllm_waste, vllm_uncovered = padding_waste(sizes, calls, ladder)
    return BucketPlan(
        model_name=model_name,
        symbol=symbol,
        kind=distribution.kind,
        groups=found,
        sizes=sizes,
        calls=calls,
        budget=budget,
        buckets=chosen,
        waste=waste,
        vllm_sizes=ladder,
        vllm_waste=vllm_waste,
        vllm_uncovered=vllm_uncovered,
    )


def default_symbol(groups: Sequence[Group]) -> str:
    """The symbol `capture buckets` sizes without --symbol: the only free symbol of `groups`,
    else their one batch symbol (the sizes vLLM's and SGLang's CUDA graphs are captured for).

    Raises:
        NoSuchSymbol: No dim varies, or several symbols and not exactly one batch symbol
            among them; the message lists them.
    """
    from capture.analysis.symbol_sizes import BATCH, model_symbols, symbol_kind

    symbols = model_symbols(groups)
    if len(symbols) == 1:
        return symbols[0]
    if not symbols:
        raise NoSuchSymbol("no dim varies in the recorded calls: there is nothing to bucket")
    batches = [
        s
        for s in symbols
        if any(symbol_kind(g, s) == BATCH for g in groups if any(d.symbol == s for d in g.dims))
    ]
    if len(batches) == 1:
        return batches[0]
    raise NoSuchSymbol(
        f"the calls have {len(symbols)} symbols ({', '.join(symbols)}) and "
        f"{'no batch symbol' if not batches else 'several batch symbols'}; pass --symbol with "
        "one of them (see `capture dims`)"
    )


def _model_groups(
    store: StoreReader, model_name: str | None, group: str | None
) -> tuple[str, list[Group]]:
    from capture.analysis.groups import analyze
    from capture.errors import UnknownModel

    model_names = store.check_model(model_name)
    if len(model_names) > 1:
        raise UnknownModel(
            f"the store at {store.path} holds several models ({', '.join(model_names)}); "
            "pass --model with one of them"
        )
    groups = analyze(store, model_names[0])
    if group is not None:
        chosen = [g for g in groups if g.name == group]
        if not chosen:
            names = ", ".join(g.name for g in groups) or "none"
            raise UnknownModel(
                f"model {model_names[0]!r} has no call group {group!r} (groups: {names}); "
                "pass --group with one of them"
            )
        groups = chosen
    return model_names[0], groups


def buckets_table(
    store: StoreReader,
    symbol: str | None,
    budget: int,
    *,
    model_name: str | None = None,
    group: str | None = None,
) -> pa.Table:
    """`Store.buckets()`: the optimal sizes for one shared symbol, as a table.

    Args:
        store: An open store.
        symbol: A shared symbol as `capture dims` names it (``batch``, ``input_ids_1``); None
            for `default_symbol`: the only free symbol of the selected groups, else their
            batch symbol.
        budget: How many sizes to choose.
        model_name: The model; may be left out when the store holds one.
        group: Only this call group's calls. Default: every group having the symbol.

    Returns:
        One row per chosen size (`BUCKETS_SCHEMA`); the schema metadata key
        `METADATA_BUCKETS` holds the totals (`BucketPlan.summary`) as JSON.

    Raises:
        UnknownModel: No such model or group, or several models and none chosen.
        NoSuchSymbol: No selected group has the symbol, or `symbol` is None and the groups
            have none, or several and not exactly one batch symbol.

    Example:
        >>> buckets_table(open_store("store"), "batch", 4).column("bucket")  # doctest: +SKIP
    """
    if budget < 1:
        raise ValueError(f"the budget must be at least 1, not {budget}")
    name, groups = _model_groups(store, model_name, group)
    plan = plan_buckets(groups, symbol or default_symbol(groups), budget, model_name=name)
    table = pa.Table.from_pylist(plan.rows(), schema=BUCKETS_SCHEMA)
    return table.replace_schema_metadata({METADATA_BUCKETS: json.dumps(plan.summary())})
