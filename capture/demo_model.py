"""The tiny models of `capture demo` and of the docs' examples, built from configs in code.

Random weights, a fixed seed, nothing downloaded: a Llama (what the demo records) and a T5 (the
encoder-decoder example of recording several modules), and `run_generate`, which serves them a
`generate()` workload. They live in the installed package so that the demo and every example
run from a wheel (the repository's ``fixtures`` is not installed); `fixtures.models`
re-exports them for the tests and benchmarks. transformers is imported only when a model is
built.

Example:
    >>> from capture.demo_model import run_generate, tiny_t5  # doctest: +SKIP
    >>> model = tiny_t5()  # doctest: +SKIP
    >>> ids = run_generate(model, [(1, 5), (2, 7)])  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = [
    "TINY_DECODER",
    "tiny_llama",
    "tiny_t5",
    "llama_config",
    "run_generate",
    "prompts",
]


TINY_DECODER: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
"""The config of every tiny decoder-only model of the tests (Llama, Mistral, Phi3, Qwen2, ...)."""


def llama_config(**overrides: Any) -> Any:
    """A 2-layer, 64-wide LlamaConfig: small enough for CPU tests, real enough for generate()."""
    from transformers import LlamaConfig

    return LlamaConfig(**{**TINY_DECODER, **overrides})


def tiny_llama(seed: int = 0, **overrides: Any) -> Any:
    """A `LlamaForCausalLM` with random weights, in eval mode."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model: Any = LlamaForCausalLM(llama_config(**overrides))
    model.eval()
    return model


def tiny_t5(seed: int = 0) -> Any:
    """A 2+2-layer, 64-wide `T5ForConditionalGeneration` with random weights, in eval mode.

    generate() runs its encoder through ``get_encoder()``, not ``forward``: record it with
    ``Recorder(model, store, modules={"encoder": model.get_encoder()})``.
    """
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    params: dict[str, Any] = dict(
        vocab_size=128,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=2,
    )
    model: Any = T5ForConditionalGeneration(T5Config(**params))
    model.eval()
    return model


def prompts(
    batch: int, length: int, seed: int = 0, vocab: int = 128, padded: bool = True
) -> dict[str, torch.Tensor]:
    """Random prompt ids (never the pad/eos ids) and their attention mask.

    With `padded` and ``batch > 1``, row ``i`` is left-padded with ``i`` pad tokens (at most
    ``length - 1``), as a tokenizer pads a batch of prompts of different lengths: the mask is then
    not all ones, and generate() passes it to every forward call.
    """
    g = torch.Generator().manual_seed(seed * 1000 + batch * 31 + length)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        for row in range(1, batch):
            pad = min(row, length - 1)
            ids[row, :pad] = 0
            mask[row, :pad] = 0
    return {"input_ids": ids, "attention_mask": mask}


def run_generate(
    model: Any,
    workload: Iterable[tuple[int, int]],
    max_new_tokens: int = 4,
    seed: int = 0,
    padded: bool = True,
) -> list[torch.Tensor]:
    """Greedy `generate()` for each (batch, prompt length) of the workload; returns the ids."""
    results = []
    for batch, length in workload:
        inputs = prompts(batch, length, seed=seed, padded=padded)
        with torch.no_grad():
            out = model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        results.append(out)
    return results
