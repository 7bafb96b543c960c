"""The state a call runs under: its key, how the recorder reads it, groups that never mix states,
and an artifact that serves each state and refuses a call of another (user-declared states; the
peft adapters are in tests/test_replay_states_peft.py)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

import capture
import replay
from capture import schema
from capture.analysis.groups import analyze
from capture.cli.main import cli
from capture.errors import CaptureError, StateError
from capture.state import declared_items, parse_key, state_key, state_label
from replay.runtime.runner import UnknownState


class Scaled(torch.nn.Module):
    """A model whose answer depends on a per-tenant scale held in a buffer (its state)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


SCALES = {"a": 2.0, "b": -3.0}


def _set_tenant(model: Scaled, tenant: str | None) -> None:
    """Writes the tenant's scale into the buffer in place (what a weight swap does)."""
    with torch.no_grad():
        model.scale.fill_(SCALES[tenant] if tenant else 1.0)


def _record_tenants(
    root: Path, payloads: float = 0.0
) -> tuple[Scaled, list[tuple[str, torch.Tensor]]]:
    torch.manual_seed(0)
    model = Scaled().eval()
    current = {"tenant": "a"}
    calls = []
    state = lambda: dict(current)  # noqa: E731
    with capture.Recorder(model, root, name="scaled", state=state, payloads=payloads):
        for tenant, batch in (("a", 2), ("b", 3), ("a", 4), ("b", 2), ("b", 5)):
            current["tenant"] = tenant
            _set_tenant(model, tenant)
            x = torch.randn(batch, 4)
            calls.append((tenant, x))
            model(x)
    _set_tenant(model, None)
    return model, calls


def test_state_key_is_canonical_json_and_empty_for_the_default_state() -> None:
    assert state_key({"training": True, "adapter": "b"}) == '{"adapter":"b","training":true}'
    assert state_key({}) is None
    assert parse_key('{"adapter":"b"}') == {"adapter": "b"}
    assert state_label('{"adapter":["a","b"],"training":true}') == "adapter=a+b,training"
    assert state_label(None) == "default"
    with pytest.raises(StateError, match="not a canonical state key"):
        parse_key('{"b": 1, "a": 2}')


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["a"], "must return a dict"),
        ({"training": True}, "set by the recorder itself"),
        ({"x": [1]}, "use a bool, an int"),
        ({"x": float("nan")}, "use a bool, an int"),
        ({"bad name": 1}, "not an identifier"),
        ({f"k{i}": i for i in range(20)}, "at most 16"),
    ],
)
def test_a_declared_state_is_checked(value: Any, message: str) -> None:
    with pytest.raises(StateError, match=message):
        declared_items(value)


def test_the_recorder_writes_each_calls_state(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)  # a fresh module is in training mode
    tenant = {"t": "x"}
    with capture.Recorder(model, tmp_path, state=lambda: dict(tenant)) as rec:
        model(torch.randn(2, 3))
        model.eval()
        tenant["t"] = "y"
        model(torch.randn(2, 3))
    assert rec.stats()["errors"] == 0
    with capture.open_store(tmp_path) as store:
        states = store.query("SELECT state FROM calls ORDER BY ts").column("state").to_pylist()
        stats = store.query("SELECT state FROM signatures ORDER BY state").column(0).to_pylist()
    assert states == ['{"t":"x","training":true}', '{"t":"y"}']
    assert stats == ['{"t":"x","training":true}', '{"t":"y"}']


def test_an_eval_module_without_declared_state_records_the_default_state(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2).eval()
    with capture.Recorder(model, tmp_path):
        model(torch.randn(2, 3))
    with capture.open_store(tmp_path) as store:
        assert store.query("SELECT state FROM calls").column(0).to_pylist() == [None]


def test_a_state_that_cannot_be_read_is_counted_and_the_call_not_recorded(
    tmp_path: Path,
) -> None:
    model = torch.nn.Linear(3, 2).eval()

    def broken() -> dict[str, Any]:
        raise RuntimeError("no tenant")

    with capture.Recorder(model, tmp_path, state=broken) as rec:
        out = model(torch.ones(1, 3))
    assert out.shape == (1, 2)  # the model's call goes on
    assert rec.stats()["errors"] == 1 and rec.stats()["recorded"] == 0
    with pytest.raises(CaptureError, match="state=1 must be a callable"):
        capture.Recorder(model, tmp_path, state=1)


def test_groups_never_mix_states_and_their_names_say_it(tmp_path: Path) -> None:
    _record_tenants(tmp_path / "store")
    with capture.open_store(tmp_path / "store") as store:
        groups = analyze(store, "scaled")
        text = CliRunner().invoke(cli, ["--store", str(tmp_path / "store"), "summary"])
    assert sorted((g.name, g.calls, parse_key(g.state)["tenant"]) for g in groups) == [
        ("g0+tenant=a", 2, "a"),
        ("g0+tenant=b", 3, "b"),
    ]
    assert text.exit_code == 0
    assert "States (what the calls ran under" in text.stdout
    assert "tenant=b" in text.stdout and "g0+tenant=a" in text.stdout


def test_a_store_without_the_state_column_reads_as_the_default_state(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2).eval()
    with capture.Recorder(model, tmp_path, name="old"):
        for b in (2, 3):
            model(torch.randn(b, 3))
    for table in (schema.CALLS, schema.STATS):  # rewrite as a version 2 writer wrote them
        for path in (tmp_path / table).rglob("*.parquet"):
            old = pq.read_table(path)
            meta = dict(old.schema.metadata)
            meta[schema.METADATA_SCHEMA_VERSION] = b"2"
            old = old.drop_columns([schema.STATE])
            pq.write_table(old.replace_schema_metadata(meta), path)
    with capture.open_store(tmp_path) as store:
        assert store.query("SELECT state FROM calls").column(0).to_pylist() == [None, None]
        groups = analyze(store, "old")
    assert [(g.name, g.calls, g.state) for g in groups] == [("g0", 2, "")]


def test_each_declared_state_is_exported_and_served_with_its_own_weights(
    tmp_path: Path,
) -> None:
    model, calls = _record_tenants(tmp_path / "store")
    result = replay.export(
        model,
        tmp_path / "store",
        probes=0,
        set_state=lambda s: _set_tenant(model, s["tenant"] if s else None),
    )
    assert result.complete, result.coverage.to_pylist()
    assert float(model.scale[0]) == 1.0  # put back after the export
    path = tmp_path / "scaled.pt2"
    result.save(path)
    runner = replay.load(path)
    assert sorted(runner.states) == ['{"tenant":"a"}', '{"tenant":"b"}']
    for tenant, x in calls:
        _set_tenant(model, tenant)
        with torch.no_grad():
            expected = model(x)
        got = runner.state(tenant=tenant)(x)
        torch.testing.assert_close(got, expected)
        assert runner.state(f"tenant={tenant}").select(x) == f"g0+tenant={tenant}"
    _set_tenant(model, None)
    # The base weights once, and each state's own scale (the tensor that differs) once.
    with zipfile.ZipFile(path) as archive:
        weights = [i.file_size for i in archive.infolist() if "/weights/weight" in i.filename]
    assert sorted(weights) == [16, 16, 16, 64]  # bias, scale a, scale b, weight
    with pytest.raises(UnknownState, match=r"several states \(tenant=a, tenant=b\)"):
        runner(calls[0][1])
    with pytest.raises(UnknownState, match="no program of the state 'tenant=c'"):
        runner.state(tenant="c")


def test_a_declared_state_without_set_state_is_not_covered_with_the_reason(
    tmp_path: Path,
) -> None:
    model, _ = _record_tenants(tmp_path / "store")
    result = replay.export(model, tmp_path / "store", probes=0)
    assert not result.complete
    errors = {r["group"]: r["error"] for r in result.coverage.to_pylist()}
    assert set(errors) == {"g0+tenant=a", "g0+tenant=b"}
    assert all("pass set_state= to replay.export" in e for e in errors.values())


def test_check_routes_each_signature_to_its_states_programs(tmp_path: Path) -> None:
    model, _ = _record_tenants(tmp_path / "store")
    result = replay.export(
        model,
        tmp_path / "store",
        probes=0,
        groups=["g0+tenant=a"],
        set_state=lambda s: _set_tenant(model, s["tenant"] if s else None),
    )
    path = tmp_path / "a.pt2"
    result.save(path)
    runner = replay.load(path)
    assert runner.states == ['{"tenant":"a"}']  # one state: plain calls are served
    runner(torch.randn(2, 4))
    out = CliRunner().invoke(
        cli, ["--store", str(tmp_path / "store"), "check", str(path), "-f", "csv"]
    )
    assert out.exit_code == 3
    rows = [line.split(",") for line in out.stdout.splitlines()]
    assert rows[0] == ["model", "group", "signature", "calls", "served", "reason", "state"]
    served = {(r[6], r[4]) for r in rows[1:]}
    assert served == {("tenant=a", "true"), ("tenant=b", "false")}
    assert "the artifact has no program of this state (its: tenant=a)" in out.stdout


def test_an_artifact_of_one_state_has_the_plain_manifest_format(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2).eval()
    with capture.Recorder(model, tmp_path / "store"):
        for b in (2, 3):
            model(torch.randn(b, 3))
    path = tmp_path / "m.pt2"
    replay.export(model, tmp_path / "store", probes=0).save(path)
    runner = replay.load(path)
    assert runner.manifest.format == "capture-artifact/2" and runner.states == [""]
    assert runner.state() is runner and runner.state("default") is runner


def test_the_report_lists_the_states_and_keeps_their_groups_apart(tmp_path: Path) -> None:
    from capture.engines.report_data import timeline
    from capture.engines.report_html import build_report

    _record_tenants(tmp_path / "store")
    with capture.open_store(tmp_path / "store") as store:
        page = build_report(store, "scaled")
        groups = analyze(store, "scaled")
        calls = timeline(store, "scaled", groups).calls.sum(axis=1).tolist()
    assert "States the calls ran under" in page and "tenant=a" in page
    assert dict(zip([g.name for g in groups], calls, strict=True)) == {
        "g0+tenant=b": 3,
        "g0+tenant=a": 2,
    }


def test_sampled_real_calls_are_checked_in_their_own_state(tmp_path: Path) -> None:
    model, _ = _record_tenants(tmp_path / "store", payloads=1.0)
    result = replay.export(
        model,
        tmp_path / "store",
        probes=0,
        set_state=lambda s: _set_tenant(model, s["tenant"] if s else None),
    )
    rows = [r for r in result.coverage.to_pylist() if r["kind"] == "payload"]
    assert sorted(r["group"] for r in rows) == ["g0+tenant=a"] * 2 + ["g0+tenant=b"] * 3
    assert all(r["covered"] for r in rows), rows
