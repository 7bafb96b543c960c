"""The models of an ONNX set combined into one (`replay.runtime.ort.combined`), run by onnxruntime.

Two small models written as an export writes them (one weight in a shared weights file, read by
both), with what a combined model must keep apart: the same value and dim names in both, a local
function of the same name with different bodies, an output that is an input, a scalar output.
Each file's branch of the combined model must answer as the file's own session does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from replay.runtime.ort.checks import read_checked  # noqa: E402
from replay.runtime.ort.combined import Checked, combine  # noqa: E402

WEIGHTS = "set.onnx.data"


def _model(folder: Path, name: str, scale: float) -> str:
    """x [batch, 64] @ w (64x64, external) -> f(...) (a local function ``f`` scaling by
    `scale`); outputs: y, x itself, and the scalar sum of y."""
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[64, 64])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", WEIGHTS), ("offset", "0"), ("length", str(64 * 64 * 4))):
        weight.external_data.add(key=key, value=value)
    scale_const = helper.make_node(
        "Constant", [], ["s"], value=helper.make_tensor("sv", TensorProto.FLOAT, [], [scale])
    )
    function = helper.make_function(
        "local", "f", ["a"], ["b"], [scale_const, helper.make_node("Mul", ["a", "s"], ["b"])],
        [helper.make_opsetid("", 20)],
    )  # fmt: skip
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("f", ["h"], ["y"], domain="local"),
            helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
        ],
        initializer=[weight],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("local", 1)],
        functions=[function],
        ir_version=10,
    )
    path = folder / name
    onnx.save(model, str(path))
    return str(path)


def _options(folder: Path | None = None) -> object:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if folder is not None:
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(folder)
        )
    return options


def test_each_branch_answers_as_its_file_s_own_session(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    (tmp_path / WEIGHTS).write_bytes(rng.standard_normal((64, 64), dtype=np.float32).tobytes())
    paths = {
        name: _model(tmp_path, name, scale) for name, scale in (("a.onnx", 2.0), ("b.onnx", -3.0))
    }
    checked = [Checked(name, *read_checked(path, WEIGHTS)) for name, path in paths.items()]
    model, branches = combine(checked, WEIGHTS)
    weights = [i for i in model.graph.initializer if i.data_location == TensorProto.EXTERNAL]
    assert [w.name for w in weights] == ["w/0"]  # read by both files, held once
    session = ort.InferenceSession(model.SerializeToString(), _options(tmp_path))
    for name, path in paths.items():
        own = ort.InferenceSession(path, _options())
        for batch in (1, 3):
            x = rng.standard_normal((batch, 64), dtype=np.float32)
            branch = branches[name]
            expected = own.run(["y", "x", "total"], {"x": x})
            feeds = {branch.inputs["x"]: x, branch.flag: np.array(True)}
            got = session.run([branch.outputs[n] for n in ("y", "x", "total")], feeds)
            for g, e in zip(got, expected, strict=True):
                np.testing.assert_array_equal(g, e)
