"""A time budget per group and the static fallback: real models, real torch.export.

The ORIGINAL calls each model received (the tensors passed to it, kept by the test) are run
through the saved artifact's runner (`replay.load`) and compared with eager: the check that can
disagree with the coverage table.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import capture
import replay
from capture.cli.main import cli


class Parity(torch.nn.Module):
    """A cut at every size: even and odd row counts take different paths."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[0] % 2 == 0 else x + 1


def _record_parity(root: Path) -> list[torch.Tensor]:
    calls = [
        torch.arange(n * 3, dtype=torch.float32).reshape(n, 3) for n in (2, 2, 2, 3, 4, 5, 5, 6)
    ]
    model = Parity()
    with capture.Recorder(model, root, name="m"), torch.no_grad():
        for x in calls:
            model(x)
    return calls


def _swin(root: Path) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """A tiny SwinModel called at six image sizes, 20 calls (batch 1): `fixtures.swin`."""
    pytest.importorskip("transformers")
    from fixtures.swin import record_swin  # imports transformers

    return record_swin(root)


def _served(path: Path, model: torch.nn.Module, calls: list[torch.Tensor]) -> int:
    """How many original calls the artifact's runner answers as eager does."""
    from fixtures.swin import served

    return served(replay.load(path), model, calls)


def test_signatures_regimes_cannot_serve_get_static_programs(tmp_path: Path) -> None:
    calls = _record_parity(tmp_path / "store")
    result = replay.export(Parity(), tmp_path / "store", probes=0, max_regimes=4)
    # Five runs (2 | 3 | 4 | 5 | 6) would make five regimes: the dynamic program, traced at
    # the most frequent size (2), keeps the even sizes; each odd size gets a static program,
    # standing before it.
    assert list(result.programs) == ["g0[x_0=5]", "g0[x_0=3]", "g0"]
    rows = result.coverage.to_pylist()
    assert [(r["group"], r["signature"], r["calls"], r["covered"]) for r in rows] == [
        ("g0[x_0=5]", "x=5x3", 2, True),
        ("g0[x_0=3]", "x=3x3", 1, True),
        ("g0", "x=2x3", 3, True),
        ("g0", "x=4x3", 1, True),
        ("g0", "x=6x3", 1, True),
    ]
    assert result.complete
    assert any("static programs, one per signature" in n for n in result.notes)
    runner = replay.load(result.save(tmp_path / "m.pt2"))
    for x in calls:
        assert torch.equal(runner(x), Parity()(x))


def test_max_static_bounds_the_static_programs(tmp_path: Path) -> None:
    _record_parity(tmp_path)
    result = replay.export(Parity(), tmp_path, probes=0, max_regimes=4, max_static=1)
    # The most frequent unserved signature first: x=5x3 was called twice, x=3x3 once.
    assert sorted(result.programs) == ["g0", "g0[x_0=5]"]
    assert any("1 of them left without a program: max_static is 1" in n for n in result.notes)
    assert not result.complete


def test_an_export_past_its_budget_returns_and_says_what_fell_back(tmp_path: Path) -> None:
    model, _ = _swin(tmp_path)
    started = time.monotonic()
    result = replay.export(model, tmp_path, time_budget=2.0, probes=0, max_payloads=0)
    elapsed = time.monotonic() - started
    # The budget, plus reading the store and checking what was exported (nothing here).
    assert elapsed < 2.0 + 30
    assert "ran past the time budget" in result.errors["g0"]
    assert any(
        n.startswith(
            "g0: 6 recorded signatures not served by a dynamic program (torch.export "
            "ran past the time budget"
        )
        for n in result.notes
    )
    assert not result.complete
    # Every recorded signature is served by a static program or not covered, with the reason.
    rows = result.coverage.to_pylist()
    assert len(rows) == 6
    for row in rows:
        if row["covered"]:
            assert row["group"].startswith("g0[") and row["group"] in result.programs, row
        else:
            assert row["group"] == "g0" and "time budget" in row["error"], row


def test_the_cli_names_the_groups_past_the_budget(tmp_path: Path) -> None:
    _swin(tmp_path)
    factory = tmp_path / "factories.py"
    factory.write_text(
        "import torch, transformers\n"
        "def swin():\n"
        "    torch.manual_seed(0)\n"
        "    config = transformers.SwinConfig(image_size=32, patch_size=4, num_channels=3,\n"
        "        embed_dim=8, depths=[1, 1], num_heads=[1, 2], window_size=2)\n"
        "    return transformers.SwinModel(config).eval()\n"
    )
    result = CliRunner().invoke(
        cli,
        [
            "--store",
            str(tmp_path),
            "export",
            f"{factory}:swin",
            "--time-budget",
            "2",
            "--probes",
            "0",
        ],
    )
    # Whether the static fallback (within what the 2 s leave) serves every signature depends
    # on the machine's speed; the exit code follows the coverage either way: 3 only when the
    # export is incomplete.
    complete = "6 of 6 recorded signatures covered" in result.stderr
    assert result.exit_code == (0 if complete else 3), result.output
    assert "error: group g0: torch.export ran past the time budget" in result.stderr
    assert "note: g0: 6 recorded signatures not served by a dynamic program" in result.stderr


@pytest.mark.slow
def test_a_swin_at_six_image_sizes_is_served_within_the_budget(tmp_path: Path) -> None:
    model, calls = _swin(tmp_path / "store")
    budget = 60.0
    started = time.monotonic()
    result = replay.export(model, tmp_path / "store", time_budget=budget)
    elapsed = time.monotonic() - started
    assert elapsed < budget + 60  # the budget, plus reading the store and the check
    served = _served(Path(result.save(tmp_path / "swin.pt2")), model, calls)
    # The dynamic program alone, unbounded, serves 6 of the 20 calls.
    assert served >= 12, (served, result.notes)
