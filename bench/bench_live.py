"""Live stores: the soak, the real server, and what the new checks cost.

Usage::

    python bench/bench_live.py [--seconds 60] [--only soak,server,costs]

- soak: `fixtures.soak.run_soak` (4 writers, one SIGKILLed, a compaction loop, library and CLI
  reader loops) on a local store and on moto's S3 server on 127.0.0.1; then the store's totals
  against what the writers reported, before and after a last compaction;
- server: `fixtures.server_load.run_server_load` (gunicorn + uvicorn workers, SIGHUP, recycling,
  SIGTERM with requests in flight): answered requests and their calls against the store;
- costs: what a reader pays per query for DuckDB's parse (`_needs_calls`), per open for the
  segment commit check (`capture.store.commits.uncommitted`, local and S3), and a checked
  payload read (`read_payload`) against safetensors' own loader.

Prints Markdown; docs/benchmarks.md ("Live stores") holds a full run's results.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from common import load_line, machine_line, md_table  # noqa: E402


def _totals(uri: str) -> tuple[int, int, int, int]:
    """(calls rows, distinct (pid, call_id), signatures total, summary total)."""
    import capture

    with capture.open_store(uri) as store:
        row = store.query(
            "SELECT count(*) AS n, count(DISTINCT (pid, call_id)) AS d FROM calls"
        ).to_pylist()[0]
        signatures = store.query("SELECT sum(calls) AS n FROM signatures").to_pylist()[0]["n"]
        summary = sum(m["calls"] for m in store.summary()["models"])
    return int(row["n"]), int(row["d"]), int(signatures), int(summary)


def soak(seconds: float) -> None:
    from s3_server import S3Server

    import capture
    from capture import schema
    from fixtures.soak import run_soak

    rows = []
    with S3Server() as server:
        bucket = server.create_bucket(f"soak-{uuid.uuid4().hex[:12]}")
        work = Path(tempfile.mkdtemp(prefix="bench-soak-"))
        for where, uri, flush, env in (
            ("local", str(work / "store"), 0.2, {}),
            ("S3 (moto)", f"s3://{bucket}/store", 1.0, server.env()),
        ):
            os.environ.update(env)
            result = run_soak(
                uri, work / where.split()[0], seconds=seconds, flush_seconds=flush, env=env
            )
            written = sum(r["written"] for r in result.writers.values())
            before = _totals(uri)
            schema.ROLLUP_GRACE_S = 0.0  # the killed writer's rollup is old by now
            capture.compact(uri)
            after = _totals(uri)
            tracebacks = sum(text.count("Traceback") for text in result.stderr.values())
            rows.append(
                [
                    where,
                    f"{result.seconds:.0f} s",
                    f"{written:,} (killed writer: {result.writers[result.killed]['written']:,})",
                    f"{before[0]:,} / {before[1]:,} / {before[2]:,} / {before[3]:,}",
                    f"{after[0]:,} / {after[1]:,} / {after[2]:,} / {after[3]:,}",
                    f"{result.compactor.get('runs', 0)} ({result.compactor.get('rolled_back', 0)}"
                    f" rolled back, {result.compactor.get('left', 0)} groups left)",
                    f"{result.readers.get('opens', 0)} / {result.cli.get('runs', 0)}",
                    f"{result.readers.get('duplicates', 0)} / {result.cli.get('failed', 0)}",
                    str(tracebacks),
                ]
            )
        shutil.rmtree(work, ignore_errors=True)
    print("### Soak\n")
    print(
        md_table(
            [
                "store",
                "ran",
                "written (reported)",
                "before compaction: rows / unique / signatures / summary",
                "after",
                "compactions",
                "reader opens / CLI runs",
                "duplicates / CLI failures",
                "tracebacks",
            ],
            rows,
        )
    )


def server() -> None:
    import capture
    from fixtures.server_load import run_server_load

    work = Path(tempfile.mkdtemp(prefix="bench-server-"))
    load = run_server_load(work / "store", work / "server")
    served: Counter[int] = Counter()
    for answer in load.answers:
        served[answer["pid"]] += answer["calls"]
    with capture.open_store(work / "store") as store:
        stored = {
            int(r["pid"]): int(r["n"])
            for r in store.query("SELECT pid, count(*) AS n FROM calls GROUP BY pid").to_pylist()
        }
    after_term = sum(a["done"] > load.term_at for a in load.answers)
    print("\n### Real server\n")
    print(
        md_table(
            ["answered", "not answered", "worker pids", "answered after SIGTERM", "calls served",
             "calls stored", "per pid equal", "tracebacks"],
            [[str(len(load.answers)), str(load.refused), str(len(served)), str(after_term),
              f"{sum(served.values()):,}", f"{sum(stored.values()):,}",
              str(stored == dict(served)), str(load.stderr.count("Traceback"))]],
        )
    )  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)


def _median_us(fn: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t)
    return statistics.median(times) / 1000


def costs() -> None:
    import duckdb
    import pyarrow.fs as pafs
    import torch
    from s3_server import S3Server

    from capture.store import commits, layout
    from capture.store.payload_files import read_payload
    from capture.store.reader import _needs_calls

    rows = []
    con = duckdb.connect()
    sql = (
        "SELECT model, in_structure, count(*) AS n FROM calls WHERE ts > now() - INTERVAL 1 DAY "
        "GROUP BY ALL ORDER BY n DESC"
    )
    parse = _median_us(lambda: _needs_calls(con, sql), 2000)
    rows.append(["`_needs_calls` (DuckDB's parse) per query", f"{parse:.0f} µs"])
    work = Path(tempfile.mkdtemp(prefix="bench-costs-"))
    infos = []
    for i in range(4):  # four live writers: four open rollups naming one calls file each
        calls = work / "calls" / "model=m" / "date=2026-01-01" / f"w{i}-000001.parquet"
        calls.parent.mkdir(parents=True, exist_ok=True)
        calls.write_bytes(b"x")
        infos.append(
            layout.FileInfo(
                f"{work}/stats/model=m/w{i}-000001.parquet", "stats", 1, 1, {},
                segment={"2026-01-01": 1},
            )
        )  # fmt: skip
    local = pafs.LocalFileSystem()
    assert not commits.uncommitted(local, infos)
    local_us = _median_us(lambda: commits.uncommitted(local, infos), 500)
    rows.append(["commit check per open, 4 rollups, local", f"{local_us:.0f} µs"])
    with S3Server() as s3:
        fs = s3.filesystem()
        bucket = s3.create_bucket(f"costs-{uuid.uuid4().hex[:12]}")
        remote = []
        for info in infos:
            path = info.path.replace(str(work), bucket)
            remote.append(layout.FileInfo(path, "stats", 1, 1, {}, segment=info.segment))
            for target in commits.segment_paths(remote[-1]):
                with fs.open_output_stream(target) as out:
                    out.write(b"x")
        assert not commits.uncommitted(fs, remote)
        s3_us = _median_us(lambda: commits.uncommitted(fs, remote), 30)
        rows.append(["commit check per open, 4 rollups, S3 (moto)", f"{s3_us / 1000:.1f} ms"])
    import capture
    from capture.record.recorder_options import Payloads

    model = torch.nn.Identity()
    big = Payloads(1.0, max_call_bytes=64 * 2**20)
    with capture.Recorder(model, work / "p", flush_seconds=3600, payloads=big):
        model(torch.randn(4, 1024, 1024))  # 16 MiB in, 16 MiB out
    (path,) = [str(p) for p in (work / "p" / "payloads").rglob("*.safetensors")]
    from safetensors.torch import load

    def before() -> None:  # the old way of reading a payload: read it all, then parse
        with open(path, "rb") as f:
            load(f.read())

    ours = _median_us(lambda: read_payload(local, path, 64 * 2**20), 20)
    theirs = _median_us(before, 20)
    compared = (
        f"{ours / 1000:.1f} ms (before: read whole + `safetensors.load`, {theirs / 1000:.1f} ms)"
    )
    rows.append(["checked `read_payload`, 32 MiB file", compared])
    shutil.rmtree(work, ignore_errors=True)
    print("\n### Costs\n")
    print(md_table(["measure", "median"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="soak duration per store")
    parser.add_argument("--only", default="soak,server,costs", help="sections to run")
    args = parser.parse_args()
    print(f"## Live stores\n\n{machine_line()}; {load_line()}\n")
    chosen = set(args.only.split(","))
    if "soak" in chosen:
        soak(args.seconds)
    if "server" in chosen:
        server()
    if "costs" in chosen:
        costs()


if __name__ == "__main__":
    main()
