"""A fleet recording into one S3 prefix on a real S3 server (moto on loopback).

Four recorder processes (tiny Llama, real generate()) write into one ``s3://`` prefix, one of them
is SIGKILLed mid-way; the store is then read by the CLI and by `replay.export`, compacted, and
read again. Every call a writer reported as flushed is in the store exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from s3_server import S3Server

import capture

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3
WRITERS = 4

# One writer process: records ROUNDS rounds of tiny-Llama generate() traffic, flushes after each
# round and then reports on stdout how many calls are in the store for sure (flush returned).
_WRITER = r"""
import json, sys, time
import capture
from fixtures.models import run_generate, tiny_llama
from fixtures.stores import LLAMA_WORKLOAD
uri, rounds, hang = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "hang"
model = tiny_llama(0)
rec = capture.Recorder(model, uri, name="llama", flush_seconds=3600)
rec.start()
for r in range(rounds):
    run_generate(model, LLAMA_WORKLOAD, max_new_tokens=3, seed=r)
    rec.flush()
    print(json.dumps({"flushed": rec.stats()["written"], "recorded": rec.stats()["recorded"]}),
          flush=True)
if hang:  # records more, never flushed: what a SIGKILL loses, and only that
    run_generate(model, LLAMA_WORKLOAD, max_new_tokens=3, seed=99)
    print("hanging", flush=True)
    time.sleep(600)
rec.stop()
"""


def _env(server: S3Server) -> dict[str, str]:
    return {**os.environ, **server.env(), "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def fleet(s3_server: S3Server) -> Iterator[dict[str, Any]]:
    """The S3 URI of a store written by 4 processes (one killed), and what each reported."""
    bucket = s3_server.create_bucket(f"fleet-{uuid.uuid4().hex[:12]}")
    uri = f"s3://{bucket}/capture"
    env = _env(s3_server)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, uri, str(ROUNDS), "hang" if i == 0 else "run"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for i in range(WRITERS)
    ]
    reports: dict[int, dict[str, int]] = {}
    killed = procs[0]
    assert killed.stdout is not None
    for line in killed.stdout:  # wait until it has flushed every round and is mid-recording
        if line.strip() == "hanging":
            break
        reports[killed.pid] = json.loads(line)
    killed.send_signal(signal.SIGKILL)
    killed.wait(60)
    for proc in procs[1:]:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        reports[proc.pid] = json.loads(out.strip().splitlines()[-1])
    killed.communicate()
    yield {"uri": uri, "reports": reports, "killed": killed.pid, "env": env}


def _per_pid(uri: str) -> dict[int, tuple[int, int]]:
    """pid -> (calls, distinct call ids) as the store counts them."""
    with capture.open_store(uri) as store:
        rows = store.query(
            "SELECT pid, count(*) AS n, count(DISTINCT call_id) AS d FROM calls GROUP BY pid"
        ).to_pylist()
    return {int(r["pid"]): (int(r["n"]), int(r["d"])) for r in rows}


@pytest.mark.slow
def test_every_flushed_call_is_stored_once_after_a_sigkill(
    fleet: dict[str, Any], s3_env: None
) -> None:
    counts = _per_pid(fleet["uri"])
    assert set(counts) == set(fleet["reports"])
    for pid, report in fleet["reports"].items():
        n, distinct = counts[pid]
        assert n == distinct  # no call counted twice
        # the killed writer lost only what it had not flushed; the others lost nothing
        assert n == report["flushed"] == report["recorded"]


@pytest.mark.slow
def test_cli_reads_the_s3_store(fleet: dict[str, Any]) -> None:
    total = sum(r["flushed"] for r in fleet["reports"].values())
    out = {}
    commands = (
        ["summary", "-f", "json"],
        ["dims", "-f", "json"],
        ["query", "-f", "json", "SELECT count(*) AS n FROM calls"],
    )
    for command in commands:
        proc = subprocess.run(
            [sys.executable, "-m", "cli", "--store", fleet["uri"], *command],
            capture_output=True,
            text=True,
            env=fleet["env"],
            cwd=ROOT,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        out[command[0]] = proc.stdout
    assert str(total) in out["query"]
    assert str(total) in out["summary"]
    assert "llama" in out["dims"]


@pytest.mark.slow
def test_replay_export_reads_the_s3_store(fleet: dict[str, Any], s3_env: None) -> None:
    import replay
    from fixtures.models import tiny_llama

    result = replay.export(tiny_llama(0), fleet["uri"], model_name="llama")
    assert result.complete
    assert sum(int(c) for c in result.coverage.column("calls").to_pylist()) == sum(
        r["flushed"] for r in fleet["reports"].values()
    )


@pytest.mark.slow
def test_compaction_on_s3_keeps_every_call_once(fleet: dict[str, Any], s3_env: None) -> None:
    before = _per_pid(fleet["uri"])
    result = capture.compact(fleet["uri"])
    assert result.tables["calls"].files_after < result.tables["calls"].files_before
    assert _per_pid(fleet["uri"]) == before  # nothing lost, nothing twice
    with capture.open_store(fleet["uri"]) as store:
        assert len(store.files["calls"]) == result.tables["calls"].files_after


def test_recorder_writes_each_object_in_one_put(s3_server: S3Server, s3_env: None) -> None:
    import torch

    bucket = s3_server.create_bucket(f"put-{uuid.uuid4().hex[:12]}")
    with s3_server.recording() as requests:
        model = torch.nn.Linear(3, 2)
        with capture.Recorder(model, f"s3://{bucket}/store", flush_seconds=3600) as rec:
            model(torch.randn(2, 3))
            rec.flush()
    writes = [r for r in requests() if r["method"] in ("PUT", "POST", "DELETE")]
    # pyarrow keeps a deleted object's "folder" with an empty marker object (a key ending in /)
    keys = [r["path"] for r in writes if r["method"] == "PUT" and not r["path"].endswith("/")]
    # no temporary name, no copy: each file is one upload of its final key:
    # structures, calls, the stats rollup, and at close the rollup again, marked closed
    assert len(keys) == 4 and all(k.endswith(".parquet") and "/." not in k for k in keys), writes
    assert not [r for r in writes if r.get("copy")], writes
    stats = [k for k in keys if "/stats/" in k]
    # the one delete is the rollup that the closed one replaces, once that one is complete
    deletes = [i for i, r in enumerate(writes) if r["method"] == "DELETE"]
    assert len(deletes) == 1 and writes[deletes[0]]["path"] == stats[0], writes
    last = max(i for i, r in enumerate(writes) if r["path"] == stats[1])
    assert last < deletes[0], writes
