"""Peak memory of `capture query` over 100 million rows, piped to head and to a file.

    python bench/bench_query_stream.py             # 100M rows, every format (numbers in docs/)
    python bench/bench_query_stream.py --rows 10000000

Prints one Markdown section on stdout (progress goes to stderr).

**What is measured.** ``capture --store S query "SELECT * FROM range(N)" -f FORMAT`` runs as a
user runs it, in a fresh process: (a) its stdout a pipe that the benchmark reads for 10 lines
and then closes (what ``| head`` does), and (b) its stdout a file in /tmp. For each, the
command's own peak RSS (``os.wait4``'s ``ru_maxrss``: the process, not the benchmark), its wall
time and its exit status (141 for a closed pipe, 0 to a file). The store is one tiny recording:
the SQL reads no store file, so the numbers are the renderer's and DuckDB's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import code_line, load_line, machine_line, md_table  # noqa: E402

FORMATS = ("table", "csv", "json", "jsonl")


def log(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


_RECORD = """
import sys, torch, capture
model = torch.nn.Linear(2, 2)
with capture.Recorder(model, sys.argv[1], name="linear"):
    model(torch.randn(1, 2))
"""


def _store(folder: str) -> str:
    """One recorded call, written by another process: this one stays small (a child's
    ``ru_maxrss`` starts at its parent's size at fork, so a parent holding torch would hide the
    command's own peak)."""
    root = os.path.join(folder, "store")
    subprocess.run([sys.executable, "-c", _RECORD, root], check=True)
    return root


def _command(store: str, rows: int, fmt: str) -> list[str]:
    sql = f"SELECT * FROM range({rows})"
    return [sys.executable, "-m", "capture.cli", "--store", store, "query", sql, "-f", fmt]


def _run(argv: list[str], stdout: object, head: int | None) -> tuple[float, int, int]:
    """(seconds, exit status, peak RSS in MiB) of one run."""
    t0 = time.perf_counter()
    process = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.DEVNULL)  # type: ignore[arg-type]
    if head is not None:
        assert process.stdout is not None
        for _ in range(head):
            process.stdout.readline()
        process.stdout.close()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t0, process.returncode, usage.ru_maxrss // 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000_000)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="capture-bench-query-") as folder:
        store = _store(folder)
        for fmt in FORMATS:
            log(f"{fmt}: piped to head")
            s, code, rss = _run(_command(store, args.rows, fmt), subprocess.PIPE, head=10)
            rows.append([fmt, "head (10 lines)", f"{rss:,}", f"{s:.1f}", str(code), "-"])
            log(f"{fmt}: to a file")
            out = os.path.join(folder, f"out.{fmt}")
            with open(out, "wb") as f:
                s, code, rss = _run(_command(store, args.rows, fmt), f, head=None)
            size = os.path.getsize(out) / 2**30
            os.remove(out)
            rows.append([fmt, "file", f"{rss:,}", f"{s:.0f}", str(code), f"{size:.2f}"])
    print(f"### `capture query` over {args.rows:,} rows: peak RSS\n")
    print(f"Machine: {machine_line(('pyarrow', 'duckdb'))}. {load_line()}\n")
    print(
        md_table(["format", "stdout", "peak RSS (MiB)", "wall (s)", "exit", "output (GiB)"], rows)
    )
    print(f"\n{code_line()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
