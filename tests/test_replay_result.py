"""`ExportResult`: built once and frozen, and `save`, the one step that writes .pt2 and ONNX.

A linear model is recorded with and without its optional input (two call groups), with
payloads, while a forward pre-hook keeps the ORIGINAL calls; what `save` writes is loaded back
and run on those calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

import capture
import replay
from capture.errors import ReplayError
from fixtures.generate_traffic import Call, record_calls
from fixtures.models import EncoderDecoder
from fixtures.seeds import LinearModel
from replay.pipeline.result import ExportResult, Saved
from replay.runtime.coverage import CoverageRow, coverage_total, group_coverage
from replay.runtime.ort.runner import OnnxRunner
from replay.runtime.runner import Runner

pytest.importorskip("onnxruntime")

CALLS = [(2, False), (3, False), (5, False), (2, True), (4, True)]


def _calls() -> Iterator[dict[str, Any]]:
    """CALLS (batch, with labels) as keyword arguments, drawn as they are called."""
    torch.manual_seed(1)
    for batch, labelled in CALLS:
        kwargs: dict[str, Any] = {"x": torch.randn(batch, 16)}
        if labelled:
            kwargs["labels"] = torch.randint(0, 8, (batch,))
        yield kwargs


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[Call], Path]:
    """(model, the original calls, store)."""
    root = tmp_path_factory.mktemp("result")
    torch.manual_seed(0)
    model = LinearModel(16, 8).eval()
    return model, record_calls(model, root / "store", _calls()), root / "store"


@pytest.fixture(scope="module")
def result(recorded: tuple[Any, list[Call], Path]) -> ExportResult:
    model, _, store = recorded
    return replay.export(model, store)


def _signature(rows: Any) -> list[tuple[Any, ...]]:
    """The rows as compared across two exports: everything but the measured difference."""
    return [(r.group, r.kind, r.target, r.signature, r.calls, r.covered, r.sizes) for r in rows]


def _served(runner: Any, model: Any, calls: list[Call]) -> None:
    """Every original call answered by `runner` as the eager model answers it."""
    for args, kwargs in calls:
        got, expected = runner(*args, **kwargs), model(*args, **kwargs)
        got_leaves, expected_leaves = pytree.tree_leaves(got), pytree.tree_leaves(expected)
        assert len(got_leaves) == len(expected_leaves)
        for value, want in zip(got_leaves, expected_leaves, strict=True):
            torch.testing.assert_close(torch.as_tensor(value), want, atol=1e-4, rtol=1e-4)


def test_assigning_any_field_of_the_result_raises(result: ExportResult) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.parts = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.complete = False  # type: ignore[misc]
    with pytest.raises(TypeError):
        result.modules["other"] = result  # type: ignore[index]


def test_the_derived_fields_are_copies_read_from_the_parts(result: ExportResult) -> None:
    result.programs.clear()
    result.notes.append("changed by a caller")
    assert sorted(result.programs) == ["g0", "g1"]
    assert "changed by a caller" not in result.notes
    assert [r.group for r in result.torch_rows][: len(result.parts[0].rows)] == [
        result.parts[0].group.name
    ] * len(result.parts[0].rows)
    assert result.coverage.num_rows == len(result.rows) and result.onnx == {}
    assert CoverageRow.from_table(result.coverage) == list(result.rows)
    assert group_coverage(result.rows) == group_coverage(result.coverage)
    assert coverage_total(result.rows) == coverage_total(result.coverage)


def test_save_to_onnx_checks_the_files_against_the_original_calls(
    recorded: tuple[Any, list[Call], Path], result: ExportResult, tmp_path: Path
) -> None:
    model, calls, _ = recorded
    saved = result.save(tmp_path / "m.onnx")
    assert isinstance(saved, Saved) and saved.path == str(tmp_path / "m.onnx")
    shipped = saved.result
    onnx_rows = [r for r in shipped.rows if r.target == "onnx"]
    torch_keys = {(r.group, r.kind, r.sizes) for r in shipped.torch_rows}
    assert {(r.group, r.kind, r.sizes) for r in onnx_rows} == torch_keys
    assert {r.kind for r in onnx_rows} == {"recorded", "probe", "payload"}
    assert all(r.covered for r in onnx_rows) and shipped.complete
    assert all(Path(f).is_file() for f in saved.files) and len(saved.files) == 4
    assert sorted(shipped.onnx) == ["g0", "g1"] and result.onnx == {}  # the result saved stays
    _served(replay.load(saved), model, calls)


def _wrong_mul(self: Any, other: Any) -> Any:
    from onnxscript import opset18

    return opset18.Add(self, other)  # a translation that does not mean what torch means


class Mul(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y


def test_onnx_rows_written_at_save_can_disagree_with_the_torch_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnxscript.function_libs.torch_lib.tensor_typing import TReal

    model = Mul()
    with capture.Recorder(model, tmp_path / "store", flush_seconds=3600):
        for batch in (2, 3, 4):
            model(torch.randn(batch, 3), torch.randn(batch, 3))
    result = replay.export(model, tmp_path / "store")
    _wrong_mul.__annotations__ = {"self": TReal, "other": TReal, "return": TReal}
    monkeypatch.setattr(
        "replay.onnx.convert.translation_table", lambda: {torch.ops.aten.mul.Tensor: _wrong_mul}
    )
    shipped = result.save(tmp_path / "mul.onnx").result
    onnx_rows = [r for r in shipped.rows if r.target == "onnx"]
    assert result.complete and not shipped.complete
    assert onnx_rows and not any(r.covered for r in onnx_rows)
    assert all("differs by" in (r.error or "") for r in onnx_rows)


def test_one_save_writes_the_artifact_and_the_onnx_set(
    recorded: tuple[Any, list[Call], Path], result: ExportResult, tmp_path: Path
) -> None:
    model, calls, _ = recorded
    saved = result.save(tmp_path / "m.pt2", onnx=tmp_path / "m.onnx")
    assert saved.path == str(tmp_path / "m.pt2") and saved.files[0] == saved.path
    assert str(tmp_path / "m.onnx.json") in saved.files
    _served(replay.load(saved), model, calls)
    _served(replay.load(tmp_path / "m.onnx"), model, calls)
    artifact = replay.load(saved)
    assert isinstance(artifact, Runner) and artifact.manifest.modules[""].complete


def test_export_with_onnx_is_export_then_save(
    recorded: tuple[Any, list[Call], Path], result: ExportResult, tmp_path: Path
) -> None:
    model, _, store = recorded
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shortcut = replay.export(model, store, onnx=tmp_path / "a" / "m.onnx")
    saved = result.save(tmp_path / "b" / "m.onnx").result
    assert _signature(shortcut.rows) == _signature(saved.rows)
    assert shortcut.notes == saved.notes and shortcut.complete == saved.complete
    assert {g: Path(f).name for g, f in shortcut.onnx.items()} == {
        g: Path(f).name for g, f in saved.onnx.items()
    }
    manifests = [(tmp_path / d / "m.onnx.json").read_text() for d in ("a", "b")]
    assert all(manifests)


def test_save_without_a_path_or_with_two_onnx_sets_is_refused(
    result: ExportResult, tmp_path: Path
) -> None:
    with pytest.raises(ReplayError, match="save needs a path"):
        result.save()
    with pytest.raises(ReplayError, match="names two ONNX sets"):
        result.save(tmp_path / "a.onnx", onnx=tmp_path / "b.onnx")
    with pytest.raises(ReplayError, match="no model to check"):
        dataclasses.replace(result, origin=None).save(tmp_path / "c.onnx")


def test_save_writes_the_sub_modules_into_the_same_onnx_set(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = EncoderDecoder().eval()
    seen: list[tuple[Any, ...]] = []  # the encoder's real calls, copied before it ran
    hook = model.encoder.register_forward_pre_hook(
        lambda m, args: seen.append(tuple(a.clone() for a in args))
    )
    with torch.no_grad(), capture.Recorder(model, tmp_path / "store", modules=["encoder"]):
        for batch, seq in [(2, 3), (3, 5), (4, 2)]:
            model(torch.randn(batch, seq, 4))
    hook.remove()
    result = replay.export(model, tmp_path / "store", modules=True, probes=0)
    shipped = result.save(tmp_path / "ed.onnx").result
    encoder = shipped.modules["encoder"]
    assert sorted(encoder.onnx) == ["g0"] and result.modules["encoder"].onnx == {}
    assert [r.target for r in encoder.rows] == ["torch"] * 3 + ["onnx"] * 3
    assert shipped.complete and encoder.complete
    runner = replay.load(tmp_path / "ed.onnx")
    assert isinstance(runner, OnnxRunner)
    with torch.no_grad():
        for args in seen:
            got = torch.as_tensor(runner.modules["encoder"](*args))
            torch.testing.assert_close(got, model.encoder(*args), atol=1e-5, rtol=1e-5)


def test_an_export_opens_its_store_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from capture.store import reader

    torch.manual_seed(0)
    model = EncoderDecoder().eval()
    with (
        torch.no_grad(),
        capture.Recorder(model, tmp_path / "store", modules=["encoder"], payloads=1.0),
    ):
        for batch, seq in [(2, 3), (3, 5), (4, 2)]:
            model(torch.randn(batch, seq, 4))
    opened: list[str] = []
    init = reader.StoreReader.__init__

    def counted(self: Any, path: Any, **kwargs: Any) -> None:
        opened.append(str(path))
        init(self, path, **kwargs)

    monkeypatch.setattr(reader.StoreReader, "__init__", counted)
    result = replay.export(
        model, tmp_path / "store", modules=True, probes=0, onnx=tmp_path / "ed.onnx"
    )
    kinds = {(r.kind, r.target) for r in result.all_rows()}
    assert ("payload", "onnx") in kinds and result.complete
    assert opened == [str(tmp_path / "store")]
