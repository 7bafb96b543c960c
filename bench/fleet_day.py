"""The fleet sections of `bench_fleet.py --fleet`: a simulated day, and SQL on 100,000 flushes.

A simulated day of N writers with the recorders' background compaction, and the first SQL on a
store of 100,000 flushes.

**A simulated day.** N writer processes flush every F seconds for 24 h, each flush one calls file
of `CALLS_PER_FILE` calls (the tables of `tables`, as the recorder writes them);
each writer keeps one stats rollup, rewritten every upkeep interval (`capture.store.upkeep`:
the rollup a writer replaces); the structures once per writer. Time is simulated: the files of
each interval are written at once, then the compaction a recorder's upkeep runs
(`capture.store.compaction.compact_root`, the same call) runs once, as one of the N processes
would at the end of that interval. Counted at the end: the store's files per table, beside what
the same day leaves without compaction.

**100,000 flushes.** The store `bench_fleet.generate` writes (100,000 calls files of 10 calls,
8 writers), generated once and kept (``--store-dir``). Timed, each in a fresh process, wall time
and peak RSS (``ru_maxrss`` of the child): plain DuckDB's ``count(*)`` over the raw files (a
glob); the compaction the recorders' upkeep runs (on a copy of the raw store); then the first
``capture query "SELECT count(*) FROM calls"`` (empty reader cache) and plain DuckDB over the
compacted files. With ``--raw-query`` also ``capture query`` over the raw files (slow).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

_DUCKDB = """
import sys, duckdb
con = duckdb.connect()
con.execute('SET enable_progress_bar = false')
where = sys.argv[2] if len(sys.argv) > 2 else ""
print(con.execute(f"SELECT count(*) FROM read_parquet(?){where}", [sys.argv[1]]).fetchone()[0])
"""


CALLS_PER_FILE = 10
"""Calls in each flushed calls file."""

MODEL = "LlamaForCausalLM"


def log(msg: str) -> None:
    print(f"[bench_fleet] {msg}", file=sys.stderr, flush=True)


def tables() -> tuple[Any, Any, Any]:
    """One calls table, its stats table and the structures table (from bench_store)."""
    import tempfile

    import bench_store
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        bench_store.generate(tmp + "/s", CALLS_PER_FILE, rows_per_file=CALLS_PER_FILE)

        def first(table: str) -> Any:
            for d, _, names in os.walk(f"{tmp}/s/{table}"):
                for n in names:
                    if n.endswith(".parquet"):
                        return pq.read_table(os.path.join(d, n))
            raise RuntimeError(table)

        return first("calls"), first("stats"), first("structures")


def measured(argv: list[str], env: dict[str, str] | None) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS MiB, stdout) of a fresh child process; raises when it fails.

    CPU counts the child's helper processes (`capture.store.footer_procs`); the peak RSS is the
    larger of the child's own ``ru_maxrss`` and the highest sum over its process tree, sampled
    every 20 ms (a helper's memory counts too). It runs outside the checkout: ``-m cli`` puts
    the working folder first on ``sys.path``, before the PYTHONPATH that picks the code
    (``bench_fleet --baseline``).
    """
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=err, text=True, env=env, cwd=tempfile.gettempdir()
        )
        tree = [0]
        done = threading.Event()
        sampler = threading.Thread(target=_sample_tree, args=(proc.pid, tree, done))
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        done.set()
        sampler.join()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv[:6]} failed: {stderr.strip()[-2000:]}")
    peak = max(usage.ru_maxrss / 1024, tree[0] / 1024)
    return wall, usage.ru_utime + usage.ru_stime, peak, stdout


def _sample_tree(pid: int, peak: list[int], done: threading.Event) -> None:
    """The highest total RSS (KiB) of `pid` and its descendants into ``peak[0]``."""
    while not done.wait(0.02):
        total, todo = 0, [pid]
        while todo:
            one = todo.pop()
            try:
                with open(f"/proc/{one}/status") as f:
                    total += next(
                        (int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0
                    )
                with open(f"/proc/{one}/task/{one}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                continue
        peak[0] = max(peak[0], total)


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of a child process (`measured`)."""
    wall, _, mb, stdout = measured(argv, env)
    return wall, mb, stdout


def count_files(root: str) -> dict[str, int]:
    out = {}
    for table in ("calls", "stats", "structures"):
        n = 0
        for _, _, names in os.walk(f"{root}/{table}"):
            n += sum(1 for name in names if name.endswith(".parquet") and name[0] != ".")
        out[table] = n
    return out


def simulated_day(writers: int, flush_s: float, upkeep_s: float, root: str) -> dict[str, Any]:
    """Files after a day of `writers` flushing every `flush_s`, compacted every `upkeep_s`."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.fs as pafs

    from capture import schema
    from capture.store.compaction import compact_root
    from capture.store.files import write_parquet

    calls, stats, structures = tables()
    calls = calls.select(schema.CALLS_SCHEMA.names).cast(schema.CALLS_SCHEMA)
    stats = stats.select(schema.STATS_SCHEMA.names).cast(schema.STATS_SCHEMA)
    structures = structures.select(schema.STRUCTURES_SCHEMA.names).cast(schema.STRUCTURES_SCHEMA)
    fs = pafs.LocalFileSystem()
    shutil.rmtree(root, ignore_errors=True)
    model = f"model={MODEL}"
    calls_dir = f"{root}/calls/{model}/date=2026-01-01"
    stats_dir = f"{root}/stats/{model}"
    prefixes = [f"day-host{w}-{2000 + w}-{w:x}0000" for w in range(writers)]
    for prefix in prefixes:
        write_parquet(
            fs, f"{root}/structures/{model}", f"{prefix}-000000.parquet", structures, "structures"
        )
    per_interval = max(1, round(upkeep_s / flush_s))
    intervals = round(86_400 / upkeep_s)
    ids = calls.column("call_id")
    rollups: dict[int, str] = {}
    flushes = 0
    compact_s = 0.0
    most = 0
    for i in range(intervals):
        for w, prefix in enumerate(prefixes):
            for k in range(per_interval):
                seq = i * per_interval + k + 1
                offset = pa.scalar(flushes * CALLS_PER_FILE, pa.int64())
                table = calls.set_column(0, "call_id", pc.add(ids, offset))
                write_parquet(fs, calls_dir, f"{prefix}-{seq:06d}.parquet", table, "calls")
                flushes += 1
            # the writer's rollup, replaced (its predecessor deleted, as the writer does)
            name = f"{prefix}-r{i:05d}.parquet"
            write_parquet(fs, stats_dir, name, stats, "stats", {schema.METADATA_ROLLUP: b"closed"})
            if w in rollups and os.path.exists(f"{stats_dir}/{rollups[w]}"):  # not merged yet
                os.remove(f"{stats_dir}/{rollups[w]}")
            rollups[w] = name
        most = max(most, sum(count_files(root).values()))
        t0 = time.perf_counter()
        compact_root(fs, root, root)  # the upkeep turn of one of the writers
        compact_s += time.perf_counter() - t0
        if i % 12 == 0:
            log(f"  simulated hour {i * upkeep_s / 3600:.0f}: {count_files(root)}")
    after = count_files(root)
    return {
        "flushes": flushes,
        "turns": intervals,
        "files": after,
        "most": most,
        "without": {"calls": flushes, "stats": writers, "structures": writers},
        "compact_s": compact_s,
    }


def hundred_k(
    raw: str, work: str, env: dict[str, str], raw_query: bool, flushes: int = 100_000
) -> list[list[str]]:
    """Rows: plain DuckDB and capture on the store of `flushes`, raw and after the upkeep."""
    py = sys.executable
    glob = f"{{}}/calls/model={MODEL}/*/*.parquet"
    sql = "SELECT count(*) AS n FROM calls"
    expected = str(flushes * CALLS_PER_FILE)
    rows = []
    s, mb, out = timed([py, "-c", _DUCKDB, glob.format(raw)], env)
    rows.append(["plain DuckDB, glob over the raw files", f"{s:.1f}", f"{mb:.0f}", out.strip()])
    log(f"  {rows[-1]}")
    cache = tempfile.mkdtemp(prefix="capture-cache-")
    if raw_query:
        s, mb, out = timed(
            [py, "-m", "cli", "--store", raw, "query", sql, "-f", "csv"],
            {**env, "CAPTURE_CACHE_DIR": cache},
        )
        rows.append(["`capture query`, raw files", f"{s:.1f}", f"{mb:.0f}", out.split()[-1]])
        log(f"  {rows[-1]}")
    shutil.rmtree(work, ignore_errors=True)
    log(f"copying {raw} to {work}")
    shutil.copytree(raw, work)
    s, mb, _ = timed([py, "-m", "cli", "--store", work, "compact"], env)
    rows.append(
        [
            "the upkeep's compaction (`capture compact`, same call)",
            f"{s:.1f}",
            f"{mb:.0f}",
            str(count_files(work)),
        ]
    )
    log(f"  {rows[-1]}")
    shutil.rmtree(cache, ignore_errors=True)
    cache = tempfile.mkdtemp(prefix="capture-cache-")
    s, mb, out = timed(
        [py, "-m", "cli", "--store", work, "query", sql, "-f", "csv"],
        {**env, "CAPTURE_CACHE_DIR": cache},
    )
    got = out.split()[-1]
    rows.append(
        [
            "first `capture query`, after the upkeep",
            f"{s:.1f}",
            f"{mb:.0f}",
            got if got == expected else f"{got} (WRONG)",
        ]
    )
    log(f"  {rows[-1]}")
    s, mb, out = timed([py, "-c", _DUCKDB, glob.format(work)], env)
    rows.append(
        ["plain DuckDB, glob over the compacted files", f"{s:.1f}", f"{mb:.0f}", out.strip()]
    )
    log(f"  {rows[-1]}")
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    return rows
