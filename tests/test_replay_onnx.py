"""The ONNX target: every file checked with onnxruntime, guarded, routed, weights shared.

The fixtures' linear model with an optional input (``labels``) is recorded with and without it
(two call groups whose ONNX files both take an input named ``x``), with payloads, while a
forward pre-hook keeps the ORIGINAL calls; ``replay.export(..., onnx=PATH)`` writes the set once
per module and the tests read it back through ``replay.load(PATH)``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from click.testing import CliRunner

import capture
import replay
from capture.analysis.groups import analyze
from capture.cli.main import cli
from capture.engines.profiles import build_profiles
from capture.errors import ReplayError
from fixtures.generate_traffic import Call, record_calls
from fixtures.seeds import LinearModel
from replay.runtime.guards import CallNotServed
from replay.runtime.ort.checks import external_initializers, read_checked
from replay.runtime.ort.combined import Checked, combine
from replay.runtime.ort.manifest import read_onnx_set
from replay.runtime.ort.runner import OnnxRunner, load_onnx
from replay.runtime.ort.sessions import COMBINED_FROM, chosen_mode
from replay.runtime.ort.weights import OnnxFileError

pytest.importorskip("onnxruntime")

FEATURES = 256  # a 64 KiB weight: above INLINE_BYTES, so it lives in the shared weights file
CALLS: list[dict[str, Any]] = [
    {"x": (2, FEATURES)},
    {"x": (3, FEATURES)},
    {"x": (5, FEATURES)},
    {"x": (2, FEATURES), "labels": (2,)},
    {"x": (4, FEATURES), "labels": (4,)},
    {"x": (7, FEATURES), "labels": (7,)},
]


def _calls(calls: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """`calls` (name -> shape) as keyword arguments, drawn as they are called."""
    torch.manual_seed(1)
    for call in calls:
        kwargs = {"x": torch.randn(*call["x"])}
        if "labels" in call:
            kwargs["labels"] = torch.randint(0, 64, call["labels"])
        yield kwargs


@pytest.fixture(scope="module")
def linear(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, list[Call], Path, Path]:
    """(model, result, original calls, store, onnx path)."""
    root = tmp_path_factory.mktemp("linear")
    torch.manual_seed(0)
    model = LinearModel(FEATURES, 64).eval()
    originals = record_calls(model, root / "store", _calls(CALLS))
    target = root / "out" / "linear.onnx"
    target.parent.mkdir()
    result = replay.export(model, root / "store", onnx=target)
    return model, result, originals, root / "store", target


def _rows(result: Any, target: str) -> list[dict[str, Any]]:
    return [r for r in result.coverage.to_pylist() if r["target"] == target]


def test_every_onnx_file_is_checked_on_the_rows_of_its_program(linear: Any) -> None:
    _, result, _, _, _ = linear
    torch_rows = {(r["group"], r["kind"], tuple(r["sizes"])) for r in _rows(result, "torch")}
    onnx_rows = {(r["group"], r["kind"], tuple(r["sizes"])) for r in _rows(result, "onnx")}
    # the same recorded signatures, probes and payloads, once per target
    assert onnx_rows == torch_rows
    assert {r["kind"] for r in _rows(result, "onnx")} == {"recorded", "probe", "payload"}


def test_every_onnx_row_is_covered_and_counts_in_complete(linear: Any) -> None:
    _, result, _, _, _ = linear
    assert all(r["covered"] for r in _rows(result, "onnx"))
    assert result.complete


def test_every_original_call_is_served_right_by_the_onnx_runner(linear: Any) -> None:
    model, _, originals, _, target = linear
    runner = replay.load(target)
    assert isinstance(runner, OnnxRunner)
    for args, kwargs in originals:
        with torch.no_grad():
            expected = model(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        got = runner(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        assert type(got) is type(expected)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_the_runner_picks_the_file_by_structure_not_input_names(linear: Any) -> None:
    _, _, originals, _, target = linear
    manifest = read_onnx_set(target)
    first_inputs = {e.group: f.inputs[0].name for e, f in manifest.entries}
    assert set(first_inputs.values()) == {"x"}  # a name-based router could not tell them apart
    runner = load_onnx(target)
    groups = {runner.select(*args, **kwargs) for args, kwargs in originals}
    assert groups == set(first_inputs)


def test_a_call_outside_the_recorded_range_is_refused_and_never_run(linear: Any) -> None:
    _, _, _, _, target = linear
    runner = load_onnx(target)
    ran: list[str] = []
    for name, program in runner.programs.items():
        session = program.session

        class Spy:
            def run_with_ort_values(
                self, *a: Any, _n: str = name, _s: Any = session, **k: Any
            ) -> Any:
                ran.append(_n)
                return _s.run_with_ort_values(*a, **k)

        program.session = Spy()
    with pytest.raises(CallNotServed, match=r"axis 0 = 50 is outside the recorded range \[2, 5\]"):
        runner(x=torch.randn(50, FEATURES))
    assert ran == []


def test_refusal_names_every_group_tried(linear: Any) -> None:
    _, _, _, _, target = linear
    with pytest.raises(CallNotServed) as info:
        load_onnx(target)(x=torch.randn(3, FEATURES, 2))
    assert set(info.value.reasons) == {"g0", "g1"}


def test_outputs_keep_eager_types_and_readable_names(linear: Any) -> None:
    _, result, _, _, _ = linear
    names = {g: [o.name for o in onnx.load(p).graph.output] for g, p in result.onnx.items()}
    groups = {len(n): g for g, n in names.items()}
    assert names[groups[1]] == ["output"]
    assert names[groups[2]] == ["output_0", "output_1"]


def test_manifest_says_what_each_file_serves(linear: Any) -> None:
    _, result, _, _, target = linear
    manifest = read_onnx_set(target)
    assert manifest.manifest.versions["onnxruntime"] is not None
    assert {f.file for f in manifest.files} == {os.path.basename(p) for p in result.onnx.values()}
    for entry, file in manifest.entries:
        meta = {p.key: p.value for p in onnx.load(target.parent / file.file).metadata_props}
        assert meta["capture.group"] == entry.group
        assert meta["capture.structure_id"] == entry.structure_id
        assert meta["capture.manifest"] == "linear.onnx.json"
        x = file.inputs[0]
        largest = 5 if len(file.inputs) == 1 else 7  # without labels: 2, 3, 5; with: 2, 4, 7
        assert (x.name, x.min[0], x.max[0]) == ("x", 2, largest)


def test_profiles_and_manifest_agree_on_input_names_and_ranges(linear: Any) -> None:
    _, result, _, store, target = linear
    manifest = read_onnx_set(target)
    with capture.open_store(store) as opened:
        profiles = build_profiles(analyze(opened))
    for entry, file in manifest.entries:
        (profile,) = [p for p in profiles if p.group == entry.group]
        assert [(i.name, tuple(i.min), tuple(i.max)) for i in profile.inputs] == [
            (i.name, i.min, i.max) for i in file.inputs
        ]
        for name, dim in file.dims.items():
            assert dim == (2, 5 if len(file.inputs) == 1 else 7), name


def test_payload_rows_are_checked_against_production_outputs(linear: Any) -> None:
    _, result, _, _, _ = linear
    payloads = [r for r in _rows(result, "onnx") if r["kind"] == "payload"]
    assert len(payloads) == len(CALLS)
    assert all(r["covered"] for r in payloads)


def test_a_manifest_naming_a_file_outside_its_folder_is_refused(
    linear: Any, tmp_path: Path
) -> None:
    _, _, _, _, target = linear
    shutil.copytree(target.parent, tmp_path / "set")
    manifest = tmp_path / "set" / "linear.onnx.json"
    data = json.loads(manifest.read_text())
    data["programs"][0]["file"] = "../elsewhere.onnx"
    manifest.write_text(json.dumps(data))
    with pytest.raises(OnnxFileError, match="'../elsewhere.onnx' is not a file name beside"):
        replay.load(tmp_path / "set" / "linear.onnx")


def test_a_manifest_of_another_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m.onnx.json").write_text('{"format": "capture-onnx/99"}')
    with pytest.raises(OnnxFileError, match="manifest format 'capture-onnx/99'"):
        replay.load(tmp_path / "m.onnx")


@pytest.mark.parametrize(
    ("linked_manifest", "message"),
    [
        (False, "missing or not a regular file"),
        (True, "linear.onnx.json is a link; an ONNX set's manifest"),
    ],
    ids=["onnx file", "manifest"],
)
def test_a_linked_file_of_the_set_is_refused(
    linear: Any, tmp_path: Path, linked_manifest: bool, message: str
) -> None:
    _, _, _, _, target = linear
    for name in os.listdir(target.parent):
        if name.endswith(".json") == linked_manifest:
            os.symlink(target.parent / name, tmp_path / name)
        else:
            shutil.copy(target.parent / name, tmp_path / name)
    with pytest.raises(OnnxFileError, match=message):
        replay.load(tmp_path / "linear.onnx")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("axes", "wide", r"programs\[0\]\.axes must be a list"),
        (
            "conditions",
            [{"expr": "exec('x')", "text": "x"}],
            r"conditions\[0\] is not what capture writes \(the size condition",
        ),
        ("file", "/etc/passwd", r"'/etc/passwd' is not a file name beside the manifest"),
    ],
)
def test_a_changed_manifest_is_one_error_naming_the_field(
    linear: Any, tmp_path: Path, field: str, value: Any, message: str
) -> None:
    # an ONNX set's typed manifest is read as data, field by field
    _, _, _, _, target = linear
    shutil.copytree(target.parent, tmp_path / "set")
    manifest = tmp_path / "set" / "linear.onnx.json"
    data = json.loads(manifest.read_text())
    data["programs"][0][field] = value
    manifest.write_text(json.dumps(data))
    with pytest.raises(OnnxFileError, match=message):
        replay.load(tmp_path / "set" / "linear.onnx")
    done = CliRunner().invoke(cli, ["check", str(tmp_path / "set" / "linear.onnx")])
    assert done.exit_code == 1
    assert done.stdout == ""
    assert done.stderr.startswith("Error: ") and len(done.stderr.splitlines()) == 1


def test_all_files_share_one_weights_file_holding_each_weight_once(linear: Any) -> None:
    model, result, _, _, target = linear
    # The exporter folds `weight.T` into the constant the graph reads: that is the weight stored.
    weight = model.weight.detach().T.contiguous().numpy().tobytes()
    data = Path(f"{target}.data").read_bytes()
    assert data == weight  # two files, one copy
    for path in result.onnx.values():
        (init,) = external_initializers(path, "linear.onnx.data")
        assert (init.offset, init.length) == (0, len(weight))


def test_one_session_serves_both_files_with_the_weight_once(linear: Any) -> None:
    _, _, _, _, target = linear
    runner = load_onnx(target, mode="combined")
    assert len(runner.programs) == 2
    assert len({id(p.session) for p in runner.programs.values()}) == 1
    folder = os.path.dirname(target)
    files = sorted({p.file.file for p in runner.programs.values()})
    checked = [
        Checked(f, *read_checked(os.path.join(folder, f), "linear.onnx.data")) for f in files
    ]
    model, branches = combine(checked, "linear.onnx.data")
    external = [i for i in model.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL]
    assert len(external) == 1  # the weight both files read, once in the main graph
    assert [n.op_type for n in model.graph.node] == ["If", "If"]  # one branch per file
    for node in model.graph.node:
        then = next(a.g for a in node.attribute if a.name == "then_branch")
        assert external[0].name in {i for n in then.node for i in n.input}  # read from outside
        assert not [i for i in then.initializer if i.data_location == onnx.TensorProto.EXTERNAL]
    assert sorted(branches) == files


def test_the_one_session_answers_each_original_call_as_the_file_s_own_session(
    linear: Any,
) -> None:
    _, _, originals, _, target = linear
    one, own = load_onnx(target, mode="combined"), load_onnx(target, share_weights=False)
    assert len({id(p.session) for p in own.programs.values()}) == 2
    for args, kwargs in originals:  # with and without labels: both branches, a scalar loss
        got = one(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        expected = own(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def _feed_by_dlpack(runner: OnnxRunner) -> None:
    """Feeds `runner`'s sessions as for an element type numpy lacks: DLPack OrtValues."""
    for program in runner.programs.values():
        program._numpy = False
        program._feed = program._dlpack
        program._flags = {k: program._true() for k in program._flags}


@pytest.mark.parametrize("mode", ["combined", "per-file"])
def test_feeds_by_dlpack_answer_as_feeds_by_numpy(linear: Any, mode: str) -> None:
    # an element type numpy lacks (bfloat16) goes by DLPack OrtValues: the same answers, the
    # same output types
    _, _, originals, _, target = linear
    by_numpy, by_dlpack = (load_onnx(target, mode=mode) for _ in range(2))
    assert all(p._numpy for p in by_numpy.programs.values())
    _feed_by_dlpack(by_dlpack)
    for args, kwargs in originals:
        got = by_dlpack(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        expected = by_numpy(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        assert type(got) is type(expected)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["combined", "per-file"])
@pytest.mark.parametrize("by_dlpack", [False, True])
def test_a_strided_grad_or_negated_tensor_answers_as_its_plain_copy(
    linear: Any, mode: str, by_dlpack: bool
) -> None:
    # numpy() refuses a tensor that needs grad or has a lazy negation bit: the runner copies
    # those; a strided or expanded one goes as it is and onnxruntime makes it contiguous. DLPack
    # (element types numpy lacks) would export a negated tensor's memory without its negation.
    _, _, originals, _, target = linear
    runner = load_onnx(target, mode=mode)
    if by_dlpack:
        _feed_by_dlpack(runner)
    for args, kwargs in originals:
        x = kwargs["x"]
        strided = x.t().contiguous().t()
        negated = torch._neg_view(-x)
        expanded = x[:1].expand_as(x)
        assert not strided.is_contiguous() and negated.is_neg() and expanded.stride()[0] == 0
        for variant in (strided, x.clone().requires_grad_(True), negated, expanded):
            plain = variant.detach().resolve_neg().contiguous().clone()
            expected = runner(*args, **{**kwargs, "x": plain})
            got = runner(*args, **{**kwargs, "x": variant})
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_auto_mode_serves_by_the_weights_size_and_says_which(linear: Any, tmp_path: Path) -> None:
    _, _, _, _, target = linear
    # a few bytes of weights: a session per file (the combined session's branches cost more
    # than the copies save at this size); a forced mode is served as asked
    assert (load_onnx(target).mode, load_onnx(target, mode="combined").mode) == (
        "per-file",
        "combined",
    )
    assert "mode=per-file" in repr(load_onnx(target))
    big = tmp_path / "weights.data"
    with open(big, "wb") as f:  # sparse: the size is what the rule reads
        f.truncate(COMBINED_FROM)
    assert chosen_mode("auto", True, str(big)) == "combined"
    assert chosen_mode("auto", False, str(big)) == "per-file"  # share_weights=False forces it
    with pytest.raises(ReplayError, match=r"^unknown ONNX runner mode 'fast'; use one of auto"):
        load_onnx(target, mode="fast")


def test_capture_check_reads_an_onnx_set(linear: Any) -> None:
    _, _, _, store, target = linear
    done = CliRunner().invoke(cli, ["--store", str(store), "check", str(target), "-f", "json"])
    assert done.exit_code == 0, done.output
    rows = json.loads(done.stdout)
    assert [(r["group"], r["served"]) for r in rows] == [("g0", True)] * 3 + [("g1", True)] * 3
    assert done.stderr == "served: 6 of 6 recorded signatures, 6 of 6 calls\n"


def test_capture_check_of_an_onnx_set_imports_no_torch(linear: Any) -> None:
    _, _, _, store, target = linear
    script = (
        "import sys\nfrom capture.cli.main import cli\n"
        "try:\n    cli(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write('torch imported: %s\\n' % ('torch' in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "--store", str(store), "check", str(target)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.stderr.splitlines()[-1] == "torch imported: False"


def test_capture_check_says_when_there_is_no_onnx_set(linear: Any, tmp_path: Path) -> None:
    _, _, _, store, _ = linear
    missing = tmp_path / "none.onnx"
    done = CliRunner().invoke(cli, ["--store", str(store), "check", str(missing)])
    assert done.exit_code == 1
    assert done.stdout == ""
    assert done.stderr == (
        f"Error: no ONNX manifest at {missing}.json: replay.load takes the path given to onnx= "
        "(capture export --out MODEL.onnx writes one)\n"
    )


class Mul(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y


def _wrong_mul(self: Any, other: Any) -> Any:
    from onnxscript import opset18

    return opset18.Add(self, other)  # a translation that does not mean what torch means


def test_an_onnx_file_that_disagrees_is_not_covered_and_not_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnxscript.function_libs.torch_lib.tensor_typing import TReal

    _wrong_mul.__annotations__ = {"self": TReal, "other": TReal, "return": TReal}
    monkeypatch.setattr(
        "replay.onnx.convert.translation_table",
        lambda: {torch.ops.aten.mul.Tensor: _wrong_mul},
    )
    model = Mul()
    with capture.Recorder(model, tmp_path / "store", flush_seconds=3600):
        for batch in (2, 3, 4):
            model(torch.randn(batch, 3), torch.randn(batch, 3))
    result = replay.export(model, tmp_path / "store", onnx=tmp_path / "mul.onnx")
    onnx_rows = _rows(result, "onnx")
    assert all(r["covered"] for r in _rows(result, "torch"))
    assert not any(r["covered"] for r in onnx_rows) and not result.complete
    assert all("differs by" in r["error"] for r in onnx_rows)
    with pytest.raises(CallNotServed, match="failed the export's check"):
        replay.load(tmp_path / "mul.onnx")(torch.randn(3, 3), torch.randn(3, 3))


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")  # torch.onnx's own deepcopy
def test_sdpa_is_translated_as_torch_computes_fully_masked_rows(tmp_path: Path) -> None:
    import onnxruntime as ort

    from replay.onnx.translation import translation_table

    class Attention(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any, mask: Any) -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = (torch.randn(2, 4, 3, 8) for _ in range(3))
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool)
    mask[0, 0, 0, :] = False  # a left-padded position: it attends to nothing
    mask[1, 0, 1, 0] = False
    program = torch.onnx.export(
        Attention().eval(),
        (q, k, v, mask),
        dynamo=True,
        custom_translation_table=translation_table(),
    )
    assert program is not None
    program.save(str(tmp_path / "sdpa.onnx"))
    session = ort.InferenceSession(str(tmp_path / "sdpa.onnx"), providers=["CPUExecutionProvider"])
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), (q, k, v, mask), strict=True)}
    got = torch.from_numpy(session.run(None, feeds)[0])
    expected = Attention()(q, k, v, mask)
    # a fully masked row gives zeros, not the mean of the values (onnxscript's translation)
    assert float(expected[0, :, 0].abs().max()) == 0.0
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_the_per_group_table_and_total_show_each_target(linear: Any) -> None:
    from replay.runtime.coverage import coverage_total, group_coverage

    _, result, _, _, _ = linear
    table = group_coverage(result.coverage)
    seen = [(r["group"], r["target"], r["signatures"]) for r in table]
    first = seen[0][0]  # groups in the order the export checked them, each target beside
    second = "g0" if first == "g1" else "g1"
    assert seen == [
        (first, "torch", "3/3"),
        (first, "onnx", "3/3"),
        (second, "torch", "3/3"),
        (second, "onnx", "3/3"),
    ]
    total = coverage_total(result.coverage)
    assert total.startswith("6 of 6 recorded signatures covered (6 of 6 calls)")
    assert "; onnx: 6 of 6 recorded signatures covered (6 of 6 calls)" in total
