"""Never record nothing: what capture cannot read is recorded by its class name, and
`capture summary`, `capture report` and `replay.export` say which class blocks which group."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import capture
import replay
from capture.cli.main import cli
from capture.engines.report_html import build_report
from capture.record import recorder as recorder_module
from fixtures.unregistered import Stateful, record_stateful

CALLS = [(2, True), (3, True), (4, True), (2, False)]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("unreadable")
    record_stateful(path, CALLS)
    return path


@pytest.fixture(scope="module")
def store(root: Path) -> Iterator[capture.Store]:
    with capture.open_store(root) as opened:
        yield opened


def test_every_call_with_an_unknown_class_is_recorded(store: capture.Store) -> None:
    # store count = calls made (Bamba and Mamba included).
    assert store.query("SELECT count(*) AS n FROM calls").to_pylist() == [{"n": len(CALLS)}]


def test_summary_names_the_class_that_blocks_export(store: capture.Store) -> None:
    groups = {g.name: g for g in store.summary().models[0].groups}
    blocked = {name: g.blocked for name, g in groups.items()}
    assert blocked["g1"] is None  # the calls without a state
    assert blocked["g0"].startswith(
        "not reproducible: kwargs['state'] is a fixtures.unregistered.RecurrentState, "
        "recorded by its class name only"
    )


def test_summary_command_lists_the_blocked_group(root: Path) -> None:
    result = CliRunner().invoke(cli, ["--store", str(root), "summary"])
    lines = result.stdout.splitlines()
    at = lines.index(
        "Not exportable (a recorded class capture cannot rebuild; calls still recorded)"
    )
    assert result.exit_code == 0
    assert lines[at + 1].split() == ["group", "calls", "reason"]
    assert lines[at + 3].split()[:3] == ["g0", "3", "not"]
    assert "RecurrentState" in lines[at + 3]


def test_report_names_the_class_that_blocks_export(store: capture.Store) -> None:
    page = build_report(store, "m")
    section = page[page.index("<h3>Not exportable</h3>") :]
    assert "fixtures.unregistered.RecurrentState" in section[: section.index("</table>")]


def test_export_reports_the_blocked_group_and_serves_the_other(root: Path) -> None:
    result = replay.export(Stateful(), root)
    rows = result.coverage.to_pylist()
    blocked = [r for r in rows if r["group"] == "g0"]
    # the group's rows are not covered, each naming the class; the rest is served.
    assert blocked and all(
        not r["covered"] and "RecurrentState, recorded by its class name only" in r["error"]
        for r in blocked
    )
    assert list(result.programs) == ["g1"]


def test_a_recorder_that_records_nothing_warns_loudly_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = torch.nn.Linear(4, 2)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the structure cache is broken")

    n = recorder_module.NOTHING_RECORDED_AFTER
    with caplog.at_level(logging.WARNING, logger="capture"):
        with capture.Recorder(model, tmp_path) as rec:
            monkeypatch.setattr(rec, "_structure", broken)
            for _ in range(2 * n):
                model(torch.ones(1, 4))
    loud = [r.getMessage() for r in caplog.records if "has recorded NO call" in r.getMessage()]
    assert rec.stats()["errors"] == 2 * n
    # said once, with what failed and the fix, not only in stats().
    assert len(loud) == 1
    assert f"its first {n} calls all failed while recording inputs" in loud[0]
    assert "RuntimeError: the structure cache is broken" in loud[0] and "Fix:" in loud[0]
