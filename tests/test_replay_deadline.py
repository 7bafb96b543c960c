"""The in-process deadline of an export: real torch.export stopped by the watchdog thread.

Each stopped export is followed by checks that torch is left as it was (`TorchState`) and that
the next export in the same process makes a correct program, run on the original calls.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

import capture
import replay
from replay.pipeline.budget.deadline import REFIRE, BudgetSpent, DeadlineReached, call_within
from replay.pipeline.budget.torchstate import TorchState


class Flatten(torch.nn.Module):
    """A quick export: one dynamic dim, a view over it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.view(x.shape[0], -1) * 2).sum(1)


def _swin() -> torch.nn.Module:
    pytest.importorskip("transformers")
    from fixtures.swin import tiny_swin

    return tiny_swin()


def _swin_export(model: torch.nn.Module, strict: bool = False) -> Any:
    """A tiny Swin's dynamic export: tens of seconds in torch's value-range analysis."""
    dim = torch.export.Dim.DYNAMIC
    return torch.export.export(
        model,
        (),
        {"pixel_values": torch.randn(1, 3, 40, 40)},
        dynamic_shapes={"pixel_values": {2: dim, 3: dim}},
        strict=strict,
    )


def _busy(seconds: float) -> int:
    """Python bytecode for `seconds` (where an asynchronous exception can land)."""
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        n += 1
    return n


def test_a_stopped_export_leaves_torch_as_it_was_and_the_next_export_is_right(
    tmp_path: Path,
) -> None:
    model = _swin()
    before = TorchState.read(model)
    for seconds in (0.05, 0.3, 1.0, 2.0):  # stopped at different points of the export
        started = time.monotonic()
        with pytest.raises(BudgetSpent, match="ran past the time budget"):
            call_within(seconds, lambda: _swin_export(model), model)
        assert time.monotonic() - started < seconds + 5
        assert before.changed() == []
    # The next export in this process, checked against the original calls the model received.
    calls = [torch.randn(n, 4, 5) for n in (2, 3, 3, 7)]
    flatten = Flatten()
    with capture.Recorder(flatten, tmp_path / "store", name="m"), torch.no_grad():
        for x in calls:
            flatten(x)
    result = replay.export(flatten, tmp_path / "store", time_budget=60.0, probes=0)
    assert result.complete and not result.errors
    runner = replay.load(result.save(tmp_path / "m.pt2"))
    for x in calls:
        assert torch.equal(runner(x), flatten(x))
    assert before.changed() == []


def test_a_stopped_strict_export_leaves_dynamo_as_it_was() -> None:
    model = _swin()
    before = TorchState.read(model)
    for seconds in (0.3, 1.5):  # inside dynamo's tracing (its frame callback set)
        with pytest.raises(BudgetSpent, match="ran past the time budget"):
            call_within(seconds, lambda: _swin_export(model, strict=True), model)
        assert before.changed() == []
    x = torch.randn(3, 4, 5)
    program = torch.export.export(
        Flatten(), (x,), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},), strict=True
    )
    y = torch.randn(8, 4, 5)
    assert torch.equal(program.module()(y), Flatten()(y))


def test_the_watchdog_never_fires_after_the_call_ended() -> None:
    # Calls that end well before the deadline, right at it, and well after it: the first
    # return, the last are stopped, those at the deadline go either way; in every case nothing
    # is raised once call_within has returned (a stray exception would fail `_busy` below).
    outcomes = {"returned": 0, "stopped": 0}
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)  # the watchdog gets the GIL soon after its deadline
    try:
        for i in range(200):
            duration = (0.0005, 0.0045, 0.005, 0.0055, 0.05)[i % 5]
            try:
                assert call_within(0.005, lambda d=duration: _busy(d)) > 0
                outcomes["returned"] += 1
            except BudgetSpent:
                outcomes["stopped"] += 1
            _busy(0.002)
    finally:
        sys.setswitchinterval(interval)
    assert outcomes["returned"] >= 10 and outcomes["stopped"] >= 10, outcomes


def test_a_quick_export_with_a_tight_deadline_returns_a_program_or_budget_spent() -> None:
    x = torch.randn(3, 4, 5)
    dims = ({0: torch.export.Dim.DYNAMIC},)

    def export() -> Any:
        return torch.export.export(Flatten(), (x,), dynamic_shapes=dims)

    started = time.monotonic()
    export()
    took = time.monotonic() - started
    outcomes = []
    for factor in (0.5, 0.9, 1.0, 1.1, 1.5, 3.0) * 2:
        try:
            program = call_within(took * factor, export)
        except BudgetSpent:
            outcomes.append("spent")
        else:
            y = torch.randn(9, 4, 5)
            assert torch.equal(program.module()(y), Flatten()(y))
            outcomes.append("program")
        _busy(0.01)
    assert "program" in outcomes, outcomes


def test_a_deadline_stops_an_export_in_a_thread_that_is_not_the_main_one(
    tmp_path: Path,
) -> None:
    model = _swin()
    calls = [torch.randn(1, 3, s, s) for s in (32, 40, 48)]
    with capture.Recorder(model, tmp_path, name="swin"), torch.no_grad():
        for x in calls:
            model(pixel_values=x)
    out: dict[str, Any] = {}

    def job() -> None:
        started = time.monotonic()
        out["result"] = replay.export(model, tmp_path, time_budget=2.0, probes=0, max_static=0)
        out["elapsed"] = time.monotonic() - started

    worker = threading.Thread(target=job)
    worker.start()
    worker.join(120)
    assert not worker.is_alive()
    assert out["elapsed"] < 2.0 + 30  # the budget, plus reading the store and the check
    assert "ran past the time budget" in out["result"].errors["g0"]


def test_an_exception_torch_swallows_is_raised_again() -> None:
    swallowed = []

    def call() -> None:
        while True:
            try:
                _busy(10)
            except DeadlineReached:  # once, as a bare ``except`` in the exported code would
                if swallowed:
                    raise
                swallowed.append(time.monotonic())

    started = time.monotonic()
    with pytest.raises(BudgetSpent):
        call_within(0.2, call)
    assert len(swallowed) == 1
    assert time.monotonic() - started >= 0.2 + REFIRE


def test_a_deadline_landing_in_a_weakref_callback_is_dropped_and_raised_again() -> None:
    # The garbage collector's callbacks cannot raise: Python reports what they raise to
    # sys.unraisablehook and goes on. Such a delivery is dropped there and raised again later.
    reported: list[Any] = []
    previous = sys.unraisablehook
    sys.unraisablehook = reported.append
    refs: list[Any] = []

    class Dies:
        pass

    def on_death(ref: Any) -> None:
        _busy(0.005)

    def make_and_drop(_: int) -> None:
        dies = Dies()
        refs.append(weakref.ref(dies, on_death))
        del dies  # the callback runs here

    def call() -> None:
        # For a whole second after the deadline, the only loops on the stack are the
        # callbacks' (map is C, make_and_drop has none): the first delivery lands in one.
        list(map(make_and_drop, range(220)))
        _busy(10)

    started = time.monotonic()
    try:
        with pytest.raises(BudgetSpent):
            call_within(0.1, call)
    finally:
        sys.unraisablehook = previous
    assert reported == []
    assert time.monotonic() - started >= REFIRE  # the first delivery was dropped


def test_the_deadline_waits_for_a_context_manager_exit_to_end() -> None:
    exits = []

    class Restores:
        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            _busy(0.3)  # the deadline passes here: an exception now would skip the restore
            exits.append("restored")

    def call() -> None:
        with Restores():
            pass
        _busy(10)

    started = time.monotonic()
    with pytest.raises(BudgetSpent):
        call_within(0.1, call)
    assert exits == ["restored"]
    assert 0.3 <= time.monotonic() - started < 5


def test_what_the_call_raises_before_the_deadline_is_raised_as_is() -> None:
    def call() -> None:
        raise ValueError("not exportable")

    with pytest.raises(ValueError, match="not exportable"):
        call_within(30.0, call)
    assert call_within(None, lambda: 3) == 3
    with pytest.raises(BudgetSpent, match="spent before this export"):
        call_within(0.0, lambda: 3)


def test_state_a_stopped_export_left_is_put_back_and_named() -> None:
    model = Flatten()
    before = TorchState.read(model)
    original = torch.compiler._is_exporting_flag
    try:
        torch.compiler._is_exporting_flag = not original
        model.forward = lambda x: x  # type: ignore[method-assign]
        assert sorted(before.changed()) == [
            "module <root> forward",
            "torch.compiler._is_exporting_flag",
        ]
        assert sorted(before.restore()) == [
            "module <root> forward",
            "torch.compiler._is_exporting_flag",
        ]
    finally:
        torch.compiler._is_exporting_flag = original
    assert "forward" not in model.__dict__
    assert before.changed() == []


_STOPS = """
import random, sys, torch
sys.path.insert(0, {tests!r})
from test_replay_deadline import _swin, _swin_export
from replay.pipeline.budget.deadline import BudgetSpent, call_within
from replay.pipeline.budget.torchstate import TorchState
model = _swin()
before = TorchState.read(model)
rng = random.Random(0)
for strict in (False, True):
    for _ in range({stops}):
        try:
            call_within(rng.uniform(0.05, 3.0), lambda: _swin_export(model, strict), model)
        except BudgetSpent:
            pass
        assert before.changed() == [], before.changed()
print("survived")
"""


@pytest.mark.slow
def test_exports_stopped_at_many_points_never_end_the_process() -> None:
    # Some of torch's C++ calls Python where an exception ends the process (std::terminate);
    # the watchdog must never raise below one. A fresh process, so an abort is seen.
    script = _STOPS.format(tests=str(Path(__file__).parent), stops=30)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("survived")
