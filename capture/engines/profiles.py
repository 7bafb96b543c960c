"""Optimization profiles from recorded traffic: min / opt / max per input (`capture profiles`).

TensorRT (trtexec ``--minShapes/--optShapes/--maxShapes``, ``torch_tensorrt.Input``, ONNX
Runtime's TensorRT provider ``trt_profile_*_shapes``) builds an engine for a range of shapes and
tunes its kernels for one shape in it, *opt*. Per call group (one exported program each):

- **min / max** of every input axis are the smallest and largest sizes recorded;
- **opt** is a signature production actually sent, never a per-axis mix: for every free shared
  symbol (``batch``, a sequence length, a cache length; derived symbols follow their relation)
  a target is taken from the recorded distribution, weighted by calls (``mode``: the size with
  the most calls, ties to the smaller; ``p50``/``p90``: the smallest size whose cumulative share
  of calls reaches 50 % / 90 %), and opt is the recorded signature nearest to those targets
  (sum over symbols of ``|size - target| / (max - min)``), ties to the signature with more
  calls, then to the smaller sizes;
- **several profiles** when the distribution has several peaks: the free symbol with the most
  peaks is cut into at most ``max_profiles`` ranges (as many as it has peaks) at the points that
  minimise padded work (`capture.engines.buckets.optimal_buckets`), and each range gets its own
  min / opt / max. A *peak* is a local maximum of the calls per power-of-two size bin
  (``[1]``, ``[2, 3]``, ``[4, 7]``, ...) separated from the next one by a bin holding less
  than half the smaller of the two.

**Input names** are the names `torch.export` gives the program's user inputs (placeholder
names): the flattened leaf path after binding to the forward signature, parts joined with
``_`` and lowercased (``input_ids``, ``past_key_values_key_cache_0``); ``torch.onnx.export``
(dynamo) keeps them as the ONNX graph's input names, which is what trtexec and ONNX Runtime
take. Only tensor inputs appear (scalars become constants, missing inputs are not inputs).

Reads the call groups of `capture.analysis.groups` (the ``stats`` rows), never the raw calls; no
torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from capture.engines.buckets import optimal_buckets
from capture.pytree.recorded_structure import RecordedLeaf, as_leaves

if TYPE_CHECKING:
    from capture.analysis.groups import Group
    from capture.store.reader import StoreReader

__all__ = [
    "OPT_CHOICES",
    "PROFILES_SCHEMA",
    "InputRange",
    "Profile",
    "build_profiles",
    "count_peaks",
    "export_names",
    "profiles_table",
    "profiles_to_table",
    "store_profiles",
    "target_size",
]

OPT_CHOICES = ("mode", "p50", "p90")
"""How opt is chosen per shared symbol (see the module docstring)."""

PROFILES_SCHEMA = pa.schema(
    [
        pa.field("model", pa.string()),
        pa.field("group", pa.string()),
        pa.field("profile", pa.int32()),
        pa.field("input", pa.string()),
        pa.field("path", pa.string()),
        pa.field("dtype", pa.string()),
        pa.field("min_shape", pa.list_(pa.int64())),
        pa.field("opt_shape", pa.list_(pa.int64())),
        pa.field("max_shape", pa.list_(pa.int64())),
        pa.field("calls", pa.int64()),
        pa.field("opt_calls", pa.int64()),
    ]
)
"""Columns of `profiles_table()` / `Store.profiles()`: one row per profile and tensor input;
``calls`` is the profile's calls, ``opt_calls`` those sent with exactly the opt signature."""

_PATH_PART = re.compile(r"\[(\d+)\]|\['((?:[^'\\]|\\.)*)'\]|\[\"((?:[^\"\\]|\\.)*)\"\]|\.(\w+)")


@dataclass(frozen=True)
class InputRange:
    """One tensor input of a profile."""

    name: str
    path: str
    dtype: str | None
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """min / opt / max for every tensor input of one call group (or of one range of it)."""

    model_name: str
    group: str
    index: int
    calls: int
    opt_calls: int
    inputs: list[InputRange]


def _parts(path: str) -> list[str]:
    """Key path -> its parts: ``kwargs['a'].b[0]`` -> ``['kwargs', 'a', 'b', '0']``."""
    head = re.match(r"\w+", path)
    out = [head.group(0)] if head else []
    for m in _PATH_PART.finditer(path, head.end() if head else 0):
        index, single, double, attr = m.groups()
        out.append(index if index is not None else single or double or attr or "")
    return out


def export_names(leaves: Iterable[RecordedLeaf | Mapping[str, Any]]) -> dict[int, str]:
    """Leaf index -> the placeholder name `torch.export` gives that tensor input.

    The path's top level (``args[i]`` / ``kwargs['name']``) becomes the forward parameter's
    name (the ``argument`` column), the other parts follow as torch names them (mapping keys
    with every non-alphanumeric character as ``_``, sequence indices, attribute names), joined
    with ``_`` and lowercased; a name already taken gets ``_1``, ``_2``, ... as torch does.

    Example:
        >>> rows = [{"leaf": 0, "kind": "tensor", "path": "kwargs['past_key_values'].key_cache[0]",
        ...          "argument": "past_key_values"}]
        >>> export_names(rows)
        {0: 'past_key_values_key_cache_0'}
    """
    names: dict[int, str] = {}
    used: set[str] = set()
    for r in as_leaves(leaves):
        if not r.is_tensor:
            continue
        parts = _parts(r.path)
        if parts[:1] in (["args"], ["kwargs"]) and len(parts) >= 2:
            top = r.argument or "_".join(parts[:2])
            rest = parts[2:]
        else:  # a path without the (args, kwargs) root: keep it whole
            top, rest = (parts[0] if parts else "input"), parts[1:]
        name = "_".join(re.sub(r"[^a-zA-Z0-9]", "_", p).lower() for p in [top, *rest])
        unique, n = name, 1
        while unique in used:
            unique, n = f"{name}_{n}", n + 1
        used.add(unique)
        names[r.leaf] = unique
    return names


def count_peaks(sizes: Sequence[int], calls: Sequence[int]) -> int:
    """Peaks of a size distribution, counted over power-of-two bins (module docstring).

    Example:
        >>> count_peaks([16, 20, 24, 1500, 1800], [30, 40, 30, 50, 50])
        2
        >>> count_peaks([1, 2, 4, 8], [55, 25, 15, 5])
        1
    """
    hist: dict[int, int] = {}
    for s, c in zip(sizes, calls, strict=True):
        b = -1 if s <= 0 else int(s).bit_length() - 1
        hist[b] = hist.get(b, 0) + int(c)
    if not hist:
        return 0
    lo, hi = min(hist), max(hist)
    h = [hist.get(b, 0) for b in range(lo, hi + 1)]
    candidates = []
    for i, x in enumerate(h):
        left = h[i - 1] if i > 0 else 0
        # First bin of a plateau that falls on its right (or ends the histogram).
        j = i
        while j + 1 < len(h) and h[j + 1] == x:
            j += 1
        right = h[j + 1] if j + 1 < len(h) else 0
        if x > 0 and x > left and x > right:
            candidates.append(i)
    kept: list[int] = []
    for c in candidates:
        if kept and min(h[kept[-1] : c + 1]) * 2 >= min(h[kept[-1]], h[c]):
            if h[c] > h[kept[-1]]:  # no deep valley between them: one peak, the higher
                kept[-1] = c
            continue
        kept.append(c)
    return len(kept)


def target_size(sizes: Sequence[int], calls: Sequence[int], how: str) -> int:
    """The opt target of one symbol: weighted mode, p50 or p90 (module docstring).

    Example:
        >>> target_size([1, 2, 8], [5, 5, 2], "mode"), target_size([1, 2, 8], [5, 5, 2], "p90")
        (1, 8)
    """
    if how == "mode":
        top = max(calls)
        return int(min(s for s, c in zip(sizes, calls, strict=True) if c == top))
    if how not in ("p50", "p90"):
        raise ValueError(f"unknown opt choice {how!r}; use one of {', '.join(OPT_CHOICES)}")
    q = 50 if how == "p50" else 90
    total = sum(calls)
    running = 0
    for s, c in sorted(zip(sizes, calls, strict=True)):
        running += c
        if running * 100 >= q * total:
            return int(s)
    return int(max(sizes))


def _arrays(group: Group) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The group's signature matrix and call counts (set by `capture.analysis.groups.analyze`)."""
    if group.matrix is None or group.weights is None:
        raise ValueError(f"call group {group.name!r} carries no signatures; use analyze()")
    return group.matrix, group.weights


def _free_symbols(group: Group) -> dict[str, int]:
    """Free symbol -> its first column in the group's matrix."""
    out: dict[str, int] = {}
    for j, d in enumerate(group.dims):
        if d.symbol is not None and d.expr is None and d.symbol not in out:
            out[d.symbol] = j
    return out


def _distribution(values: np.ndarray[Any, Any], weights: np.ndarray[Any, Any]) -> Any:
    sizes, inverse = np.unique(values, return_inverse=True)
    counts = np.bincount(inverse, weights=weights).astype(np.int64)
    return sizes.tolist(), counts.tolist()


def _opt_row(
    matrix: np.ndarray[Any, Any], weights: np.ndarray[Any, Any], free: dict[str, int], how: str
) -> int:
    """Index of the recorded signature nearest to the per-symbol targets."""
    if not free:
        return int(np.argmax(weights))
    distance = np.zeros(matrix.shape[0])
    for column in free.values():
        values = matrix[:, column]
        sizes, counts = _distribution(values, weights)
        target = target_size(sizes, counts, how)
        spread = max(sizes) - min(sizes)
        if spread:
            distance += np.abs(values - target) / spread
    # Nearest first, then most calls, then smallest sizes (lexicographic over the symbols).
    keys = [matrix[:, c] for c in reversed(list(free.values()))]
    order = np.lexsort((*keys, -weights, distance))
    return int(order[0])


def _split_symbol(group: Group, free: dict[str, int]) -> tuple[str | None, int]:
    """The free symbol to cut into several profiles, and its number of peaks."""
    matrix, weights = _arrays(group)
    best: tuple[int, float, str] | None = None
    for symbol, column in free.items():
        sizes, counts = _distribution(matrix[:, column], weights)
        peaks = count_peaks(sizes, counts)
        spread = max(sizes) / max(min(sizes), 1)
        key = (peaks, spread, symbol)
        if best is None or (key[0], key[1]) > (best[0], best[1]):
            best = key
    if best is None:
        return None, 1
    return best[2], best[0]


def _profile(
    group: Group, rows: np.ndarray[Any, Any], index: int, how: str, names: dict[int, str]
) -> Profile:
    all_rows, all_weights = _arrays(group)
    matrix, weights = all_rows[rows], all_weights[rows]
    free = _free_symbols(group)
    opt = _opt_row(matrix, weights, free, how)
    lo, hi = matrix.min(axis=0), matrix.max(axis=0)
    by_leaf: dict[int, list[int]] = {}
    for j, d in enumerate(group.dims):
        by_leaf.setdefault(d.leaf, []).append(j)
    inputs = []
    for r in group.structure.tensors:
        cols = by_leaf.get(r.leaf, [])
        inputs.append(
            InputRange(
                name=names[r.leaf],
                path=r.path,
                dtype=r.dtype,
                min=tuple(int(lo[c]) for c in cols),
                opt=tuple(int(matrix[opt, c]) for c in cols),
                max=tuple(int(hi[c]) for c in cols),
            )
        )
    return Profile(
        model_name=group.model_name,
        group=group.name,
        index=index,
        calls=int(weights.sum()),
        opt_calls=int(weights[opt]),
        inputs=inputs,
    )


def build_profiles(
    groups: Sequence[Group], opt: str = "mode", max_profiles: int = 1
) -> list[Profile]:
    """min / opt / max per tensor input for each call group (module docstring).

    Args:
        groups: Call groups from `capture.analysis.groups.analyze`.
        opt: ``mode`` (default), ``p50`` or ``p90``: how opt is targeted per shared symbol.
        max_profiles: Most profiles per group; a group gets several only when its
            distribution has several peaks.

    Returns:
        Profiles, group by group, ranges of the split symbol in ascending order.

    Raises:
        ValueError: Unknown `opt` or `max_profiles` < 1.

    Example:
        >>> [p.group for p in build_profiles(analyze(store, "M"))]  # doctest: +SKIP
        ['decode', 'prefill']
    """
    if opt not in OPT_CHOICES:
        raise ValueError(f"unknown opt choice {opt!r}; use one of {', '.join(OPT_CHOICES)}")
    if max_profiles < 1:
        raise ValueError(f"max_profiles must be at least 1, not {max_profiles}")
    out: list[Profile] = []
    for g in groups:
        if g.matrix is None or g.weights is None:
            continue
        names = export_names(g.structure.leaves)
        free = _free_symbols(g)
        symbol, peaks = _split_symbol(g, free)
        pieces = min(max_profiles, peaks)
        everything = np.arange(g.matrix.shape[0])
        if symbol is None or pieces < 2:
            out.append(_profile(g, everything, 0, opt, names))
            continue
        values = g.matrix[:, free[symbol]]
        sizes, counts = _distribution(values, g.weights)
        cuts = optimal_buckets(sizes, counts, pieces)
        lower = None
        for i, upper in enumerate(cuts):
            mask = values <= upper if lower is None else (values > lower) & (values <= upper)
            out.append(_profile(g, everything[mask], i, opt, names))
            lower = upper
    return out


def store_profiles(
    store: StoreReader,
    model_name: str | None = None,
    *,
    group: str | None = None,
    opt: str = "mode",
    max_profiles: int = 1,
) -> list[Profile]:
    """`build_profiles` over the call groups of a store (every model, or one; one group or all).

    Raises:
        UnknownModel: No such model, or no such group.
        ValueError: Unknown `opt` or `max_profiles` < 1.
    """
    from capture.analysis.groups import analyze
    from capture.errors import UnknownModel

    groups = analyze(store, model_name)
    if group is not None:
        chosen = [g for g in groups if g.name == group]
        if not chosen:
            names = ", ".join(sorted({g.name for g in groups})) or "none"
            raise UnknownModel(
                f"no call group {group!r} (groups: {names}); pass --group with one of them"
            )
        groups = chosen
    return build_profiles(groups, opt, max_profiles)


def profiles_table(store: StoreReader, model_name: str | None = None, **options: Any) -> pa.Table:
    """`Store.profiles()`: one row per model, group, profile and tensor input (`PROFILES_SCHEMA`).

    Args:
        store: An open store.
        model_name: A model name, or None for every model.
        **options: Passed to `store_profiles`: ``group`` (only this call group; default every
            group), ``opt`` (``mode``, ``p50`` or ``p90``: module docstring), ``max_profiles``
            (most profiles per group, default 1).

    Returns:
        The table; ``min_shape`` / ``opt_shape`` / ``max_shape`` are lists of sizes.

    Raises:
        UnknownModel: No such model, or no such group.
        ValueError: Unknown `opt` or `max_profiles` < 1.

    Example:
        >>> profiles_table(open_store("store"), "M").column("opt_shape")  # doctest: +SKIP
    """
    return profiles_to_table(store_profiles(store, model_name, **options))


def profiles_to_table(profiles: Sequence[Profile]) -> pa.Table:
    """Profiles as a `pyarrow.Table` with the columns of `PROFILES_SCHEMA`."""
    rows = [
        {
            "model": p.model_name,
            "group": p.group,
            "profile": p.index,
            "input": i.name,
            "path": i.path,
            "dtype": i.dtype,
            "min_shape": list(i.min),
            "opt_shape": list(i.opt),
            "max_shape": list(i.max),
            "calls": p.calls,
            "opt_calls": p.opt_calls,
        }
        for p in profiles
        for i in p.inputs
    ]
    return pa.Table.from_pylist(rows, schema=PROFILES_SCHEMA)
