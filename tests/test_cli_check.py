"""`capture export --out MODEL.pt2` and `capture check MODEL.pt2`: the export job's end.

A toy model is recorded, exported to an artifact through the CLI, then the store receives newer
traffic (longer inputs, a larger batch, a new dtype): `capture check --since` must list exactly
the calls outside the programs' accepted ranges. The stdout checks run the CLI in a real
subprocess, where torch writes to file descriptor 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import capture
from capture.cli.main import cli
from replay.runtime.pt2.loading import read_manifest

ROOT = Path(__file__).resolve().parents[1]

FACTORIES = textwrap.dedent(
    """
    import torch


    class Twice(torch.nn.Module):
        def forward(self, x, mask=None):
            return x * 2 if mask is None else x * mask


    def twice():
        return Twice()


    class DataDependent(torch.nn.Module):
        def forward(self, x, mask=None):
            return x * 2 if x.sum() > 0 else x


    def data_dependent():
        return DataDependent()
    """
)


class _Twice(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return x * 2 if mask is None else x * mask


def _record(
    store: Path, calls: list[tuple[int, int, bool]], dtype: torch.dtype = torch.float32
) -> None:
    """Records (batch, length, with a mask) calls of the toy model under the name 'twice'."""
    model = _Twice()
    with capture.Recorder(model, store, name="twice"), torch.no_grad():
        for batch, length, masked in calls:
            x = torch.randn(batch, length, dtype=dtype)
            if masked:
                model(x, mask=torch.ones(batch, length))
            else:
                model(x)


@pytest.fixture
def factories(tmp_path: Path) -> str:
    path = tmp_path / "factories.py"
    path.write_text(FACTORIES)
    return str(path)


@pytest.fixture
def exported(tmp_path: Path, factories: str) -> tuple[Path, Path]:
    store = tmp_path / "store"
    _record(store, [(2, 6, False), (3, 7, False), (4, 8, False), (2, 5, True), (3, 5, True)])
    artifact = tmp_path / "twice.pt2"
    result = CliRunner().invoke(
        cli, ["--store", str(store), "export", f"{factories}:twice", "--out", str(artifact)]
    )
    assert result.exit_code == 0, result.stderr
    assert f"wrote {artifact}\n" in result.stderr
    return store, artifact


def _check(store: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--store", str(store), "check", *args])
    return result.exit_code, result.stdout, result.stderr


def test_export_out_writes_one_artifact(exported: tuple[Path, Path]) -> None:
    store, artifact = exported
    assert sorted(p.name for p in artifact.parent.glob("*.pt2")) == ["twice.pt2"]
    assert [p.group for p in read_manifest(artifact).programs] == ["g0", "g1"]


def test_check_lists_exactly_the_newer_calls_outside_the_accepted_ranges(
    exported: tuple[Path, Path],
) -> None:
    store, artifact = exported
    since = datetime.now(timezone.utc).isoformat()
    # newer traffic: one call still within range, a larger batch, a longer input, a new dtype
    _record(store, [(3, 7, False), (5, 7, False), (2, 20, False), (3, 5, True), (3, 5, True)])
    _record(store, [(3, 7, False)], dtype=torch.float64)
    code, out, err = _check(store, str(artifact), "--since", since, "-f", "json")
    assert code == 3  # some calls are not served
    rows = json.loads(out)
    # the store's column names (`DriftRow.model_name` is printed as ``model``), in their order
    assert [list(r) for r in rows] == [
        ["model", "group", "signature", "calls", "served", "reason"]
    ] * 5
    assert {r["model"] for r in rows} == {"twice"}
    assert [(r["signature"], r["calls"], r["group"]) for r in rows] == [
        ("x=3x7", 1, "g0"),
        ("x=5x7", 1, None),
        ("x=2x20", 1, None),
        ("x=3x5 mask=3x5", 2, "g1"),
        ("x=3x7", 1, None),
    ]
    reasons = [r["reason"] for r in rows if not r["served"]]
    differs = "different call structure: "
    no_mask = f"{differs}the call does not pass kwargs['mask'] (the program takes a float32 tensor"
    # the runner's own reasons, from the one routing function both use
    assert reasons == [
        f"g0: args[0] axis 0 = 5 is outside the recorded range [2, 4]; g1: {no_mask} of rank 2)",
        f"g0: args[0] axis 1 = 20 is outside the recorded range [6, 8]; g1: {no_mask} of rank 2)",
        f"g0: {differs}args[0] is a float64 tensor of rank 2, the program takes a float32 tensor "
        f"of rank 2; g1: {no_mask} of rank 2); args[0] is a float64 tensor of rank 2, the "
        "program takes a float32 tensor of rank 2",
    ]
    assert err == "served: 2 of 5 recorded signatures, 3 of 6 calls\n"


def test_check_of_the_recorded_window_serves_everything(exported: tuple[Path, Path]) -> None:
    store, artifact = exported
    code, out, err = _check(store, str(artifact), "-f", "jsonl")
    assert code == 0
    assert len(out.splitlines()) == 5
    assert err == "served: 5 of 5 recorded signatures, 5 of 5 calls\n"


def test_check_of_an_empty_window_says_so(exported: tuple[Path, Path]) -> None:
    store, artifact = exported
    code, out, err = _check(store, str(artifact), "--since", "2999-01-01")
    assert (code, out) == (0, "")
    assert err == "no recorded calls since 2999-01-01: nothing to check\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.pt2"], "Error: no artifact at missing.pt2\n"),
        (["{artifact}", "--since", "yesterday"], "is not a date (YYYY-MM-DD) or an ISO timestamp"),
        (["{artifact}", "--model", "nope"], "Error: "),
    ],
)
def test_check_errors(exported: tuple[Path, Path], args: list[str], message: str) -> None:
    store, artifact = exported
    code, out, err = _check(store, *[a.format(artifact=artifact) for a in args])
    assert code in (1, 2)
    assert out == ""
    assert message in err
    assert "Traceback" not in err


def test_check_imports_not_the_model(exported: tuple[Path, Path]) -> None:
    # check validates as replay.load does (torch reads the programs), without the model's code
    store, artifact = exported
    script = (
        "import sys\nfrom capture.cli.main import cli\n"
        "try:\n    cli(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write('model imported: %s\\n' % ('factories' in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "--store", str(store), "check", str(artifact)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.stderr.splitlines()[-1] == "model imported: False"


def _cli(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "capture.cli", "--store", str(store), *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


# Slow: a whole torch.export (15-25 s); keeps the fast suite under 3 minutes.
@pytest.mark.slow
def test_export_onnx_json_is_valid_json(tmp_path: Path, factories: str) -> None:
    pytest.importorskip("onnxscript")
    store = tmp_path / "store"
    _record(store, [(2, 6, False), (3, 7, False)])
    done = _cli(
        store, "export", f"{factories}:twice", "--out", str(tmp_path / "x.onnx"), "-f", "json"
    )
    assert done.returncode == 0, done.stderr
    # stdout is the coverage table alone; torch.onnx's progress lines are kept off
    # both streams (replay.onnx.convert, verbose=False)
    rows = json.loads(done.stdout)
    # every recorded signature once per target, the ONNX file's rows beside the torch
    recorded = [(r["target"], r["covered"]) for r in rows if r["kind"] == "recorded"]
    assert sorted(recorded) == [("onnx", True)] * 2 + [("torch", True)] * 2
    assert all(r["covered"] for r in rows)
    assert "[torch.onnx]" not in done.stderr


# Slow: a whole torch.export (15-25 s); keeps the fast suite under 3 minutes.
@pytest.mark.slow
def test_a_torch_export_failure_is_one_line_on_stderr(tmp_path: Path, factories: str) -> None:
    store = tmp_path / "store"
    _record(store, [(2, 6, False), (3, 7, False)])
    done = _cli(store, "export", f"{factories}:data_dependent", "-f", "json")
    assert done.returncode == 3
    rows = json.loads(done.stdout)
    assert all(
        r["error"].startswith("torch.export failed: GuardOnDataDependentSymNode") for r in rows
    )
    failures = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert failures == [f"error: group g0: {rows[0]['error']}"]
    assert "Traceback" not in done.stderr
