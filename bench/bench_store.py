"""Benchmarks of the analysis side: open_store, dims, summary, CLI cold start, on big stores.

    python bench/bench_store.py              # full run: 1M and 10M calls (numbers in docs/)
    python bench/bench_store.py --quick      # 100k and 1M calls, fewer repetitions
    python bench/bench_store.py --regenerate # rebuild the synthetic stores even if present

Prints one Markdown section on stdout (progress goes to stderr).

**The stores.** Synthetic, deterministic (seeded), built with the writer's own code: the structures
are `capture.record.flatten.describe()` of real calls and are written with
`capture.record.writer.structure_table()`; calls and stats tables follow `capture.schema`'s schemas
and are written with `capture.store.files.write_parquet()` (zstd, tmp name + rename, schema
metadata), 100k calls per file, one stats file per calls file (one row per distinct signature in it,
as `Segment.stats_table` computes them), the calls spread over several writer processes (file
prefixes, each with its own copy of the structures file) and UTC dates. The traffic is an LLM's:
`forward(input_ids, attention_mask=None, position_ids=None, past_key_values=None)` with a 4-layer
`DynamicCache`, i.e. 10 tensor leaves per call (36 sizes), in two structures (with `attention_mask`,
with `position_ids` instead), and the logits as output. Sizes are drawn from a fixed set of distinct
signatures (batch, new tokens, cached tokens) with Zipf-like weights: prefill (new tokens > 1, empty
cache) and decode (1 new token, cache 1..2047). The stores are kept under /tmp/capture-bench-stores/
between runs (never in the repository).

**What is timed.** Each measurement runs in a fresh Python process (so imports and DuckDB's
first query are included, as for a user), repeated; median and max reported. In the child:
`import capture` + `capture.open_store(path)`, `Store.dims()`, `Store.summary()`, and peak RSS
(ru_maxrss). The CLI: `capture --help` and `capture --store PATH query "SELECT count(*) FROM
calls"` as subprocesses (wall time, peak RSS from wait4). The page cache is warm (the files were
just written or read): this is not a cold-disk measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (  # noqa: E402
    code_line,
    load_line,
    machine_line,
    md_table,
    median,
    mib,
)

STORES_DIR = "/tmp/capture-bench-stores"
ROWS_PER_FILE = 100_000
LAYERS = 4
GENERATOR_VERSION = "2"
TARGETS_S = {1_000_000: 1.0, 10_000_000: 10.0}
TARGET_HELP_S = 0.5
MODEL = "LlamaForCausalLM"


def log(msg: str) -> None:
    print(f"[bench_store] {msg}", file=sys.stderr, flush=True)


# -- the synthetic store --------------------------------------------------------------------
def _structures() -> tuple[list[Any], Any, tuple[Any, ...]]:
    """Two input structures (10 tensor leaves each) and one output structure, via describe()."""
    import torch

    from capture.pytree import nodes
    from capture.record import flatten
    from capture.signature import Signature

    def forward(
        input_ids: Any,
        attention_mask: Any = None,
        position_ids: Any = None,
        past_key_values: Any = None,
    ) -> Any:
        return None

    sig = Signature.of(forward)
    with nodes.register_flattening_functions():
        cache = nodes.make_dynamic_cache(
            [(torch.zeros(1, 8, 3, 64), torch.zeros(1, 8, 3, 64)) for _ in range(LAYERS)]
        )
        ids = torch.zeros(1, 1, dtype=torch.int64)
        calls = [
            {
                "input_ids": ids,
                "attention_mask": torch.ones(1, 4, dtype=torch.int64),
                "past_key_values": cache,
            },
            {
                "input_ids": ids,
                "position_ids": torch.zeros(1, 1, dtype=torch.int64),
                "past_key_values": cache,
            },
        ]
        structures = []
        for kwargs in calls:
            tensors: list[Any] = []
            flatten.walk(((), kwargs), tensors, [])
            st = flatten.describe(((), kwargs), tensors, signature=sig, track_ranges=lambda t: True)
            assert st.n_tensors == 2 + 2 * LAYERS, st.n_tensors
            structures.append(st)
        logits = torch.zeros(1, 1, 32000)
        out = flatten.describe(logits, [logits], root="output")
    return structures, out, sig


def _signatures(rng: Any, n_a: int, n_b: int) -> Any:
    """Distinct (structure, batch, new tokens, cached tokens) rows and their weights."""
    import numpy as np

    rows: set[tuple[int, int, int, int]] = set()
    for structure, n in ((0, n_a), (1, n_b)):
        count = 0
        while count < n:
            batch = int(rng.choice([1, 2, 4, 8], p=[0.55, 0.25, 0.15, 0.05]))
            if structure == 0 and rng.random() < 0.2:  # prefill: empty cache
                new, past = int(rng.integers(2, 513)), 0
            else:  # decode
                new, past = 1, int(rng.integers(1, 2048))
            if (structure, batch, new, past) not in rows:
                rows.add((structure, batch, new, past))
                count += 1
    sigs = np.array(sorted(rows), dtype=np.int64)
    rng.shuffle(sigs)
    weights = 1.0 / (np.arange(len(sigs)) + 10.0)
    return sigs, weights / weights.sum()


def _dims_matrix(sigs: Any) -> tuple[Any, Any]:
    """Per signature: the 36 input sizes in leaf order, and the 3 output sizes."""
    import numpy as np

    s, b, new, past = sigs[:, 0], sigs[:, 1], sigs[:, 2], sigs[:, 3]
    n = len(sigs)
    second = np.where(
        s == 0, past + new, new
    )  # attention_mask (B, past+new) / position_ids (B, new)
    cols = [b, new, b, second]
    for _ in range(2 * LAYERS):
        cols += [b, np.full(n, 8), past, np.full(n, 64)]
    dims = np.stack(cols, axis=1)
    out = np.stack([b, new, np.full(n, 32000)], axis=1)
    return dims, out


def _list_array(matrix: Any) -> Any:
    import numpy as np
    import pyarrow as pa

    rows, width = matrix.shape
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(
        offsets, pa.array(matrix.reshape(-1)), type=pa.list_(pa.int64())
    )


def _ts(values: Any) -> Any:
    import pyarrow as pa

    return (
        pa.array(values, pa.int64())
        .cast(pa.timestamp("ns", tz="UTC"))
        .cast(pa.timestamp("us", tz="UTC"), safe=False)
    )


def generate(
    path: str, calls: int, rows_per_file: int = ROWS_PER_FILE, seed: int = 0
) -> dict[str, Any]:
    """Writes a synthetic store of `calls` calls into `path` (replacing it)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.fs as pafs

    from capture import schema
    from capture.record.segment import structure_table
    from capture.store.files import write_parquet

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    structures, out_st, sig = _structures()
    in_ids = [st.structure_id for st in structures]
    sigs, weights = _signatures(rng, 2000, 500)
    dims, out_dims = _dims_matrix(sigs)
    fs = pafs.LocalFileSystem()
    shutil.rmtree(path, ignore_errors=True)
    files = (calls + rows_per_file - 1) // rows_per_file
    processes = max(1, min(8, files // 4))
    days = max(1, min(7, calls // 1_000_000))
    ts0 = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z
    day_ns = 86_400 * 10**9
    prefixes = [f"bench-host{p % 3}-{1000 + p}-{p:x}0000-{p:04x}" for p in range(processes)]
    seqs = [0] * processes
    st_table = structure_table(MODEL, [*structures, out_st], sig)
    for p in range(processes):  # every writer process writes the structures it saw first
        write_parquet(
            fs,
            f"{path}/{schema.STRUCTURES}/model={MODEL}",
            f"{prefixes[p]}-000000.parquet",
            st_table,
            schema.STRUCTURES,
        )
        seqs[p] = 1
    sid_dict = pa.array(in_ids, pa.string())
    written = 0
    for f in range(files):
        rows = min(rows_per_file, calls - written)
        p = f % processes
        day = f * days // files
        idx = rng.choice(len(sigs), size=rows, p=weights)
        structure = sigs[idx, 0]
        batch, past = sigs[idx, 1], sigs[idx, 3]
        ts = ts0 + day * day_ns + np.sort(rng.integers(0, day_ns - 1, size=rows))
        ids_min = rng.integers(0, 1000, size=rows)
        ids_max = ids_min + rng.integers(0, 31000, size=rows)
        second_min = np.where(structure == 0, rng.integers(0, 2, size=rows), past)
        second_max = np.where(structure == 0, 1, past)
        int_min = np.stack([ids_min, second_min], axis=1)
        int_max = np.stack([ids_max, second_max], axis=1)
        duration = (rng.gamma(2.0, 4e6, size=rows) * batch).astype(np.int64) + 100_000
        call_id = (np.int64(p + 1) << 40) + written + np.arange(rows, dtype=np.int64)
        in_structure = pa.DictionaryArray.from_arrays(
            pa.array(structure.astype(np.int32)), sid_dict
        ).cast(pa.string())
        table = pa.table(
            {
                "call_id": pa.array(call_id),
                "ts": _ts(ts),
                "model": pa.array([MODEL] * rows, pa.string()),
                "host": pa.array([prefixes[p].split("-")[1]] * rows, pa.string()),
                "pid": pa.array(np.full(rows, 1000 + p, dtype=np.int32)),
                "in_structure": in_structure,
                "out_structure": pa.array([out_st.structure_id] * rows, pa.string()),
                "dims": _list_array(dims[idx]),
                "out_dims": _list_array(out_dims[idx]),
                "int_min": _list_array(int_min),
                "int_max": _list_array(int_max),
                "duration_ns": pa.array(duration),
                "error": pa.nulls(rows, pa.string()),
                schema.STATE: pa.nulls(rows, pa.string()),  # no state declared
            },
            schema=schema.CALLS_SCHEMA,
        )
        # stats: one row per distinct signature in this file, as Segment.stats_table does
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
        starts = np.flatnonzero(np.r_[True, sorted_idx[1:] != sorted_idx[:-1]])
        present = sorted_idx[starts]
        counts = np.diff(np.r_[starts, rows])

        def red(fn: Any, values: Any, starts: Any = starts, order: Any = order) -> Any:
            return fn.reduceat(values[order], starts, axis=0)

        stats = pa.table(
            {
                "model": pa.array([MODEL] * len(present), pa.string()),
                "in_structure": pa.array([in_ids[s] for s in sigs[present, 0]], pa.string()),
                "out_structure": pa.array([out_st.structure_id] * len(present), pa.string()),
                "dims": _list_array(dims[present]),
                "out_dims": _list_array(out_dims[present]),
                "calls": pa.array(counts.astype(np.int64)),
                "errors": pa.array(np.zeros(len(present), dtype=np.int64)),
                "int_min": _list_array(red(np.minimum, int_min)),
                "int_max": _list_array(red(np.maximum, int_max)),
                "first_ts": _ts(red(np.minimum, ts)),
                "last_ts": _ts(red(np.maximum, ts)),
                "duration_ns_sum": pa.array(red(np.add, duration)),
                "duration_ns_min": pa.array(red(np.minimum, duration)),
                "duration_ns_max": pa.array(red(np.maximum, duration)),
                schema.STATE: pa.nulls(len(present), pa.string()),
            },
            schema=schema.STATS_SCHEMA,
        )
        date = time.strftime("%Y-%m-%d", time.gmtime((ts0 + day * day_ns) // 10**9))
        name = f"{prefixes[p]}-{seqs[p]:06d}.parquet"
        seqs[p] += 1
        write_parquet(
            fs, f"{path}/{schema.CALLS}/model={MODEL}/date={date}", name, table, schema.CALLS
        )
        write_parquet(fs, f"{path}/{schema.STATS}/model={MODEL}", name, stats, schema.STATS)
        written += rows
    size = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)
    info = {
        "version": GENERATOR_VERSION,
        "calls": calls,
        "rows_per_file": rows_per_file,
        "seed": seed,
        "files": files,
        "processes": processes,
        "days": days,
        "signatures": len(sigs),
        "bytes": size,
        "seconds": time.perf_counter() - t0,
    }
    with open(os.path.join(path, "..", os.path.basename(path) + ".json"), "w") as fh:
        json.dump(info, fh)
    return info


def ensure_store(
    calls: int, rows_per_file: int, regenerate: bool
) -> tuple[str, dict[str, Any], bool]:
    path = os.path.join(STORES_DIR, f"calls-{calls}-per-file-{rows_per_file}")
    meta = path + ".json"
    if not regenerate and os.path.exists(meta):
        with open(meta) as fh:
            info = json.load(fh)
        if info.get("version") == GENERATOR_VERSION and info.get("calls") == calls:
            return path, info, False
    os.makedirs(STORES_DIR, exist_ok=True)
    log(f"generating {calls:,} calls into {path}")
    # In a child process: this one stays small (no torch, numpy), so the ru_maxrss of the
    # processes it starts later is theirs (Linux carries the parent's RSS over fork into it).
    subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--generate",
            str(calls),
            str(rows_per_file),
            path,
        ],
        check=True,
    )
    with open(meta) as fh:
        return path, json.load(fh), True


# -- measurements in fresh processes --------------------------------------------------------
CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import capture
import capture.store_api
ti = time.perf_counter()
store = capture.open_store(sys.argv[1])
t1 = time.perf_counter()
out = {"open_store": t1 - t0, "imports": ti - t0, "open_only": t1 - ti}
n = store.query("SELECT count(*) AS n FROM calls").column("n")[0].as_py()
out["count"] = n
t2 = time.perf_counter()
out["count_query"] = t2 - t1
try:
    dims = store.dims()
    t3 = time.perf_counter()
    out["dims"] = t3 - t2
    out["dims_rows"] = dims.num_rows
    out["dynamic"] = sum(1 for d in dims.column("dynamic").to_pylist() if d)
except Exception as e:
    t3 = time.perf_counter()
    out["dims_error"] = f"{type(e).__name__}: {e}"
try:
    s = store.summary()
    out["summary"] = time.perf_counter() - t3
    out["summary_calls"] = s.get("calls") if isinstance(s, dict) else None
except Exception as e:
    out["summary_error"] = f"{type(e).__name__}: {e}"
out["torch_imported"] = "torch" in sys.modules
with open("/proc/self/status") as f:
    hwm = [line.split()[1] for line in f if line.startswith("VmHWM:")]
usage = resource.getrusage(resource.RUSAGE_SELF)
out["peak_rss"] = int(hwm[0]) * 1024 if hwm else usage.ru_maxrss * 1024
print(json.dumps(out))
"""


def run_child(path: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, path], capture_output=True, text=True, check=True
    )
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def time_command(argv: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak RSS bytes, exit status) of one subprocess."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.stderr is not None:
        proc.stderr.close()
    return seconds, usage.ru_maxrss * 1024, proc.returncode


def _s(values: list[float]) -> str:
    return f"{median(values):.3f}"


def _mx(values: list[float]) -> str:
    return f"{max(values):.3f}"


def store_rows(
    calls: int, path: str, info: dict[str, Any], repeat: int, label: str | None = None
) -> tuple[list[list[Any]], list[str]]:
    per_file = info.get("rows_per_file", ROWS_PER_FILE)
    label_calls = label or f"{calls:,} ({per_file:,}/file)"
    log(f"timing {label_calls} calls ({repeat} fresh processes)")
    runs = [run_child(path) for _ in range(repeat)]
    notes = []
    first = runs[0]
    if first["count"] != calls:
        notes.append(f"count(*) returned {first['count']}, expected {calls}")
    if first.get("summary_calls") not in (None, calls):
        notes.append(f"summary() counted {first['summary_calls']} calls, expected {calls}")
    if first["torch_imported"]:
        notes.append("open_store/dims/summary imported torch")
    target = TARGETS_S.get(calls)
    rows = []
    total = []
    for r in runs:
        parts = [r["open_store"], r.get("dims", 0.0), r.get("summary", 0.0)]
        total.append(sum(parts))
    for key, label in (
        ("open_store", "`import capture` + `open_store()`"),
        ("imports", "… of which `import capture.store_api` (duckdb, pyarrow)"),
        ("open_only", "… of which `open_store()` itself (list, check, create views)"),
        ("count_query", '`query("SELECT count(*) FROM calls")`'),
        ("dims", "`Store.dims()`"),
        ("summary", "`Store.summary()`"),
    ):
        values = [r[key] for r in runs if key in r]
        if not values:
            err = first.get(f"{key}_error", "not run")
            rows.append([label_calls, label, "—", "—", "—", f"not available: {err}"])
            continue
        rows.append([label_calls, label, _s(values), _mx(values), "", ""])
    complete = all("dims" in r and "summary" in r for r in runs)
    verdict = ""
    if target is not None:
        t = median(total)
        if not complete:
            verdict = "incomplete (dims/summary not available)"
        elif t <= target:
            verdict = f"**met** (≤ {target:g} s)"
        else:
            verdict = f"**missed** by {t - target:.2f} s (target ≤ {target:g} s)"
    rows.append(
        [
            label_calls,
            "**open_store + dims + summary**",
            f"**{_s(total)}**",
            _mx(total),
            f"{mib(median([r['peak_rss'] for r in runs]))}",
            verdict,
        ]
    )
    extra = first.get("dims_rows")
    store_line = (
        f"{label_calls} calls: {info['files']} calls files + {info['files']} stats files from "
        f"{info['processes']} writer processes over {info['days']} day(s), "
        f"{info['signatures']} distinct signatures, {info['bytes'] / 2**20:.0f} MiB on disk"
        + (f"; dims() returned {extra} rows, {first.get('dynamic')} dynamic" if extra else "")
        + "."
    )
    return rows, [store_line, *notes]


def cli_rows(path: str, calls: int, repeat: int) -> tuple[list[list[Any]], list[str]]:
    exe = shutil.which("capture") or os.path.join(os.path.dirname(sys.executable), "capture")
    notes = []
    if not os.path.exists(exe):
        return [], ["`capture` is not installed in this environment: CLI not measured"]
    commands = [
        ("`capture --help`", [exe, "--help"], TARGET_HELP_S),
        (
            f'`capture --store <{calls:,} calls> query "SELECT count(*) FROM calls"`',
            [exe, "--store", path, "query", "SELECT count(*) FROM calls"],
            None,
        ),
        (f"`capture --store <{calls:,} calls> dims`", [exe, "--store", path, "dims"], None),
        (f"`capture --store <{calls:,} calls> summary`", [exe, "--store", path, "summary"], None),
    ]
    rows = []
    for label, argv, target in commands:
        log(f"timing {' '.join(argv[1:])}")
        time_command(argv)  # warm the page cache for the interpreter and packages
        res = [time_command(argv) for _ in range(repeat)]
        secs = [r[0] for r in res]
        codes = {r[2] for r in res}
        if codes != {0}:
            notes.append(f"{label} exited with {sorted(codes)}")
        verdict = ""
        if target is not None:
            verdict = (
                f"**met** (≤ {target:g} s)"
                if median(secs) <= target
                else f"**missed** by {median(secs) - target:.2f} s"
            )
        rows.append([label, _s(secs), _mx(secs), mib(max(r[1] for r in res)), verdict])
    return rows, notes


def imports_line() -> str:
    """Which heavy modules `capture --help` and the query path load (no torch allowed)."""
    code = (
        "import sys, json; sys.argv=['capture', '--help']\n"
        "import capture.cli.main\n"
        "print(json.dumps({m: m in sys.modules for m in ('torch', 'duckdb', 'pyarrow', "
        "'transformers', 'numpy')}))"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
        loaded = json.loads(out.strip().splitlines()[-1])
    except Exception as e:  # the CLI is being written concurrently
        return f"could not import capture.cli.main: {e}"
    return "importing `capture.cli.main` loads: " + ", ".join(
        f"{m} {'yes' if v else 'no'}" for m, v in loaded.items()
    )


_COMPACT = """
import json, sys, time
import capture
t0 = time.perf_counter()
result = capture.compact(sys.argv[1])
seconds = time.perf_counter() - t0
files = {t: [r.files_before, r.files_after] for t, r in result.tables.items()}
print(json.dumps({"seconds": seconds, "files": files}))
"""


def compacted_rows(
    calls: int, per_file: int, path: str, info: dict[str, Any], repeat: int
) -> tuple[list[list[Any]], list[str]]:
    """Copies a store, runs `capture.compact` on the copy (a fresh process), then the usual rows.

    In a child process: this parent stays without pyarrow and numpy, whose pages would
    otherwise count in the CLI children's peak RSS.
    """
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as tmp:
        copy = os.path.join(tmp, "store")
        shutil.copytree(path, copy)
        log(f"compacting a copy of the {calls:,}-call store of {per_file:,}-call files")
        out = subprocess.run(
            [sys.executable, "-c", _COMPACT, copy],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        done = json.loads(out.strip().splitlines()[-1])
        label = f"{calls:,} ({per_file:,}/file, after `capture compact`)"
        r, n = store_rows(calls, copy, info, repeat, label=label)
    n = [m for m in n if not m.startswith(label)]
    n.append(
        f"{label}: `capture.compact()` took {done['seconds']:.2f} s (one run, fresh process, "
        "imports excluded); files "
        + ", ".join(f"{t} {a:,} → {b:,}" for t, (a, b) in done["files"].items())
    )
    return r, n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller stores, fewer repeats")
    parser.add_argument("--regenerate", action="store_true", help="rebuild the stores")
    parser.add_argument("--generate", nargs=3, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.generate:
        generate(opts.generate[2], int(opts.generate[0]), int(opts.generate[1]))
        return 0
    # (calls, calls per file): the brief's stores (100k per file, what a busy server's
    # flush_rows gives), and one of small files (what flush_seconds gives a quiet server)
    cases = (
        [(100_000, ROWS_PER_FILE), (1_000_000, ROWS_PER_FILE), (100_000, 1_000)]
        if opts.quick
        else [(1_000_000, ROWS_PER_FILE), (10_000_000, ROWS_PER_FILE), (1_000_000, 1_000)]
    )
    repeat = 2 if opts.quick else 5
    t_start = time.perf_counter()
    load_start = load_line()
    stores = {}
    generated = []
    for calls, per_file in cases:
        path, info, fresh = ensure_store(calls, per_file, opts.regenerate)
        stores[calls, per_file] = (path, info)
        generated.append(
            f"{calls:,} calls in files of {per_file:,}: "
            f"{'generated in' if fresh else 'reused (generated earlier in'} "
            f"{info['seconds']:.1f} s{'' if fresh else ')'}"
        )
    rows: list[list[Any]] = []
    notes: list[str] = []
    for calls, per_file in cases:
        path, info = stores[calls, per_file]
        r, n = store_rows(calls, path, info, repeat)
        rows += r
        notes += n
    small = [(c, p) for c, p in cases if p < ROWS_PER_FILE]
    for calls, per_file in small:  # the small-file store again, after `capture compact`
        path, info = stores[calls, per_file]
        r, n = compacted_rows(calls, per_file, path, info, repeat)
        rows += r
        notes += n
    big = max(c for c, _ in cases)
    c_rows, c_notes = cli_rows(stores[big, ROWS_PER_FILE][0], big, repeat)
    cmd = "python bench/bench_store.py" + (" --quick" if opts.quick else "")
    out = [
        "## Store benchmarks" + (" (quick run: small stores)" if opts.quick else ""),
        "",
        f"- Command: `{cmd}`",
        f"- Machine: {machine_line(('pyarrow', 'duckdb', 'click'))}",
        f"- Code: {code_line(('capture', 'cli'))}",
        f"- Load at start: {load_start}",
        "- Stores: synthetic, built with the writer's code path (`describe()` structures, "
        "`structure_table`, `write_parquet`; one stats file per calls file), 10 tensor "
        "leaves per call, 2,500 distinct signatures; under "
        + STORES_DIR
        + " ("
        + "; ".join(generated)
        + "). Files of 100k calls are what `flush_rows` gives a busy "
        "server; the store of 1k-call files is what `flush_seconds=10` gives a server at "
        "100 calls/s (beyond the brief: it shows what the number of files costs).",
        f"- Method: every row is a fresh Python process, run {repeat} times: median and max "
        "wall seconds. Peak RSS: VmHWM of the measuring process (open_store/dims/summary), "
        "ru_maxrss from wait4 for the CLI (the parent stays ~20 MiB, without torch or numpy, "
        "so the fork does not inflate it). Warm page cache (the files were just written or "
        "read): not a cold-disk measurement.",
        "",
        "### open_store, dims, summary",
        "",
        md_table(["calls", "step", "median s", "max s", "peak RSS MiB", "verdict"], rows),
        "",
        *[f"- {n}" for n in notes],
        "",
        "### CLI cold start (subprocess)",
        "",
        md_table(["command", "median s", "max s", "peak RSS MiB", "verdict"], c_rows),
        "",
        *[f"- {n}" for n in c_notes],
        f"- {imports_line()}",
        "",
        f"Total run time {time.perf_counter() - t_start:.0f} s; load at end: {load_line()}.",
        "",
    ]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
