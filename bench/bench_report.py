"""Benchmark of `capture report`, `capture profiles` and `capture buckets` on a 1M-call store.

    python bench/bench_report.py             # 1M calls, 5 repetitions (numbers in docs/)
    python bench/bench_report.py --quick     # 100k calls, 2 repetitions
    python bench/bench_report.py --regenerate

Prints one Markdown section on stdout (progress goes to stderr).

**The store** is bench_store.py's synthetic LLM traffic (same generator, same folder under
/tmp/capture-bench-stores/, shared with that benchmark): 1M calls in files of 100k calls, two
input structures, 2,500 distinct signatures, with the per-segment ``stats`` files a recorder
writes.

**What is timed.** Each command runs as a user runs it: ``capture --store P <command>`` in a
fresh process, wall time from start to exit (interpreter start, imports, opening the store,
the analysis, plotting and writing included), repeated; median and max reported. Then, in one
process, the stages of the report (open_store, analyze, the whole page) to show where the time
goes. The page cache is warm (not a cold-disk measurement).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_store import ROWS_PER_FILE, ensure_store  # noqa: E402
from common import code_line, load_line, machine_line, md_table, median  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_S = 2.0


def log(msg: str) -> None:
    print(f"[bench_report] {msg}", file=sys.stderr, flush=True)


def _capture() -> list[str]:
    return [sys.executable, "-m", "capture.cli"]


def _time_command(args: list[str], repeat: int) -> tuple[list[float], list[float]]:
    """Wall seconds and CPU seconds (user + system, of the child) per run."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    times, cpu = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(args, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return times, cpu


_STAGES = """
import sys, time
t0 = time.perf_counter()
import capture
from capture.analysis.groups import analyze
from capture.engines.report_html import build_report
t1 = time.perf_counter()
store = capture.open_store(sys.argv[1])
t2 = time.perf_counter()
analyze(store)
t3 = time.perf_counter()
import matplotlib.figure
t4 = time.perf_counter()
page = build_report(store)
t5 = time.perf_counter()
store.profiles()
t6 = time.perf_counter()
store.buckets("batch", 8)
t7 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6, len(page))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--regenerate", action="store_true")
    options = parser.parse_args()
    calls = 100_000 if options.quick else 1_000_000
    repeat = 2 if options.quick else 5
    path, info, _ = ensure_store(calls, ROWS_PER_FILE, options.regenerate)
    out = os.path.join(tempfile.mkdtemp(prefix="bench-report-"), "report.html")
    store = ["--store", path]
    commands = {
        "report": [*_capture(), *store, "report", "--out", out],
        "profiles -f trtexec": [*_capture(), *store, "profiles", "-f", "trtexec"],
        "profiles --max-profiles 4": [*_capture(), *store, "profiles", "--max-profiles", "4"],
        "buckets --symbol batch --budget 8": [
            *_capture(),
            *store,
            "buckets",
            "--symbol",
            "batch",
            "--budget",
            "8",
        ],
        "buckets --symbol past_key_values_2 --budget 16": [
            *_capture(),
            *store,
            "buckets",
            "--symbol",
            "past_key_values_2",
            "--budget",
            "16",
        ],
        "capture --help (interpreter + click floor)": [*_capture(), "--help"],
    }
    rows = []
    for name, args in commands.items():
        log(f"timing {name}")
        times, cpu = _time_command(args, repeat)
        rows.append(
            {
                "command": f"`{name}`",
                "median s": f"{median(times):.2f}",
                "max s": f"{max(times):.2f}",
                "median CPU s": f"{median(cpu):.2f}",
                "target": "" if "help" in name else f"≤ {TARGET_S:.0f} s",
                "verdict": ""
                if "help" in name
                else ("met" if median(times) <= TARGET_S else "missed"),
            }
        )
    log("stages")
    stage_times = subprocess.run(
        [sys.executable, "-c", _STAGES, path],
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
        cwd=ROOT,
    ).stdout.split()
    names = [
        "import capture + report module",
        "open_store",
        "analyze (stats → groups)",
        "import matplotlib",
        "build_report (analysis again, timeline, 6+ plots)",
        "Store.profiles()",
        "Store.buckets('batch', 8)",
    ]
    stages = [
        {"stage": n, "seconds": f"{float(t):.3f}"}
        for n, t in zip(names, stage_times[:-1], strict=True)
    ]
    page_kib = int(stage_times[-1]) / 1024
    print(f"### capture report / profiles / buckets on {calls:,} calls\n")
    print(f"- Machine: {machine_line(('pyarrow', 'duckdb', 'matplotlib'))}")
    print(f"- {load_line()}")
    print(f"- {code_line(('capture', 'cli'))}")
    print(
        f"- Store: {info['calls']:,} calls, {info['files']} calls files, {info['signatures']:,} "
        f"distinct signatures (bench_store.py generator v{info['version']}); report page "
        f"{page_kib:,.0f} KiB"
    )
    print(
        f"- Method: fresh process per run (`python -m capture.cli ...`), {repeat} runs, wall time; "
        "CPU time (user + system of the process) as well, which a loaded machine inflates less\n"
    )
    print(md_table(list(rows[0]), [list(r.values()) for r in rows]))
    print("\nStages in one process (one run):\n")
    print(md_table(list(stages[0]), [list(r.values()) for r in stages]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
