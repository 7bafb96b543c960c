"""The ``dims`` SQL view against the same group-by written by hand over the Parquet files.

    python bench/bench_dims_view.py              # 10M calls (generated once, kept)
    python bench/bench_dims_view.py --calls 2000000

Prints one Markdown section on stdout (progress goes to stderr).

**The store.** `bench_store`'s synthetic LLM traffic (10 tensor leaves per call, files of 100,000
calls), generated once under /tmp/capture-bench-stores/ and reused.

**The question.** How many calls had each size on each axis of each input leaf:

- over the view: ``SELECT leaf, axis, size, count(*) FROM dims WHERE side = 'input' GROUP BY ALL``;
- by hand: DuckDB over the calls files (``read_parquet`` of the same list of files), each call's
  ``dims`` flattened with their positions and counted per (structure, position, size), then
  named by the structures' leaves (``dim_offset + axis = position``): the cheapest way we know
  to write it without the view;
- the view as it was (each leaf's sizes sliced out of the call's list, then unnested), for
  the record.

Each is run in a fresh process (`capture.open_store` first, untimed), alternating, `--repeat`
times; the CPU time of the query alone (the process's, every DuckDB thread included) and its wall
time are reported, the smallest of the runs. Results are checked to be the same rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import load_line, machine_line, md_table  # noqa: E402

VIEW = "SELECT leaf, axis, size, count(*) AS n FROM dims WHERE side = 'input' GROUP BY ALL"

OLD_VIEW = """
SELECT leaf, axis, size, count(*) AS n FROM (
    SELECT call_id, model, side, leaf, path,
           unnest(generate_series(0, len(shape) - 1)) AS axis, unnest(shape) AS size
    FROM leaves WHERE kind = 'tensor'
) WHERE side = 'input' GROUP BY ALL
"""

BY_HAND = """
WITH flat AS (
    SELECT in_structure AS sid, model, unnest(dims) AS size,
           unnest(range(len(dims))) AS position
    FROM read_parquet($files)
),
counted AS (SELECT sid, model, position, size, count(*) AS n FROM flat GROUP BY ALL),
axes AS (
    SELECT structure_id, model, leaf, unnest(range(rank)) AS axis, dim_offset
    FROM leaf_rows WHERE kind = 'tensor'
)
SELECT a.leaf, a.axis, c.size, sum(c.n)::BIGINT AS n
FROM counted c JOIN axes a
  ON a.structure_id = c.sid AND a.model = c.model AND a.dim_offset + a.axis = c.position
GROUP BY ALL
"""

_CHILD = """
import json, sys, time
import capture
store, which = sys.argv[1], sys.argv[2]
with capture.open_store(store) as s:
    if which == "by hand":
        import duckdb
        con = duckdb.connect()
        con.execute("SET enable_progress_bar = false")
        con.register("leaf_rows", s.query("SELECT * FROM structures"))
        files = s.files["calls"]
        run = lambda: con.execute(sys.argv[3], {"files": files}).to_arrow_table()
    else:
        run = lambda: s.query(sys.argv[3])
    cpu, wall = time.process_time(), time.perf_counter()
    rows = run()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
key = sorted(map(tuple, zip(*(rows.column(n).to_pylist() for n in ("leaf", "axis", "size", "n")))))
print(json.dumps({"cpu": cpu, "wall": wall, "rows": rows.num_rows, "key": hash(tuple(key))}))
"""


def log(msg: str) -> None:
    print(f"[bench_dims_view] {msg}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--no-old", action="store_true", help="leave the old view out")
    args = parser.parse_args()
    import bench_store

    store, info, _ = bench_store.ensure_store(args.calls, bench_store.ROWS_PER_FILE, False)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    ways = {"`dims` view": VIEW, "by hand over the Parquet files": BY_HAND}
    if not args.no_old:
        ways["the view as it was (a list sliced per leaf)"] = OLD_VIEW
    best: dict[str, dict[str, float]] = {}
    keys = set()
    for r in range(args.repeat):
        for name, sql in ways.items():
            if r and name.startswith("the view as it was"):
                continue  # once is enough for the record
            which = "by hand" if sql is BY_HAND else "view"
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, store, which, sql],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            ).stdout
            got = json.loads(out.strip().splitlines()[-1])
            keys.add(got["key"])
            log(f"{name}: {got}")
            old = best.get(name)
            if old is None or got["cpu"] < old["cpu"]:
                best[name] = got
    same = "yes" if len(keys) == 1 else "NO"
    base = best["by hand over the Parquet files"]["cpu"]
    rows = [
        [name, f"{b['cpu']:.1f}", f"{b['wall']:.1f}", f"{b['cpu'] / base:.2f}x", f"{b['rows']:,}"]
        for name, b in best.items()
    ]
    print(f"### The `dims` view on {args.calls:,} calls\n")
    print(f"- Machine: {machine_line(('pyarrow', 'duckdb'))}")
    print(f"- Load: {load_line()}")
    print(f"- Store: {info['files']} files, {info['calls']:,} calls; same rows every way: {same}\n")
    print(md_table(["written as", "CPU (s)", "wall (s)", "CPU vs by hand", "rows"], rows))


if __name__ == "__main__":
    main()
