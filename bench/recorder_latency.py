"""Recorder benchmark sections (a), (b) and the wrapper breakdown: latency the real wrapper adds.

Every number here comes from calling a module wrapped by a real `capture.Recorder` (through
``nn.Module.__call__``, public options only), against the same module unwrapped: nothing
re-implements the hot path.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import torch
from common import Timer, md_table, median, p90, quantile, us
from recorder_cases import GcWatch, Variant, observer_reset, per_call_ns, run_interleaved

import capture
from capture.pytree import nodes
from capture.record.flatten import metadata_guard, tensor_key, walk


def latency_section(
    title: str,
    make_model: Callable[[], Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    n: int,
    warmup: int,
    target_us: float,
    store: str,
    observer_n: int,
    observer_reset_every: int,
    extra_recorders: dict[str, dict[str, Any]],
) -> tuple[str, dict[str, float]]:
    """Runs one latency benchmark, returns its Markdown and the added medians (ns) by variant.

    Two interleaved runs, each with its own bare baseline: (1) bare, the Recorder variants and
    the default InputObserver; (2) bare and the keep-every-call InputObserver, whose clones
    (megabytes per call for (b)) would otherwise evict the CPU caches and feed the cyclic GC
    under the other variants' calls.
    """
    bare = Variant("bare module", make_model())
    rec_model = make_model()
    recorder = capture.Recorder(rec_model, os.path.join(store, "default"), name="bench")
    variants = [bare, Variant("capture.Recorder (every call)", rec_model)]
    recorders = [recorder]
    for label, options in extra_recorders.items():
        m = make_model()
        recorders.append(capture.Recorder(m, os.path.join(store, label), name="bench", **options))
        variants.append(Variant(f"capture.Recorder ({label})", m))
    obs_default_model = make_model()
    obs_default = torch.onnx.InputObserver()
    variants.append(Variant("torch.onnx.InputObserver (default, keeps 3 calls)", obs_default_model))
    with contextlib.ExitStack() as stack:
        stack.enter_context(nodes.register_flattening_functions())
        for r in recorders:
            stack.enter_context(r)
        stack.enter_context(obs_default(obs_default_model))
        with Timer() as t1, GcWatch() as gc1:
            run_interleaved(variants, args, kwargs, n, warmup)
    stats = [r.stats() for r in recorders]

    bare2 = Variant("bare module (baseline of run 2)", make_model())
    obs_all_model = make_model()
    obs_all = torch.onnx.InputObserver()
    obs_variant = Variant(
        "torch.onnx.InputObserver (store_n_calls=10**9, keeps every call)",
        obs_all_model,
        after=observer_reset(obs_all),
        after_every=observer_reset_every,
    )
    with nodes.register_flattening_functions(), obs_all(obs_all_model, store_n_calls=10**9):
        with Timer() as t2, GcWatch() as gc2:
            run_interleaved([bare2, obs_variant], args, kwargs, observer_n, min(warmup, 100))

    # Run 3: the bare module and one Recorder only, so fewer objects pass through the CPU
    # caches between two recorded calls than in run 1 (where five variants rotate).
    bare3 = Variant("bare module (baseline of run 3)", make_model())
    pair_model = make_model()
    pair = Variant(
        "capture.Recorder (every call), interleaved with the bare module only", pair_model
    )
    pair_recorder = capture.Recorder(pair_model, os.path.join(store, "pair"), name="bench")
    with nodes.register_flattening_functions(), pair_recorder:
        with Timer() as t3:
            run_interleaved([bare3, pair], args, kwargs, n, warmup)

    rows = []
    added: dict[str, float] = {}
    runs = ((1, bare, variants), (2, bare2, [bare2, obs_variant]), (3, bare3, [bare3, pair]))
    for run, base, members in runs:
        base_med, base_p90 = median(base.samples), p90(base.samples)
        for v in members:
            med, q90 = median(v.samples), p90(v.samples)
            if v is base:
                add_med = add_p90 = "—"
            else:
                add_med, add_p90 = us(med - base_med), us(q90 - base_p90)
                added[v.name] = med - base_med
            rows.append(
                [
                    run,
                    v.name,
                    len(v.samples),
                    us(med),
                    us(q90),
                    us(quantile(v.samples, 0.99)),
                    us(max(v.samples), 0),
                    us(sum(v.samples) / len(v.samples)),
                    add_med,
                    add_p90,
                ]
            )
    rec_added = added["capture.Recorder (every call)"] / 1000
    verdict = "met" if rec_added <= target_us else f"missed by {rec_added - target_us:.1f} µs"
    text = [
        f"### {title}",
        "",
        md_table(
            [
                "run",
                "variant",
                "timed calls",
                "median µs",
                "p90 µs",
                "p99 µs",
                "max µs",
                "mean µs",
                "added median µs",
                "added p90 µs",
            ],
            rows,
        ),
        "",
        f"Target: ≤ {target_us:g} µs added per call with `capture.Recorder` recording every call. "
        f"Result: {rec_added:.2f} µs added (median) — **{verdict}**.",
        "",
        f"Run 1: {n} timed iterations after {warmup} warm-up iterations, {t1.seconds:.1f} s; "
        f"cyclic GC during it: {gc1.line()}. Recorder stats after it: "
        + "; ".join(
            f"recorded {s['recorded']}, written {s['written']}, dropped {s['dropped']}, "
            f"errors {s['errors']}"
            for s in stats
        )
        + f". Run 2: {observer_n} timed iterations, {t2.seconds:.1f} s; what the "
        f"keep-every-call InputObserver kept is dropped after every {observer_reset_every} "
        f"calls, outside the timed call, to bound memory; cyclic GC during it: {gc2.line()}. "
        f"Run 3: {n} timed iterations of the bare module and one Recorder only, "
        f"{t3.seconds:.1f} s: the same hot path with fewer other objects passing through the "
        "CPU caches between two recorded calls (run 1 rotates five variants).",
        "",
        "Medians are the robust numbers. p99, max and mean carry the tails: cyclic GC "
        "collections (the Recorder allocates containers on every call, so collections "
        "triggered by allocation counts land on its calls; a full collection takes ~0.1-0.3 s "
        "here with torch and transformers loaded), the writer thread taking the GIL (every "
        "torch op on the hot path, such as the value-range `aminmax`, releases it), and the "
        "other users of this 2-core VM.",
        "",
    ]
    return "\n".join(text), added


WRAPPER_VARIANTS: dict[str, dict[str, Any]] = {
    "default options (inputs, outputs, value ranges)": {},
    "record_outputs=False": {"record_outputs": False},
    "value_ranges='none'": {"value_ranges": "none"},
    "record_outputs=False, value_ranges='none'": {"record_outputs": False, "value_ranges": "none"},
    "sample=0.0 (wrapper and sampling check only, nothing recorded)": {"sample": 0.0},
}
"""Recorder options timed by `wrapper_section`: each difference to the default is one part."""


def wrapper_section(
    title: str,
    make_model: Callable[[], Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    number: int,
    store: str,
    measured_ns: float,
) -> str:
    """Times the real wrapper: `model(*args, **kwargs)` through a `Recorder` per option set.

    Each variant is its own module instance wrapped by its own `Recorder` (writer thread
    running); the added cost of a variant is its per-call time minus the bare module's, both
    timed with `timeit` (min and median of 7 repeats of `number` calls). Options that switch a
    part off (outputs, value ranges, every call sampled out) tell what that part costs.
    """
    bare = make_model()
    recorders: list[tuple[str, Any, capture.Recorder]] = []
    for i, (label, options) in enumerate(WRAPPER_VARIANTS.items()):
        model = make_model()
        rec = capture.Recorder(model, os.path.join(store, f"v{i}"), name="wrapper", **options)
        recorders.append((label, model, rec))
    rows: list[list[Any]] = []
    with contextlib.ExitStack() as stack, torch.no_grad():
        stack.enter_context(nodes.register_flattening_functions())
        for _, _, rec in recorders:
            stack.enter_context(rec)
        bare_lo, bare_med = per_call_ns(lambda: bare(*args, **kwargs), number)
        rows.append(["bare module", us(bare_lo), us(bare_med), "—", "—"])
        for label, model, _ in recorders:
            model(*args, **kwargs)  # the first call describes the structures: not timed
            lo, med = per_call_ns(lambda m=model: m(*args, **kwargs), number)
            rows.append(
                [f"`Recorder`, {label}", us(lo), us(med), us(lo - bare_lo), us(med - bare_med)]
            )
    stats = [r.stats() for _, _, r in recorders]
    extra = _walk_detail(args, kwargs, number)
    text = [
        f"### {title}",
        "",
        md_table(
            ["variant", "min µs per call", "median µs per call", "added min µs", "added median µs"],
            rows,
        ),
        "",
        f"`timeit`, {number} calls per repeat, 7 repeats (min and median), each variant its own "
        "module and `Recorder` (writer thread running, so its work on the queued records is "
        "in these numbers as it is in production). Calls in a tight loop run with warm caches: "
        "a lower bound of the interleaved run above "
        f"(median added there: {us(measured_ns)} µs). Recorder stats after the run: "
        + "; ".join(
            f"recorded {s['recorded']}, dropped {s['dropped']}, errors {s['errors']}" for s in stats
        )
        + ".",
        "",
    ]
    if extra:
        text += [extra, ""]
    return "\n".join(text)


def _walk_detail(args: tuple[Any, ...], kwargs: dict[str, Any], number: int) -> str:
    """For a call holding a cache: what `walk` and `tensor_key` cost on the cache alone."""
    caches = [
        v
        for v in list(args) + list(kwargs.values())
        if type(v) in nodes.LAYERED_CACHES or type(v).__name__.endswith("Cache")
    ]
    if not caches:
        return ""
    cache = caches[0]
    tensors: list[torch.Tensor] = []
    key: list[Any] = []
    walk(cache, tensors, key)
    k, _ = tensor_key(key, tensors)
    guard = metadata_guard(tensors)
    assert guard is not None
    one = tensors[0]
    n = len(tensors)

    def d_walk() -> Any:
        t: list[torch.Tensor] = []
        walk(cache, t, [])

    items: list[tuple[str, Callable[[], Any], int]] = [
        ("`walk(cache)`", d_walk, number),
        (
            f"`tensor_key` of its {n} tensors (Python; new structures only)",
            lambda: tensor_key(key, tensors),
            number,
        ),
        (f"`metadata_guard` check of its {n} tensors (C++)", lambda: guard(*tensors), number),
        ("`hash()` of that key (a fresh tuple each call)", lambda: hash(tuple(k)), number),
        (f"`[t.shape for t in tensors]` ({n} tensors)", lambda: [t.shape for t in tensors], number),
        ("one `t.shape`", lambda: one.shape, number * 10),
        ("one `t.dtype`", lambda: one.dtype, number * 10),
        ("one `t.get_device()`", lambda: one.get_device(), number * 10),
        ("one `t.device`", lambda: one.device, number * 10),
    ]
    rows = []
    for label, fn, count in items:
        lo, med = per_call_ns(fn, count)
        digits = 3 if count > number else 2
        rows.append([label, us(lo, digits), us(med, digits)])
    return (
        f"The cache alone ({type(cache).__name__}, {n} tensors; the output walk pays it again):"
        "\n\n" + md_table(["step", "min µs per call", "median µs per call"], rows)
    )
