"""Benchmark of stores written by a fleet: many small files, on a local disk and on S3.

    python bench/bench_fleet.py                      # 1k/10k/100k local, 1k/10k S3
    python bench/bench_fleet.py --sizes 1000 10000   # fewer
    python bench/bench_fleet.py --no-s3              # local only
    python bench/bench_fleet.py --baseline /tmp/base # also the summary of a checkout before
    python bench/bench_fleet.py --reuse              # keep and reuse stores already generated
    python bench/bench_fleet.py --fleet              # a simulated day of N writers, and the
                                                     # first SQL on 100,000 flushes (fleet_day.py)
    python bench/bench_fleet.py --first-query 10000  # the first SQL and summary beside DuckDB
                                                     # on a raw store of N flushes (no upkeep)

Prints one Markdown section on stdout (progress goes to stderr).

**The stores.** A fleet that flushes every 10 s leaves, per flush of each process, one calls file
and one stats file (and one structures file per process). The synthetic store reproduces that:
`N` flushes, each writing a calls file of 10 calls and its stats file (`capture.schema` tables
written with `capture.store.files.write_parquet`, zstd + schema metadata, as the recorder
writes them),
spread over 8 writer processes. The tables are built once per process from
`bench_store.generate`'s LLM traffic (10 tensor leaves per call) and written again under each
file name (contents are the same, names and call ids differ), so 100,000 files take minutes, not
hours. So "N files" means N calls files + 8 structures files + the stats: 8 rollups (one per
writer process, what this version's writers leave), or, with the layout "per flush" (what
writers before the rollups left, still read by this version), N stats files.

S3: moto's standalone server (`tests/s3_server.py`) on 127.0.0.1, a real HTTP S3 API; the store
is written through pyarrow's S3FileSystem.

**What is timed.** `capture --store PATH summary` as a subprocess (imports, listing, footers, views
and the summary queries, as a user sees it), wall time of one run: with `--baseline` first by the
code before, then twice by this code: the first open of the store (the reader's cache of checked
files, `capture.store.footer_cache`, is empty: every file is read) and a second one (the cache holds
the files' verdicts and stats rows). Then `capture query "SELECT count(*) FROM calls"` (the first
SQL over the calls: their footers are checked now; empty cache) beside plain DuckDB's count
over the same files (a glob; the ratios of wall time and peak RSS), then `capture compact` (wall
time and peak memory of the process), then `summary` again. The cache lives in a fresh folder
per store (``CAPTURE_CACHE_DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import load_line, machine_line, md_table  # noqa: E402
from fleet_day import CALLS_PER_FILE, MODEL, log, measured, tables  # noqa: E402

STORES_DIR = "/tmp/capture-bench-fleet"
PROCESSES = 8


def generate(uri: str, files: int, per_flush_stats: bool = False) -> float:
    """Writes a store of `files` calls files at `uri`; seconds taken.

    The stats are what this version's writers leave: per process one rollup (its flushes'
    signature rows merged, `capture.record.writer`); with `per_flush_stats`, what writers before
    rollups left: one stats file per calls file.
    """
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa

    from capture import schema
    from capture.store.files import resolve_store, write_parquet

    t0 = time.perf_counter()
    calls, stats, structures = tables()
    calls = calls.select(schema.CALLS_SCHEMA.names).cast(schema.CALLS_SCHEMA)
    stats = stats.select(schema.STATS_SCHEMA.names).cast(schema.STATS_SCHEMA)
    structures = structures.select(schema.STRUCTURES_SCHEMA.names).cast(schema.STRUCTURES_SCHEMA)
    fs, root = resolve_store(uri)
    prefixes = [f"bench-host{p % 3}-{1000 + p}-{p:x}0000" for p in range(PROCESSES)]
    for p in range(PROCESSES):
        write_parquet(
            fs,
            f"{root}/{schema.STRUCTURES}/model={MODEL}",
            f"{prefixes[p]}-000000.parquet",
            structures,
            schema.STRUCTURES,
        )
    date = "2026-01-01"
    calls_dir = f"{root}/{schema.CALLS}/model={MODEL}/date={date}"
    stats_dir = f"{root}/{schema.STATS}/model={MODEL}"
    fs.create_dir(calls_dir, recursive=True)
    fs.create_dir(stats_dir, recursive=True)
    ids = calls.column("call_id")

    def one(f: int) -> None:
        p = f % PROCESSES
        name = f"{prefixes[p]}-{f // PROCESSES + 1:06d}.parquet"
        offset = pa.scalar(f * CALLS_PER_FILE, pa.int64())
        import pyarrow.compute as pc

        table = calls.set_column(0, "call_id", pc.add(ids, offset))
        write_parquet(fs, calls_dir, name, table, schema.CALLS)
        if per_flush_stats:
            write_parquet(fs, stats_dir, name, stats, schema.STATS)
        if f and f % 10_000 == 0:
            log(f"  {f:,} files written")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(files)))
    if not per_flush_stats:
        from capture.store.file_merge import merge_stats

        for p in range(PROCESSES):
            flushes = len(range(p, files, PROCESSES))
            last = f"{prefixes[p]}-{flushes:06d}.parquet"
            # the rollup of `flushes` identical segments, merged by the store's SQL rule
            rollup = merge_stats(pa.concat_tables([stats] * flushes)) if flushes else None
            if rollup is not None:
                meta = {schema.METADATA_ROLLUP: b"closed"}
                write_parquet(fs, stats_dir, last, rollup, schema.STATS, meta)
    return time.perf_counter() - t0


def generated(path: str, files: int, per_flush_stats: bool, env: dict[str, str]) -> float:
    """`generate` in a child process; its wall seconds.

    This process stays small, so the peak RSS of the processes it starts later is theirs
    (Linux carries the parent's RSS over fork into the child).
    """
    t0 = time.perf_counter()
    script = (
        f"import sys; sys.path[:0] = [{os.path.dirname(os.path.abspath(__file__))!r}]; "
        f"import bench_fleet; bench_fleet.generate({path!r}, {files}, {per_flush_stats})"
    )
    subprocess.run([sys.executable, "-c", script], check=True, env=env)
    return time.perf_counter() - t0


def first_query(files: int, env: dict[str, str], reuse: bool, summary: bool = True) -> None:
    """The first ``capture query`` count and the first ``capture summary`` of raw stores.

    Two stores of `files` calls files, no upkeep (`generate`): with the stats rollups of this
    version's writers (count beside plain DuckDB's over a glob of the same files), and with one
    stats file per flush, as older writers left them (`files` x 2 files: the summary). The
    page cache holds every file first. Each step a fresh process with an empty reader cache,
    beside plain DuckDB's same statement: a count (capture answers it from the footers it
    checks) and a filtered count (DuckDB scans the files capture checked), alternately,
    twice; then the filtered count once more with the reader's cache of checked footers kept
    (a store's second query).
    """
    py = sys.executable
    stores = {}
    for old in (False, True) if summary else (False,):
        path = f"{STORES_DIR}/raw-{files}{'-old' if old else ''}"
        if not (reuse and os.path.exists(f"{path}/.generated")):
            shutil.rmtree(path, ignore_errors=True)
            log(f"generating {files:,} flushes at {path}")
            generated(path, files, old, env)
            open(f"{path}/.generated", "w").close()
        stores[old] = path
    glob = f"{stores[False]}/calls/model={MODEL}/*/*.parquet"
    from fleet_day import _DUCKDB

    for path in stores.values():  # whichever engine ran first would pay the disk otherwise
        _warm(path)

    rows = []
    for turn in (1, 2):
        steps = [("count", "", True), ("filtered count", " WHERE duration_ns >= 0", True)]
        if turn == 2:  # the same statement again: the reader's cache holds the checked footers
            steps.append(("filtered count, second query", " WHERE duration_ns >= 0", False))
        for label, where, first in steps:
            cache = f"{STORES_DIR}/cache/first-{turn}"
            if first:
                shutil.rmtree(cache, ignore_errors=True)
            sql = f"SELECT count(*) AS n FROM calls{where}"
            run = {**env, "CAPTURE_CACHE_DIR": cache}
            argv = [py, "-m", "cli", "--store", stores[False], "query", sql, "-f", "csv"]
            cap = measured(argv, run)
            duck = measured([py, "-c", _DUCKDB, glob, where], env)
            ok = cap[3].split()[-1] == duck[3].strip() == str(files * CALLS_PER_FILE)
            ratio = f"{cap[0] / duck[0]:.2f}x, {cap[1] / duck[1]:.2f}x, {cap[2] / duck[2]:.2f}x"
            rows.append(
                [f"{label}, turn {turn}", *(f"{v:.1f}" for v in cap[:3])]
                + [*(f"{v:.1f}" for v in duck[:3]), ratio, "yes" if ok else "NO"]
            )
            log(f"  {rows[-1]} ({load_line()})")
    if summary:
        rows.append(_first_summary(stores[True], files, env))
        log(f"  {rows[-1]}")
    shutil.rmtree(f"{STORES_DIR}/cache", ignore_errors=True)
    print(f"### First SQL on a raw store of {files:,} flushes\n")
    print(f"- Machine: {machine_line(('pyarrow', 'duckdb'))}")
    print(f"- Load: {load_line()}\n")
    head = ["step", "capture wall (s)", "CPU (s)", "peak RSS (MiB)", "DuckDB wall (s)", "CPU (s)"]
    head += ["peak RSS (MiB)", "capture / DuckDB: wall, CPU, RSS", "right"]
    print(md_table(head, rows))


def _warm(store: str) -> None:
    """Reads every file of `store` once: both engines then read it from the page cache (this
    VM drops it between runs; a cold first run took 1.9x a warm one)."""
    for folder, _, names in os.walk(store):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                while f.read(1 << 20):
                    pass


def _first_summary(store: str, files: int, env: dict[str, str]) -> list[str]:
    """The row of ``capture summary`` on the per-flush store, a fresh process, empty cache,
    beside plain DuckDB reading every column of the same stats files (what `summary` decodes)."""
    cache = f"{STORES_DIR}/cache/first-summary"
    shutil.rmtree(cache, ignore_errors=True)
    argv = [sys.executable, "-m", "cli", "--store", store, "summary"]
    summ = measured(argv, {**env, "CAPTURE_CACHE_DIR": cache})
    ok = _counted(summ[3], files)
    duck = measured([sys.executable, "-c", _DUCKDB_EVERY_VALUE, f"{store}/stats/**/*.parquet"], env)
    ratio = f"{summ[0] / duck[0]:.2f}x, {summ[1] / duck[1]:.2f}x, {summ[2] / duck[2]:.2f}x"
    return [
        f"`summary`, {files:,} calls + {files:,} stats files",
        *(f"{v:.1f}" for v in summ[:3]),
        *(f"{v:.1f}" for v in duck[:3]),
        ratio,
        "yes" if ok else "NO",
    ]


_DUCKDB_EVERY_VALUE = """
import sys, duckdb
con = duckdb.connect()
con.execute('SET enable_progress_bar = false')
print(con.execute("SELECT max(hash(COLUMNS(*))) FROM read_parquet(?)", [sys.argv[1]]).fetchall())
"""


PEAK_MB: list[float] = []
"""Peak resident memory (MiB) of each `capture_cli` process, in order."""


def capture_cli(store: str, *args: str, env: dict[str, str] | None = None) -> tuple[float, str]:
    """(wall seconds, stdout) of `capture --store STORE ARGS`; raises when it fails."""
    wall, _, mb, stdout = measured([sys.executable, "-m", "cli", "--store", store, *args], env)
    PEAK_MB.append(mb)
    return wall, stdout


def _counted(out: str, n: int) -> bool:
    return f"{n * CALLS_PER_FILE:,}" in out or str(n * CALLS_PER_FILE) in out


def _summaries(
    args: argparse.Namespace,
    store: str,
    n: int,
    env: dict[str, str],
    key: str,
    baseline_max: int | None = None,
) -> list[str]:
    """[before, first open, cached, all counted] of `capture summary` on `store`."""
    cache = f"{STORES_DIR}/cache/{key or os.path.basename(store)}"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**env, "CAPTURE_CACHE_DIR": cache}
    before = ""
    if args.baseline and n <= (baseline_max or args.baseline_max):
        # its own cache: the first open timed below must find none
        shutil.rmtree(f"{cache}-before", ignore_errors=True)
        old = {**env, "PYTHONPATH": args.baseline, "CAPTURE_CACHE_DIR": f"{cache}-before"}
        before = f"{capture_cli(store, 'summary', env=old)[0]:.1f}"
    t_first, out = capture_cli(store, "summary", env=env)
    t_cached, out2 = capture_cli(store, "summary", env=env)
    ok = _counted(out, n) and out2 == out
    return [before, f"{t_first:.1f}", f"{t_cached:.1f}", "yes" if ok else "NO"]


def _count_query(store: str, n: int, env: dict[str, str], key: str) -> list[str]:
    """The first SQL over the calls (their footers are checked then), beside plain DuckDB's
    count over the same files (a glob, local stores only), each a fresh process: [capture s,
    DuckDB s, wall ratio, peak RSS ratio]."""
    from fleet_day import _DUCKDB, timed

    cache = f"{STORES_DIR}/cache/{os.path.basename(key)}"
    shutil.rmtree(cache, ignore_errors=True)
    sql = "SELECT count(*) AS n FROM calls"
    seconds, out = capture_cli(store, "query", sql, env={**env, "CAPTURE_CACHE_DIR": cache})
    mb = PEAK_MB[-1]
    got = f"{seconds:.1f}" if str(n * CALLS_PER_FILE) in out else f"{seconds:.1f} (WRONG)"
    if "://" in store:
        return [got, "", "", ""]
    glob = f"{store}/calls/model={MODEL}/*/*.parquet"
    plain_s, plain_mb, _ = timed([sys.executable, "-c", _DUCKDB, glob], env)
    return [got, f"{plain_s:.1f}", f"{seconds / plain_s:.2f}x", f"{mb / plain_mb:.2f}x"]


def _compacted(store: str, n: int, env: dict[str, str]) -> list[str]:
    """[compact seconds, its peak MiB, summary after, counted after]."""
    t_c, _ = capture_cli(store, "compact", env=env)
    peak = PEAK_MB[-1]
    t_after, out = capture_cli(store, "summary", env={**env, "CAPTURE_CACHE_DIR": "off"})
    return [f"{t_c:.1f}", f"{peak:.0f}", f"{t_after:.1f}", "yes" if _counted(out, n) else "NO"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    parser.add_argument("--s3-sizes", type=int, nargs="*", default=[1_000, 10_000])
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument(
        "--layouts",
        nargs="*",
        default=["rollups", "per flush"],
        choices=["rollups", "per flush"],
        help="stats layouts: this version's writers, writers before stats rollups",
    )
    parser.add_argument("--no-compact", action="store_true")
    parser.add_argument("--label", default="this branch")
    parser.add_argument(
        "--baseline", help="a checkout of the code before (e.g. /work/main): its summary too"
    )
    parser.add_argument("--baseline-max", type=int, default=10_000, help="largest store for it")
    parser.add_argument("--reuse", action="store_true", help="reuse and keep generated stores")
    parser.add_argument("--s3-baseline-max", type=int, default=1_000, help="largest S3 store")
    parser.add_argument("--fleet", action="store_true", help="the fleet sections only")
    parser.add_argument("--writers", type=int, default=10, help="--fleet: writer processes")
    parser.add_argument("--flush-s", type=float, default=60.0, help="--fleet: seconds per flush")
    parser.add_argument("--upkeep-s", type=float, default=900.0, help="--fleet: upkeep interval")
    parser.add_argument(
        "--store-dir", default="/work/fleet-bench-store", help="--fleet: where stores are kept"
    )
    parser.add_argument("--raw-query", action="store_true", help="--fleet: capture on raw files")
    parser.add_argument(
        "--raw-files", type=int, default=100_000, help="--fleet: flushes in the raw store"
    )
    parser.add_argument("--no-summary", action="store_true", help="--first-query: count only")
    parser.add_argument(
        "--first-query",
        type=int,
        metavar="N",
        help="only the first count beside DuckDB and the summary, on raw stores of N flushes",
    )
    args = parser.parse_args()
    rows: list[list[Any]] = []
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if args.fleet:
        fleet(args, env)
        return
    if args.first_query:
        first_query(args.first_query, env, args.reuse, not args.no_summary)
        return
    for layout in args.layouts:
        old = layout == "per flush"
        for n in args.sizes:
            path = f"{STORES_DIR}/local-{n}{'-old' if old else ''}"
            if not (args.reuse and os.path.exists(f"{path}/.generated")):
                shutil.rmtree(path, ignore_errors=True)
                log(f"generating {n:,} files at {path} (stats: {layout})")
                gen = generated(path, n, old, env)
                open(f"{path}/.generated", "w").close()
                log(f"  generated in {gen:.0f} s; summary")
            row = [f"local, {n:,} files", layout, *_summaries(args, path, n, env, "")]
            row += _count_query(path, n, env, path)
            if not args.no_compact:
                row += _compacted(path, n, env)
                shutil.rmtree(path, ignore_errors=True)  # compacted: no longer the store to reuse
            else:
                row += ["", "", "", ""]
            rows.append(row)
            log(f"  {row}")
            if not args.reuse:
                shutil.rmtree(path, ignore_errors=True)
    if not args.no_s3 and args.s3_sizes:
        sys.path.insert(0, os.path.join(env["PYTHONPATH"], "tests"))
        from s3_server import S3Server

        with S3Server() as server:
            s3env = {**env, **server.env()}
            os.environ.update(server.env())
            for layout in args.layouts:
                old = layout == "per flush"
                for n in args.s3_sizes:
                    bucket = server.create_bucket(f"bench-{n}{'-old' if old else ''}")
                    uri = f"s3://{bucket}/store"
                    log(f"generating {n:,} files at {uri} (stats: {layout})")
                    gen = generated(uri, n, old, s3env)
                    log(f"  generated in {gen:.0f} s; summary")
                    key = f"s3-{n}-{layout.replace(' ', '-')}"
                    row = [f"S3 (moto, loopback), {n:,} files", layout]
                    row += _summaries(args, uri, n, s3env, key, args.s3_baseline_max)
                    row += _count_query(uri, n, s3env, key)
                    row += _compacted(uri, n, s3env) if not args.no_compact else [""] * 4
                    rows.append(row)
                    log(f"  {row}")
    shutil.rmtree(f"{STORES_DIR}/cache", ignore_errors=True)
    print(f"### Fleet stores ({args.label})\n")
    print(f"- Machine: {machine_line(('pyarrow', 'duckdb', 'moto'))}")
    print(f"- Load: {load_line()}\n")
    print(
        md_table(
            [
                "store",
                "stats files",
                "`summary` before (s)",
                "`summary`, first open (s)",
                "`summary`, cached (s)",
                "all calls counted",
                "first `query` over calls (s)",
                "plain DuckDB count (s)",
                "`query` / DuckDB, wall",
                "`query` / DuckDB, peak RSS",
                "`compact` (s)",
                "`compact` peak RSS (MiB)",
                "`summary` after compact (s)",
                "counted after",
            ],
            rows,
        )
    )


def fleet(args: argparse.Namespace, env: dict[str, str]) -> None:
    """The fleet sections (`fleet_day`): files after a simulated day, first SQL on 100k flushes."""
    import fleet_day

    os.makedirs(args.store_dir, exist_ok=True)
    n = args.raw_files
    raw = f"{args.store_dir}/raw-{n}"
    if not os.path.exists(raw):
        log(f"generating {n:,} flushes at {raw} (kept for later runs)")
        script = (
            f"import sys; sys.path[:0] = [{os.path.dirname(os.path.abspath(__file__))!r}]; "
            f"import bench_fleet; bench_fleet.generate({raw + '.tmp'!r}, {n})"
        )
        subprocess.run([sys.executable, "-c", script], check=True, env=env)
        os.rename(f"{raw}.tmp", raw)
    log(f"a simulated day: {args.writers} writers, a flush every {args.flush_s:g} s")
    t0 = time.perf_counter()
    # In a child process: this one stays small, so the ru_maxrss of the processes it starts
    # later is theirs (Linux carries the parent's RSS over fork into the child).
    here = os.path.dirname(os.path.abspath(__file__))
    script = (
        f"import sys, json; sys.path[:0] = [{here!r}, {os.path.dirname(here)!r}]; "
        "import fleet_day; print(json.dumps(fleet_day.simulated_day(*json.loads(sys.argv[1]))))"
    )
    spec = json.dumps([args.writers, args.flush_s, args.upkeep_s, f"{args.store_dir}/day"])
    out = subprocess.run(
        [sys.executable, "-c", script, spec], capture_output=True, text=True, check=True, env=env
    ).stdout
    day = json.loads(out.strip().splitlines()[-1])
    day_s = time.perf_counter() - t0
    log(f"  {day} in {day_s:.0f} s")
    shutil.rmtree(f"{args.store_dir}/day", ignore_errors=True)
    log(f"{n:,} flushes")
    rows = fleet_day.hundred_k(raw, f"{args.store_dir}/work-{n}", env, args.raw_query, n)
    print(f"### A fleet's store without an operator ({args.label})\n")
    print(f"- Machine: {machine_line(('pyarrow', 'duckdb'))}")
    print(f"- Load: {load_line()}\n")
    files, without = day["files"], day["without"]
    print(
        f"A simulated day: {args.writers} writers, a flush every {args.flush_s:g} s "
        f"({day['flushes']:,} calls files of {CALLS_PER_FILE} calls), the recorders' upkeep "
        f"every {args.upkeep_s:g} s ({day['turns']} compactions, {day['compact_s']:.0f} s "
        f"in all; simulated in {day_s:.0f} s).\n"
    )
    print(
        md_table(
            ["table", "files at the end of the day", "most files at any time", "without upkeep"],
            [
                [
                    t,
                    f"{files[t]:,}",
                    "" if t != "calls" else f"{day['most']:,} (all tables)",
                    f"{without[t]:,}",
                ]
                for t in ("calls", "stats", "structures")
            ],
        )
    )
    print()
    print(f"{n:,} flushes ({n * CALLS_PER_FILE:,} calls), each step a fresh process:\n")
    print(md_table(["step", "wall (s)", "peak RSS (MiB)", "result"], rows))


if __name__ == "__main__":
    main()
