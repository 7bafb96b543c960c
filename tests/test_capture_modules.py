"""Recorder(modules=...): sub-modules recorded under ``<name>.<sub>``, exported and
served from the same artifact, through the Python API and ``capture export --out``."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import capture
import replay
from capture.cli.main import cli
from capture.errors import CaptureError

FACTORY = textwrap.dedent(
    """
    import torch


    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.inner = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.inner(x).relu()


    def outer():
        return Outer().eval()
    """
)


@pytest.fixture
def outer(tmp_path: Path) -> tuple[str, torch.nn.Module]:
    path = tmp_path / "factory.py"
    path.write_text(FACTORY)
    spec = importlib.util.spec_from_file_location("outer_factory", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return f"{path}:outer", module.outer()


def _record(model: torch.nn.Module, store: Path) -> capture.Recorder:
    with capture.Recorder(model, store, modules=["inner"]) as rec, torch.no_grad():
        for batch in (2, 3, 5):
            model(torch.randn(batch, 4))
    return rec


def test_sub_modules_are_recorded_under_their_own_partition(
    outer: tuple[str, torch.nn.Module], tmp_path: Path
) -> None:
    rec = _record(outer[1], tmp_path / "store")
    assert sorted(rec.modules) == ["inner"]
    with capture.open_store(tmp_path / "store") as store:
        assert sorted(store.models()) == ["Outer", "Outer.inner"]
        assert store.query("SELECT count(*) AS n FROM calls WHERE model = 'Outer.inner'")[
            "n"
        ].to_pylist() == [3]
    assert "forward" not in vars(outer[1].inner)  # the child recorder stopped with its parent


def test_a_sub_module_path_that_does_not_exist_is_refused(
    outer: tuple[str, torch.nn.Module], tmp_path: Path
) -> None:
    with pytest.raises(CaptureError, match="Outer has no sub-module 'nope'"):
        capture.Recorder(outer[1], tmp_path / "store", modules=["nope"])


def test_export_out_puts_every_recorded_sub_module_in_the_artifact(
    outer: tuple[str, torch.nn.Module], tmp_path: Path
) -> None:
    target, model = outer
    _record(model, tmp_path / "store")
    artifact = tmp_path / "outer.pt2"
    result = CliRunner().invoke(
        cli,
        ["--store", str(tmp_path / "store"), "export", target, "--out", str(artifact)]
        + ["--signatures"],  # one row per signature (one per group by default)
    )
    assert result.exit_code == 0, result.stderr
    rows = [line.split()[:2] for line in result.stdout.splitlines()[2:]]
    groups = [group for group, kind in rows if kind == "recorded"]
    assert groups == ["g0", "g0", "g0", "inner.g0", "inner.g0", "inner.g0"]
    runner = replay.load(artifact)
    x = torch.randn(4, 4)
    with torch.no_grad():
        torch.testing.assert_close(runner(x), model(x))
        torch.testing.assert_close(runner.modules["inner"](x), model.inner(x))
