"""Every model family records, and the families people export are served ("Must hold").

Each family runs real greedy ``generate()`` (batches 1-3, left padding, one request without a
mask), recorded by the Recorder while a forward pre-hook keeps deep copies of the ORIGINAL calls;
`replay.export` exports the store, the result is saved and loaded back with `replay.load`, and
every original call goes through the loaded runner and through eager
(`fixtures.generate_traffic.serve_originals`): served means the runner accepted it, wrong means it
answered differently from eager.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import capture
import replay
from fixtures.families import (
    image_request,
    record_requests,
    tiny_bamba,
    tiny_falcon_h1,
    tiny_mamba,
    tiny_qwen2_vl,
)
from fixtures.generate_traffic import record_traffic, serve_originals, tiny_causal

pytest.importorskip("transformers")

WORKLOAD = [(1, 7, True), (2, 9, True), (3, 10, True), (1, 12, False), (2, 6, True)]
STATIC = {"cache_implementation": "static"}
FAMILIES: dict[str, tuple[Callable[[], Any], dict[str, Any]]] = {
    "mamba": (tiny_mamba, {}),
    "bamba": (tiny_bamba, {}),
    "llama-static": (lambda: tiny_causal("llama"), STATIC),
    "falcon_h1-static": (tiny_falcon_h1, STATIC),
}


class Run:
    """One family's recording, export and loaded-runner verdicts."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        build, options = FAMILIES[name]
        self.model = build()
        self.originals = record_traffic(
            self.model, root / "store", WORKLOAD, max_new_tokens=5, **options
        )
        self.result = replay.export(self.model, root / "store")
        with capture.open_store(root / "store") as store:
            self.recorded = store.query("SELECT count(*) AS n FROM calls").to_pylist()[0]["n"]
            self.layers = {
                r["context"]
                for r in store.query(
                    "SELECT DISTINCT treespec AS context FROM structures WHERE treespec IS NOT NULL"
                ).to_pylist()
            }
        if self.result.programs:
            self.result.save(root / "model.pt2")
            runner = replay.load(root / "model.pt2")
            found = serve_originals(self.model, runner, self.originals)
            self.verdicts = [(v.group is not None, v.correct) for v in found]
        else:
            self.verdicts = [(False, False)] * len(self.originals)

    @property
    def served(self) -> float:
        return sum(served for served, _ in self.verdicts) / len(self.verdicts)

    @property
    def wrong(self) -> int:
        return sum(served and not correct for served, correct in self.verdicts)


@pytest.fixture(scope="module", params=list(FAMILIES))
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return Run(request.param, tmp_path_factory.mktemp(request.param))


@pytest.mark.slow
def test_every_call_is_recorded(run: Run) -> None:
    # every call, Bamba's and Mamba's included (flattening never assumes layer.keys).
    assert (run.recorded, len(run.originals)) == (25, 25)


@pytest.mark.slow
def test_no_served_call_answers_wrong(run: Run) -> None:
    assert run.wrong == 0


@pytest.mark.slow
def test_the_cache_layers_are_the_family_s(run: Run) -> None:
    wanted = {
        "mamba": "LinearAttentionLayer",
        "bamba": "LinearAttentionLayer",
        "llama-static": "StaticLayer",
        "falcon_h1-static": "LinearAttentionAndStaticFullAttentionLayer",
    }
    # Not vacuous: the traffic went through the layer class the family is here for.
    assert any(wanted[run.name] in treespec for treespec in run.layers)


@pytest.mark.slow
def test_state_space_and_static_families_are_served(run: Run) -> None:
    # >= 95 % of the calls served through replay.load (static caches included).
    # Mamba's prefills are served by regimes: torch.export specializes the prompt length
    # (transformers' reference scan loops over it), so each length is a regime.
    assert run.served >= 0.95


def _qwen2_vl_requests() -> list[dict[str, Any]]:
    images = [
        image_request(b, grid) for b, grid in [(1, (1, 4, 4)), (2, (1, 4, 6)), (3, (1, 4, 4))]
    ]
    g = torch.Generator().manual_seed(5)
    text = []
    for batch, length in [(2, 8), (1, 6)]:
        ids = torch.randint(3, 100, (batch, length), generator=g)
        text.append({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    return images + text


@pytest.mark.slow
def test_qwen2_vl_image_prefills_are_checked_on_inputs_eager_accepts(tmp_path: Path) -> None:
    model = tiny_qwen2_vl()
    originals = record_requests(model, tmp_path / "store", _qwen2_vl_requests())
    result = replay.export(model, tmp_path / "store")
    rows = [r for r in result.coverage.to_pylist() if "mm_encoder_outputs" in r["signature"]]
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13):
        # torch 2.11/2.12 cannot serialize the image prefill's cast_symbool_to_symint_guardless
        # node: the artifact could not hold that program, so none of its rows is claimed, and
        # each says why (the loader's validation runs before a claim).
        assert rows and not any(r["covered"] for r in rows)
        assert all("cannot serialize or read this program" in r["error"] for r in rows)
        return
    # rebuilt ids hold the image tokens (without them: "Image features and image tokens do
    # not match, tokens: 0"); each image prefill row is checked, and served here.
    assert rows and all(r["covered"] for r in rows)
    result.save(tmp_path / "model.pt2")
    verdicts = serve_originals(model, replay.load(tmp_path / "model.pt2"), originals)
    assert all(v.correct for v in verdicts)


@pytest.mark.slow
def test_a_vision_tower_torch_export_refuses_is_reported_and_text_is_served(
    tmp_path: Path,
) -> None:
    model = tiny_qwen2_vl()
    calls = [image_request(1, (1, 4, 4)), image_request(2, (1, 4, 6))]
    g = torch.Generator().manual_seed(5)
    for batch, length in [(2, 8), (1, 6), (3, 5)]:
        ids = torch.randint(3, 100, (batch, length), generator=g)
        calls.append({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    with capture.Recorder(model, tmp_path, name="vl"), torch.no_grad():
        for call in calls:
            model(**call)  # pixel_values through forward: the vision tower runs in the call
    result = replay.export(model, tmp_path)
    vision = [r for r in result.coverage.to_pylist() if "pixel_values" in r["signature"]]
    text = [r for r in result.coverage.to_pylist() if "pixel_values" not in r["signature"]]
    # Reported per group with the reason (the rebuilt image call is refused by eager before
    # torch.export is tried, or by torch.export's data-dependent guard); the text group is served.
    reasons = ("torch.export failed: GuardOnDataDependentSymNode", "the model's eager forward")
    assert vision and all(r["error"].startswith(reasons) for r in vision)
    assert text and all(r["covered"] for r in text)
