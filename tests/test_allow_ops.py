"""The quantized operators on the list, and the operators a caller names with ``allow_ops``.

Real torch.export programs of quantized modules (fp8 ``_scaled_mm`` over a float8 buffer, int4
packed weights, torch's ``quantized_decomposed`` (de)quantize pair) pass the loader's whole
validation without ``allow_ops`` (`replay.artifact.loadable.refusal`); the namespaces outside
``aten`` resolve in a fresh process (their modules imported by the loader); ``allow_ops`` takes
any single operator or overload of any namespace, never ``aten`` whole. A model with float8
and int4-packed buffers is exported, saved, loaded and serves its ORIGINAL calls.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import replay
from capture import Recorder
from replay.artifact.loadable import refusal
from replay.runtime.allowed import allow_ops
from replay.runtime.guards import ArtifactError
from replay.runtime.pt2.operators import op_kind

ROOT = Path(__file__).resolve().parents[1]


class _Float8(torch.nn.Module):
    weight: torch.Tensor
    scale: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randn(16, 32).to(torch.float8_e4m3fn))
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = x.to(torch.float8_e4m3fn)
        return torch._scaled_mm(
            q, self.weight.t(), torch.tensor(1.0), self.scale, out_dtype=torch.float32
        )


class _Int4(torch.nn.Module):
    weight: torch.Tensor
    scales_and_zeros: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        packed = torch.randint(0, 16, (32, 64), dtype=torch.int32)
        self.register_buffer("weight", torch._convert_weight_to_int4pack_for_cpu(packed, 1))
        self.register_buffer("scales_and_zeros", torch.randn(2, 32, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x, self.weight, 32, self.scales_and_zeros)


class _QuantizeDequantize(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.ao.quantization.fx._decomposed  # noqa: F401 (registers the namespace)

        ops = torch.ops.quantized_decomposed
        q = ops.quantize_per_tensor(x, 0.1, 0, -128, 127, torch.int8)
        return ops.dequantize_per_tensor(q, 0.1, 0, -128, 127, torch.int8)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("module", "x", "operator"),
    [
        (_Float8, torch.randn(16, 32), "aten._scaled_mm.default"),
        (_Int4, torch.randn(4, 64), "aten._weight_int4pack_mm_for_cpu.default"),
        (
            _QuantizeDequantize,
            torch.randn(3, 4),
            "quantized_decomposed.quantize_per_tensor.default",
        ),
    ],
)
def test_a_quantized_program_passes_the_loaders_validation(
    module: type[torch.nn.Module], x: torch.Tensor, operator: str
) -> None:
    program = torch.export.export(module(), (x,))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert operator in targets  # the case calls the operator it is about
    assert refusal("g", program) is None


def test_the_namespaces_outside_aten_resolve_in_a_fresh_process() -> None:
    code = (
        "from replay.runtime.pt2.program import resolve_target\n"
        "for name in ('quantized_decomposed.quantize_per_tensor.default',"
        " 'transformers.grouped_mm_fallback.default'):\n"
        "    print(resolve_target('torch.ops.' + name))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "quantized_decomposed.quantize_per_tensor.default",
        "transformers.grouped_mm_fallback.default",
    ]


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["aten._int_mm"], {"aten._int_mm"}),
        (["aten::bincount"], {"aten.bincount"}),
        (
            ["quantized_decomposed.quantize_per_tensor.default"],
            {"quantized_decomposed.quantize_per_tensor.default"},
        ),
        (["mylib", "mylib::op.default"], {"mylib", "mylib.op.default"}),
    ],
)
def test_allow_ops_takes_any_single_operator(names: list[str], expected: set[str]) -> None:
    assert allow_ops(names) == expected


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("aten", "allow_ops: 'aten' would allow every torch operator"),
        ("a.b.c.d", "allow_ops: 'a.b.c.d' is not an operator namespace"),
        ("os.system()", "allow_ops: 'os.system()' is not an operator namespace"),
    ],
)
def test_allow_ops_refuses_aten_whole_and_what_is_no_operator(name: str, message: str) -> None:
    with pytest.raises(ArtifactError, match=message.replace("(", r"\(").replace(")", r"\)")):
        allow_ops([name])


@pytest.mark.parametrize(
    ("target", "named", "kind"),
    [
        ("torch.ops.aten.bincount.default", [], None),
        ("torch.ops.aten.bincount.default", ["aten.bincount"], "pure"),
        ("torch.ops.aten.bincount.default", ["aten.bincount.default"], "pure"),
        ("torch.ops.aten.bincount.out", ["aten.bincount.default"], None),
        ("torch.ops.aten.from_file.default", ["aten.bincount"], None),
        ("torch.ops.aten.index_reduce_.default", [], None),
        ("torch.ops.aten.index_reduce_.default", ["aten.index_reduce_"], "inplace"),
        ("torch.ops.aten._int_mm.default", [], "pure"),
        ("torch.ops.quantized_decomposed.choose_qparams.tensor", [], "pure"),
        ("torch.ops.transformers.grouped_mm_fallback.default", [], "pure"),
        ("torch.ops.transformers.grouped_mm_fallback_backward.default", [], None),
    ],
)
def test_a_named_operator_and_only_it_is_allowed(
    target: str, named: list[str], kind: str | None
) -> None:
    assert op_kind(target, allow_ops(named)) == kind


@pytest.mark.parametrize(("module", "shape"), [(_Float8, (16, 32)), (_Int4, (4, 64))])
def test_a_float8_or_int4_model_is_saved_loaded_and_serves_its_calls(
    module: type[torch.nn.Module], shape: tuple[int, int], tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = module().eval()
    originals: list[tuple[torch.Tensor, ...]] = []
    hook = model.register_forward_pre_hook(lambda _m, args: originals.append(copy.deepcopy(args)))
    with Recorder(model, tmp_path / "store"), torch.no_grad():
        for _ in range(3):
            model(torch.randn(*shape))
    hook.remove()
    result = replay.export(model, tmp_path / "store", probes=0)
    assert result.complete, result.coverage.to_pylist()
    result.save(tmp_path / "m.pt2")
    runner = replay.load(tmp_path / "m.pt2", verify_weights=True)  # float8/int4 records hashed
    for args in originals:
        assert torch.equal(runner(*args), model(*args))
