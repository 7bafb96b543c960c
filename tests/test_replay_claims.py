"""What an export claims is what the loader serves: programs go through the loader's validation.

A model whose forward calls an operator off the allow-list (a custom operator library,
registered here with torch.library) exports fine with torch.export; without ``allow_ops`` its
rows are not covered and carry the loader's own reason, and with ``allow_ops`` naming the
operator they are covered, and the saved artifact loads with the same name and serves the
ORIGINAL calls (forward pre-hook copies).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

import replay
from capture import Recorder
from replay.artifact.loadable import refusal
from replay.runtime.guards import ArtifactError


@torch.library.custom_op("capture_claims::scaled", mutates_args=())
def _scaled(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@_scaled.register_fake
def _(x: torch.Tensor, factor: float) -> torch.Tensor:
    return torch.empty_like(x)


class _Custom(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.capture_claims.scaled(self.proj(x), 2.0)
        return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, list[Any]]:
    torch.manual_seed(0)
    model = _Custom().eval()
    root = tmp_path_factory.mktemp("claims") / "store"
    originals: list[Any] = []
    handle = model.register_forward_pre_hook(lambda _m, args: originals.append(copy.deepcopy(args)))
    with Recorder(model, root), torch.no_grad():
        for batch in (2, 3, 5):
            model(torch.randn(batch, 4))
    handle.remove()
    return model, root, originals


def _claimed(result: Any) -> list[tuple[bool, str | None]]:
    return [
        (r["covered"], r["error"]) for r in result.coverage.to_pylist() if r["kind"] == "recorded"
    ]


def test_a_program_the_loader_refuses_is_not_claimed(recorded: Any) -> None:
    model, root, _ = recorded
    result = replay.export(model, root, probes=0)
    rows = _claimed(result)
    reason = (
        "replay.load would refuse its program: models/{}.json: the program calls "
        "'torch.ops.capture_claims.scaled.default', which is not an operator an artifact may call"
    )
    group = result.coverage.column("group")[0].as_py()
    assert rows and all(not covered for covered, _ in rows)
    assert all(str(error).startswith(reason.format(group)) for _, error in rows)
    assert result.programs == {} and not result.complete
    # An operator refused: no static program is tried (each would call it too).
    assert not any("static" in note for note in result.notes), result.notes


def test_naming_the_operator_claims_it_and_the_artifact_loads(
    recorded: Any, tmp_path: Path
) -> None:
    model, root, originals = recorded
    result = replay.export(model, root, probes=0, allow_ops=["capture_claims.scaled"])
    assert [covered for covered, _ in _claimed(result)] == [True] * len(_claimed(result))
    result.save(tmp_path / "m.pt2")
    with pytest.raises(ArtifactError, match="capture_claims.scaled"):
        replay.load(tmp_path / "m.pt2")  # the load names it too, or refuses it
    runner = replay.load(tmp_path / "m.pt2", allow_ops=["capture_claims::scaled.default"])
    for args in originals:
        torch.testing.assert_close(runner(*args), model(*args), rtol=0, atol=0)


def test_an_int_mm_program_is_taken_without_allow_ops() -> None:
    class _W8A8(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch._int_mm(a, b)

    a = torch.randint(-128, 127, (32, 16), dtype=torch.int8)
    b = torch.randint(-128, 127, (16, 8), dtype=torch.int8)
    program = torch.export.export(_W8A8(), (a, b))
    assert refusal("g", program) is None


def test_a_refused_operator_is_taken_when_named() -> None:
    class _Counts(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.bincount(x, minlength=8)[:8]

    program = torch.export.export(_Counts(), (torch.tensor([1, 2, 2, 7]),))
    assert "'torch.ops.aten.bincount.default', which is not an operator" in str(
        refusal("g", program)
    )
    assert refusal("g", program, frozenset({"aten.bincount"})) is None
