"""The ONNX target serves the families the torch target serves, or refuses them with the reason.

- an encoder-decoder (a tiny Whisper, its encoder recorded as a sub-module under
  ``generate()``): one ONNX set holds the decoder's groups and the encoder's
  (``runner.modules["encoder"]``), served through `replay.load` on the ORIGINAL calls each
  received (forward pre-hook copies);
- a bfloat16 model: onnxruntime's CPU provider has no bfloat16 kernels, so the export refuses
  the ONNX set with that reason and writes no file (never a set that cannot be opened).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

import capture
import replay
from fixtures.families import record_whisper, tiny_whisper
from fixtures.generate_traffic import record_traffic, serve_originals, tiny_causal
from fixtures.seeds import LinearModel
from replay.runtime.ort.weights import OnnxFileError

pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")


class Whisper:
    """A tiny Whisper recorded under generate(), exported with its encoder to one ONNX set."""

    def __init__(self, root: Path) -> None:
        self.model = tiny_whisper()
        self.originals = record_whisper(self.model, root / "store", [1, 2, 3])
        (root / "out").mkdir()
        self.result = replay.export(
            self.model, root / "store", modules=True, onnx=root / "out" / "whisper.onnx"
        )
        self.result.save(root / "whisper.pt2")
        self.runners = {
            "onnx": replay.load(root / "out" / "whisper.onnx"),
            "pt2": replay.load(root / "whisper.pt2"),
        }
        self.runner = self.runners["onnx"]
        self.root = root


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> Whisper:
    return Whisper(tmp_path_factory.mktemp("whisper"))


@pytest.mark.slow
def test_the_whisper_set_holds_the_encoder_and_the_decoder(whisper: Whisper) -> None:
    out = whisper.root / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "whisper.decode.onnx",
        "whisper.encoder.g0.onnx",
        "whisper.onnx.data",
        "whisper.onnx.json",
        "whisper.prefill.onnx",
    ]
    assert sorted(whisper.runner.modules) == ["encoder"]
    assert whisper.result.complete and whisper.result.modules["encoder"].complete
    onnx_rows = [
        r for r in whisper.result.modules["encoder"].coverage.to_pylist() if r["target"] == "onnx"
    ]
    assert onnx_rows and all(r["covered"] for r in onnx_rows)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["onnx", "pt2"])
@pytest.mark.parametrize("module", ["", "encoder"])
def test_every_original_whisper_call_is_served_right(
    whisper: Whisper, module: str, target: str
) -> None:
    model = whisper.model.get_encoder() if module else whisper.model
    loaded = whisper.runners[target]
    runner = loaded.modules[module] if module else loaded
    verdicts = serve_originals(model, runner, whisper.originals[module])
    wanted = {"": {"prefill": 3, "decode": 9}, "encoder": {"g0": 3}}[module]
    served: dict[str, int] = {}
    for v in verdicts:
        served[str(v.group)] = served.get(str(v.group), 0) + 1
    assert served == wanted
    assert all(v.correct for v in verdicts)


def _refused(result: Any, target: Path) -> None:
    rows = [r for r in result.coverage.to_pylist() if r["target"] == "onnx"]
    assert rows and all(
        not r["covered"] and "bfloat16" in r["error"] and "no kernels" in r["error"] for r in rows
    )
    assert not result.onnx and not result.complete
    assert not list(target.parent.iterdir())  # nothing written, nothing half-written
    with pytest.raises(OnnxFileError, match="no ONNX manifest"):
        replay.load(target)


def test_a_bfloat16_model_s_onnx_set_is_refused_with_the_reason(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = LinearModel().to(torch.bfloat16)
    with capture.Recorder(model, tmp_path / "store", flush_seconds=3600), torch.no_grad():
        for batch in (2, 3, 5):
            model(torch.randn(batch, 8, dtype=torch.bfloat16))
    target = tmp_path / "out" / "model.onnx"
    target.parent.mkdir()
    result = replay.export(model, tmp_path / "store", onnx=target, probes=0)
    assert result.programs  # the torch target serves it
    _refused(result, target)


@pytest.mark.slow
def test_a_bfloat16_llama_is_refused_for_onnx_and_served_by_torch(tmp_path: Path) -> None:
    model = tiny_causal("llama", dtype=torch.bfloat16)
    originals = record_traffic(model, tmp_path / "store", [(1, 5, True), (2, 7, True)])
    target = tmp_path / "out" / "llama.onnx"
    target.parent.mkdir()
    result = replay.export(model, tmp_path / "store", onnx=target, probes=0)
    _refused(result, target)
    result.save(tmp_path / "llama.pt2")
    verdicts = serve_originals(model, replay.load(tmp_path / "llama.pt2"), copy.deepcopy(originals))
    assert verdicts and all(v.correct for v in verdicts)


def test_renaming_torch_s_dims_leaves_an_unnamed_dim_unnamed() -> None:
    import onnx_ir as ir

    from replay.onnx.convert import _rename_dims

    x = ir.Value(name="x", shape=ir.Shape([ir.SymbolicDim("s1"), ir.SymbolicDim(None)]))
    node = ir.Node("", "Identity", [x], num_outputs=1)
    y = node.outputs[0]
    y.shape = ir.Shape([ir.SymbolicDim(None), ir.SymbolicDim("s1 + 1"), 4])
    model = ir.Model(ir.Graph([x], [y], nodes=[node], opset_imports={"": 18}), ir_version=10)
    _rename_dims(model, {"s1": "batch"})
    # An unnamed dim spelled "None" would make every unknown dim of the graph one size to
    # onnxruntime (a UNet's Transpose then failed to reuse a buffer).
    assert [d.value if not isinstance(d, int) else d for d in x.shape] == ["batch", None]
    assert [d.value if not isinstance(d, int) else d for d in y.shape] == [None, "batch + 1", 4]
