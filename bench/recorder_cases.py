"""The cases the recorder benchmarks time: the modules, their inputs, interleaved timing, GC watch.

Shared by `bench_recorder.py` and its sections (`recorder_latency`, `recorder_memory`,
`recorder_writer`).
"""

from __future__ import annotations

import gc
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

import torch
from common import median

from capture.pytree import nodes

LAYERS = 32


def log(msg: str) -> None:
    print(f"[bench_recorder] {msg}", file=sys.stderr, flush=True)


# -- the modules ----------------------------------------------------------------------------
class Small(torch.nn.Module):
    """forward(x, y) -> x + y."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class Decode(torch.nn.Module):
    """An LLM-shaped forward that computes nothing: returns fixed logits and the cache it got."""

    def __init__(self, vocab: int = 32_000) -> None:
        super().__init__()
        self.logits = torch.zeros(1, 1, vocab)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
    ) -> tuple[torch.Tensor, Any]:
        return self.logits, past_key_values


def small_inputs() -> tuple[tuple[Any, ...], dict[str, Any]]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(2, 6, generator=g), torch.randn(2, 6, generator=g)), {}


def decode_inputs(cache_len: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    g = torch.Generator().manual_seed(0)
    pairs = [
        (
            torch.randn(1, 8, cache_len, 64, generator=g),
            torch.randn(1, 8, cache_len, 64, generator=g),
        )
        for _ in range(LAYERS)
    ]
    kwargs = dict(
        input_ids=torch.tensor([[42]]),
        attention_mask=torch.ones(1, cache_len + 1, dtype=torch.int64),
        position_ids=torch.tensor([[cache_len]]),
        past_key_values=nodes.make_dynamic_cache(pairs),
    )
    return (), kwargs


# -- interleaved latency --------------------------------------------------------------------
class Variant:
    """One way of calling the module, with its samples (ns per call)."""

    def __init__(
        self,
        name: str,
        model: Any,
        after: Callable[[], None] | None = None,
        after_every: int = 0,
    ) -> None:
        self.name = name
        self.model = model
        self.after = after
        self.after_every = after_every
        self.samples: list[int] = []
        self.calls = 0


def run_interleaved(
    variants: list[Variant], args: tuple[Any, ...], kwargs: dict[str, Any], n: int, warmup: int
) -> None:
    """Calls every variant once per iteration, rotating the order; times each call alone."""
    perf = time.perf_counter_ns
    nv = len(variants)
    with torch.no_grad():
        for i in range(warmup + n):
            keep = i >= warmup
            for j in range(nv):
                v = variants[(i + j) % nv]
                model = v.model
                t0 = perf()
                model(*args, **kwargs)
                t1 = perf()
                v.calls += 1
                if keep:
                    v.samples.append(t1 - t0)
                if v.after is not None and v.calls % v.after_every == 0:
                    v.after()


def observer_reset(obs: Any) -> Callable[[], None]:
    """Drops what an InputObserver kept so far (outside the timed call), so memory stays bounded."""

    def reset() -> None:
        info = obs.info
        info.inputs.clear()
        info.outputs_specs.clear()
        info.flat_outputs.clear()
        info.latencies.clear()
        info._best_candidate = None

    return reset


class GcWatch:
    """Counts the cyclic GC's collections per generation, and their pauses, during a block."""

    def __enter__(self) -> GcWatch:
        self.count = [0, 0, 0]
        self.total = [0, 0, 0]
        self.longest = [0, 0, 0]
        self._t0 = 0
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter_ns()
            return
        g = info["generation"]
        pause = time.perf_counter_ns() - self._t0
        self.count[g] += 1
        self.total[g] += pause
        self.longest[g] = max(self.longest[g], pause)

    def line(self) -> str:
        return ", ".join(
            f"gen{g} {self.count[g]}× ({self.total[g] / 1e6:.1f} ms in all, longest "
            f"{self.longest[g] / 1e6:.1f} ms)"
            for g in range(3)
        )


def per_call_ns(fn: Callable[[], Any], number: int, repeat: int = 7) -> tuple[float, float]:
    """(min, median) over `repeat` timeit repeats, in ns per call."""
    times = timeit.repeat(fn, number=number, repeat=repeat)
    return min(times) / number * 1e9, median(times) / number * 1e9
