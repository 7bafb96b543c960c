"""A Llama with two real peft LoRA adapters, served per adapter from one artifact.

The generate() traffic tests are slow (recording and six exports of a tiny Llama: about 90 s on
a loaded 2-core machine); a two-layer MLP with LoRA checks the same promise in the default run.

What a multi-tenant server does: ``generate()`` requests with the adapter switched between them by
``set_adapter()`` and some under ``disable_adapter()``. The recorder finds the adapters by itself;
the export puts the model in each recorded state; the saved artifact, loaded with
``replay.load``, serves every ORIGINAL call (forward pre-hook copies) under its state with the
eager model's answer under that state, and refuses a call whose state it does not know.
"""

from __future__ import annotations

import copy
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import capture
import replay
from capture.analysis.groups import analyze
from capture.cli.main import cli
from fixtures.adapters import DISABLED, AdapterCall, in_state, lora_llama, record_adapter_traffic
from replay.runtime.runner import UnknownState

pytest.importorskip("peft")


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc(x)))


def test_a_small_peft_model_is_served_per_adapter(tmp_path: Path) -> None:
    """The same promise on a two-layer MLP with LoRA on one layer: fast, in the default run."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = {"r": 2, "target_modules": ["fc"], "init_lora_weights": False}
    peft_model = get_peft_model(Mlp().eval(), LoraConfig(**config), adapter_name="alpha")
    peft_model.add_adapter("beta", LoraConfig(**config))
    peft_model.eval()
    calls = []
    with capture.Recorder(peft_model, tmp_path / "store", name="mlp"), torch.no_grad():
        for adapter, batch in [("alpha", 2), ("beta", 3), (DISABLED, 2), ("alpha", 5)]:
            for rows in (batch, batch + 1):
                x = torch.randn(rows, 8)
                calls.append(AdapterCall(adapter, (x,), {}))
                with in_state(peft_model, adapter):
                    peft_model(x)
    peft_model.set_adapter("beta")  # the export enters each recorded state itself
    result = replay.export(peft_model, tmp_path / "store", probes=0)
    assert peft_model.active_adapter == "beta"  # put back as it was
    assert result.complete
    assert sorted(result.programs) == [
        "g0+adapter=alpha",
        "g0+adapter=beta",
        "g0+adapters_disabled",
    ]
    result.save(tmp_path / "mlp.pt2")
    runner = replay.load(tmp_path / "mlp.pt2")
    for call in calls:
        with in_state(peft_model, call.adapter), torch.no_grad():
            expected = peft_model(*call.args)
        got = runner.state(**STATES[call.adapter])(*call.args)
        torch.testing.assert_close(got, expected)
    with pytest.raises(UnknownState, match="several states"):
        runner(*calls[0].args)


# (adapter, batch, prompt length): two requests per state, of different lengths (dynamic dims)
WORKLOAD = [
    ("alpha", 2, 5),
    ("beta", 2, 6),
    (DISABLED, 2, 7),
    ("alpha", 2, 4),
    ("beta", 2, 5),
    (DISABLED, 2, 6),
]
STATES = {
    "alpha": {"adapter": "alpha"},
    "beta": {"adapter": "beta"},
    DISABLED: {"adapters_disabled": True},
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("peft")
    peft_model = lora_llama()
    calls = record_adapter_traffic(peft_model, root / "store", WORKLOAD)
    inner = peft_model.get_base_model()
    result = replay.export(inner, root / "store", probes=0)
    path = root / "lora.pt2"
    result.save(path)
    return {
        "peft": peft_model,
        "calls": calls,
        "result": result,
        "path": path,
        "store": root / "store",
    }


def _eager(peft_model: Any, call: AdapterCall) -> Any:
    with in_state(peft_model, call.adapter), torch.no_grad():
        return peft_model.get_base_model()(*copy.deepcopy(call.args), **copy.deepcopy(call.kwargs))


@pytest.mark.slow
def test_the_recorder_finds_each_requests_adapter_state(served: dict[str, Any]) -> None:
    with capture.open_store(served["store"]) as store:
        rows = store.query("SELECT state, count(*) AS n FROM calls GROUP BY 1 ORDER BY 1")
        groups = analyze(store)
    assert rows.to_pylist() == [
        {"state": '{"adapter":"alpha"}', "n": 6},
        {"state": '{"adapter":"beta"}', "n": 6},
        {"state": '{"adapters_disabled":true}', "n": 6},
    ]
    assert sorted(g.name for g in groups) == [
        f"{kind}+{label}"
        for kind in ("decode", "prefill")
        for label in ("adapter=alpha", "adapter=beta", "adapters_disabled")
    ]


@pytest.mark.slow
def test_every_original_call_is_served_right_under_its_state(served: dict[str, Any]) -> None:
    result = served["result"]
    assert result.complete, [r for r in result.coverage.to_pylist() if not r["covered"]]
    runner = replay.load(served["path"])
    wrong, per_state = [], dict.fromkeys(STATES, 0)
    for index, call in enumerate(served["calls"]):
        expected = _eager(served["peft"], call)
        view = runner.state(**STATES[call.adapter])
        with torch.no_grad():
            got = view(*copy.deepcopy(call.args), **copy.deepcopy(call.kwargs))
        diff = float((got.logits - expected.logits).abs().max())
        if diff > 1e-4:
            wrong.append((index, call.adapter, diff))
        per_state[call.adapter] += 1
    assert wrong == []
    assert per_state == {"alpha": 6, "beta": 6, DISABLED: 6}  # every state served, every call
    # The adapters change the answers: serving a call under another state would be wrong.
    first = served["calls"][0]
    with torch.no_grad():
        other = runner.state(adapter="beta")(*copy.deepcopy(first.args), **first.kwargs)
    assert float((other.logits - _eager(served["peft"], first).logits).abs().max()) > 1e-3


@pytest.mark.slow
def test_a_call_whose_state_the_artifact_does_not_know_is_refused(
    served: dict[str, Any],
) -> None:
    runner = replay.load(served["path"])
    call = served["calls"][0]
    with pytest.raises(
        UnknownState, match=r"several states \(adapter=alpha, adapter=beta, adapters_"
    ):
        runner(*call.args, **call.kwargs)
    with pytest.raises(UnknownState, match="no program of the state 'adapter=c'"):
        runner.state(adapter="c")
    with pytest.raises(UnknownState, match="no program of the state 'default'"):
        runner.state()


@pytest.mark.slow
def test_the_artifact_holds_the_base_weights_once(served: dict[str, Any]) -> None:
    inner = served["peft"].get_base_model()
    model_bytes = sum(t.numel() * t.element_size() for t in inner.state_dict().values())
    with zipfile.ZipFile(served["path"]) as archive:
        stored = sum(i.file_size for i in archive.infolist() if "/weights/weight_" in i.filename)
    # six programs of three states, each weight (both adapters' too) once; equal tensors (the
    # norms' ones) once too
    assert model_bytes - 2048 <= stored <= model_bytes


@pytest.mark.slow
def test_check_agrees_with_the_runner_state_by_state(served: dict[str, Any]) -> None:
    out = CliRunner().invoke(
        cli, ["--store", str(served["store"]), "check", str(served["path"]), "-f", "csv"]
    )
    assert out.exit_code == 0, out.stderr
    rows = [line.split(",") for line in out.stdout.splitlines()]
    states = {r[-1] for r in rows[1:]}
    assert states == {"adapter=alpha", "adapter=beta", "adapters_disabled"}
    assert all(r[1].endswith("+" + r[-1]) for r in rows[1:])  # each routed to its state's group
    assert out.stderr.endswith(
        f"served: {len(rows) - 1} of {len(rows) - 1} recorded signatures, 18 of 18 calls\n"
    )
