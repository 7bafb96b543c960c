"""`capture check` and the runner give one answer per recorded signature.

A model with a weight and a size branch is recorded with payloads on (every call kept), while
a forward pre-hook copies every ORIGINAL call. torch.export specializes the branch at the
example's batch (a guard ``batch <= 3``), so the recorded batch-6 and batch-5 signatures fail
the export's check; probes (unseen batches between the recorded ones) run too. Then: the
runner refuses exactly the signatures the coverage table marks failed, serves every other
original call equal to eager, and ``capture check`` says the same thing, row by row, with the
same reasons.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import capture
import replay
from capture.cli.main import cli
from replay.runtime.coverage import KIND_PAYLOAD, KIND_PROBE, KIND_RECORDED, CoverageRow
from replay.runtime.pt2.loading import CallNotServed

pytest.importorskip("safetensors")


class Branchy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = self.proj(x)
        y = y * 2 if x.shape[0] > 3 else y + 1
        return y if mask is None else y * mask


def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The signature text `capture check` prints for a call (``x=2x3 mask=2x3``)."""
    named = {"x": args[0], **kwargs} if args else dict(kwargs)
    return " ".join(f"{k}={'x'.join(map(str, v.shape))}" for k, v in named.items())


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Branchy, list[Any]]:
    root = tmp_path_factory.mktemp("agreement")
    torch.manual_seed(0)
    model = Branchy()
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def hook(_m: Any, args: Any, kwargs: Any) -> None:
        calls.append((copy.deepcopy(args), copy.deepcopy(kwargs)))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    with capture.Recorder(model, root / "store", name="branchy", payloads=1.0), torch.no_grad():
        for b in (2, 2, 2, 3, 6):
            model(torch.randn(b, 3))
        for b in (2, 3, 3, 5):
            model(torch.randn(b, 3), mask=torch.randint(0, 2, (b, 3)))
    handle.remove()
    return root, model, calls


def test_runner_and_check_agree_on_every_recorded_signature(
    recorded: tuple[Path, Branchy, list[Any]],
) -> None:
    root, model, calls = recorded
    # one program per group (no regimes at the cut, no static fallback): a recorded signature
    # fails, so the runner and the check have refusals to agree on
    result = replay.export(model, root / "store", max_regimes=1, max_static=0)
    rows = CoverageRow.from_table(result.coverage)
    kinds = {r.kind for r in rows}
    assert {KIND_RECORDED, KIND_PROBE, KIND_PAYLOAD} <= kinds  # probes and payloads checked
    failed = {r.signature for r in rows if r.kind == KIND_RECORDED and not r.covered}
    # the signatures the guard `batch <= 3` cuts off, in each group
    assert failed == {"x=6x3", "x=5x3 mask=5x3"}
    result.save(root / "branchy.pt2")
    runner = replay.load(root / "branchy.pt2")

    served: dict[str, str | None] = {}
    with torch.no_grad():
        for args, kwargs in calls:
            sig = _signature(args, kwargs)
            try:
                served[sig] = runner.select(*args, **kwargs)
            except CallNotServed:
                served[sig] = None
                continue
            torch.testing.assert_close(runner(*args, **kwargs), model(*args, **kwargs))
    # the runner refuses exactly the signatures the coverage table marks failed
    assert {sig for sig, group in served.items() if group is None} == failed

    out = CliRunner().invoke(
        cli, ["--store", str(root / "store"), "check", str(root / "branchy.pt2"), "-f", "json"]
    )
    assert out.exit_code == 3  # some recorded calls are not served
    checked = {row["signature"]: row["group"] for row in json.loads(out.stdout)}
    assert checked == served  # row for row: the same group, or refused by both
    refused = next(row for row in json.loads(out.stdout) if row["signature"] == "x=6x3")
    with pytest.raises(CallNotServed) as caught:
        runner(torch.randn(6, 3))
    assert refused["reason"] == "; ".join(f"{k}: {v}" for k, v in caught.value.reasons.items())


def test_runner_and_check_agree_with_regimes_and_merged_groups(
    recorded: tuple[Path, Branchy, list[Any]],
) -> None:
    # The default export splits each group at the cut (regimes) and may serve the group without
    # a mask by the other's program, the mask filled: still one answer per original call.
    root, model, calls = recorded
    result = replay.export(model, root / "store")
    result.save(root / "regimes.pt2")
    runner = replay.load(root / "regimes.pt2")
    served: dict[str, str | None] = {}
    with torch.no_grad():
        for args, kwargs in calls:
            try:
                served[_signature(args, kwargs)] = runner.select(*args, **kwargs)
            except CallNotServed:
                served[_signature(args, kwargs)] = None
                continue
            torch.testing.assert_close(runner(*args, **kwargs), model(*args, **kwargs))
    assert len(set(served.values()) - {None}) > 2  # regimes serve the sides of the cut
    out = CliRunner().invoke(
        cli, ["--store", str(root / "store"), "check", str(root / "regimes.pt2"), "-f", "json"]
    )
    assert {row["signature"]: row["group"] for row in json.loads(out.stdout)} == served
