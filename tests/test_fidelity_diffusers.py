"""diffusers models are served like transformers': outputs flatten, check and load agree.

A tiny `UNet2DConditionModel` (random weights, built from its config) is driven the way a
classifier-free guidance loop drives it (the batch doubled, several latent sizes, the timestep
0-d or one per row: `fixtures.families.guidance_calls`) under the Recorder, while a forward
pre-hook keeps the ORIGINAL calls; the export is served through `replay.load` (``.pt2`` and the
ONNX set) on those calls and checked by the real ``capture check`` script, which runs without
torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

import capture
import replay
from capture.errors import CaptureError
from capture.pytree import outputs
from fixtures.families import guidance_calls, record_calls, tiny_unet
from fixtures.generate_traffic import serve_originals
from replay.runtime.allowed import loadable_type, register_types
from replay.runtime.guards import ArtifactError

pytest.importorskip("diffusers")

UNET_OUTPUT = "diffusers.models.unets.unet_2d_condition.UNet2DConditionOutput"
GUIDANCE_FAST = [(1, 8, "0-d"), (2, 8, "1-d")]


def test_a_diffusers_output_flattens_with_key_paths_once_capture_registers_it() -> None:
    from diffusers.models.unets.unet_2d_condition import UNet2DConditionOutput

    assert outputs.add_keys(UNet2DConditionOutput)
    sample = torch.ones(2, 4, 8, 8)
    flat, spec = pytree.tree_flatten_with_path(UNet2DConditionOutput(sample=sample))
    assert [(pytree.keystr(path), value is sample) for path, value in flat] == [
        ("['sample']", True)
    ]
    # The library's own flattening is kept: the same leaves, the same serialized name.
    assert pytree.treespec_loads(pytree.treespec_dumps(spec)) == spec


def test_the_recorder_flattens_a_unet_s_output(tmp_path: Path) -> None:
    model = tiny_unet()
    record_calls(model, tmp_path, guidance_calls(GUIDANCE_FAST))
    with capture.open_store(tmp_path) as store:
        specs = [
            r["treespec"]
            for r in store.query(
                "SELECT DISTINCT treespec FROM structures WHERE treespec LIKE '%Output%'"
            ).to_pylist()
        ]
        opaque = store.query(
            "SELECT count(*) AS n FROM structures WHERE treespec LIKE '%opaque%'"
        ).to_pylist()[0]["n"]
    # Before: one opaque leaf naming the class (the recorder could not name its leaves).
    assert len(specs) == 1 and UNET_OUTPUT in specs[0] and opaque == 0


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("diffusers.models.unets.unet_2d_condition.UNet2DConditionModel", "not an output class"),
        ("diffusers.utils.outputs.is_tensor", "not an output class"),
        ("diffusers.no_such_module.Thing", "cannot be imported"),
    ],
)
def test_the_loader_takes_only_diffusers_output_classes(name: str, match: str) -> None:
    with pytest.raises(CaptureError, match=match):
        outputs.load_output_type(name)
    with pytest.raises(ArtifactError, match=match):
        register_types({name})


def test_a_module_outside_the_families_is_never_imported() -> None:
    assert not loadable_type("evil.models.Output")
    with pytest.raises(ArtifactError, match="does not register"):
        register_types({"evil.models.Output"})
    assert "evil" not in sys.modules


def test_the_unet_output_loads_as_a_registered_output_class() -> None:
    tp = outputs.load_output_type(UNET_OUTPUT)
    assert tp.__name__ == "UNet2DConditionOutput" and loadable_type(UNET_OUTPUT)


class Served:
    """The tiny UNet recorded under guidance, exported to ``.pt2`` and ONNX, both loaded."""

    def __init__(self, root: Path) -> None:
        self.model = tiny_unet()
        self.originals = record_calls(self.model, root / "store", guidance_calls())
        self.result = replay.export(self.model, root / "store", onnx=root / "unet.onnx")
        self.result.save(root / "unet.pt2")
        self.root = root

    def verdicts(self, path: Path) -> list[Any]:
        return serve_originals(self.model, replay.load(path), self.originals)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Served:
    return Served(tmp_path_factory.mktemp("unet"))


@pytest.mark.slow
@pytest.mark.parametrize("artifact", ["unet.pt2", "unet.onnx"])
def test_every_guidance_call_is_served_right(served: Served, artifact: str) -> None:
    verdicts = served.verdicts(served.root / artifact)
    # 0-d and 1-d timesteps are two groups; every call served, none wrong.
    assert {v.group for v in verdicts} == {"g0", "g1"}
    assert [v.correct for v in verdicts] == [True] * len(served.originals) == [True] * 6


@pytest.mark.slow
@pytest.mark.parametrize("artifact", ["unet.pt2", "unet.onnx"])
def test_capture_check_serves_what_load_serves(served: Served, artifact: str) -> None:
    # The real script, without torch: it must accept the diffusers output type load accepts.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["capture", "--store", str(served.root / "store"), "check", str(served.root / artifact)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "served: 6 of 6 recorded signatures, 6 of 6 calls" in done.stderr


FRESH = """
import sys

import torch
import torch.utils._pytree as pytree

import replay

assert "diffusers" not in sys.modules
runner = replay.load(sys.argv[1])
context = torch.randn(4, 7, 16)
out = runner(torch.randn(4, 4, 8, 8), torch.full((4,), 7), encoder_hidden_states=context)
print(type(out).__name__, *[pytree.keystr(p) for p, _ in pytree.tree_flatten_with_path(out)[0]])
"""


@pytest.mark.slow
@pytest.mark.parametrize("artifact", ["unet.pt2", "unet.onnx"])
def test_a_fresh_process_loads_the_output_class_the_artifact_names(
    served: Served, artifact: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FRESH, str(served.root / artifact)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    # diffusers imported by the loader (a BaseOutput subclass), its leaves named by capture
    assert done.stdout.split() == ["UNet2DConditionOutput", "['sample']"]
