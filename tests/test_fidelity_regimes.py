"""Regimes and merged groups under real generate() traffic ("Must hold").

Each model is recorded under greedy generate() with the real Recorder while a forward pre-hook
keeps deep copies of the ORIGINAL calls; `replay.export` makes the programs, `save` writes the
artifact, and a fresh runner (`replay.load` of the saved file) serves every original call,
compared with eager (`fixtures.generate_traffic.serve_originals`). Nothing here trusts the
coverage table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import replay
from capture.cli.demo import MAX_NEW_TOKENS, WORKLOAD
from fixtures.generate_traffic import RunnerVerdict, record_traffic, serve_originals, tiny_causal
from fixtures.models import tiny_llama

pytest.importorskip("transformers")

# Prompts of 4-12 tokens without a mask, around a sliding window of 6.
SHORT_AND_LONG = [(1, length, False) for length in range(4, 13)]
# Batches of 1-3 with and without mask, prompts on both sides of a window of 6.
CROSSING = [
    (1, 4, True),
    (2, 5, True),
    (1, 8, True),
    (2, 10, True),
    (1, 3, True),
    (2, 7, True),
    (3, 9, True),
    (1, 12, False),
]


def _served(
    model: Any, root: Path, workload: list[tuple[int, int, bool]]
) -> tuple[Any, list[RunnerVerdict]]:
    originals = record_traffic(model, root, workload, max_new_tokens=3)
    result = replay.export(model, root)
    runner = replay.load(result.save(root / "model.pt2"))
    return result, serve_originals(model, runner, originals)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["mistral", "phi3"])
def test_prefills_across_the_window_are_served_by_regimes(arch: str, tmp_path: Path) -> None:
    model = tiny_causal(arch, sliding_window=6)
    result, found = _served(model, tmp_path, SHORT_AND_LONG)
    prefill = [v for v in found if v.group is not None and v.group.startswith("prefill[")]
    # no prefill call lost to "Constraints violated (input_ids.size()[1] ...)".
    assert [v.reason for v in found if not v.correct] == []
    assert len(prefill) == len(SHORT_AND_LONG)
    assert len({v.group for v in prefill}) >= 2, result.notes


@pytest.mark.slow
def test_gemma3_window_crossing_traffic_is_served(tmp_path: Path) -> None:
    model = tiny_causal("gemma3", sliding_window=6)
    _, found = _served(model, tmp_path, CROSSING)
    # every call of a Gemma3 window-crossing workload is served.
    assert [v.reason for v in found if not v.correct] == []


@pytest.mark.slow
def test_the_demo_workload_ships_two_programs(tmp_path: Path) -> None:
    model = tiny_llama(seed=0)
    workload = [(batch, length, batch > 1) for batch, length in WORKLOAD]
    originals = record_traffic(model, tmp_path, workload, max_new_tokens=MAX_NEW_TOKENS)
    result = replay.export(model, tmp_path)
    runner = replay.load(result.save(tmp_path / "model.pt2"))
    found = serve_originals(model, runner, originals)
    # decode_no_attention_mask and prefill_no_attention_mask are served by the
    # decode and prefill programs, the all-ones mask filled, proven on their own calls.
    assert sorted(result.programs) == ["decode", "prefill"]
    assert [v.reason for v in found if not v.correct] == []
    assert {v.group for v in found} == {
        "decode",
        "decode_no_attention_mask",
        "prefill",
        "prefill_no_attention_mask",
    }
