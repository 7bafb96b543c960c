"""`capture.engines.buckets`: the sizes that minimise padding, exactly.

Expected answers come from brute force over every bucket set, computed here from the traffic
the test recorded.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import capture
from capture.cli.main import cli
from capture.engines.buckets import (
    METADATA_BUCKETS,
    NoSuchSymbol,
    optimal_buckets,
    padding_waste,
    vllm_default_sizes,
)
from capture.store_api import Store
from fixtures.traffic import record_traffic

TRAFFIC = [((1, 7), 9), ((2, 7), 4), ((3, 12), 2), ((5, 12), 3), ((8, 40), 5), ((13, 40), 1)]


def _brute_force(sizes: list[int], calls: list[int], budget: int) -> int:
    """Least padding over every set of at most `budget` sizes holding the largest size."""
    best = None
    for k in range(min(budget, len(sizes))):
        for chosen in itertools.combinations(sizes[:-1], k):
            buckets = [*chosen, sizes[-1]]
            waste = 0
            for s, n in zip(sizes, calls, strict=True):
                waste += (min(b for b in buckets if b >= s) - s) * n
            best = waste if best is None else min(best, waste)
    assert best is not None
    return best


def _distribution(axis: int) -> tuple[list[int], list[int]]:
    counts: dict[int, int] = {}
    for sizes, n in TRAFFIC:
        counts[sizes[axis]] = counts.get(sizes[axis], 0) + n
    return sorted(counts), [counts[s] for s in sorted(counts)]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    root = tmp_path_factory.mktemp("buckets")
    record_traffic(root, TRAFFIC)
    with capture.open_store(root) as opened:
        yield opened


def test_dynamic_program_matches_brute_force_on_random_distributions() -> None:
    rng = random.Random(15)
    for _ in range(400):
        sizes = sorted(rng.sample(range(1, 300), rng.randint(1, 9)))
        calls = [rng.randint(1, 50) for _ in sizes]
        budget = rng.randint(1, len(sizes) + 1)
        chosen = optimal_buckets(sizes, calls, budget)
        assert len(chosen) <= budget and chosen[-1] == sizes[-1]
        assert padding_waste(sizes, calls, chosen) == (_brute_force(sizes, calls, budget), 0)


def test_hand_computed_example() -> None:
    # {1, 8}: 2 and 3 pad to 8 (6 + 5); {2, 8} pads 10 + 5; {3, 8} pads 20 + 1.
    assert optimal_buckets([1, 2, 3, 8], [10, 1, 1, 5], 2) == [1, 8]
    assert padding_waste([1, 2, 3, 8], [10, 1, 1, 5], [1, 8]) == (11, 0)


def test_budget_at_least_the_distinct_sizes_pads_nothing() -> None:
    assert optimal_buckets([3, 5], [1, 1], 4) == [3, 5]


def test_vllm_default_ladder() -> None:
    expected = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
    assert vllm_default_sizes() == expected
    assert len(expected) == 51


@pytest.mark.parametrize("budget", [1, 2, 3, 4])
def test_store_batch_buckets_equal_brute_force(store: Store, budget: int) -> None:
    sizes, calls = _distribution(0)
    table = store.buckets("batch", budget)
    summary = json.loads(table.schema.metadata[METADATA_BUCKETS])
    assert summary["padding"] == _brute_force(sizes, calls, budget)
    assert padding_waste(sizes, calls, table.column("bucket").to_pylist()) == (
        summary["padding"],
        0,
    )


def test_store_sequence_buckets(store: Store) -> None:
    sizes, calls = _distribution(1)  # 7 x 13 calls, 12 x 5, 40 x 6
    table = store.buckets("x_1", 2)
    assert table.to_pylist() == [
        {"bucket": 12, "calls": 18, "smallest": 7, "padding": 5 * 13},
        {"bucket": 40, "calls": 6, "smallest": 40, "padding": 0},
    ]
    assert _brute_force(sizes, calls, 2) == 65


def test_vllm_comparison_counts_calls_above_the_cut_ladder(store: Store) -> None:
    sizes, calls = _distribution(0)
    summary = json.loads(store.buckets("batch", 3).schema.metadata[METADATA_BUCKETS])
    assert summary["vllm_sizes"] == [1, 2, 4]
    # 1 -> 1, 2 -> 2, 3 -> 4: padding 2; 5, 8 and 13 fit no size of [1, 2, 4].
    assert (summary["vllm_padding"], summary["vllm_uncovered_calls"]) == (2, 3 + 5 + 1)
    assert summary["work"] == sum(s * n for s, n in zip(sizes, calls, strict=True))


def test_unknown_symbol_names_the_known_ones(store: Store) -> None:
    with pytest.raises(NoSuchSymbol, match="pass --symbol with one of batch, x_1"):
        store.buckets("seq", 2)


def test_llama_fixture_batch_over_groups(llama: Store) -> None:
    table = llama.buckets("batch", 1)
    summary = json.loads(table.schema.metadata[METADATA_BUCKETS])
    # Where batch varies, decode (9 calls) and prefill (3); and where it is always 1, the
    # *_no_attention_mask groups (8 calls): batch 1 is counted (else [2, 4] for the demo).
    assert (summary["groups"], summary["calls"], summary["buckets"]) == (
        ["decode", "decode_no_attention_mask", "prefill", "prefill_no_attention_mask"],
        20,
        [3],
    )
    assert table.to_pylist()[0]["smallest"] == 1


def test_without_a_symbol_the_batch_symbol_is_sized(store: Store) -> None:
    # `capture buckets --budget 4`, the first example of its --help, runs without --symbol
    chosen = store.buckets(None, 3)
    assert json.loads(chosen.schema.metadata[METADATA_BUCKETS])["symbol"] == "batch"
    assert chosen == store.buckets("batch", 3)


class TwoLengths(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a.sum() + b.sum()


def test_without_a_symbol_and_no_batch_symbol_names_them(tmp_path: Path) -> None:
    model = TwoLengths()
    with capture.Recorder(model, tmp_path, name="two", flush_seconds=3600), torch.no_grad():
        for n, m in [(3, 5), (4, 9), (6, 2)]:
            model(torch.zeros(1, n), torch.zeros(1, m))
    with capture.open_store(tmp_path) as opened, pytest.raises(NoSuchSymbol) as caught:
        opened.buckets(None, 2)
    assert str(caught.value) == (
        "the calls have 2 symbols (a_1, b_1) and no batch symbol; pass --symbol with one of "
        "them (see `capture dims`)"
    )


def test_cli_buckets_without_a_symbol_on_the_llama_store(llama_root: Path) -> None:
    result = CliRunner().invoke(cli, ["--store", str(llama_root), "buckets", "--budget", "4"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("LlamaForCausalLM, symbol batch (batch size; groups ")
    assert result.stderr == ""
