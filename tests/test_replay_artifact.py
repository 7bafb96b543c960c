"""ExportResult.save / replay.load: one PT2 archive, a runner that routes calls.

The must-hold checks run the artifact in a fresh Python process (tests/serve_artifact.py) that
imports only torch, transformers, safetensors and replay: it rebuilds the eager model from its
config and safetensors weights, copies every call generate() makes with a forward pre-hook (the
ORIGINAL calls), and serves each through the runner and through eager.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch as st
import torch

import capture
import replay
from capture.errors import ReplayError
from fixtures.models import prompts, run_generate, tiny_gpt2, tiny_llama, tiny_t5
from fixtures.stores import LLAMA_WORKLOAD
from replay.runtime.guards import Axis, ProgramGuard, Relation
from replay.runtime.pt2.loading import ArtifactError, CallNotServed, read_artifact, read_manifest

ROOT = Path(__file__).resolve().parents[1]
SERVE = Path(__file__).with_name("serve_artifact.py")


class Twice(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return x * 2 if mask is None else x * mask


def _record_twice(root: Path) -> Twice:
    model = Twice()
    with capture.Recorder(model, root, name="twice"), torch.no_grad():
        for b, s in ((2, 6), (3, 7), (4, 8)):
            model(torch.randn(b, s))
        for b in (2, 3):
            model(torch.randn(b, 5), mask=torch.ones(b, 5))
    return model


@pytest.fixture
def twice(tmp_path: Path) -> tuple[Twice, Path]:
    model = _record_twice(tmp_path / "store")
    path = tmp_path / "twice.pt2"
    replay.export(model, tmp_path / "store").save(path)
    return model, path


def test_save_writes_one_archive_with_every_program_and_a_manifest(
    twice: tuple[Twice, Path], tmp_path: Path
) -> None:
    _, path = twice
    with zipfile.ZipFile(path) as archive:
        programs = sorted(n.split("/")[-1] for n in archive.namelist() if "/models/" in n)
    assert programs == ["g0.json", "g1.json"]
    manifest = read_manifest(path)
    assert manifest.model_name == "twice"
    assert [(p.group, p.calls) for p in manifest.programs] == [("g0", 3), ("g1", 2)]
    assert manifest.versions["torch"] == torch.__version__
    assert manifest.modules[""].store == str(tmp_path / "store")
    assert manifest.modules[""].first is not None
    coverage = manifest.modules[""].coverage
    assert len([r for r in coverage if r.kind == "recorded"]) == 5  # and the probes
    g0 = manifest.programs[0].guard
    assert [(a.path, a.axis, a.min, a.max) for a in g0.axes] == [
        ("args[0]", 0, 2, 4),
        ("args[0]", 1, 6, 8),
    ]


def test_the_archive_holds_no_pickle(twice: tuple[Twice, Path]) -> None:
    _, path = twice
    with zipfile.ZipFile(path) as archive:
        samples = [n for n in archive.namelist() if "/sample_inputs/" in n]
        assert samples and all(archive.read(n) == b"" for n in samples)
        configs = [n for n in archive.namelist() if n.endswith("_config.json")]
        for name in configs:
            config = json.loads(archive.read(name))["config"]
            assert not any(item["use_pickle"] for item in config.values()), name


def test_the_runner_routes_each_call_to_its_group(twice: tuple[Twice, Path]) -> None:
    model, path = twice
    runner = replay.load(path)
    x = torch.randn(3, 7)
    assert runner.select(x) == "g0"
    torch.testing.assert_close(runner(x), model(x), rtol=0, atol=0)
    mask = torch.rand(2, 5)
    assert runner.select(x[:2, :5], mask=mask) == "g1"
    torch.testing.assert_close(runner(x[:2, :5], mask=mask), x[:2, :5] * mask, rtol=0, atol=0)


def test_a_size_outside_the_recorded_range_names_every_group_and_guard(
    twice: tuple[Twice, Path],
) -> None:
    runner = replay.load(twice[1])
    with pytest.raises(CallNotServed) as caught:
        runner(torch.randn(5, 7))
    assert isinstance(caught.value, ReplayError)
    assert caught.value.reasons == {
        "g0": "args[0] axis 0 = 5 is outside the recorded range [2, 4]",
        "g1": "different call structure: the call does not pass kwargs['mask'] (the program "
        "takes a float32 tensor of rank 2)",
    }
    assert str(caught.value).startswith("no program of twice accepts this call (g0: args[0] axis")
    assert str(caught.value).endswith("; closest: group g0")  # its structure matched


def test_a_new_dtype_is_a_different_structure(twice: tuple[Twice, Path]) -> None:
    runner = replay.load(twice[1])
    with pytest.raises(CallNotServed) as caught:
        runner(torch.randn(3, 7, dtype=torch.float64))
    assert caught.value.reasons["g0"] == (
        "different call structure: args[0] is a float64 tensor of rank 2, the program takes a "
        "float32 tensor of rank 2"
    )


def test_a_call_missing_an_argument_names_it_and_the_closest_group(
    twice: tuple[Twice, Path],
) -> None:
    # the missing argument is named, not "different call structure" for every group
    runner = replay.load(twice[1])
    with pytest.raises(CallNotServed) as caught:
        runner(mask=torch.ones(3, 5))
    assert caught.value.reasons == {
        "g0": "different call structure: the call does not pass args[0] (the program takes a "
        "float32 tensor of rank 2); the call passes kwargs['mask'], which the program does not "
        "take",
        "g1": "different call structure: the call does not pass args[0] (the program takes a "
        "float32 tensor of rank 2)",
    }
    assert str(caught.value).endswith("; closest: group g1")


def test_a_file_that_is_not_an_artifact_is_refused(tmp_path: Path) -> None:
    plain = tmp_path / "plain.pt2"
    torch.export.save(torch.export.export(Twice(), (torch.randn(2, 3),)), plain)
    with pytest.raises(ArtifactError, match="holds no capture_manifest.json"):
        replay.load(plain)
    with pytest.raises(ArtifactError, match="no artifact at"):
        replay.load(tmp_path / "missing.pt2")


def _guard(**changes: Any) -> ProgramGuard:
    fields: dict[str, Any] = {
        "module_name": "",
        "group": "decode",
        "program": "decode",
        "treespec": None,
        "leaves": (),
        "axes": (
            Axis("ids", 0, 1, 3, True, "batch"),
            Axis("ids", 1, 1, 1, False),
            Axis("kv", 0, 1, 3, True, "batch"),
            Axis("kv", 1, 4, 9, True, "past"),
            Axis("mask", 1, 5, 10, True, "m"),
        ),
        "relations": (Relation("m", ("past",), 1),),
    }
    fields.update(changes)
    return ProgramGuard(**fields)


@pytest.mark.parametrize(
    ("dims", "reason"),
    [
        ([2, 1, 2, 6, 7], None),
        ([2, 2, 2, 6, 7], "ids axis 1 = 2, the program takes 1 only (static)"),
        ([2, 1, 2, 12, 13], "kv axis 1 = 12 is outside the recorded range [4, 9]"),
        (
            [2, 1, 3, 6, 7],
            "kv axis 0 = 3 but ids axis 0 = 2: they were equal in every recorded call",
        ),
        (
            [2, 1, 2, 6, 8],
            "mask axis 1 = 8, but m = past + 1 held in every recorded call (= 7 here)",
        ),
        ([2, 1, 2], "the call has 3 tensor dims, the program 5"),
    ],
)
def test_guards(dims: list[int], reason: str | None) -> None:
    assert _guard().check(dims) == reason


def test_a_signature_that_failed_the_export_check_is_not_served() -> None:
    guard = _guard(rejected={(2, 1, 2, 6, 7): "program failed: x"})
    assert guard.check([2, 1, 2, 6, 7]) == (
        "this recorded signature failed the export's check (program failed: x)"
    )


def test_the_refusal_list_matches_failed_recorded_rows_by_their_sizes() -> None:
    # Rows are matched by sizes, not paired with ExportGroup.recorded() by position: the
    # probes (and payloads) of a group make the counts differ.
    from types import SimpleNamespace

    from replay.artifact.entries import rejected
    from replay.runtime.coverage import KIND_PAYLOAD, KIND_PROBE, KIND_RECORDED, CoverageRow

    rows = [
        CoverageRow("g", KIND_PROBE, "p", 0, False, None, "probe failed", sizes=(9, 9)),
        CoverageRow("g", KIND_RECORDED, "a", 3, True, 0.0, None, sizes=(2, 4)),
        CoverageRow("g", KIND_RECORDED, "b", 1, False, None, "program failed: x", sizes=(3, 4)),
        CoverageRow("g", KIND_PAYLOAD, "c", 1, False, None, "payload failed", sizes=(5, 4)),
        CoverageRow("h", KIND_RECORDED, "d", 1, False, None, "other group", sizes=(7, 4)),
    ]
    group = SimpleNamespace(name="g")
    assert rejected(group, rows) == {(3, 4): "program failed: x"}  # type: ignore[arg-type]


# -- fresh process, real generate() ------------------------------------------------------------
def _serve(
    tmp_path: Path,
    model: Any,
    artifact: Path,
    auto_class: str,
    modules: dict[str, str] | None = None,
) -> dict[str, Any]:
    model_dir = tmp_path / "model"
    model.config.save_pretrained(model_dir)
    st.save_model(model, str(model_dir / "model.safetensors"))
    tensors = {}
    for i, (batch, length) in enumerate(LLAMA_WORKLOAD):
        p = prompts(batch, length, seed=0)
        tensors[f"input_ids_{i}"], tensors[f"attention_mask_{i}"] = (
            p["input_ids"],
            p["attention_mask"],
        )
    st.save_file(tensors, str(tmp_path / "prompts.safetensors"))
    spec = {
        "artifact": str(artifact),
        "model_dir": str(model_dir),
        "auto_class": auto_class,
        "prompts": str(tmp_path / "prompts.safetensors"),
        "max_new_tokens": 4,
        "modules": modules or {},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, str(SERVE), str(tmp_path / "spec.json")],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # nothing printed: no "--- Logging error ---", no warning
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["unpickled"] == []  # no weights_only=False fallback, no pickle.loads
    assert report["capture_modules"] == []  # no recorder, no capture context
    assert report["types_equal"]  # CausalLMOutputWithPast + DynamicCache, as eager
    assert report["max_abs_diff"] <= 1e-5
    # each weight once in memory, in a fresh process, right after replay.load
    assert report["storage_bytes"] <= 1.10 * _unique_weight_bytes(model)
    return report


def _unique_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's own parameters and buffers, each storage counted once."""
    storages = {}
    for t in [*model.parameters(), *model.buffers()]:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def _archive_weight_ratio(path: Path, model: torch.nn.Module) -> float:
    return read_artifact(path).weight_bytes / _unique_weight_bytes(model)


def _export_and_serve(tmp_path: Path, model: Any) -> dict[str, Any]:
    with capture.Recorder(model, tmp_path / "store", flush_seconds=3600):
        run_generate(model, LLAMA_WORKLOAD, max_new_tokens=4)
    result = replay.export(model, tmp_path / "store")
    assert result.complete
    result.save(tmp_path / "model.pt2")
    # each weight once on disk (torch's package_pt2 writes it once per program: 4.00x)
    assert _archive_weight_ratio(tmp_path / "model.pt2", model) <= 1.10
    return _serve(tmp_path, model, tmp_path / "model.pt2", "AutoModelForCausalLM")


@pytest.mark.slow
def test_a_tiny_llama_artifact_serves_every_original_call_in_a_fresh_process(
    tmp_path: Path,
) -> None:
    report = _export_and_serve(tmp_path, tiny_llama(0))
    # batches 1-3: prefill and decode, with and without a mask
    assert report["served"] == {
        "prefill_no_attention_mask": 2,
        "decode_no_attention_mask": 6,
        "prefill": 3,
        "decode": 9,
    }
    assert report["calls"] == 20


@pytest.mark.slow
def test_a_tiny_gpt2_artifact_serves_every_original_call_in_a_fresh_process(
    tmp_path: Path,
) -> None:
    report = _export_and_serve(tmp_path, tiny_gpt2(0))
    assert sum(report["served"].values()) == report["calls"] == 20
    assert sorted(report["served"]) == [
        "decode",
        "decode_no_attention_mask",
        "prefill",
        "prefill_no_attention_mask",
    ]


@pytest.mark.slow
def test_a_tiny_t5_encoder_and_decoder_in_one_artifact(tmp_path: Path) -> None:
    model = tiny_t5(0)
    encoder = model.get_encoder()
    with capture.Recorder(model, tmp_path / "store", modules={"encoder": encoder}) as rec:
        run_generate(model, LLAMA_WORKLOAD, max_new_tokens=4)
    assert rec.modules["encoder"].name == "T5ForConditionalGeneration.encoder"
    # the library exports the recorded sub-modules with the model (modules=True)
    result = replay.export(model, tmp_path / "store", "T5ForConditionalGeneration", modules=True)
    assert sorted(result.modules) == ["encoder"]
    assert result.modules["encoder"].inputs.model_name == "T5ForConditionalGeneration.encoder"
    assert result.complete and result.modules["encoder"].complete
    result.save(tmp_path / "t5.pt2")
    # the encoder's embedding is the decoder's: stored once for both modules
    assert _archive_weight_ratio(tmp_path / "t5.pt2", model) <= 1.10
    runner = replay.load(tmp_path / "t5.pt2")
    assert sorted(runner.modules) == ["encoder"]
    report = _serve(
        tmp_path, model, tmp_path / "t5.pt2", "AutoModelForSeq2SeqLM", {"encoder": "get_encoder"}
    )
    # every recorded call: 5 encoder runs, 5 prefill and 15 decode steps of the decoder
    assert report["served"] == {"encoder.g0": 5, "prefill": 5, "decode": 15}


def test_the_loader_finds_the_cache_types_in_the_programs_treespecs(tmp_path: Path) -> None:
    model = tiny_llama(0)
    with capture.Recorder(model, tmp_path / "store", flush_seconds=3600):
        run_generate(model, [(2, 4)], max_new_tokens=2)
    result = replay.export(model, tmp_path / "store", groups=["decode"])
    result.save(tmp_path / "decode.pt2")
    assert read_artifact(tmp_path / "decode.pt2").types == {
        "transformers.cache_utils.DynamicCache",
        "transformers.modeling_outputs.CausalLMOutputWithPast",
    }


@pytest.mark.slow
def test_aoti_compiles_every_program_into_the_artifact_and_load_runs_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    with capture.Recorder(model, tmp_path / "store", name="linear"), torch.no_grad():
        for batch in (2, 3, 5):
            model(torch.randn(batch, 4))
    replay.export(model, tmp_path / "store").save(tmp_path / "linear.pt2", aoti=True)
    assert read_manifest(tmp_path / "linear.pt2").aoti is True
    # the builds carry no weights; the archive's records are the model's, once
    assert read_artifact(tmp_path / "linear.pt2").weight_bytes == _unique_weight_bytes(model)
    assert replay.load(tmp_path / "linear.pt2").compiled == {}  # native code only when asked
    runner = replay.load(tmp_path / "linear.pt2", compiled=True)
    assert type(runner.compiled["g0"]).__name__ == "AOTICompiledModel"
    x = torch.randn(4, 4)
    with torch.no_grad():
        torch.testing.assert_close(runner(x), model(x))
        # the build runs on the program's own (memory-mapped) tensors: change those it names
        # (AOTInductor may fold others, a bias, into its code), and its output follows
        names = runner.compiled["g0"].get_constant_fqns()
        assert "weight" in names
        expected = copy.deepcopy(model)
        for name in names:
            runner.programs["g0"].state_dict[name].mul_(2)
            expected.get_parameter(name).mul_(2)
        torch.testing.assert_close(runner(x), expected(x))
    # the compiled form checks no input itself: the runner's guards still refuse
    with pytest.raises(CallNotServed, match=r"axis 0 = 9 is outside the recorded range \[2, 5\]"):
        runner(torch.randn(9, 4))


def test_compiled_needs_an_artifact_saved_with_aoti(twice: tuple[Twice, Path]) -> None:
    with pytest.raises(ArtifactError, match="holds no AOTInductor builds; save it with aoti=True"):
        replay.load(twice[1], compiled=True)
