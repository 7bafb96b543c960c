"""A soak that can fail: 4 writers, a compaction loop and readers on one live store.

Local and on the S3 server the tests start (moto on 127.0.0.1). One writer is SIGKILLed half-way.
At the end: every call a writer reported written is stored, exactly once; the summary, the
``signatures`` view and the ``calls`` rows agree, before and after a last compaction; no child
printed a traceback, no reader saw a call twice or a skipped file, no CLI run failed.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from s3_server import S3Server

import capture
from capture import schema
from fixtures.soak import SoakResult, run_soak

SECONDS = 24.0


def _totals(uri: str) -> dict[str, object]:
    with capture.open_store(uri) as store:
        per_pid = {
            int(r["pid"]): int(r["n"])
            for r in store.query("SELECT pid, count(*) AS n FROM calls GROUP BY pid").to_pylist()
        }
        row = store.query(
            "SELECT count(*) AS n, count(DISTINCT (pid, call_id)) AS d FROM calls"
        ).to_pylist()[0]
        signatures = store.query("SELECT sum(calls) AS n FROM signatures").to_pylist()[0]["n"]
        summary = sum(m.calls for m in store.summary().models)
    return {
        "rows": row["n"],
        "distinct": row["d"],
        "signatures": signatures,
        "summary": summary,
        "per_pid": per_pid,
    }


def _check(uri: str, soak: SoakResult) -> dict[str, object]:
    totals = _totals(uri)
    assert totals["rows"] == totals["distinct"]  # no call stored twice
    # the summary and the signatures count every stored call
    assert totals["rows"] == totals["signatures"] == totals["summary"]
    per_pid = totals["per_pid"]
    assert isinstance(per_pid, dict)
    for pid, report in soak.writers.items():
        if pid == soak.killed:  # it may have committed a segment after its last report
            assert per_pid.get(pid, 0) >= report["written"]
        else:
            assert report["final"] and report["dropped"] == 0
            assert per_pid[pid] == report["written"] == report["recorded"]
    return totals


def _no_failure(soak: SoakResult) -> None:
    for name, text in soak.stderr.items():
        assert "Traceback" not in text, f"{name}:\n{text[-3000:]}"
    assert soak.readers.get("opens", 0) > 0 and soak.readers["duplicates"] == 0
    assert soak.cli.get("runs", 0) > 0 and soak.cli["failed"] == 0
    assert soak.compactor.get("runs", 0) > 0


def _soak(uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **options: object) -> None:
    soak = run_soak(uri, tmp_path / "soak", seconds=SECONDS, **options)  # type: ignore[arg-type]
    _no_failure(soak)
    before = _check(uri, soak)
    # the killed writer's rollup is old now: the last compaction merges (or rolls back) it
    monkeypatch.setattr(schema, "ROLLUP_GRACE_S", 0.0)
    capture.compact(uri)
    assert _check(uri, soak) == before  # nothing lost, nothing twice, after compaction too


@pytest.mark.slow
def test_soak_on_a_local_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _soak(str(tmp_path / "store"), tmp_path, monkeypatch)


@pytest.mark.slow
def test_soak_with_writers_compacting_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every writer process also runs the store's upkeep (capture.store.upkeep) every ~2 s,
    # beside the compaction loop: they take turns under the one lock
    _soak(str(tmp_path / "store"), tmp_path, monkeypatch, env={"CAPTURE_AUTO_COMPACT": "2"})


@pytest.mark.slow
def test_soak_on_s3(
    s3_server: S3Server, s3_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3_server.create_bucket(f"soak-{uuid.uuid4().hex[:12]}")
    uri = f"s3://{bucket}/store"
    _soak(uri, tmp_path, monkeypatch, flush_seconds=1.0, env=s3_server.env())
