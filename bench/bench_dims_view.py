"""The ``dims`` SQL view against the same group-by written by hand over the Parquet files.

    python bench/bench_dims_view.py              # 10M calls (generated once, kept)
    python bench/bench_dims_view.py --calls 2000000

Prints one Markdown section on stdout (progress goes to stderr).

**The store.** `bench_store`'s synthetic LLM traffic (10 tensor leaves per call, files of 100,000
calls), generated once under /tmp/capture-bench-stores/ and reused.

**The questions**, each asked of the ``dims`` view and by hand (DuckDB over the calls files,
``read_parquet`` of the same list of files: each call's ``dims`` flattened with their positions and
counted per (structure, position, size), then named by the structures' leaves, ``dim_offset +
axis = position``: the cheapest way we know to write it without the view):

- *sizes per axis*: how many calls had each size on each axis of each input leaf
  (``GROUP BY leaf, axis, size``);
- *every input axis*: per input path and axis, the smallest and largest size, the number of
  distinct sizes and of calls (``GROUP BY path, axis`` with ``count(DISTINCT size)``): what a
  user asks to see which axes vary. The view names every call's every size before the group-by
  (tens of rows per call), where the hand-written query names a few hundred counted rows: the
  cost of the view is what it pays per row for the name (the view's ``path`` is an ENUM, so
  that is a small integer, not a string);
- with ``--old``, the view as it was (each leaf's sizes sliced out of the call's list, then
  unnested) on the first question, for the record.

The queries are printed with the results.

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
from typing import Any

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

_COUNTED = """
WITH flat AS (
    SELECT in_structure AS sid, model, unnest(dims) AS size,
           unnest(range(len(dims))) AS position
    FROM read_parquet($files)
),
counted AS (SELECT sid, model, position, size, count(*) AS n FROM flat GROUP BY ALL),
axes AS (
    SELECT structure_id, model, leaf, path, unnest(range(rank)) AS axis, dim_offset
    FROM leaf_rows WHERE kind = 'tensor'
)
"""

BY_HAND = (
    _COUNTED
    + """SELECT a.leaf, a.axis, c.size, sum(c.n)::BIGINT AS n
FROM counted c JOIN axes a
  ON a.structure_id = c.sid AND a.model = c.model AND a.dim_offset + a.axis = c.position
GROUP BY ALL
"""
)

AXIS_VIEW = (
    "SELECT path, axis, min(size) AS lo, max(size) AS hi, count(DISTINCT size) AS sizes, "
    "count(*) AS n FROM dims WHERE side = 'input' GROUP BY path, axis"
)

AXIS_BY_HAND = (
    _COUNTED
    + """SELECT a.path, a.axis, min(c.size) AS lo, max(c.size) AS hi,
       count(DISTINCT c.size) AS sizes, sum(c.n)::BIGINT AS n
FROM counted c JOIN axes a
  ON a.structure_id = c.sid AND a.model = c.model AND a.dim_offset + a.axis = c.position
GROUP BY a.path, a.axis
"""
)

QUESTIONS = {
    "sizes per axis": (VIEW, BY_HAND),
    "every input axis": (AXIS_VIEW, AXIS_BY_HAND),
}
"""Question -> (over the view, by hand)."""

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
import hashlib
key = sorted(map(tuple, zip(*(rows.column(i).to_pylist() for i in range(rows.num_columns)))))
digest = hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()[:16]
print(json.dumps({"cpu": cpu, "wall": wall, "rows": rows.num_rows, "key": digest}))
"""


def log(msg: str) -> None:
    print(f"[bench_dims_view] {msg}", file=sys.stderr, flush=True)


def _run(store: str, env: dict[str, str], which: str, sql: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, store, which, sql],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    got: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--old", action="store_true", help="also the view as it was")
    args = parser.parse_args()
    import bench_store

    store, info, _ = bench_store.ensure_store(args.calls, bench_store.ROWS_PER_FILE, False)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    rows: list[list[str]] = []
    for question, (view_sql, hand_sql) in QUESTIONS.items():
        ways = {"`dims` view": ("view", view_sql), "by hand": ("by hand", hand_sql)}
        if args.old and question == "sizes per axis":
            ways["the view as it was"] = ("view", OLD_VIEW)
        best: dict[str, dict[str, Any]] = {}
        keys: dict[str, str] = {}
        for r in range(args.repeat):
            for name, (which, sql) in ways.items():
                if r and name == "the view as it was":
                    continue  # once is enough for the record
                got = _run(store, env, which, sql)
                keys[name] = got["key"]
                log(f"{question}, {name}: {got}")
                if name not in best or got["cpu"] < best[name]["cpu"]:
                    best[name] = got
        same = "yes" if len(set(keys.values())) == 1 else "NO"
        base = best["by hand"]["cpu"]
        for name, b in best.items():
            cpu, wall = f"{b['cpu']:.1f}", f"{b['wall']:.1f}"
            ratio = f"{b['cpu'] / base:.2f}x"
            rows.append([question, name, cpu, wall, ratio, f"{b['rows']:,}", same])
    print(f"### The `dims` view on {args.calls:,} calls\n")
    print(f"- Machine: {machine_line(('pyarrow', 'duckdb'))}")
    print(f"- Load: {load_line()}")
    print(f"- Store: {info['files']} files, {info['calls']:,} calls\n")
    print(
        md_table(
            ["question", "written as", "CPU (s)", "wall (s)", "CPU vs by hand", "rows", "same"],
            rows,
        )
    )
    print("\nThe queries (``$files``: the store's calls files; ``leaf_rows``: its structures):\n")
    for question, (view_sql, hand_sql) in QUESTIONS.items():
        print(f"*{question}*, over the view:\n\n```sql\n{view_sql.strip()}\n```\n")
        print(f"*{question}*, by hand:\n\n```sql\n{hand_sql.strip()}\n```\n")


if __name__ == "__main__":
    main()
