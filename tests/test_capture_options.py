"""RecorderOptions: the recording options as one frozen object, checked once, shared whole by a
recorder and its sub-module recorders; the keywords of ``Recorder(...)`` build it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import capture
from capture.errors import CaptureError
from capture.record.recorder_options import RecorderOptions


class Outer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x).relu()


def _calls(store: Path) -> dict[str, tuple[int, int]]:
    """model -> (calls, calls with an output structure) as the store holds them."""
    with capture.open_store(store) as opened:
        table = opened.query(
            "SELECT model, count(*) AS n, count(out_structure) AS outs FROM calls GROUP BY model"
        )
    rows = table.to_pylist()
    return {row["model"]: (row["n"], row["outs"]) for row in rows}


def test_the_package_exports_the_options() -> None:
    assert capture.RecorderOptions is RecorderOptions
    assert capture.Payloads is capture.record.recorder_options.Payloads


def test_a_sub_module_recorder_gets_the_same_options_object(tmp_path: Path) -> None:
    model = Outer().eval()
    rec = capture.Recorder(
        model, tmp_path, modules=["inner"], max_calls=2, record_outputs=False, flush_rows=1
    )
    assert rec.modules["inner"].options is rec.options
    assert rec.options == RecorderOptions(max_calls=2, record_outputs=False, flush_rows=1)
    with rec, torch.no_grad():
        for batch in (1, 2, 3, 4):
            model(torch.randn(batch, 4))
    # Both recorders stopped after two calls and recorded no outputs: the child obeyed them too.
    assert _calls(tmp_path) == {"Outer": (2, 0), "Outer.inner": (2, 0)}


def test_an_options_object_is_taken_whole_and_keywords_replace_its_fields(tmp_path: Path) -> None:
    shared = RecorderOptions(sample=0.0, max_structures=7)
    first = capture.Recorder(torch.nn.Linear(4, 2), tmp_path / "a", options=shared)
    assert first.options is shared
    second = capture.Recorder(torch.nn.Linear(4, 2), tmp_path / "b", options=shared, sample=1.0)
    assert second.options == RecorderOptions(sample=1.0, max_structures=7)
    assert shared.sample == 0.0  # the shared object is unchanged
    model = torch.nn.Linear(4, 2)
    with capture.Recorder(model, tmp_path / "c", options=shared) as rec, torch.no_grad():
        model(torch.randn(3, 4))
    assert rec.stats()["recorded"] == 0 and rec.stats()["sampled_out"] == 1


def test_options_are_built_and_checked_without_torch() -> None:
    code = (
        "import sys, capture\n"
        "capture.RecorderOptions(sample=0.5, max_calls=10)\n"
        "print('torch' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert proc.stdout == "False\n"


def test_the_options_are_frozen() -> None:
    options = RecorderOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.sample = 0.5  # type: ignore[misc]


BAD = [
    ({"sample": 2}, r"sample=2 must be within \[0, 1\]"),
    ({"sample": -0.1}, r"sample=-0.1 must be within \[0, 1\]"),
    ({"sample": "all"}, r"sample='all' must be a number within \[0, 1\]"),
    ({"value_ranges": "gpu"}, r"value_ranges='gpu' must be one of \('cpu', 'all', 'none'\)"),
    ({"max_calls": -1}, r"max_calls=-1 must be a count >= 0, or None for no limit"),
    ({"queue_size": 0}, r"queue_size=0 must be a whole number >= 1"),
    ({"flush_rows": "10"}, r"flush_rows='10' must be a whole number >= 1"),
    ({"max_structures": 1.5}, r"max_structures=1.5 must be a whole number >= 1"),
    ({"flush_seconds": -1}, r"flush_seconds=-1 must be a number of seconds >= 0"),
    ({"payloads": 1.5}, r"payloads rate 1.5 must be within \[0, 1\]"),
    ({"payloads": "some"}, r"payloads='some' must be a rate within \[0, 1\] or a capture.Payloads"),
    (
        {"payloads": capture.Payloads(0.5, max_pending=0)},
        r"Payloads.max_pending=0 must be positive",
    ),
]


@pytest.mark.parametrize(("keywords", "message"), BAD, ids=[str(k) for k, _ in BAD])
def test_a_bad_option_is_one_clear_error_from_the_recorder_and_the_options(
    keywords: dict[str, Any], message: str, tmp_path: Path
) -> None:
    store = tmp_path / "never-created"
    with pytest.raises(CaptureError, match=message):
        RecorderOptions(**keywords)
    model = torch.nn.Linear(4, 2)
    with pytest.raises(CaptureError, match=message):
        capture.Recorder(model, store, **keywords)
    with pytest.raises(CaptureError, match=message):  # a keyword beside options= is checked too
        capture.Recorder(model, store, options=RecorderOptions(), **keywords)
    assert "forward" not in vars(model)  # nothing was wrapped
    assert not store.exists()


def test_an_unknown_option_names_the_closest_one(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    with pytest.raises(CaptureError, match=r"no option 'smaple'; did you mean 'sample'\?"):
        capture.Recorder(model, tmp_path, smaple=0.5)
    with pytest.raises(CaptureError, match=r"options=\{'sample': 0.5\} must be a capture"):
        capture.Recorder(model, tmp_path, options={"sample": 0.5})
    assert "forward" not in vars(model)
