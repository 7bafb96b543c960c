"""What recording costs on the cache families capture serves, next to the DynamicCache decode step.

    python bench/bench_families.py            # the numbers in docs/benchmarks.md
    python bench/bench_families.py --quick    # a smoke run

Prints one Markdown section on stdout (progress on stderr). The decode step of
`bench/bench_recorder.py` (b) (a module that returns fixed logits and the cache it got, so the
recorder is what is measured; ``input_ids`` (1,1), ``attention_mask`` (1,L+1), ``position_ids``)
with a 32-layer cache of each kind, L = 128 cached tokens:

- **DynamicCache**: (1,8,L,64) float32 keys and values per layer, as in (b);
- **StaticCache**: 32 `StaticLayer` of (1,8,L+64,64) filled to L: the keys, values and each
  layer's fill level (a 0-d int64 tensor; layer 0's value is read, on the CPU: no sync);
- **Mamba-like**: 32 `LinearAttentionLayer` with a (1,1536,4) conv and a (1,1536,16) recurrent
  state each;
- and the DynamicCache step of a model whose config names 4 special token ids (Qwen2-VL's), whose
  ``input_ids`` are counted, plus a 1x2048-token prefill of that model with and without counting.

Each variant is its own module instance; every iteration calls each once in a rotating order
(interleaved), timed alone with ``perf_counter_ns``; added latency = median (p90) of the recorded
variant - that of the bare module of the same cache, same run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import code_line, load_line, machine_line, md_table, median, p90, us  # noqa: E402
from recorder_cases import LAYERS, Decode, Variant, decode_inputs, log, run_interleaved  # noqa: E402

import capture  # noqa: E402
from capture.pytree import nodes  # noqa: E402

CACHE_LEN = 128
SPECIAL = dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652)
SPECIAL["vision_end_token_id"] = 151653


class CountingDecode(Decode):
    """`Decode` with a config naming special token ids: the recorder counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(**SPECIAL)


def _static_cache() -> Any:
    import transformers.cache_utils as cu

    g = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layer = cu.StaticLayer(max_cache_len=CACHE_LEN + 64)
        k = torch.randn(1, 8, CACHE_LEN, 64, generator=g)
        layer.update(k, torch.randn(1, 8, CACHE_LEN, 64, generator=g))
        layers.append(layer)
    cache = object.__new__(cu.StaticCache)
    cu.Cache.__init__(cache, layers=layers)
    return cache


def _linear_cache() -> Any:
    import transformers.cache_utils as cu

    g = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layer = cu.LinearAttentionLayer()
        layer.update_conv_state(torch.randn(1, 1536, 4, generator=g))
        layer.update_recurrent_state(torch.randn(1, 1536, 16, generator=g))
        layers.append(layer)
    cache = cu.DynamicCache()
    cache.layers = layers
    return cache


def _cases() -> dict[str, tuple[type, dict[str, Any]]]:
    kwargs = decode_inputs(CACHE_LEN)[1]
    prefill = dict(input_ids=torch.randint(0, 151000, (1, 2048)))
    return {
        "DynamicCache (as (b))": (Decode, kwargs),
        "StaticCache (fill level read)": (Decode, {**kwargs, "past_key_values": _static_cache()}),
        "Mamba-like (conv + recurrent states)": (
            Decode,
            {**kwargs, "past_key_values": _linear_cache()},
        ),
        "DynamicCache, 4 special ids counted": (CountingDecode, kwargs),
        "prefill 1x2048, no special ids": (Decode, prefill),
        "prefill 1x2048, 4 special ids counted": (CountingDecode, prefill),
    }


HEADERS = ("case", "bare median µs", "added median µs", "added p90 µs")


def _row(name: str, bare: Variant, recorded: Variant) -> list[str]:
    return [
        name,
        us(median(bare.samples)),
        us(median(recorded.samples) - median(bare.samples)),
        us(p90(recorded.samples) - p90(bare.samples)),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few calls: a smoke run")
    opts = parser.parse_args(argv)
    n = 300 if opts.quick else 3_000
    torch.set_num_threads(1)
    store = tempfile.mkdtemp(prefix="capture-bench-families-", dir="/tmp")
    start = load_line()
    t0 = time.perf_counter()
    rows = []
    try:
        with nodes.register_flattening_functions():
            for i, (name, (make, kwargs)) in enumerate(_cases().items()):
                log(name)
                bare = Variant("bare", make())
                model = make()
                recorded = Variant("recorded", model)
                with capture.Recorder(model, os.path.join(store, str(i)), name="bench"):
                    run_interleaved([bare, recorded], (), kwargs, n, warmup=100)
                rows.append(_row(name, bare, recorded))
    finally:
        shutil.rmtree(store, ignore_errors=True)
    quick = " (quick run: too few calls to trust)" if opts.quick else ""
    print(f"## Cache families: recording cost{quick}\n")
    print(f"- Command: `python bench/bench_families.py{' --quick' if opts.quick else ''}`")
    print(f"- Machine: {machine_line()}")
    print(f"- Code: {code_line()}")
    took = time.perf_counter() - t0
    print(f"- Load at start: {start}; {n} interleaved iterations per case, {took:.0f} s in all;")
    print(f"  load at end: {load_line()}\n")
    print(md_table(HEADERS, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
