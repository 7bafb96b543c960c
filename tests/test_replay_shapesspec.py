"""torch's ShapesSpec learned from a store: facts, the spec object, the export, the router.

The facts (ranges, hint, divisor, 0/1 sizes) are read without torch; everything that builds a
``ShapesSpec`` or exports with one needs torch >= 2.14 and skips with the reason elsewhere.
Modules are recorded by the real Recorder, exported by the real torch.export, served by
`replay.load`, and compared with eager on the original calls.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import capture
import replay
from capture.analysis.groups import analyze
from capture.cli.main import cli
from capture.errors import ReplayError
from fixtures.traffic import record_scale
from replay.inputs.specs import shapesspec
from replay.inputs.specs.facts import MIN_DIVISOR_CALLS, group_facts
from replay.runtime.guards import CallNotServed

needs_shapes_spec = pytest.mark.skipif(
    not shapesspec.supported(),
    reason=f"torch {torch.__version__} has no ShapesSpec export (torch >= 2.14)",
)


PADDED = [(b, s) for s in (8, 16, 32, 40) for b in (1, 2, 3)]
"""A pad-to-8 workload: every sequence length a multiple of 8, batch 1 to 3."""


def test_facts_hint_is_the_most_called_size_and_divisor_needs_enough_sizes(
    tmp_path: Path,
) -> None:
    calls = PADDED + [(2, 16)] * 3
    record_scale(tmp_path, calls)
    with capture.open_store(tmp_path) as store:
        (group,) = analyze(store, "m")
    facts = group_facts(group)
    seq = facts.symbols["x_1"]
    batch = facts.symbols["batch"]
    assert (seq.min, seq.max, seq.divisor, seq.sizes) == (8, 40, 8, 4)
    assert seq.hint == 16  # 3 + 3 extra calls at 16
    assert batch.hint == 2 and batch.divisor is None and batch.small == (1,)
    assert facts.assumptions == {"x_1": 8}
    assert facts.small == {"batch": (1,)}


def test_two_distinct_sizes_or_few_calls_are_no_divisor(tmp_path: Path) -> None:
    # Multiples of 8 twice only: (1/8)**1 > 1/64, a coincidence is too likely.
    record_scale(tmp_path / "two", [(b, s) for s in (8, 16) for b in (1, 2, 3, 4, 5)])
    # Three multiples of 8, but fewer calls than trusted.
    few = [(1, 8), (1, 16), (1, 24)]
    assert len(few) < MIN_DIVISOR_CALLS
    record_scale(tmp_path / "few", few)
    for name in ("two", "few"):
        with capture.open_store(tmp_path / name) as store:
            (group,) = analyze(store, "m")
        assert group_facts(group).assumptions == {}, name


def test_dims_python_shapes_source_is_torch_shapes_spec(tmp_path: Path) -> None:
    model, originals = record_scale(tmp_path, PADDED)
    result = CliRunner().invoke(
        cli, ["--store", str(tmp_path), "dims", "--python", "--spec", "shapes"]
    )
    assert result.exit_code == 0, result.output
    text = result.output
    assert "assumptions=[x_1 % 8 == 0]" in text
    assert "ShapeVar('batch', min=1, max=3, optimization_hint=3)" in text
    if not shapesspec.supported():
        pytest.skip(f"torch {torch.__version__} has no ShapesSpec export (torch >= 2.14)")
    namespace: dict[str, Any] = {}
    exec(compile(text, "capture-dims", "exec"), namespace)  # the printed source, run as is
    from torch.fx.experimental.dynamic_spec import ShapesSpec

    spec = namespace["shapes_spec"]
    assert isinstance(spec, ShapesSpec)
    assert [repr(a) for a in spec.assumptions] == [f"Eq(Mod(x_1#{_uid(namespace)}, 8), 0)"]
    program = torch.export.export(model, originals[4], dynamic_shapes=spec)
    for args in originals:
        torch.testing.assert_close(program.module()(*args), model(*args))


def _uid(namespace: dict[str, Any]) -> int:
    return int(namespace["x_1"]._uid)


def test_dims_spec_without_python_is_a_usage_error(tmp_path: Path) -> None:
    record_scale(tmp_path, PADDED[:3])
    result = CliRunner().invoke(cli, ["--store", str(tmp_path), "dims", "--spec", "shapes"])
    assert result.exit_code == 2 and "pass --python too" in result.output


@pytest.mark.skipif(shapesspec.supported(), reason="this torch has ShapesSpec")
def test_shapes_spec_on_an_older_torch_names_the_fix(tmp_path: Path) -> None:
    model, _ = record_scale(tmp_path, PADDED[:3])
    with pytest.raises(ReplayError, match="needs torch >= 2.14"):
        replay.export(model, tmp_path, spec="shapes")


@needs_shapes_spec
def test_padded_workload_exports_with_the_assumption_and_the_router_checks_it(
    tmp_path: Path,
) -> None:
    model, originals = record_scale(tmp_path / "store", PADDED)
    result = replay.export(model, tmp_path / "store", spec="shapes")
    assert result.complete, result.coverage.to_pylist()
    # Probes the assumption admits only (sizes between the recorded ones, multiples of 8).
    probes = [r for r in result.coverage.to_pylist() if r["kind"] == "probe"]
    assert probes and all(r["sizes"][1] % 8 == 0 for r in probes)
    (group,) = result.inputs.groups
    spec = group.dynamic_shapes
    assert [repr(a).split("#")[0] for a in spec.assumptions] == ["Eq(Mod(x_1"]
    # batch was recorded at 1 and at 2, 3: one program, not specialized, and the notes say so.
    assert any("batch recorded at 1: kept dynamic" in n for n in result.notes)
    assert len(result.programs) == 1
    saved = tmp_path / "m.pt2"
    result.save(saved)
    runner = replay.load(saved)
    for args in originals:
        torch.testing.assert_close(runner(*copy.deepcopy(args)), model(*args))
    # Inside the range but not a multiple of 8: the router refuses it, naming the assumption.
    odd = (torch.randn(2, 12, 4), torch.ones(2, 12))
    with pytest.raises(CallNotServed, match=r"x_1 % 8 == 0"):
        runner(*odd)
    # Batch 1 with a length never recorded at batch 1: served (1 is not specialized).
    one = (torch.randn(1, 24, 4), torch.ones(1, 24))
    torch.testing.assert_close(runner(*one), model(*one))


@needs_shapes_spec
@pytest.mark.slow
def test_llama_generate_with_learned_shapes_spec_serves_every_original_call(
    tmp_path: Path,
) -> None:
    from fixtures.generate_traffic import record_traffic, serve_originals, tiny_causal

    model = tiny_causal("llama")
    # Five prompt lengths: enough distinct decode signatures for capture to trust the relation
    # attention_mask_1 = past_key_values_2 + 1, which the unbacked mask branch needs.
    workload = [(2, 5, True), (3, 8, True), (2, 6, True), (3, 7, True), (2, 4, True)]
    originals = record_traffic(model, tmp_path / "store", workload, max_new_tokens=3)
    result = replay.export(model, tmp_path / "store", spec="shapes")
    assert result.complete, [r for r in result.coverage.to_pylist() if not r["covered"]]
    from torch.fx.experimental.dynamic_spec import ShapesSpec

    assert all(isinstance(g.dynamic_shapes, ShapesSpec) for g in result.inputs.groups)
    result.save(tmp_path / "llama.pt2")
    verdicts = serve_originals(model, replay.load(tmp_path / "llama.pt2"), originals)
    assert [v.reason for v in verdicts if not v.correct] == []
    assert {v.group for v in verdicts} == {"prefill", "decode"}


def test_capture_export_spec_shapes(tmp_path: Path) -> None:
    record_scale(tmp_path / "store", PADDED)
    (tmp_path / "scale_model.py").write_text(
        "import torch\n\n"
        "class Scale(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, 4))\n\n"
        "    def forward(self, x, mask):\n"
        "        return x * self.w + mask.sum(-1, keepdim=True).unsqueeze(-1)\n\n"
        "def build():\n"
        "    return Scale()\n"
    )
    args = ["--store", str(tmp_path / "store"), "export", f"{tmp_path / 'scale_model.py'}:build"]
    result = CliRunner().invoke(cli, [*args, "--spec", "shapes"])
    if not shapesspec.supported():
        assert result.exit_code == 1 and "needs torch >= 2.14" in result.output
        return
    assert result.exit_code == 0, result.output
    assert "x_1 % 8 == 0" in result.output and "batch recorded at 1" in result.output
