"""The work of an ONNX file's loops is bounded at load (replay/runtime/ort/loops.py):
a Loop's trip count and a Scan's length, evaluated over the guards' ranges, at most MAX_TRIPS
(nested loops multiplied); a count not known at load is refused, in one line."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from replay.runtime.ort.loops import MAX_TRIPS, check_loops
from replay.runtime.ort.manifest import OnnxFile, OnnxInput, OnnxOutputs
from replay.runtime.ort.weights import OnnxFileError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
helper, TP = onnx.helper, onnx.TensorProto


def _served(batch_max: int) -> OnnxFile:
    x = OnnxInput("x", 0, "args[0]", "float32", ("batch", 4), (1, 4), (batch_max, 4))
    return OnnxFile("m.onnx", (x,), OnnxOutputs("", (), ()), {"batch": (1, batch_max)})


def _counting_body() -> Any:
    """A Loop body adding one to a carried counter."""
    return helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Add", ["acc", "one"], ["acc_out"])],
        "body",
        [helper.make_tensor_value_info("i", TP.INT64, []),
         helper.make_tensor_value_info("cond", TP.BOOL, []),
         helper.make_tensor_value_info("acc", TP.INT64, [])],
        [helper.make_tensor_value_info("cond_out", TP.BOOL, []),
         helper.make_tensor_value_info("acc_out", TP.INT64, [])],
        [helper.make_tensor("one", TP.INT64, [], [1])],
    )  # fmt: skip


def _model(count_nodes: list[Any], count: str, body: Any | None = None) -> Any:
    """x -> a Loop of `count` trips (computed by `count_nodes`) counting its iterations."""
    nodes = [
        *count_nodes,
        helper.make_node("Constant", [], ["go"], value=helper.make_tensor("t", TP.BOOL, [], [1])),
        helper.make_node("Constant", [], ["zero"], value_int=0),
        helper.make_node("Loop", [count, "go", "zero"], ["n"], body=body or _counting_body()),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("n", TP.INT64, [])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _rows_times(k: int) -> list[Any]:
    """trips = x.shape[0] * k."""
    return [
        helper.make_node("Shape", ["x"], ["shape"], start=0, end=1),
        helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", TP.INT64, [1], [k])),
        helper.make_node("Mul", ["shape", "k"], ["rows_k"]),
        helper.make_node("Squeeze", ["rows_k"], ["trips"]),
    ]


def test_a_trip_count_from_sizes_within_the_budget_is_served() -> None:
    model = _model(_rows_times(1000), "trips")
    check_loops(model, "m.onnx", [_served(5)])  # at most 5 * 1000 trips
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (n,) = session.run(None, {"x": np.ones((3, 4), np.float32)})
    assert int(n) == 3000  # the Loop is real: it ran x.shape[0] * 1000 times


def test_the_same_count_over_a_wider_guard_is_refused() -> None:
    model = _model(_rows_times(1000), "trips")
    with pytest.raises(OnnxFileError) as refused:
        check_loops(model, "m.onnx", [_served(5), _served(10**6)])
    assert str(refused.value) == (
        "m.onnx: the Loop node '' would run 1,000,000,000 times (more than 1,048,576) at the "
        "sizes the guards admit; onnxruntime runs it where no deadline can stop a call, so the "
        "file is not loaded"
    )


def test_nested_loops_multiply() -> None:
    inner = helper.make_node("Loop", ["inner_trips", "cond", "acc"], ["acc_out"])
    inner.attribute.append(helper.make_attribute("body", _counting_body()))
    count = helper.make_tensor("c", TP.INT64, [], [2048])
    outer_body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Constant", [], ["inner_trips"], value=count), inner],
        "outer",
        [helper.make_tensor_value_info("i", TP.INT64, []),
         helper.make_tensor_value_info("cond", TP.BOOL, []),
         helper.make_tensor_value_info("acc", TP.INT64, [])],
        [helper.make_tensor_value_info("cond_out", TP.BOOL, []),
         helper.make_tensor_value_info("acc_out", TP.INT64, [])],
    )  # fmt: skip
    model = _model(_rows_times(256), "trips", outer_body)
    check_loops(model, "m.onnx", [_served(2)])  # 512 * 2048 = 2**20
    with pytest.raises(OnnxFileError, match="would run 3,145,728 times"):
        check_loops(model, "m.onnx", [_served(6)])  # 1536 * 2048


def test_a_trip_count_read_from_a_value_is_refused() -> None:
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0),
        helper.make_node("Cast", ["top"], ["trips"], to=TP.INT64),
    ]
    with pytest.raises(OnnxFileError, match="has a trip count \\('trips'\\) not computed from"):
        check_loops(_model(nodes, "trips"), "m.onnx", [_served(5)])


def _scan(over: list[Any], scanned: str) -> Any:
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "row"], ["s_out"])],
        "body",
        [helper.make_tensor_value_info("s", TP.FLOAT, [4]),
         helper.make_tensor_value_info("row", TP.FLOAT, [4])],
        [helper.make_tensor_value_info("s_out", TP.FLOAT, [4])],
    )  # fmt: skip
    zeros = helper.make_tensor("z", TP.FLOAT, [4], [0.0] * 4)
    nodes = [
        *over,
        helper.make_node("Constant", [], ["init"], value=zeros),
        helper.make_node("Scan", ["init", scanned], ["total"], body=body, num_scan_inputs=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("total", TP.FLOAT, [4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_a_scan_over_an_input_is_bounded_by_its_guard() -> None:
    check_loops(_scan([], "x"), "m.onnx", [_served(MAX_TRIPS)])
    with pytest.raises(OnnxFileError, match="would run 1,048,577 times"):
        check_loops(_scan([], "x"), "m.onnx", [_served(MAX_TRIPS + 1)])


def test_a_scan_over_a_length_known_only_when_run_is_refused() -> None:
    nodes = [
        helper.make_node("NonZero", ["x"], ["where"]),
        helper.make_node("Cast", ["where"], ["rows"], to=TP.FLOAT),
        helper.make_node("Transpose", ["rows"], ["scanned"]),
    ]
    with pytest.raises(OnnxFileError, match="scans 'scanned', whose length is not known"):
        check_loops(_scan(nodes, "scanned"), "m.onnx", [_served(5)])
