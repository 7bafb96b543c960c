"""One export-options object: `ExportOptions` holds every option and its default,
the documented keywords of `replay.export` / `replay.export_inputs` and the options of
``capture export`` read their defaults from it; sub-modules are exported by the library.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import capture
import replay
from capture.errors import ReplayError
from fixtures.models import EncoderDecoder
from replay.inputs.builder import export_inputs
from replay.inputs.options import ExportOptions
from replay.pipeline.exporting import export

# Keywords of the functions that are not options.
_NOT_OPTIONS = {"model", "store", "model_name"}
# Options only `replay.export` takes (the inputs are the same whatever the check does).
_EXPORT_ONLY = {
    "onnx",
    "modules",
    "strict",
    "atol",
    "rtol",
    "probes",
    "max_payloads",
    "max_payload_bytes",
    "max_regimes",
    "merge",
    "time_budget",
    "max_static",
    "allow_ops",
    "set_state",
}


def _defaults() -> dict[str, Any]:
    """Option -> its default, as a keyword argument spells it (a mapping default: None)."""
    out = {}
    for f in dataclasses.fields(ExportOptions):
        out[f.name] = None if f.default is dataclasses.MISSING else f.default
    return out


def _keywords(fn: Any) -> dict[str, Any]:
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.name not in _NOT_OPTIONS}


def test_export_takes_every_option_with_the_options_default() -> None:
    assert _keywords(export) == _defaults()
    assert replay.export is export


def test_export_inputs_takes_the_input_options_with_the_options_default() -> None:
    expected = {k: v for k, v in _defaults().items() if k not in _EXPORT_ONLY}
    assert _keywords(export_inputs) == expected


def test_the_cli_reads_its_defaults_from_the_options() -> None:
    from capture.cli.export import export_command

    defaults = {p.name: p.default for p in export_command.params}
    assert (defaults["probes"], defaults["named_dims"], defaults["keyword_only"]) == (
        ExportOptions.probes,
        ExportOptions.named_dims,
        ExportOptions.keyword_only,
    )


@pytest.mark.parametrize("name", ["hinted", "floor", "no_such_option"])
def test_of_refuses_what_is_not_a_callers_option(name: str) -> None:
    with pytest.raises(TypeError, match=name):
        ExportOptions.of(**{name: 1})


def test_of_converts_the_public_forms_once() -> None:
    options = ExportOptions.of(
        groups=["decode"], set_batch_dimension_for=["x", 0], onnx=Path("m.onnx")
    )
    assert (options.groups, options.set_batch_dimension_for, options.onnx) == (
        ("decode",),
        ("x", 0),
        "m.onnx",
    )


def test_export_with_modules_exports_the_recorded_submodules(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = EncoderDecoder().eval()
    seen: list[tuple[Any, ...]] = []  # the encoder's real calls, copied before it ran
    hook = model.encoder.register_forward_pre_hook(
        lambda m, args: seen.append(tuple(a.clone() for a in args))
    )
    with torch.no_grad(), capture.Recorder(model, tmp_path, modules=["encoder"]):
        for batch, seq in [(2, 3), (3, 5), (4, 2)]:
            model(torch.randn(batch, seq, 4))
    hook.remove()  # torch.export calls the encoder too, with fake tensors
    result = replay.export(model, tmp_path, modules=True, probes=0)
    assert sorted(result.modules) == ["encoder"]
    encoder = result.modules["encoder"]
    assert result.complete and encoder.complete
    assert encoder.inputs.model_name == "EncoderDecoder.encoder"
    # The encoder's program on the calls the encoder really received, not on rebuilt ones.
    program = encoder.programs["g0"].module()
    with torch.no_grad():
        for args in seen:
            torch.testing.assert_close(program(*args), model.encoder(*args))
    groups = result.all_coverage().column("group").to_pylist()
    assert groups == ["g0"] * 3 + ["encoder.g0"] * 3


def test_a_recorded_submodule_the_model_lacks_is_one_error(tmp_path: Path) -> None:
    model = EncoderDecoder().eval()
    with torch.no_grad(), capture.Recorder(model, tmp_path, modules=["encoder"]):
        model(torch.randn(2, 3, 4))
    with pytest.raises(ReplayError, match="no get_encoder\\(\\) and no sub-module 'encoder'"):
        replay.export(model.encoder, tmp_path, "EncoderDecoder", modules=True, probes=0)


def test_capture_export_out_writes_the_submodules_into_the_artifact(tmp_path: Path) -> None:
    from capture.cli.main import cli

    torch.manual_seed(0)
    model = EncoderDecoder().eval()
    with torch.no_grad(), capture.Recorder(model, tmp_path / "store", modules=["encoder"]):
        model(torch.randn(2, 3, 4))
        model(torch.randn(3, 5, 4))
    factory = tmp_path / "factory.py"
    factory.write_text(
        "import torch\nfrom fixtures.models import EncoderDecoder\n"
        "def build():\n    torch.manual_seed(0)\n    return EncoderDecoder().eval()\n"
    )
    out = tmp_path / "m.pt2"
    args = ["--store", str(tmp_path / "store"), "export", f"{factory}:build", "--out", str(out)]
    result = CliRunner().invoke(cli, [*args, "--probes", "0", "-f", "csv"])
    assert result.exit_code == 0, result.output
    assert sorted(replay.load(out).modules) == ["encoder"]
