"""A model that is not the one its calls were recorded from: the group's error names what
differs (layer count, head size), not the IndexError torch.export meets deep inside."""

from __future__ import annotations

import re
from pathlib import Path

import torch

import capture
import replay
from fixtures.models import tiny_llama

EAGER_INDEX = "IndexError: list index out of range"


def test_more_layers_than_the_recorded_cache(llama_root: Path) -> None:
    # the mismatch is named, not a bare "torch.export failed: IndexError: list index out of range"
    result = replay.export(tiny_llama(num_hidden_layers=3), llama_root, groups=["decode"])
    assert result.programs == {}
    assert re.fullmatch(
        r"the model does not match the recorded calls: (\w+) holds 2 layers in the recorded "
        r"calls, the model has 3 \(config\.num_hidden_layers\) \(its eager forward fails on "
        rf"them: {EAGER_INDEX}\); export the model they were recorded from",
        result.errors["decode"],
    ), result.errors["decode"]
    assert not result.complete


def test_a_wider_model_names_the_head_size(llama_root: Path) -> None:
    result = replay.export(tiny_llama(hidden_size=128), llama_root, groups=["decode"])
    error = result.errors["decode"]
    assert re.match(
        r"the model does not match the recorded calls: kwargs\['(\w+)'\]\.key_cache\[0\] has a "
        r"head size of 16 in the recorded calls, the model's config\.head_dim is 32 \(its "
        r"eager forward fails on them: RuntimeError: ",
        error,
    ), error


def test_the_recorded_model_has_no_difference(llama_root: Path) -> None:
    from replay.inputs.builder import export_inputs
    from replay.pipeline.model_match import differences, eager_failure

    group = export_inputs(llama_root).group("decode")
    model = tiny_llama()
    assert (differences(model, group), eager_failure(model, group)) == ([], None)


def test_a_model_without_a_config_gets_the_eager_error(tmp_path: Path) -> None:
    recorded = torch.nn.Linear(3, 2)
    with capture.Recorder(recorded, tmp_path, name="linear", flush_seconds=3600):
        with torch.no_grad():
            recorded(torch.randn(2, 3))
            recorded(torch.randn(5, 3))
    result = replay.export(torch.nn.Linear(4, 2), tmp_path)
    [(group, error)] = result.errors.items()
    assert error.startswith(
        "the model's eager forward fails on the group's rebuilt recorded call (RuntimeError: "
    )
    assert error.endswith("or the model is not the recorded one")
