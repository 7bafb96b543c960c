"""Quantized and mixture-of-experts models served by the loaded artifact, claims equal to serving.

Each model runs real greedy ``generate()`` (batches 1-3, left padding, one request without a
mask), recorded while a forward pre-hook keeps deep copies of the ORIGINAL calls: a Llama whose
attention is weight-only int8 (dequantizing and ``torch._weight_int8pack_mm`` forms) with a
weight-only int8 MLP or a W8A8 dynamic one (``torch._int_mm``), as torchao's and serving stacks'
module swaps write them (`fixtures.quantized`), a Mixtral and a Qwen2-MoE (4 experts, 2 per
token). Each is
exported, saved and loaded with `replay.load`; every original call goes through the runner and
through eager. The calls the export claims covered, those ``capture check`` says the artifact
serves and those the loaded runner serves are the same number, every call, and none is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import replay
from capture.cli.main import cli
from fixtures.generate_traffic import record_traffic, serve_originals, tiny_causal
from fixtures.quantized import quantize, tiny_mixtral, tiny_qwen2_moe

pytestmark = pytest.mark.slow  # four generate() recordings, exports and loads: minutes

WORKLOAD = [(1, 7, True), (2, 9, True), (3, 10, True), (1, 12, False)]
MODELS: dict[str, tuple[Callable[[], Any], str]] = {
    "weight-only-int8": (
        lambda: quantize(tiny_causal("llama"), "weight-only"),
        "_weight_int8pack_mm",
    ),
    "w8a8-int-mm": (lambda: quantize(tiny_causal("llama"), "w8a8"), "_int_mm"),
    "mixtral": (tiny_mixtral, "histc"),
    "qwen2-moe": (tiny_qwen2_moe, "histc"),
}
"""Name -> (the model, an operator its programs must call: the case is about it)."""


class Run:
    """One model's recording, export, ``capture check`` and loaded-runner verdicts."""

    def __init__(self, name: str, root: Path) -> None:
        build, self.operator = MODELS[name]
        self.model = build()
        store, path = root / "store", root / "model.pt2"
        self.originals = record_traffic(self.model, store, WORKLOAD, max_new_tokens=4)
        result = replay.export(self.model, store)
        self.claimed = sum(
            r["calls"]
            for r in result.coverage.to_pylist()
            if r["kind"] == "recorded" and r["target"] == "torch" and r["covered"]
        )
        self.targets = {
            str(node.target)
            for program in result.programs.values()
            for node in program.graph.nodes
            if node.op == "call_function"
        }
        result.save(path)
        checked = CliRunner().invoke(cli, ["--store", str(store), "check", str(path), "-f", "json"])
        self.check_exit = checked.exit_code
        self.check_served = sum(r["calls"] for r in json.loads(checked.stdout) if r["served"])
        verdicts = serve_originals(self.model, replay.load(path), self.originals)
        self.served = sum(v.group is not None for v in verdicts)
        self.wrong = [v.reason for v in verdicts if v.group is not None and not v.correct]


@pytest.fixture(scope="module", params=list(MODELS))
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return Run(request.param, tmp_path_factory.mktemp(request.param))


def test_the_programs_call_the_operator_the_case_is_about(run: Run) -> None:
    assert any(f"aten.{run.operator}." in target for target in run.targets), sorted(run.targets)


def test_no_served_call_answers_wrong(run: Run) -> None:
    assert run.wrong == []


def test_claimed_equals_checked_equals_served_equals_every_call(run: Run) -> None:
    # The quantized Llama's artifact did not load (aten._int_mm off the list), nor Mixtral's
    # and Qwen2-MoE's (aten.histc): claimed 30/30, 35/35 and 32/32, served 0.
    assert (run.claimed, run.check_served, run.served) == (len(run.originals),) * 3
    assert run.check_exit == 0
